"""Fused regions with convolutions in Inductor's channels-last layout or in PyTorch's: speed, and a later first run.

Inductor compiles a region's convolutions channels-last where its heuristic expects that to be faster
(``torch._inductor.config.layout_optimization``, on by default). In that layout PyTorch sends grouped (depthwise)
convolutions to cuDNN, whose plans for them take seconds to make in every new process
(``scripts/exp_first_run.py``): the first run of a later build's loaded regions (2.5-2.8 s on nasnet and
mobilenet_v3_large, H200). In PyTorch's own layout, its own depthwise kernels run them and need no plan. This
script builds ``FusedBackend(model)`` twice in one process, with layout optimization on and off (each variant with
a store of compiled regions of its own, compiled here without workers), checks both against eager, times the
sequential and the greedy schedule of each in alternating rounds (CUDA Graph replays), then builds each variant
again from its store in new processes, alternating, and records where those later builds' seconds went
(``FusedBackend.compile_seconds``: ``load``, ``run``). Writes ``OUT/exp_layout.json`` after every model.

``--variants`` picks other Inductor settings to build the regions with, side by side in the same way
(:data:`VARIANTS`): ``max_autotune`` lets Inductor time its Triton templates for convolutions and matrix products
against the library kernels and take the faster (a template fuses the operators after it into its kernel), at a
compile that times every candidate. ``weights_channels_last`` builds Inductor's layout from the model with its
4-D parameters and buffers stored channels-last once (``model.to(memory_format=torch.channels_last)``, grouped
convolutions too): a region takes its weights as inputs, so a weight Inductor wants channels-last and gets in
PyTorch's layout is copied into it on every call (a ``triton_poi_fused_convolution_*`` kernel before the
convolution). ``FusedBackend`` now stores them so itself in Inductor's layout
(``opbench.runtime.fused.weights_channels_last``); every other variant is built with that step left out, from the
weights as the model has them, as before it. Each variant's kernels per replay of the sequential schedule are
counted under PyTorch's profiler (``kernels``, ``kernels_by_name``). ``conv_relu`` is ``FusedBackend``'s own build
on a GPU: the weights channels-last, and every convolution -> eval batch norm -> ReLU chain one call of cuDNN's
fused convolution + bias + ReLU (``opbench.ir.conv_relu``), where the other variants leave out that step: one
kernel where they run a convolution and a Triton kernel for the batch norm and ReLU after it (``conv_relu``: how
many chains). ``taps`` is ``FusedBackend(depthwise="taps")``: every depthwise convolution a sum of shifted products
that Inductor compiles into the region's kernels (``opbench.ir.depthwise``), the rest of the build as the library
does it for a network without grouped convolutions (channels-last weights, chains as one cuDNN call where the
network has no other grouped convolution); ``taps_no_chains`` the same without the chains (``unfolded``: how many
depthwise convolutions); ``taps_window`` the same as ``taps`` with the taps summed as one reduction over an
unfolded view of the input (``depthwise_taps(unrolled=False)``) instead of one shifted product after another;
``taps_chains_cl`` the same as ``taps`` with each chain's input made channels-last in the graph first
(``fuse_conv_relu(channels_last_inputs=True)``, what ``FusedBackend`` now does where it unfolds; ``taps`` keeps the
chains' inputs as they come): cuDNN runs a fused chain channels-last, and an input in PyTorch's
layout (shufflenet_v2_x1_0's channel shuffle makes one) is otherwise copied inside the call and its output copied
back (PyTorch's element-wise kernels in ``kernels_by_name``); ``conv_relu_cl`` the same for ``conv_relu``.

    PYTHONUNBUFFERED=1 PYTHONPATH=python python3 scripts/exp_layout.py --out out --models mobilenet_v3_large,nasnet
    PYTHONUNBUFFERED=1 PYTHONPATH=python python3 scripts/exp_layout.py --out out --models googlenet \
        --variants channels_last,max_autotune --later 0
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from typing import Any

from _cli import ROOT, checked_models, experiment_doc, measure_each, model_device_args, timing_args
from bench_fused import relative_err

sys.path.insert(0, str(ROOT / "python"))

#: each variant's Inductor settings (``torch._inductor.config``) while its regions compile
VARIANTS = {"channels_last": {"layout_optimization": True}, "pytorch": {"layout_optimization": False},
            "max_autotune": {"max_autotune": True}, "weights_channels_last": {"layout_optimization": True},
            "conv_relu": {"layout_optimization": True}, "taps": {"layout_optimization": True},
            "taps_no_chains": {"layout_optimization": True}, "taps_window": {"layout_optimization": True},
            "taps_chains_cl": {"layout_optimization": True}, "conv_relu_cl": {"layout_optimization": True}}
#: variants whose regions take their weights channels-last: ``weights_channels_last`` from a channels-last copy of
#: the model (:func:`_variant_model`), ``conv_relu``, ``taps`` and ``taps_no_chains`` through ``FusedBackend``'s own
#: step; the other variants are built with that step left out (:func:`build`)
CHANNELS_LAST_WEIGHTS = {"weights_channels_last", "conv_relu", "taps", "taps_no_chains", "taps_window",
                         "taps_chains_cl", "conv_relu_cl"}
#: variants whose chains take channels-last inputs (``fuse_conv_relu(channels_last_inputs=True)``)
CHAINS_CL = {"taps_chains_cl", "conv_relu_cl"}
#: ``FusedBackend``'s arguments in each variant (else none of its steps: no chains, PyTorch's depthwise convolution)
BACKEND = {"conv_relu": {"conv_relu": True}, "taps": {"depthwise": "taps", "conv_relu": None},
           "taps_no_chains": {"depthwise": "taps"}, "taps_window": {"depthwise": "taps", "conv_relu": None},
           "taps_chains_cl": {"depthwise": "taps", "conv_relu": None}, "conv_relu_cl": {"conv_relu": True}}


def _variant_model(model: Any, layout: str) -> Any:
    """``model`` as the variant ``layout`` builds from: a channels-last copy for ``weights_channels_last``, the model
    as it is for ``conv_relu`` (whose build takes the library's channels-last step)."""
    import copy

    import torch

    if layout == "weights_channels_last":
        return copy.deepcopy(model).to(memory_format=torch.channels_last)
    return model


def kernels_by_name(replay: Any, folder: Path) -> dict[str, int]:
    """How many kernels of each kind one ``replay()`` runs (:func:`exp_capture_variation.kernel_trace`), by the
    name's first words."""
    from collections import Counter

    from exp_capture_variation import kernel_trace

    names = [k[0] for k in kernel_trace(replay, folder)["kernels"]]
    return dict(Counter("_".join(n.split("<")[0].split("_")[:4]) for n in names).most_common())


def _model(name: str, batch: int, dtype: str, device: str) -> tuple[Any, Any]:
    import torch

    from opbench.models import get_source

    torch.manual_seed(0)
    model, x = get_source("local").torch_model(name, batch, dtype=dtype)
    return model.to(device).eval(), x.to(device)


def build(model: Any, x: Any, layout: str, store: Path) -> tuple[Any, float]:
    """``FusedBackend(model)`` with Inductor's settings as the variant ``layout`` says (:data:`VARIANTS`), its
    regions kept in ``store`` and compiled in this process (the settings hold here, not in worker processes);
    and its seconds."""
    from unittest import mock

    import torch

    from opbench.runtime import fused

    as_given = layout not in CHANNELS_LAST_WEIGHTS  # the weights as the model has them: the backend's step left out
    window = partial(fused.unfold_depthwise, unrolled=False)
    fuse = fused.fuse_conv_relu

    def chains(gm: Any, inputs: Any = None, channels_last_inputs: bool = False) -> int:
        # the variant, not the backend, says how the chains take their inputs: ``taps`` as they come (the library
        # gives unfolded networks' chains channels-last ones: ``taps_chains_cl``)
        return fuse(gm, inputs, channels_last_inputs=layout in CHAINS_CL)

    clock = time.perf_counter()
    with torch._inductor.config.patch(VARIANTS[layout]), \
            mock.patch.object(fused, "weights_channels_last", lambda module: module) if as_given else nullcontext(), \
            mock.patch.object(fused, "unfold_depthwise", window) if layout == "taps_window" else nullcontext(), \
            mock.patch.object(fused, "fuse_conv_relu", chains):
        backend = fused.FusedBackend(model, [x], store=store, jobs=1,
                                     **({"conv_relu": False, "depthwise": "aten"} | BACKEND.get(layout, {})))
    return backend, time.perf_counter() - clock


def later_build(name: str, batch: int, dtype: str, device: str, layout: str, store: Path) -> dict:
    """A build from ``store`` in this (new) process: its seconds and where the regions' went."""
    model, x = _model(name, batch, dtype, device)
    backend, seconds = build(_variant_model(model, layout), x, layout, store)
    return {"build_s": seconds, "regions_s": backend.compile_s, "built": backend.built,
            "seconds": backend.compile_seconds}


def measure(name: str, args: Any, out: Path) -> dict:
    """Both variants of ``name``: built, checked, timed side by side, then built again in new processes."""
    import torch

    from opbench.profile.timer import cuda_event_samples
    from opbench.runtime.executor import ParallelExecutor
    from opbench.schedule import Greedy, Sequential

    model, x = _model(name, args.batch, args.dtype, args.device)
    with torch.no_grad():
        ref = model(x)
    row: dict[str, Any] = {"model": name, "batch": args.batch, "dtype": args.dtype, "variants": {}}
    runs: dict[tuple[str, str], Any] = {}
    for layout in args.variants:
        store = out / "stores" / f"{name}_{args.batch}_{args.dtype}_{layout}"
        backend, seconds = build(_variant_model(model, layout), x, layout, store)
        variant = {"build_s": seconds, "regions": len(backend.regions), "built": backend.built,
                   "conv_relu": backend.conv_relu_chains, "unfolded": backend.depthwise_unfolded}
        for scheduler in (Sequential(), Greedy(4)):
            executor = ParallelExecutor(backend, scheduler.schedule(backend.graph))
            got = executor.run()
            variant[f"{scheduler.name}_err"] = relative_err(got[0] if isinstance(got, list | tuple) else got, ref)
            runs[(layout, scheduler.name)] = executor
            if args.device == "cuda" and scheduler.name == "sequential":
                variant["kernels_by_name"] = kernels_by_name(executor.cuda_graph.replay, out)
                variant["kernels"] = sum(variant["kernels_by_name"].values())
        row["variants"][layout] = variant
        print(f"{name} {layout}: built in {seconds:.1f} s {backend.built}", flush=True)
    samples: dict[tuple[str, str], list[float]] = {key: [] for key in runs}
    for _ in range(args.rounds):  # alternating: each replayed right after the others, round after round
        for key, executor in runs.items():
            if args.device == "cuda":
                samples[key].append(statistics.median(
                    cuda_event_samples(executor.cuda_graph.replay, args.repeat, args.number)) * 1e3)
            else:
                clock = time.perf_counter()
                executor.run()
                samples[key].append((time.perf_counter() - clock) * 1e3)
    for (layout, schedule), values in samples.items():
        row["variants"][layout][f"{schedule}_ms"] = statistics.median(values)
    for layout in args.variants:
        print(f"{name} {layout}: " + ", ".join(f"{k} {v:.4f}" for k, v in row["variants"][layout].items()
                                             if k.endswith("_ms")), flush=True)
    later: dict[str, list[dict]] = {layout: [] for layout in args.variants}
    for _ in range(args.later):
        for layout in args.variants:
            cmd = [sys.executable, __file__, "--out", str(out), "--models", name, "--batch", str(args.batch),
                   "--dtype", args.dtype, "--device", args.device, "--later-build", layout]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
            try:
                later[layout].append(json.loads(done.stdout.strip().splitlines()[-1]))
            except (IndexError, ValueError):
                later[layout].append({"error": (done.stderr or done.stdout).strip().splitlines()[-1:]})
            print(f"{name} {layout} later build: {json.dumps(later[layout][-1])[:300]}", flush=True)
    for layout, builds in later.items() if args.later else ():
        row["variants"][layout]["later_builds"] = builds
        ok = [b for b in builds if "regions_s" in b]
        if ok:
            row["variants"][layout]["later_regions_s"] = statistics.median(b["regions_s"] for b in ok)
            row["variants"][layout]["later_run_s"] = statistics.median(b["seconds"].get("run", 0.0) for b in ok)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    model_device_args(parser, "mobilenet_v3_large,nasnet")
    timing_args(parser)
    parser.add_argument("--later", type=int, default=2, help="later builds of each variant, in new processes")
    parser.add_argument("--variants", default="channels_last,pytorch",
                        help=f"comma-separated, of: {', '.join(VARIANTS)}")
    parser.add_argument("--later-build", choices=VARIANTS, help=argparse.SUPPRESS)  # one, in this new process
    args = parser.parse_args()
    models = checked_models(args)
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown or not args.variants:
        parser.error(f"unknown --variants {','.join(unknown)!r} (accepted: {', '.join(VARIANTS)})")
    out = Path(args.out)
    if args.later_build:
        store = out / "stores" / f"{models[0]}_{args.batch}_{args.dtype}_{args.later_build}"
        print(json.dumps(later_build(models[0], args.batch, args.dtype, args.device, args.later_build, store)))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    measure_each(models, experiment_doc("exp_layout.py", args.device), out / "exp_layout.json",
                 lambda name: measure(name, args, out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
