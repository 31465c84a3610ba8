"""Tuning through a local RPC farm whose server does not fork (as a GPU's must): trials per second and
the sessions the server served, for one or more checkouts of OpBench, interleaved round by round.

A server started with ``--no-fork`` runs every session in a new interpreter. MetaSchedule's ``RPCRunner``
opens a session per candidate; OpBench's runner workers keep theirs (``opbench.profile.rpc.kept_session``).
To compare, give ``--src`` the ``python/`` folders of two checkouts (e.g. one made with ``git worktree
add /tmp/old <commit>``). Every run is ``opbench collect --iftune true`` through the command line, as a
user's; ``--target llvm`` runs anywhere (the server's "GPU" is then only its environment).

    PYTHONPATH=python python3 scripts/bench_rpc_sessions.py --out DIR --src /tmp/old/python,python --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _cli import ROOT


def one_run(src: Path, out: Path, args: argparse.Namespace) -> dict:
    """One tuning run with the checkout at ``src``, its farm started by that checkout's ``LocalFarm``."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    code = f"""
import json, subprocess, sys, time
sys.path.insert(0, {str(src)!r})
from opbench.profile.rpc import LocalFarm
with LocalFarm("bench", ["0"], {str(out / 'farm')!r}) as farm:  # a device's server: --no-fork
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "opbench", "collect", "--modelsource", "local", "--modelname",
                           {args.model!r}, "--target", {args.target!r}, "--dataset", {str(out / 'd.sqlite')!r},
                           "--iftune", "true", "--tuner", {args.tuner!r}, "--trials", "{args.trials}",
                           "--tune-tasks", "{args.tasks}", "--rpc-tracker", farm.address, "--rpc-key", "bench",
                           "--json", {str(out / 'run.json')!r}, "-q"], capture_output=True, text=True)
    print(json.dumps({{"exit": proc.returncode, "wall_s": time.perf_counter() - start,
                      "sessions": farm.sessions(), "stderr": proc.stderr[-500:]}}))
"""
    env = {**os.environ, "PYTHONPATH": str(src), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=args.limit)
    result = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.stdout.strip() else {"error": proc.stderr[-500:]}
    try:
        tuning = json.loads((out / "run.json").read_text())["tuning"]
        result.update(trials=tuning["trials"], tuning_s=round(tuning["tuning_s"], 1),
                      trials_per_s=round(tuning["trials_per_s"], 4), valid=[t["valid"] for t in tuning["tasks"]])
    except (OSError, ValueError, KeyError):
        pass
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description="RPC tuning with a server that does not fork, by checkout.")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--src", default=str(ROOT / "python"),
                        help="python/ folders of the checkouts to time, comma-separated (default: this one's)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds; each runs every checkout once")
    parser.add_argument("--model", default="resnet-18")
    parser.add_argument("--target", default="llvm")
    parser.add_argument("--tuner", default="xgb")
    parser.add_argument("--trials", type=int, default=8, help="trials per task (default: 8)")
    parser.add_argument("--tasks", type=int, default=2, help="tasks tuned (default: the 2 heaviest)")
    parser.add_argument("--limit", type=float, default=900, help="seconds per run (default: 900)")
    args = parser.parse_args()
    out = Path(args.out)
    sources = [Path(s).resolve() for s in args.src.split(",") if s.strip()]
    runs: dict[str, list[dict]] = {str(s): [] for s in sources}
    for r in range(args.rounds):
        for i, src in enumerate(sources):
            result = one_run(src, out / f"run-{r}-{i}", args)
            runs[str(src)].append(result)
            print(f"round {r + 1}, {src}: {result.get('trials_per_s')} trials/s, sessions {result.get('sessions')}",
                  flush=True)
    summary = {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "model": args.model, "target": args.target,
               "tuner": args.tuner, "trials_per_task": args.trials, "tasks": args.tasks, "runs": runs,
               "median_trials_per_s": {s: statistics.median([x["trials_per_s"] for x in v if "trials_per_s" in x] or
                                                            [0.0]) for s, v in runs.items()}}
    (out / "bench_rpc_sessions.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary["median_trials_per_s"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
