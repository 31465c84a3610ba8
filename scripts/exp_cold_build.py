"""A first build of a model's fused regions from empty caches, with the region compile workers started early or
after this process's first compiles, fed from a queue or in shares, and with the regions handed other strides
compiled again together or one by one.

A cold ``capturer(kernels="fused")`` compiles every region structure: this process compiles from the first, and
once its first compiles turn slow (Inductor's caches cold), worker processes compile the rest from the last
(``opbench.runtime.fused.RegionCompiler``). A worker takes seconds to start (an import of torch and Inductor, a
CUDA context), so since ``START_WORKERS_EARLY`` they start as soon as the regions' quick keys show enough
structures that the store lacks, while this process traces the regions to ATen and compiles its first ones.
Since ``WORKERS_QUEUE`` each ready worker takes the next structure nobody has taken, and the workers stay for the
regions compiled again for the strides their compiled producers hand them, which one run of the graph finds
together (``STRIDE_PASSES``).

Each build is a new process with empty Inductor, Triton and OpBench caches of its own, as
``scripts/bench_fused.py --cold-caches`` builds: a cold ``torch.compile(mode="reduce-overhead")`` of the model
first (three calls), then the ``FusedBackend`` the capturer compiles (combo-kernel code of long regions too),
each timed. The variants (``--variants``) take turns, ``--reps`` builds each: ``as shipped``, ``workers after
the first compiles`` (``START_WORKERS_EARLY`` off), ``4 workers of 3 compile threads`` (``WORKER_THREADS``;
``$OPBENCH_COMPILE_JOBS``), ``workers in shares`` (``WORKERS_QUEUE`` off: each worker every ``jobs``-th
structure, all at once), ``strides one by one`` (``STRIDE_PASSES`` 0 and ``KEEP_WORKERS`` off: the workers end
after the first compiles, and each region handed other strides is compiled again here when the run of the graph
gets to it) and ``heaviest first`` (``WORKERS_HEAVIEST_FIRST``: the workers take the structures with the most ATen
operators first). ``OUT/exp_cold_build.json`` has every build
(seconds, how the regions were built, where the seconds went, how busy the host's cores were meanwhile, and what
happened when: ``fused_host_busy``) and the medians, written after every build.

    PYTHONUNBUFFERED=1 PYTHONPATH=python python3 scripts/exp_cold_build.py --out out \
        --models shufflenet_v2_x1_0 --batch 8 --dtype bfloat16 --reps 3
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

from _cli import in_child, variant_main, variant_medians
from bench_fused import stem

#: the builds' variants: as shipped, with the workers started only once this process's compiles turn slow, and
#: with four workers of three Inductor compile threads each (instead of one per two cores, of one thread each),
#: with the structures handed out in shares, all at once, instead of from a queue, and with the regions handed other
#: strides compiled again one by one, here, and with the workers taking the heaviest structures first
VARIANTS = ("as shipped", "strides one by one", "workers after the first compiles", "4 workers of 3 compile threads",
            "workers in shares", "heaviest first")


def build(name: str, args: Any, variant: str) -> dict[str, Any]:
    """One cold build of ``name`` in this process (a new one, its caches empty) in ``variant``."""
    import bench_fused

    from opbench.runtime import fused

    fused.START_WORKERS_EARLY = variant != "workers after the first compiles"
    if variant == "workers in shares":
        fused.WORKERS_QUEUE = False
    if variant == "heaviest first":
        fused.WORKERS_HEAVIEST_FIRST = True
    if variant == "strides one by one":
        fused.STRIDE_PASSES, fused.KEEP_WORKERS = 0, False
    if variant == "4 workers of 3 compile threads":
        os.environ["OPBENCH_COMPILE_JOBS"] = "4"
        fused.WORKER_THREADS = 3
    bench_fused.DTYPE = args.dtype
    busy: dict[str, float] = {}
    fused.FusedBackend.__init__ = _host_busy(fused.FusedBackend.__init__, busy)
    return {"variant": variant} | bench_fused.prebuild(name, args.batch) | {"fused_host_busy": busy}


def _host_busy(fn: Any, busy: dict[str, float]) -> Any:
    """``fn``, noting in ``busy`` how busy the host's cores were while it ran: ``share``, the cores' busy seconds
    (every process's, from ``psutil``) over all their seconds, busy or idle, with ``cores`` and ``wall_s``; and
    ``timeline``, what happened while the regions compiled (``FusedBackend.compile_timeline``)."""
    import time

    import psutil

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        before, clock = psutil.cpu_times(), time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            wall, after = time.perf_counter() - clock, psutil.cpu_times()
            idle = sum(getattr(after, f) - getattr(before, f) for f in ("idle", "iowait") if hasattr(after, f))
            total = sum(after) - sum(before)
            busy.update(share=(total - idle) / total if total > 0 else 0.0, cores=psutil.cpu_count(),
                        wall_s=wall, timeline=getattr(args[0], "compile_timeline", []))
    return wrapper


def measure(name: str, args: Any, save: Any) -> dict[str, Any]:
    """``--reps`` cold builds of ``name`` in each variant, taking turns; ``save(row)`` after every build."""
    builds: list[dict[str, Any]] = []
    row = {"model": name, "batch": args.batch, "dtype": args.dtype, "builds": builds}
    flags = ["--models", name, "--batch", str(args.batch), "--dtype", args.dtype]
    variants = args.variants
    for r in range(args.reps):
        for variant in variants[r % len(variants):] + variants[:r % len(variants)]:
            caches = Path(args.out) / "caches" / stem(name, args.batch, args.dtype)
            shutil.rmtree(caches, ignore_errors=True)
            env = dict(os.environ, OPBENCH_CACHE=str(caches / "opbench"),
                       TORCHINDUCTOR_CACHE_DIR=str(caches / "inductor"), TRITON_CACHE_DIR=str(caches / "triton"))
            builds.append(in_child(__file__, args, variant, flags, env))
            shutil.rmtree(caches, ignore_errors=True)
            save(row)
            got = builds[-1]
            workers = ", ".join(f"{k.replace('_', ' ')} {v:.1f} s" for k, v in got.get("regions_seconds", {}).items()
                                if k.startswith("workers"))
            print(f"{name}: {variant:<33} fused {got.get('fused_cold_s', float('nan')):5.1f} s, torch.compile "
                  f"{got.get('torch_compile_cold_s', float('nan')):5.1f} s, regions {got.get('regions_built')}, "
                  f"{workers or 'no workers'}, the host's cores "
                  f"{100 * got.get('fused_host_busy', {}).get('share', float('nan')):.0f} % busy "
                  f"{got.get('error', '')}", flush=True)
    summary = variant_medians(builds, variants, {
        "fused_cold_s": lambda b: b["fused_cold_s"], "torch_compile_cold_s": lambda b: b["torch_compile_cold_s"],
        "ratio": lambda b: b["fused_cold_s"] / b["torch_compile_cold_s"],
        "compiled_here": lambda b: b["regions_built"].get("compiled", 0),
        "host_busy": lambda b: b.get("fused_host_busy", {}).get("share", float("nan"))}, "builds")
    for variant, s in summary.items():
        print(f"{name}: {variant:<33} median fused {s['fused_cold_s']:.1f} s, torch.compile "
              f"{s['torch_compile_cold_s']:.1f} s, ratio {s['ratio']:.2f}, {s['compiled_here']:.0f} structures "
              f"compiled here, the host's cores {100 * s['host_busy']:.0f} % busy", flush=True)
    return row | {"summary": summary}


def main() -> int:
    return variant_main(__file__, __doc__.splitlines()[0], "shufflenet_v2_x1_0", VARIANTS, VARIANTS[:2], "builds",
                        400.0, build, measure, "the builds time CUDA code")


if __name__ == "__main__":
    sys.exit(main())
