"""Collect the shipped tensor-program records (``data/dataset/``) with ``opbench sample``, resumably.

The collection is a list of sampling jobs (:data:`PLAN`, each a ``SampleJob`` as JSON, run with
``opbench sample --config``). One invocation of this script works for ``--budget`` seconds:

1. If the working dataset (``--dataset``) does not exist yet, the records folder (``--records``) is unpacked
   into it: its tasks (no model is loaded again) and its records (none is measured again).
2. The jobs run in order, each with ``--time-limit`` set to what is left of the budget; a finished job
   costs a few seconds (every candidate is stored); the next invocation resumes where this one stopped.
3. The working dataset is packed into ``OUT/records.tar`` (the records folder: Parquet, zstd, files of at
   most 8 MiB) and ``OUT/collect.json`` says what each job stored, how fast, and the totals.

``--tasks-only sm_90`` runs the jobs' first step only (every model's tasks extracted and stored, nothing
sampled), on any machine: the GPU's calls then load no model.

Regenerate the shipped records from nothing (each call resumes the last; repeat until every job is done):

    PYTHONPATH=python python3 scripts/collect_records.py --records data/dataset --out DIR
    tar -xf DIR/records.tar -C data/dataset
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import tarfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cli import ROOT, run_opbench  # noqa: E402

SIMPLE = ["matmul:n=256", "matmul:n=512", "matmul:n=1024", "matmul:n=2048", "matmul_matmul_add", "branchy",
          "ios_block", "kernels"]
#: the collection, in order: breadth first (every model at one precision), then the other precisions and batch 8.
#: The first nine jobs were begun with TVM's time_evaluator and finish with it (a timer files its records under a
#: config of its own, so changing it would measure every stored candidate again); the later ones time CUDA Graph
#: replays (``opbench sample``'s default on a GPU of this host: steadier on microsecond kernels)
PLAN: list[dict] = [
    {"source": "local", "models": ["all"], "dtypes": ["float16"], "batch_sizes": [1]},
    {"source": "transformers", "models": ["all"], "dtypes": ["float16"], "batch_sizes": [1]},
    {"source": "simple", "models": SIMPLE, "dtypes": ["float16", "float32"], "batch_sizes": [1]},
    {"source": "local", "models": ["all"], "dtypes": ["float32"], "batch_sizes": [1]},
    {"source": "transformers", "models": ["all"], "dtypes": ["float32"], "batch_sizes": [1]},
    {"source": "local", "models": ["all"], "dtypes": ["bfloat16"], "batch_sizes": [1]},
    {"source": "transformers", "models": ["all"], "dtypes": ["bfloat16"], "batch_sizes": [1]},
    {"source": "local", "models": ["all"], "dtypes": ["float16"], "batch_sizes": [8]},
    {"source": "transformers", "models": ["all"], "dtypes": ["float16"], "batch_sizes": [8]},
    {"source": "local", "models": ["all"], "dtypes": ["float32"], "batch_sizes": [8], "timer": "graph"},
    {"source": "transformers", "models": ["all"], "dtypes": ["float32"], "batch_sizes": [8], "timer": "graph"},
    {"source": "local", "models": ["all"], "dtypes": ["bfloat16"], "batch_sizes": [8], "timer": "graph"},
    {"source": "transformers", "models": ["all"], "dtypes": ["bfloat16"], "batch_sizes": [8], "timer": "graph"},
]
#: the second pass (jobs 13-25): the same jobs, each task extended from 16 to 32 candidates (the sampler is
#: prefix-stable: a task's first 16 are the stored ones, neither built nor measured again)
PLAN += [{**job, "per_task": 32} for job in PLAN]
COMMON = {"target": "cuda", "per_task": 16, "seed": 0, "audit": 0.02, "timer": "evaluator"}


def count(dataset: Path) -> int:
    """The sampled records a working dataset holds."""
    if not dataset.exists():
        return 0
    with sqlite3.connect(dataset) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM trials WHERE tuner='sample'").fetchone()[0])


def prepare(dataset: Path, records: Path) -> dict | None:
    """Unpack the records folder into the working dataset unless it exists; what was added, or None."""
    from opbench.dataset import records as packed

    dataset.parent.mkdir(parents=True, exist_ok=True)
    if dataset.exists() or not (records / "manifest.json").is_file():
        return None
    added = packed.unpack(records, dataset)
    print(f"unpacked {records}: {added}", flush=True)
    return added


def job_config(index: int, dataset: Path, per_task: int | None = None, devices: list[int] | None = None,
               builders: int = 0, tasks_only: str | None = None) -> dict:
    """Job ``index`` of :data:`PLAN` as a ``SampleJob`` (JSON fields); ``per_task`` replaces the job's own."""
    job = {**COMMON, **PLAN[index], "dataset": str(dataset), "builders": builders}
    if per_task is not None:
        job["per_task"] = per_task
    if devices:
        job["devices"] = devices
    if tasks_only:
        job.update(tasks_only=True, target=json.dumps({"kind": "cuda", "arch": tasks_only}))
    return job


