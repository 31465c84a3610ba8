"""Benchmark: on the CPU, do a parallel schedule's threads run its branches at once?

A two-branch ``simple`` model's TVM kernels (llvm, untuned: each kernel a loop nest on one core) run
under the sequential schedule and under greedy (one thread per branch), side by side, alternating,
many times; the medians and their ratio go to OUT/bench_cpu_threads.json. On an idle machine with
two or more cores the greedy run takes clearly less than sequential; a busy machine narrows the gap,
which is why this is a benchmark and not a test.

    PYTHONPATH=python python3 scripts/bench_cpu_threads.py --out out
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="out", help="output folder")
    parser.add_argument("--model", default="branchy:branches=2,depth=1,channels=48,size=24")
    parser.add_argument("--rounds", type=int, default=30, help="alternating timed runs of each schedule")
    args = parser.parse_args()

    from opbench.models import load_workload
    from opbench.pipeline.compile import tvm_backend
    from opbench.runtime import resolve_target
    from opbench.runtime.executor import ParallelExecutor
    from opbench.schedule import get_scheduler

    backend = tvm_backend(load_workload("simple", args.model, 1), resolve_target("llvm"))
    runs = {name: ParallelExecutor(backend, get_scheduler(name).schedule(backend.graph)).run
            for name in ("sequential", "greedy")}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for run in runs.values():
        run()  # warm-up
    for _ in range(args.rounds):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    result = {"model": args.model, "cores": os.cpu_count(), "rounds": args.rounds,
              "median_ms": {n: statistics.median(t) * 1e3 for n, t in times.items()},
              "min_ms": {n: min(t) * 1e3 for n, t in times.items()}}
    result["greedy_over_sequential"] = result["median_ms"]["greedy"] / result["median_ms"]["sequential"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_cpu_threads.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
