"""Collect the dataset that OpBench ships in ``data/``: every ``local`` model with default kernels
and co-run groups, sampled operators (``--kernels``), and the tuning trials of a few tasks, on one
device.

Models are collected by several ``opbench collect`` processes at once: they compile in parallel
and take turns on the device (``$OPBENCH_DEVICE_LOCK``), so no measurement overlaps another's.
A re-run with the same ``--dataset`` skips what is already measured, so the work can be split
over several calls (``--models``). Writes the dataset and ``DIR/collect_summary.json``.

    PYTHONPATH=python python3 scripts/collect_dataset.py --out DIR --target cuda --models all
    PYTHONPATH=python python3 scripts/collect_dataset.py --out DIR --target cuda --models none \\
        --tune resnet-18 --tune-tasks 8 --trials 32
    PYTHONPATH=python python3 scripts/collect_dataset.py --out DIR --dataset ALL.sqlite --merge A.sqlite B.sqlite
    PYTHONPATH=python python3 scripts/collect_dataset.py --out DIR --target cuda --dtypes float16,bfloat16 \\
        --batchsize 1,8 --models resnet-18,resnet-50,googlenet,inception_v3,mobilenet,squeezenet_v1.1
    PYTHONPATH=python python3 scripts/collect_dataset.py --out DIR --target cuda --dtypes float16,bfloat16 \\
        --batchsize 1,8 --models transformers:gpt2,vit_b_16 --time-limit 400   # a re-run resumes

A (model, dtype) whose default-kernel rows are all in the dataset already is skipped without compiling.
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
sys.path.insert(0, str(ROOT / "python"))


def finished(dataset: Path, source: str, model: str, dtype: str, batches: list[int]) -> bool:
    """Whether ``dataset`` already holds an ``ok`` default-kernel model row of ``model`` in ``dtype`` at every
    batch size: such a collection is skipped without compiling anything."""
    if model.startswith("kernels:") or not dataset.exists():  # every draw of sampled operators is its own
        return False
    conn = sqlite3.connect(f"file:{dataset}?mode=ro", uri=True)
    try:
        done = {b for (b,) in conn.execute(
            "SELECT batch_size FROM models WHERE source = ? AND model = ? AND dtype = ? AND config = 'default' "
            "AND status = 'ok'", (source, model, dtype))}
    except sqlite3.DatabaseError:
        done = set()
    finally:
        conn.close()
    return set(batches) <= done


def collect_models(models: list[tuple[str, str]], args: argparse.Namespace, env: dict[str, str],
                   log: Path) -> dict:
    """One ``opbench collect`` process per (source, model) and dtype, ``args.jobs`` at a time; none starts
    after ``args.time_limit`` seconds (the running ones finish)."""
    base = [sys.executable, "-m", "opbench", "collect", "--target", args.target,
            "--dataset", str(args.dataset), "-q"]
    if args.target.startswith("cuda") and args.corun_limit:
        base += ["--corun", "--corun-limit", str(args.corun_limit)]
    base += ["--batchsize", args.batchsize]
    batches = [int(b) for b in args.batchsize.split(",")]
    pending = [(s, m, d) for s, m in models for d in args.dtypes.split(",")]
    running, results, start = [], {}, time.perf_counter()
    while pending or running:
        while pending and len(running) < args.jobs:
            source, model, dtype = pending.pop(0)
            name = (model if source in ("local", "simple") else f"{source}:{model}") + \
                ("" if dtype == "float32" else f" {dtype}")
            if finished(args.dataset, source, model, dtype, batches):
                results[name] = {"exit": 0, "seconds": 0.0, "last_line": "already in the dataset: skipped"}
                continue
            if args.time_limit and time.perf_counter() - start > args.time_limit:
                results[name] = {"exit": None, "seconds": 0.0, "last_line": "not started: --time-limit reached"}
                continue
            proc = subprocess.Popen(base + ["--modelsource", source, "--modelname", model, "--dtype", dtype],
                                    cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            running.append((name, proc, time.perf_counter()))
        time.sleep(0.5)
        for item in list(running):
            name, proc, started = item
            if proc.poll() is None:
                continue
            text = proc.stdout.read()
            with open(log, "a") as handle:
                handle.write(f"===== {name} (exit {proc.returncode})\n{text}\n")
            results[name] = {"exit": proc.returncode, "seconds": round(time.perf_counter() - started, 1),
                             "last_line": (text.strip().splitlines() or [""])[-1][:300]}
            print(f"{name}: exit {proc.returncode} in {results[name]['seconds']} s", flush=True)
            running.remove(item)
    return results


def tune(args: argparse.Namespace, env: dict[str, str], log: Path) -> dict:
    """Tune the heaviest tasks of one model; every trial goes into the ``trials`` table."""
    cmd = [sys.executable, "-m", "opbench", "collect", "--modelsource", "local", "--modelname", args.tune,
           "--target", args.target, "--dataset", str(args.dataset), "--iftune", "true", "--tuner", args.tuner,
           "--trials", str(args.trials), "--tune-tasks", str(args.tune_tasks), "-q"]
    if args.tune_time:
        cmd += ["--tune-time", str(args.tune_time)]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with open(log, "a") as handle:
        handle.write(f"===== tune {args.tune} (exit {proc.returncode})\n{proc.stdout}\n")
    print(proc.stdout[-3000:], flush=True)
    return {"model": args.tune, "exit": proc.returncode, "seconds": round(time.perf_counter() - start, 1)}


def merge(dest: Path, sources: list[Path]) -> dict:
    """Copy every run and row of ``sources`` into ``dest`` (runs renumbered; a row with the same key is
    replaced) and write the readable ``workload`` column as the tool now writes it."""
    from opbench.dataset import Dataset
    from opbench.dataset.schema import TABLES
    from opbench.models.base import readable_fingerprint

    Dataset(dest).close()  # creates or migrates the destination
    conn = sqlite3.connect(dest)
    copied: dict = {}
    for source in sources:
        Dataset(source).close()
        conn.execute("ATTACH DATABASE ? AS src", (str(source),))
        runs = {}
        fields = "started_at, finished_at, status, command, env"
        for run_id, *rest in conn.execute(f"SELECT run_id, {fields} FROM src.runs"):
            cur = conn.execute(f"INSERT INTO runs ({fields}) VALUES (?,?,?,?,?)", rest)
            runs[run_id] = cur.lastrowid
        for table, (columns, _) in TABLES.items():
            names = ["run_id"] + [c for c, _ in columns]
            rows = conn.execute(f"SELECT {', '.join(names)} FROM src.{table} ORDER BY id").fetchall()
            at = names.index("workload") if "workload" in names else None  # the tasks table has none
            for row in rows:
                row = list(row)
                row[0] = runs.get(row[0], row[0])
                if at is not None and row[at]:
                    row[at] = json.dumps(readable_fingerprint(json.loads(row[at])))
                conn.execute(f"INSERT OR REPLACE INTO {table} ({', '.join(names)}) VALUES "
                             f"({', '.join('?' for _ in names)})", row)
            copied[f"{source.name}:{table}"] = len(rows)
        conn.commit()
        conn.execute("DETACH DATABASE src")
    conn.execute("VACUUM")
    conn.close()
    return copied


def summary(path: Path) -> dict:
    """Rows per table and per model in the dataset."""
    conn = sqlite3.connect(path)
    out: dict = {"size_mb": round(path.stat().st_size / 2**20, 2)}
    for table in ("operators", "models", "corun", "trials"):
        rows = conn.execute(f"SELECT model, dtype, batch_size, device_name, COUNT(*) FROM {table} "
                            "GROUP BY model, dtype, batch_size, device_name")
        out[table] = {f"{m} {t} batch {b} @ {d}": n for m, t, b, d, n in rows}
    conn.close()
    return out


def main() -> int:
    from opbench.models import list_sources

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--dataset", default=None, help="dataset file (default: DIR/opbench_dataset.sqlite)")
    parser.add_argument("--target", default="cuda", help="llvm or cuda")
    parser.add_argument("--models", default="all",
                        help="comma-separated local models (transformers:NAME for a transformers config), "
                             "'all' (every local model) or 'none'")
    parser.add_argument("--kernels", type=int, default=0, metavar="N",
                        help="also N sampled operators per draw (the simple model kernels:n=N,sample=S)")
    parser.add_argument("--kernel-samples", type=int, default=0, metavar="S", help="draws of --kernels to collect")
    parser.add_argument("--kernel-from", type=int, default=1, metavar="K", help="first draw (draws K..K+S-1)")
    parser.add_argument("--jobs", type=int, default=4, help="collections at once (they take turns measuring)")
    parser.add_argument("--time-limit", type=float, default=None, metavar="S",
                        help="start no collection after S seconds (the running ones finish; a re-run resumes)")
    parser.add_argument("--corun-limit", type=int, default=100, help="co-run groups per model (cuda; 0: no co-runs)")
    parser.add_argument("--dtypes", default="float32", help="precisions to collect every model in (comma-separated)")
    parser.add_argument("--batchsize", default="1", help="batch sizes to collect every model at (e.g. 1,8)")
    parser.add_argument("--merge", nargs="+", default=None, metavar="FILE",
                        help="only merge these datasets into --dataset (or DIR's), then summarise")
    parser.add_argument("--tune", default=None, help="a local model whose heaviest tasks are tuned")
    parser.add_argument("--tuner", default="xgb")
    parser.add_argument("--tune-tasks", type=int, default=8)
    parser.add_argument("--trials", type=int, default=32)
    parser.add_argument("--tune-time", type=float, default=None)
    args = parser.parse_args()
    out = Path(args.out)
    args.dataset = Path(args.dataset or out / "opbench_dataset.sqlite").resolve()
    sources = list_sources()
    known = sorted(sources["local"])
    if args.models == "all":
        models = [("local", m) for m in known]
    elif args.models == "none":
        models = []
    else:
        models = []
        for token in (m.strip() for m in args.models.split(",") if m.strip()):
            source, sep, name = token.partition(":")
            if not sep:
                source, name = "local", token
            if source not in ("local", "transformers") or name not in sources[source]:
                parser.error(f"unknown model {token!r} (accepted: {', '.join(known)}, or transformers:NAME with "
                             f"NAME one of {', '.join(sorted(sources['transformers']))})")
            models.append((source, name))
    if args.kernels and args.kernel_samples:
        first = args.kernel_from
        models += [("simple", f"kernels:n={args.kernels},sample={s}")
                   for s in range(first, first + args.kernel_samples)]
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python"), "PYTHONUNBUFFERED": "1",
           "OPBENCH_DEVICE_LOCK": str(out / ".device.lock")}
    if args.merge:
        copied = merge(args.dataset, [Path(p).resolve() for p in args.merge])
        print(json.dumps({"merged": copied, "dataset": summary(args.dataset)}, indent=1))
        return 0
    log = out / "collect.log"
    start = time.perf_counter()
    result: dict = {"command": " ".join(sys.argv), "target": args.target,
                    "models": collect_models(models, args, env, log) if models else {}}
    if args.tune:
        result["tuning"] = tune(args, env, log)
    result["wall_s"] = round(time.perf_counter() - start, 1)
    if args.dataset.exists():
        result["dataset"] = summary(args.dataset)
    (out / "collect_summary.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return 0 if all(r["exit"] in (0, None) for r in result["models"].values()) else 1  # None: not started


if __name__ == "__main__":
    sys.exit(main())
