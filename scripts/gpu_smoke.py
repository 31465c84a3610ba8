"""GPU smoke run on a machine with an NVIDIA GPU and OpBench's dependencies installed.

Runs the GPU test subset, then collects googlenet on CUDA with co-runs (all operators + 200
co-run groups) and writes ``DIR/gpu_smoke.json`` (device, counts, compile/measure split, the
best, worst and a typical co-run row) and the dataset ``DIR/opbench_gpu.sqlite``.

    PYTHONUNBUFFERED=1 PYTHONPATH=python python3 scripts/gpu_smoke.py --out DIR [--skip-tests] [--model googlenet]
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_tests(env: dict, out: Path, jobs: int) -> dict:
    """The GPU tests: one process per model replay (compiles dominate; a crash stays in its process),
    plus one process per other file with GPU tests, ``jobs`` at a time."""
    sys.path.insert(0, str(ROOT / "python"))
    from opbench.models import list_sources

    base = [sys.executable, "-X", "faulthandler", "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider"]
    replay = "tests/profile/test_cuda.py::test_local_replay_cuda"
    selections: dict[str, list[str]] = {}
    selections["tests/profile/test_cuda.py (not replays)"] = ["tests/profile/test_cuda.py", "-k",
                                                              "not test_local_replay_cuda"]
    for path in sorted(ROOT.glob("tests/**/test_*.py")):  # every other file with GPU tests, one process each
        name = str(path.relative_to(ROOT))
        if name != "tests/profile/test_cuda.py" and "mark.gpu" in path.read_text():
            selections[name] = [name]
    selections.update({f"{replay}[{name}]": [f"{replay}[{name}]"] for name in sorted(list_sources()["local"])})
    start = time.perf_counter()
    results: dict = {}
    pending = list(selections)
    running: list = []
    while pending or running:
        while pending and len(running) < jobs:
            sel = pending.pop(0)
            running.append((sel, subprocess.Popen(base + selections[sel], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                                  stderr=subprocess.STDOUT, text=True)))
        time.sleep(0.5)
        for item in list(running):
            sel, proc = item
            if proc.poll() is not None:
                text = proc.stdout.read()
                results[sel] = {"exit": proc.returncode, "tail": text.strip().splitlines()[-1:]}
                with open(out / "gpu_tests.log", "a") as log:
                    log.write(f"===== {sel} (exit {proc.returncode})\n{text}\n")
                print(f"{sel}: exit {proc.returncode} {results[sel]['tail']}", flush=True)
                running.remove(item)
    failed = [s for s, r in results.items() if r["exit"] != 0]
    return {"exit": 1 if failed else 0, "failed": failed, "runs": results,
            "seconds": time.perf_counter() - start}


def main() -> int:
    parser = argparse.ArgumentParser(description="GPU tests and a googlenet collection with co-runs.")
    parser.add_argument("--out", default=os.environ.get("OUT", "out"), help="output folder (default: $OUT or out)")
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--model", default="googlenet")
    parser.add_argument("--corun-limit", type=int, default=200)
    parser.add_argument("--skip-collect", action="store_true")
    parser.add_argument("--jobs", type=int, default=8, help="parallel test processes")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
    summary: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    if not args.skip_tests:
        summary["gpu_tests"] = run_tests(env, out, args.jobs)
    if args.skip_collect:
        (out / "gpu_smoke.json").write_text(json.dumps(summary, indent=2, default=str))
        print(json.dumps(summary, indent=1, default=str))
        return 0 if summary.get("gpu_tests", {}).get("exit", 0) == 0 else 1
    db = out / "opbench_gpu.sqlite"
    t = time.perf_counter()
    collect = subprocess.run([sys.executable, str(ROOT / "python/performance_collector/op_performance_collector.py"),
                              "--modelsource", "local", "--modelname", args.model, "--target", "cuda",
                              "--dataset", str(db), "--corun", "--corun-limit", str(args.corun_limit),
                              "--json", str(out / "collect.json")], cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    print(collect.stdout[-12000:])
    print(collect.stderr[-4000:], file=sys.stderr)
    summary["collect_exit"] = collect.returncode
    summary["collect_wall_s"] = wall
    if collect.returncode in (0, 3):  # 3: finished with failed operators, rows say which
        summary["collect"] = json.loads((out / "collect.json").read_text())
        conn = sqlite3.connect(db)
        conn.row_factory = sqlite3.Row
        ops = conn.execute("SELECT COUNT(*) n, SUM(registers IS NOT NULL) res, SUM(status='failed') failed "
                           "FROM operators").fetchone()
        summary["operator_rows"] = dict(ops)
        rows = [dict(r) for r in conn.execute(
            "SELECT group_key, group_size, kinds, sequential_s, concurrent_s, speedup, solo_s, slowdowns "
            "FROM corun WHERE status='ok' ORDER BY speedup")]
        summary["corun_rows"] = len(rows)
        if rows:
            summary["corun_examples"] = {"worst": rows[0], "typical": rows[len(rows) // 2], "best": rows[-1]}
            speedups = [r["speedup"] for r in rows]
            summary["corun_speedup"] = {"min": min(speedups), "median": speedups[len(speedups) // 2],
                                        "max": max(speedups)}
        env_row = conn.execute("SELECT gpu_name, gpu_sm_count, gpu_memory_mb, gpu_driver, cuda_runtime, "
                               "gpu_clock_start_mhz, gpu_clock_end_mhz, tvm_version FROM models").fetchone()
        summary["environment"] = dict(env_row) if env_row else None
    (out / "gpu_smoke.json").write_text(json.dumps(summary, indent=2, default=str))
    print(json.dumps({k: v for k, v in summary.items() if k != "corun_examples"}, indent=1, default=str))
    return 0 if collect.returncode == 0 and summary.get("gpu_tests", {}).get("exit", 0) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
