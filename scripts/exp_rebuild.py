"""What a later build of ``capturer(kernels="fused", cache=True)`` spends its seconds on, with one of its steps undone.

A build from the cache loads every region's stored code, runs the model once to check it and captures the kept
schedule, by default eight times, keeping the fastest capture. Three steps shorten it:

- the digests of torch's and Triton's sources that Inductor keys stored code by are computed in a thread of their
  own while the model is prepared (``opbench.runtime.fused.hash_sources_meanwhile``);
- of the captures, one screening round picks the fastest ``FINALISTS``, and only those are timed in full
  (``opbench.pipeline.compare.fastest_capture``);
- the regions' code is loaded in a thread of its own while this thread makes cuDNN's plans for the convolutions
  the build that stored it noted, and then runs each loaded region once (``opbench.runtime.fused.LOAD_WHILE_RUNNING``).

For each model this script makes the cache with one build in a new process, then rebuilds from it ``--reps`` times
in each variant of ``--variants``, each rebuild a new process, the variants taking turns: as shipped, without the
digest thread, with every capture timed in full, and with every load in this thread. It records each
rebuild's seconds, its phases (load, runs, captures), what it kept, the kept capture's time and its outputs'
distance to the model's, and writes ``OUT/exp_rebuild.json`` after every build (a run stopped part-way keeps the
builds it finished).

    PYTHONUNBUFFERED=1 PYTHONPATH=python python3 scripts/exp_rebuild.py --out out --models googlenet --batch 8
    PYTHONPATH=python python3 scripts/exp_rebuild.py --out out --models nasnet --dtype bfloat16 \
        --variants "as shipped,no loads while running" --reps 4
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from _cli import in_child, variant_main, variant_medians
from bench_fused import stem

#: the variants a rebuild runs in: as shipped, and with one step undone
VARIANTS = ("as shipped", "no source digests", "every capture timed in full", "no loads while running")


def build(name: str, args: Any, variant: str) -> dict[str, Any]:
    """One build of ``name`` in this process (a new one): the first (``variant`` "first") or a rebuild from the
    cache in ``variant``."""
    import bench_fused
    import torch

    from opbench.parallel import capturer
    from opbench.pipeline import compare
    from opbench.runtime import fused

    if variant == "no source digests":
        fused.hash_sources_meanwhile = lambda: None
    elif variant == "every capture timed in full":
        compare.FINALISTS = 1 << 30
    elif variant == "no loads while running":
        fused.LOAD_WHILE_RUNNING = False
    steps = _timed_steps(fused)
    bench_fused.DTYPE = args.dtype
    torch.manual_seed(0)
    model, inputs = bench_fused.load(name, args.batch)
    with torch.no_grad():
        reference = model(*inputs)
    clock = time.perf_counter()
    run = capturer(inputs, model, kernels="fused", cache=True)
    seconds = time.perf_counter() - clock
    kept = next(r for r in run.table if r["kept"])
    with torch.no_grad():
        err = bench_fused.relative_err(run(*inputs), reference)
    return {"variant": variant, "build_s": seconds, "phases": run.phases, "kept": kept["schedule"],
            "latency_ms": kept["latency_ms"], "captures_ms": kept.get("captures_ms"),
            "finalists": kept.get("finalists"), "err": err, "steps_s": steps}


def _timed_steps(fused: Any) -> dict[str, float]:
    """Seconds, summed over the build, of its steps, filled in as the build goes: the time its phases leave out.
    The capturer's rebuild: ``backend`` (making the regions' backend) and ``kept_capture`` (the captures); the
    rest of the build is the model's reference run, the cache's key and the outputs' check. Inside the backend
    (``fused_backend``): ``trace`` (``torch.fx``), ``split`` (into regions), ``interpreter`` (every run of a
    graph by ``torch.fx``'s interpreter: the eager run that records each region's inputs, the pass that runs the
    compiled regions once for the strides they are handed, which is ``strides_pass`` too), ``compile_all`` (each
    compiler's, which holds ``plans``: :func:`make_plans`, with ``convolutions`` the count it was given),
    ``torch_backend`` (the operator graph of the split module) and ``region_flops``."""
    import torch.fx.interpreter
    import torch.fx.passes.split_module

    from opbench import parallel

    steps: dict[str, float] = {}

    def timed(step: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            clock = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                steps[step] = steps.get(step, 0.0) + time.perf_counter() - clock
        return wrapper

    def counted(fn: Any) -> Any:
        def wrapper(calls: Any, *args: Any) -> Any:
            steps["convolutions"] = steps.get("convolutions", 0) + len(calls)
            return fn(calls, *args)
        return wrapper

    fused.RegionCompiler.compile_all = timed("compile_all", fused.RegionCompiler.compile_all)
    fused._compile_for_handed_strides = timed("strides_pass", fused._compile_for_handed_strides)
    fused.FusedBackend.__init__ = timed("fused_backend", fused.FusedBackend.__init__)
    fused.make_plans = counted(timed("plans", fused.make_plans))
    fused.fx_module = timed("trace", fused.fx_module)
    fused.TorchBackend.__init__ = timed("torch_backend", fused.TorchBackend.__init__)
    fused.FusedBackend._region_flops = timed("region_flops", fused.FusedBackend._region_flops)
    torch.fx.passes.split_module.split_module = timed("split", torch.fx.passes.split_module.split_module)
    torch.fx.interpreter.Interpreter.run = timed("interpreter", torch.fx.interpreter.Interpreter.run)
    parallel._backend = timed("backend", parallel._backend)
    parallel._kept_capture = timed("kept_capture", parallel._kept_capture)
    return steps


def in_new_process(name: str, args: Any, variant: str, cache: Path) -> dict[str, Any]:
    """:func:`build` in a process of its own, ``$OPBENCH_CACHE`` at ``cache``."""
    flags = ["--models", name, "--batch", str(args.batch), "--dtype", args.dtype]
    return in_child(__file__, args, variant, flags, dict(os.environ, OPBENCH_CACHE=str(cache)))


def measure(name: str, args: Any, save: Any) -> dict[str, Any]:
    """The first build of ``name`` and its rebuilds in each variant; ``save(row)`` after every build."""
    cache = Path(args.out) / "cache" / stem(name, args.batch, args.dtype)
    first = in_new_process(name, args, "first", cache)
    print(f"{name}: first build {first.get('build_s', float('nan')):.1f} s, kept {first.get('kept')}", flush=True)
    rebuilds: list[dict[str, Any]] = []
    row = {"model": name, "batch": args.batch, "dtype": args.dtype, "first": first, "rebuilds": rebuilds}
    variants = args.variants
    for r in range(args.reps):
        for variant in variants[r % len(variants):] + variants[:r % len(variants)]:
            rebuilds.append(in_new_process(name, args, variant, cache))
            save(row)
            got = rebuilds[-1]
            print(f"{name}: {variant:<28} {got.get('build_s', float('nan')):5.2f} s (load "
                  f"{got.get('phases', {}).get('regions_time_load_s', float('nan')):.2f}, runs "
                  f"{got.get('phases', {}).get('regions_time_run_s', float('nan')):.2f}, captures "
                  f"{got.get('phases', {}).get('captures_s', 0.0):.2f}), kept {got.get('kept')} "
                  f"{got.get('latency_ms', float('nan')):.4f} ms {got.get('error', '')}", flush=True)
    def phase(key: str) -> Any:
        return lambda g: g["phases"].get(key, 0.0)

    summary = variant_medians(rebuilds, variants, {
        "build_s": lambda g: g["build_s"], "load_s": phase("regions_time_load_s"),
        "run_s": phase("regions_time_run_s"), "load_waited_s": phase("regions_time_load_waited_s"),
        "strides_pass_s": lambda g: g.get("steps_s", {}).get("strides_pass", 0.0),
        "captures_s": phase("captures_s"), "latency_ms": lambda g: g["latency_ms"]}, "rebuilds")
    for variant, s in summary.items():  # the steps' medians, of the steps any rebuild timed
        done = [g for g in rebuilds if g["variant"] == variant and "error" not in g]
        s["steps_s"] = {k: statistics.median(g.get("steps_s", {}).get(k, 0.0) for g in done)
                        for k in sorted({k for g in done for k in g.get("steps_s", {})})}
    for variant, s in summary.items():
        print(f"{name}: {variant:<28} median {s['build_s']:.2f} s (load {s['load_s']:.2f}, runs {s['run_s']:.2f}, "
              f"waited {s['load_waited_s']:.2f}, strides pass {s['strides_pass_s']:.2f}, captures "
              f"{s['captures_s']:.2f}), kept capture {s['latency_ms']:.4f} ms; steps "
              + ", ".join(f"{k} {v:.3g}" for k, v in s["steps_s"].items()), flush=True)
    return row | {"summary": summary}


def main() -> int:
    return variant_main(__file__, __doc__.splitlines()[0], "googlenet", VARIANTS, VARIANTS, "rebuilds", 300.0,
                        build, measure, "captures need a GPU")


if __name__ == "__main__":
    sys.exit(main())
