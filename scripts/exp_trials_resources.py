"""Experiment: does the trials cost model rank better when it knows what the compiler made of each candidate?

``PerStoreFeature`` describes a candidate's loops and buffer accesses; it cannot know how many registers
``ptxas`` gives each thread, whether the thread's stack spills to local memory, or how many blocks an SM can
hold as a result. Those decide a kernel's occupancy. Here every stored candidate of a share of the tasks
(``--share``, chosen by a hash of the task) is built again as the sampler's builders build it (its trace
replayed on the task's module, ``tvm.tirx.build``, NVRTC), and its cubin is read
(:func:`opbench.runtime.resources.cubin_resources`, no GPU needed) together with its launch extents
(:func:`opbench.runtime.resources.launch_extents`). The trials model is then trained on the same held-out
model folds (``scripts/exp_trials_features.py``'s), once as shipped and once with each store row widened by
its candidate's resource columns (:func:`resource_columns`), on the same tasks.

``--part compute`` builds (in ``--workers`` processes, for at most ``--time-limit`` seconds; a task's figures
are cached in ``--cache`` (default ``$OPBENCH_CACHE/trial-resources``) as it finishes, and the cache is packed
into OUT/trial-resources.tar, so a later run resumes); ``--part evaluate`` trains and writes
OUT/exp_trials_resources_evaluate.json. NVRTC needs the CUDA headers: on a machine where ``nvcc`` is not that of
the toolkit's folder, name the folder in ``CUDA_PATH`` (say ``/usr/local/cuda-13.0``).

    PYTHONPATH=python python3 scripts/exp_trials_resources.py --part compute --out out --share 0.1
    PYTHONPATH=python python3 scripts/exp_trials_resources.py --part evaluate --out out --share 0.1
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import tarfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from _cli import ROOT, shown

#: an H100's SMs and what one SM holds: 32-bit registers, warps, blocks, shared memory (bytes)
SMS, REGISTERS_PER_SM, WARPS_PER_SM, BLOCKS_PER_SM, SMEM_PER_SM = 132, 65536, 64, 32, 233472
#: registers are given to a warp in units of 256; each block's shared memory takes 1 KiB more, in 128-byte units
REGISTER_UNIT, SMEM_RESERVED, SMEM_UNIT = 256, 1024, 128
#: the figures kept per candidate (its kernel with the most threads in flight; ``kernels``: how many it launches)
FIGURES = ("registers", "frame_bytes", "static_smem", "threads", "blocks", "kernels")


def chosen(workload_id: str, share: float) -> bool:
    """Whether the task ``workload_id`` is in the experiment's share of the tasks (a stable hash of its id)."""
    return int(hashlib.sha256(workload_id.encode()).hexdigest()[:8], 16) < share * 0x100000000


def cache_file(folder: Path, mod_json: str, target_json: str) -> Path:
    """The cache file of one task's candidates' figures (its module and target, TVM's version)."""
    import tvm

    from opbench.utils import digest

    key = digest({"mod": hashlib.sha256(mod_json.encode()).hexdigest(), "target": target_json,
                  "tvm": tvm.__version__, "what": "cubin_resources"})
    return folder / f"{key}.json"


def _worker_ready() -> None:
    from opbench.runtime.startup import import_tensor_intrinsics
    from opbench.tune.measure import use_cuda_compiler

    import_tensor_intrinsics()
    use_cuda_compiler(os.environ.get("OPBENCH_CUDA_COMPILER") or "nvrtc-pch")


def candidate_figures(mod: Any, target: Any, trace: str) -> dict[str, int] | None:
    """The figures (:data:`FIGURES`) of one candidate, built as the sampler's builders build it; None where
    its trace does not replay or it does not build. Where the build leaves the kernels as CUDA source (TVM
    compiles them when a GPU's runtime loads them), the source is compiled here as the builders would."""
    import tvm_ffi
    from tvm.s_tir import Schedule
    from tvm.s_tir.schedule import Trace

    from opbench.dataset.frames import json_value
    from opbench.runtime.resources import cubin_resources, kernel_index, launch_extents
    from opbench.tune.measure import build_candidate

    compile_cuda = tvm_ffi.get_global_func("tvm_callback_cuda_compile")
    images: list[bytes] = []

    def keep(code: str, *rest: Any) -> Any:
        image = compile_cuda(code, *rest)
        images.append(bytes(image))
        return image

    try:
        sch = Schedule(mod)
        Trace.apply_json_to_schedule(json_value(trace), sch)
        tvm_ffi.register_global_func("tvm_callback_cuda_compile", keep, override=True)
        try:
            lib = build_candidate(sch.mod, target)
        finally:
            tvm_ffi.register_global_func("tvm_callback_cuda_compile", compile_cuda, override=True)
        if not images:
            with target:
                images.append(bytes(compile_cuda(lib.imports[0].inspect_source(""))))
        kernels = {name: figures for image in images for name, figures in cubin_resources(image).items()}
        extents = launch_extents(sch.mod["main"])
    except Exception:  # noqa: BLE001 (a candidate that no longer builds: no figures)
        return None
    names = sorted(kernels, key=kernel_index)
    if not names:
        return None
    rows = []
    for i, name in enumerate(names):
        ext = extents[i] if i < len(extents) else {"grid": [1, 1, 1], "block": [1, 1, 1]}
        rows.append({**kernels[name], "threads": int(np.prod(ext["block"])), "blocks": int(np.prod(ext["grid"]))})
    main = max(rows, key=lambda k: k["threads"] * k["blocks"])
    return {**{k: int(main[k]) for k in FIGURES if k != "kernels"}, "kernels": len(rows)}


