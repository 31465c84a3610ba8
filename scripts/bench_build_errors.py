"""What a candidate that does not build costs the builders: stored records built again in this process.

Draws ``--count`` candidates of each kind from a records folder (``int64x8``: NVRTC's ``too many arguments
in function call`` on TVM's 8-lane int64 vectors; ``nvrtc``: the other NVRTC errors; ``timeout``: builds
stopped at the builders' time limit; ``ok``: candidates that built), replays each stored trace on its task,
lowers it and generates its CUDA source (:func:`opbench.tune.measure.build_candidate`), then times the
builders' CUDA compile callback on that source (``nvrtc-pch``, in a process where the header has compiled a
kernel) against what the callback did before a kernel's failure stopped being compiled a second time: the
compile with the header, and where it failed, the compile without it (both timed here). No GPU is needed:
NVRTC only compiles (it needs the CUDA headers: set ``CUDA_PATH`` where ``nvcc`` is not on the path). One
process compiles, where the builders were 15 at once beside the sampling: compare within a row.

    PYTHONPATH=python python3 scripts/bench_build_errors.py --records data/dataset --dtype bfloat16 --out DIR
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

KINDS = ("int64x8", "nvrtc", "timeout", "ok")


def kind_of(row: dict) -> str | None:
    error = row.get("error") or ""
    if row.get("build_status") == "ok":
        return "ok"
    if row.get("build_status") == "build_timeout":
        return "timeout"
    if "NVRTC compilation failed" in error:
        return "int64x8" if "too many arguments in function call" in error else "nvrtc"
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", default="data/dataset")
    parser.add_argument("--dtype", default="bfloat16", choices=["float16", "bfloat16", "float32"],
                        help="the candidates' dtype")
    parser.add_argument("--count", type=int, default=10, help="candidates of each kind")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scan", type=int, default=0,
                        help="also generate the CUDA source (no compile) of this many candidates that built and "
                             "of a quarter as many int64x8 ones, of every dtype, and count what "
                             "known_compile_error finds")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if not (Path(args.records) / "manifest.json").is_file():
        parser.error(f"--records {args.records}: not a records folder (it has no manifest.json)")
    if args.count < 1 or args.scan < 0:
        parser.error("--count must be at least 1 and --scan at least 0")
    import tvm
    import tvm_ffi
    from tvm.s_tir import Schedule
    from tvm.s_tir.schedule import Trace

    from opbench.dataset import json_value, records
    from opbench.predict.trials import target_for
    from opbench.runtime.startup import import_tensor_intrinsics
    from opbench.tune import measure

    import_tensor_intrinsics()
    every = records.read_rows(args.records)
    rows = [r for r in every if r.get("dtype") == args.dtype]
    tasks = {t["workload_id"]: t for t in records.read_rows(args.records, "tasks")}
    rng = random.Random(args.seed)
    chosen = {}
    for kind in KINDS:
        pool = [r for r in rows if kind_of(r) == kind and r["workload_id"] in tasks]
        chosen[kind] = rng.sample(pool, min(args.count, len(pool)))
        print(f"{kind}: {len(pool)} stored at {args.dtype}, {len(chosen[kind])} drawn", flush=True)

    def scheduled(row: dict) -> tuple:
        task = tasks[row["workload_id"]]
        sch = Schedule(tvm.ir.load_json(task["mod"]))
        Trace.apply_json_to_schedule(json_value(row["trace"]), sch)
        return sch.mod, target_for(task["target"])

    def timed(call, *a, **k) -> tuple[float, str | None]:
        start = time.perf_counter()
        try:
            call(*a, **k)
            error = None
        except Exception as err:  # the candidate's build error, as a builder records it
            error = measure.exception_text(err)
        return time.perf_counter() - start, error

    from tvm.support.nvcc import compile_cuda

    measure._PCH.clear()  # noqa: SLF001 (a fresh process's state)
    measure.use_cuda_compiler("nvrtc-pch")
    callback = tvm_ffi.get_global_func("tvm_callback_cuda_compile")
    def cuda_source(row: dict) -> tuple[str, object, float]:
        mod, target = scheduled(row)
        start = time.perf_counter()
        lib = measure.build_candidate(mod, target)
        seconds = time.perf_counter() - start
        return next(m for m in (lib.imports if hasattr(lib, "imports") else lib.imported_modules)
                    if m.kind in ("cuda", "source")).inspect_source(), target, seconds

    if not chosen["ok"]:
        raise SystemExit(f"bench_build_errors: no candidate that built at {args.dtype} in {args.records}")
    source, target, _ = cuda_source(chosen["ok"][0])
    with target:  # as in a builder that has compiled kernels: the header is written and has worked
        _, error = timed(callback, source)
    if error is not None:
        raise SystemExit(f"bench_build_errors: NVRTC cannot compile a candidate that built on the GPU machine "
                         f"({error.splitlines()[0][:160]}); set CUDA_PATH to the CUDA toolkit")
    results = []
    for kind in KINDS:
        for row in chosen[kind]:
            source, target, codegen_s = cuda_source(row)
            with target:
                new_s, new_error = timed(callback, source)
                pch_s, pch_error = timed(compile_cuda, source, target_format="cubin", compiler="nvrtc",
                                         options=measure._PCH["options"])  # noqa: SLF001
                plain_s, plain_error = timed(compile_cuda, source, target_format="cubin", compiler="nvrtc")
            old_s = pch_s + (plain_s if pch_error else 0.0)  # the callback before: a failure compiled again
            entry = {"kind": kind, "workload_id": row["workload_id"], "task": row["task"],
                     "stored_build_s": row.get("build_s"), "codegen_s": round(codegen_s, 4),
                     "callback_s": round(new_s, 4), "with_header_s": round(pch_s, 4), "plain_s": round(plain_s, 4),
                     "callback_before_s": round(old_s, 4),
                     "errors": {name: None if e is None else e.splitlines()[0][:200] for name, e in
                                (("callback", new_error), ("with_header", pch_error), ("plain", plain_error))}}
            results.append(entry)
            print(f"{kind:8s} {row['task'][:40]:40s} codegen {codegen_s:.2f} s, callback {new_s:.2f} s "
                  f"(before: {old_s:.2f} s){' error' if new_error else ''}", flush=True)
    summary = {}
    for kind in KINDS:
        mine = [r for r in results if r["kind"] == kind]
        if not mine:
            continue
        summary[kind] = {"n": len(mine), **{f"median_{k}": round(statistics.median(r[k] for r in mine), 3) for k in
                                            ("codegen_s", "callback_s", "callback_before_s", "with_header_s",
                                             "plain_s")},
                         "failed": {k: sum(r["errors"][k] is not None for r in mine) for k in
                                    ("callback", "with_header", "plain")},
                         "median_stored_build_s": round(statistics.median(r["stored_build_s"] or 0 for r in mine), 3)}
        print(kind, summary[kind], flush=True)
    scan = {}
    if args.scan:  # does the check before compiling find every int64x8 candidate, and nothing in the others?
        for kind, count in (("ok", args.scan), ("int64x8", max(1, args.scan // 4))):
            pool = [r for r in every if kind_of(r) == kind and r["workload_id"] in tasks]
            for row in rng.sample(pool, min(count, len(pool))):
                found = measure.known_compile_error(cuda_source(row)[0]) is not None
                key = f"{kind} {row['dtype']} {'found' if found else 'not found'}"
                scan[key] = scan.get(key, 0) + 1
        print("scan:", scan, flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_build_errors.json").write_text(json.dumps(
        {"records": args.records, "dtype": args.dtype, "count": args.count, "seed": args.seed,
         "tvm": tvm.__version__, "summary": summary, "scan": scan, "candidates": results}, indent=1))


if __name__ == "__main__":
    main()
