"""Where a candidate's build goes: lowering and code generation, the CUDA compiler, the host code, the link.

Samples ``--count`` candidates of the heaviest tasks of a model (:mod:`opbench.tune.sampler`, no hardware
needed) and builds each one in this process, once with each CUDA compiler (``nvrtc``, ``nvcc``), timing
the CUDA compile callback separately from the rest of ``tvm.tirx.build`` and from ``export_library``.

    PYTHONPATH=python python3 scripts/bench_build.py --model resnet-50 --count 8 --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--model", default="resnet-50")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--count", type=int, default=8)
    args = parser.parse_args()
    import tvm
    from tvm.support import nvcc

    from opbench.models import load_workload
    from opbench.pipeline.tune import extracted_tasks
    from opbench.runtime.target import resolve_target, tuning_target
    from opbench.tune.measure import build_candidate
    from opbench.tune.sampler import sample_task

    target = resolve_target("cuda")
    ms_target = tuning_target(target)
    tasks = sorted(extracted_tasks(load_workload("local", args.model, 1, dtype=args.dtype), target),
                   key=lambda t: -t.weight * (1 if "conv" in t.task_name or "matmul" in t.task_name else 0))
    spent = {"cuda": 0.0}
    original = nvcc.compile_cuda

    def timed(*a, **k):
        start = time.perf_counter()
        try:
            return original(*a, **k)
        finally:
            spent["cuda"] += time.perf_counter() - start

    nvcc.compile_cuda = timed
    rows = []
    for task in tasks[: args.tasks]:
        for cand in sample_task(task.dispatched[0], ms_target, args.count, seed=0):
            mod = tvm.ir.load_json(cand.mod)
            for compiler in ("nvrtc", "nvcc"):
                os.environ["TVM_CUDA_COMPILE_MODE"] = compiler
                spent["cuda"] = 0.0
                start = time.perf_counter()
                try:
                    lib = build_candidate(mod, ms_target)
                    built = time.perf_counter()
                    path = os.path.join(tempfile.mkdtemp(), "m.so")
                    lib.export_library(path)
                    error = None
                except Exception as err:  # noqa: BLE001
                    built, error = time.perf_counter(), f"{type(err).__name__}: {str(err)[:200]}"
                end = time.perf_counter()
                rows.append({"task": task.task_name, "index": cand.index, "compiler": compiler,
                             "cuda_compile_s": spent["cuda"], "lower_and_host_s": built - start - spent["cuda"],
                             "export_s": end - built, "total_s": end - start, "error": error})
                print(json.dumps(rows[-1]), flush=True)
    summary = {}
    for compiler in ("nvrtc", "nvcc"):
        mine = [r for r in rows if r["compiler"] == compiler and not r["error"]]
        summary[compiler] = {k: statistics.median(r[k] for r in mine) for k in
                             ("cuda_compile_s", "lower_and_host_s", "export_s", "total_s")} if mine else None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_build.json").write_text(json.dumps({"model": args.model, "dtype": args.dtype,
                                                      "median": summary, "rows": rows}, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