def _task_figures(job: tuple[str, str, list[str], str]) -> tuple[int, int, float]:
    return task_figures(*job)


def task_figures(mod_json: str, target_json: str, traces: list[str], cache: str) -> tuple[int, int, float]:
    """Worker: the figures of a task's candidates not yet in its cache file, written there; (new, built, seconds)."""
    import tvm

    from opbench.predict.trials import trace_key
    from opbench.utils import written_whole

    start = time.perf_counter()
    path = cache_file(Path(cache), mod_json, target_json)
    known = json.loads(path.read_text()) if path.is_file() else {}
    todo = [t for t in traces if trace_key(t) not in known]
    if not todo:
        return 0, 0, 0.0
    mod, target = tvm.ir.load_json(mod_json), tvm.target.Target(json.loads(target_json))
    for trace in todo:
        known[trace_key(trace)] = candidate_figures(mod, target, trace)
    with written_whole(path) as part:
        part.write_text(json.dumps(known))
    return len(todo), sum(known[trace_key(t)] is not None for t in todo), time.perf_counter() - start


def compute(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Build the stored candidates of the chosen tasks for their figures, a task per job (in the order of their ids)."""
    from opbench.dataset import records
    from opbench.predict.base import dataset_rows
    from opbench.utils import cache_root

    cache = Path(args.cache) if args.cache else cache_root() / "trial-resources"
    cache.mkdir(parents=True, exist_ok=True)
    tasks = {t["workload_id"]: t for t in records.read_rows(args.records, "tasks")
             if chosen(t["workload_id"], args.share)}
    rows, _ = dataset_rows(args.records, "trials")
    traces: dict[str, list[str]] = {}
    for r in rows:
        if r["workload_id"] in tasks:
            traces.setdefault(r["workload_id"], []).append(r["trace"])
    print(f"{len(traces)} tasks, {sum(map(len, traces.values()))} candidates to build", flush=True)
    start, done, built, busy, finished = time.perf_counter(), 0, 0, 0.0, 0
    jobs = [(tasks[w]["mod"], tasks[w]["target"], ts, str(cache)) for w, ts in sorted(traces.items())]
    pool = multiprocessing.get_context("spawn").Pool(args.workers, initializer=_worker_ready)
    try:
        results = pool.imap_unordered(_task_figures, jobs)
        while finished < len(jobs):
            left = args.time_limit - (time.perf_counter() - start)
            if left <= 0:
                break
            try:
                new, ok, seconds = results.next(timeout=left)
            except multiprocessing.TimeoutError:
                break
            done, built, busy, finished = done + new, built + ok, busy + seconds, finished + 1
            if finished % 20 == 0 or finished == len(jobs):
                print(f"{finished} of {len(traces)} tasks, {done} candidates ({built} built) in "
                      f"{time.perf_counter() - start:.0f} s", flush=True)
    finally:
        pool.terminate()  # the builds past the time limit
        pool.join()
    with tarfile.open(out / "trial-resources.tar", "w") as tar:  # one file: the cache as it now is
        tar.add(cache, arcname="trial-resources")
    return {"tasks": len(traces), "tasks_finished": finished, "candidates": done, "built": built,
            "seconds": round(time.perf_counter() - start, 1), "workers": args.workers,
            "worker_seconds_per_candidate": busy / done if done else None}


def occupancy(figures: np.ndarray) -> np.ndarray:
    """Blocks an SM holds at once (by registers, shared memory, warps and its block limit), the share of its
    warps they fill, and the waves of the grid at that residency, for rows of :data:`FIGURES`."""
    regs, _, smem, threads, blocks, _ = figures.T
    warps = np.ceil(np.maximum(threads, 1) / 32.0)
    warp_regs = np.ceil(np.maximum(regs, 1) * 32.0 / REGISTER_UNIT) * REGISTER_UNIT
    block_smem = np.ceil((smem + SMEM_RESERVED) / SMEM_UNIT) * SMEM_UNIT
    resident = np.minimum.reduce([np.floor(REGISTERS_PER_SM / (warps * warp_regs)), np.floor(SMEM_PER_SM / block_smem),
                                  np.floor(WARPS_PER_SM / warps), np.full_like(warps, BLOCKS_PER_SM)])
    resident = np.maximum(resident, 1.0)
    waves = blocks / (SMS * resident)
    return np.stack([resident, resident * warps / WARPS_PER_SM, waves, waves / np.ceil(np.maximum(waves, 1e-9))], 1)


def resource_columns(figures: np.ndarray) -> np.ndarray:
    """A candidate's columns from its figures (NaN where unknown): log2(1 + each figure), then :func:`occupancy`."""
    return np.concatenate([np.log2(1.0 + figures), occupancy(figures)], axis=1).astype("float32")


def with_resources(tasks: dict[Any, dict[str, Any]], known: dict[str, dict[str, Any]], width: int
                   ) -> dict[Any, dict[str, Any]]:
    """The tasks with each store row widened by its candidate's :func:`resource_columns` (NaN where unknown)."""
    out = {}
    for key, task in tasks.items():
        figures = np.array([[np.nan] * len(FIGURES) if known.get(k) is None else [known[k][f] for f in FIGURES]
                            for k in task["trace_keys"]], dtype="float64")
        columns = resource_columns(figures)
        rows = [np.concatenate([np.asarray(x, "float32").reshape(-1, width),
                                np.repeat(columns[i:i + 1], max(1, len(x)), 0)[:len(x)]], axis=1)
                for i, x in enumerate(task["xs"])]
        out[key] = {**task, "xs": rows}
    return out


def evaluate(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Train the shipped model with and without the resource columns on the chosen tasks' held-out folds."""
    from opbench.dataset import records
    from opbench.pipeline.train import task_modules
    from opbench.predict import trials
    from opbench.utils import cache_root

    cache = Path(args.cache) if args.cache else cache_root() / "trial-resources"
    tasks, device = trials.trial_examples(args.records, task_modules)
    skip = {m.strip() for m in args.exclude.split(",") if m.strip()}
    rows = {t["workload_id"]: t for t in records.read_rows(args.records, "tasks")}
    tasks = {k: t for k, t in tasks.items() if chosen(t["workload_id"], args.share) and not skip & set(t["models"])}
    known_by_task = {}
    for key, task in tasks.items():
        path = cache_file(cache, rows[task["workload_id"]]["mod"], rows[task["workload_id"]]["target"])
        known_by_task[key] = json.loads(path.read_text()) if path.is_file() else {}
    # only the tasks whose every candidate was built again: both models see the same candidates
    tasks = {k: t for k, t in tasks.items() if all(c in known_by_task[k] for c in t["trace_keys"])}
    known = {c: v for k in tasks for c, v in known_by_task[k].items()}
    n = sum(len(t["xs"]) for t in tasks.values())
    print(f"{len(tasks)} tasks, {n} records with their figures on {device}", flush=True)
    variants = {"per-store": tasks, "resources": with_resources(tasks, known, trials.FEATURE_WIDTH)}
    results = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        for name, data in variants.items():
            start = time.perf_counter()
            got = trials.evaluate(data, "by_model", args.folds, seed)
            m = got["metrics"]
            results.append({"variant": name, "seed": seed, "seconds": round(time.perf_counter() - start, 1),
                            **{k: m[k] for k in ("pairwise", "top1", "top5", "tasks", "candidates")},
                            "by_dtype": {d: {k: v[k] for k in ("pairwise", "top1", "top5")}
                                         for d, v in got["by_dtype"].items()}})
            print(f"seed {seed} {name}: pairwise {m['pairwise']:.3f} top-1 {m['top1']:.3f} top-5 {m['top5']:.3f}",
                  flush=True)
    built = [v for v in known.values() if v is not None]
    regs = np.array([v["registers"] for v in built])
    return {"device_name": device, "tasks": len(tasks), "candidates": n, "excluded": sorted(skip), "folds": args.folds,
            "candidates_without_figures": len(known) - len(built),
            "registers": {"median": float(np.median(regs)), "p90": float(np.quantile(regs, 0.9)),
                          "max": int(regs.max())} if len(regs) else None,
            "spilling_share": float(np.mean([v["frame_bytes"] > 0 for v in built])) if built else None,
            "results": results}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", required=True, choices=["compute", "evaluate"])
    parser.add_argument("--out", required=True, help="folder for the JSON (and, with compute, trial-resources/)")
    parser.add_argument("--records", default=str(ROOT / "data" / "dataset"), help="a records folder")
    parser.add_argument("--share", type=float, default=0.1, help="share of the tasks (by a hash of each), 0 to 1")
    parser.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1), help="compute: processes")
    parser.add_argument("--time-limit", type=float, default=500.0, help="compute: seconds")
    parser.add_argument("--cache", default=None,
                        help="folder of the figures (default $OPBENCH_CACHE/trial-resources)")
    parser.add_argument("--seeds", default="0", help="evaluate: fold seeds")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--exclude", default="resnet-50", help="evaluate: models left out with every task they use")
    args = parser.parse_args()
    if not 0 < args.share <= 1:
        parser.error(f"--share {args.share} is not in (0, 1]")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = compute(args, out) if args.part == "compute" else evaluate(args, out)
    result = {"records": shown(args.records), "share": args.share, "part": args.part, **result}
    (out / f"exp_trials_resources_{args.part}.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "results"}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