def pack_into(dataset: Path, out: Path) -> dict:
    """Pack the working dataset into ``out/records.tar`` (a records folder); the manifest and its bytes."""
    from opbench.dataset import records as packed

    folder = out / "records"
    manifest = packed.pack(dataset, folder)
    with tarfile.open(out / "records.tar", "w") as tar:
        for file in sorted(folder.iterdir()):
            tar.add(file, arcname=file.name)
    for file in folder.iterdir():
        file.unlink()
    folder.rmdir()
    return {"manifest": {k: v for k, v in manifest.items() if k != "files"},
            "bytes": sum(f["bytes"] for f in manifest["files"])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for records.tar, collect.json and the log")
    parser.add_argument("--records", default="data/dataset", help="the records folder to resume from")
    parser.add_argument("--dataset", default="/tmp/opbench-records/records.sqlite", help="the working dataset")
    parser.add_argument("--budget", type=float, default=520.0, help="seconds of sampling in this invocation")
    parser.add_argument("--per-task", type=int, default=None,
                        help="candidates per task for every job run (default: each job's own, 16 or 32)")
    parser.add_argument("--jobs", default=None, help="indices of PLAN to run, comma-separated (default: all)")
    parser.add_argument("--devices", default=None, help="GPU indices measuring, comma-separated (default: one GPU)")
    parser.add_argument("--builders", type=int, default=0, help="building processes (default 0: every core not "
                                                               "measuring)")
    parser.add_argument("--tasks-only", default=None, metavar="ARCH",
                        help="extract and store the jobs' tasks for this CUDA arch (e.g. sm_90) and sample nothing: "
                             "a machine without the GPU prepares the collection, whose GPU time then loads no model")
    args = parser.parse_args()
    start = time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dataset = Path(args.dataset)
    devices = [int(d) for d in args.devices.split(",")] if args.devices else None
    summary: dict = {"budget_s": args.budget, "per_task": args.per_task, "devices": devices,
                     "builders": args.builders, "jobs": []}
    unpacked = prepare(dataset, Path(args.records))
    if unpacked is not None:
        summary["unpacked"] = unpacked
    summary["records_before"] = count(dataset)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python"), "PYTHONUNBUFFERED": "1"}
    chosen = [int(i) for i in args.jobs.split(",")] if args.jobs else range(len(PLAN))
    for index in chosen:
        left = args.budget - (time.monotonic() - start)
        if left < 90:  # too little for a job's start (tasks from the dataset, workers) and some sampling
            break
        job = job_config(index, dataset, args.per_task, devices, args.builders, args.tasks_only)
        config = out / f"job{index}.json"
        config.write_text(json.dumps(job))
        before = count(dataset)
        # the job stops starting candidates at its time limit and measures what is built for at most 30 s more
        # (FarmConfig.drain_s); packing the records then takes seconds: the invocation stays within the budget
        code, wall, text = run_opbench(["sample", "--config", str(config), "--time-limit", f"{left - 50:.0f}",
                                        "--json", str(out / f"job{index}.summary.json"), "-q"], env,
                                       out / "collect.log", limit=left)
        stored = count(dataset) - before
        result = json.loads((out / f"job{index}.summary.json").read_text()) \
            if (out / f"job{index}.summary.json").exists() else {}
        for name in (f"job{index}.json", f"job{index}.summary.json"):
            (out / name).unlink(missing_ok=True)
        summary["jobs"].append({"index": index, "job": PLAN[index], "exit": code, "wall_s": round(wall, 1),
                                "stored": stored, "records_per_s": round(stored / wall, 2) if wall else None,
                                "tasks": result.get("tasks"), "summary": result})
        print(f"job {index} {PLAN[index]}: exit {code}, {stored} new records in {wall:.0f} s", flush=True)
        if code != 0:
            print(text[-3000:], flush=True)
    summary["records_after"] = count(dataset)
    summary.update(pack_into(dataset, out))
    summary["wall_s"] = round(time.monotonic() - start, 1)
    (out / "collect.json").write_text(json.dumps(summary, indent=1))
    print(f"records: {summary['records_before']} -> {summary['records_after']} "
          f"({summary['bytes'] / 2**20:.1f} MiB packed) in {summary['wall_s']:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
