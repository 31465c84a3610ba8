"""How a network's depthwise convolutions compile and run in each form Inductor can be given them, shape by shape.

``FusedBackend(depthwise="taps")`` writes each depthwise convolution into the traced graph as a sum over its
kernel's taps (``opbench.ir.depthwise.depthwise_taps``), for Inductor to compile into the region's kernels with
the batch norm and activation around it. This script takes every distinct depthwise convolution of the given zoo
models (with a forward hook: input shape, kernel, stride, padding, dilation, filters per channel; how often each
occurs) and compiles ``relu(bn(conv(relu(x))))`` for each (``bn``: an eval batch norm's scale and shift per
channel; ``x`` channels-last, as Inductor's layout has it) once in each form (:data:`FORMS`):

- ``aten``: PyTorch's convolution (cuDNN, whose plan is made in the first run: ``first_run_s``);
- ``unrolled``: ``depthwise_taps(unrolled=True)``, the taps added one shifted product after another;
- ``window``: ``depthwise_taps``, one reduction over the taps of an unfolded view of the input;
- ``window_looped``: the same with Inductor's persistent reductions off (a loop over the taps in blocks);
- ``window_unroll``: the same with Inductor unrolling the reduction (``unroll_reductions_threshold`` above the
  taps).

Each form's compile is timed (the first call, from empty Inductor and Triton caches in a folder of this run's own),
then one call of each is captured in a CUDA Graph and the forms are replayed in alternating rounds (CUDA events,
medians). Each output is compared with PyTorch's eager convolution in float64. The generated code of each form's
first shape is kept (``OUT/code/<form>.py``). Writes ``OUT/exp_depthwise_forms.json`` (after each shape's compiles,
then whole): per shape and form the compile seconds, the microseconds of a replay and the error, and per form the
sums weighted by how often each shape occurs in the models.

    PYTHONPATH=python python3 scripts/exp_depthwise_forms.py --out out --models nasnet,mobilenet_v3_large
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
from typing import Any

from _cli import ROOT, bad_input, checked_models, experiment_doc, model_device_args, timing_args

sys.path.insert(0, str(ROOT / "python"))

#: each form: whether it unrolls the taps itself, and Inductor's settings while it compiles
FORMS: dict[str, tuple[str, dict[str, Any]]] = {
    "aten": ("aten", {}), "unrolled": ("unrolled", {}), "window": ("window", {}),
    "window_looped": ("window", {"triton.persistent_reductions": False}),
    "window_unroll": ("window", {"unroll_reductions_threshold": 1024})}


def shapes_of(names: list[str], batch: int, dtype: str) -> list[dict[str, Any]]:
    """Every distinct depthwise ``Conv2d`` call of the models, with how often it occurs."""
    import torch

    from opbench.models import get_source

    seen: dict[tuple, dict[str, Any]] = {}
    for name in names:
        model, x = get_source("local").torch_model(name, batch, dtype=dtype)

        def hook(module: Any, args: Any, _out: Any, name: str = name) -> None:
            shape = tuple(args[0].shape)
            key = (shape, module.out_channels, module.kernel_size, module.stride, module.padding, module.dilation)
            row = seen.setdefault(key, {"input": list(shape), "out_channels": module.out_channels,
                                        "kernel": list(module.kernel_size), "stride": list(module.stride),
                                        "padding": list(module.padding), "dilation": list(module.dilation),
                                        "count": 0, "models": []})
            row["count"] += 1
            row["models"] = sorted({*row["models"], name})

        hooks = [m.register_forward_hook(hook) for m in model.modules()
                 if type(m) is torch.nn.Conv2d and m.groups == m.in_channels and m.groups > 1
                 and not isinstance(m.padding, str)]
        with torch.no_grad():
            model.eval()(x)
        for h in hooks:
            h.remove()
    return list(seen.values())


def _function(form: str, shape: dict[str, Any], dtype: Any, device: str) -> tuple[Any, Any, Any]:
    """The function of ``form`` for ``shape``, its channels-last input, and the float64 reference output."""
    import torch

    from opbench.ir.depthwise import depthwise_taps

    torch.manual_seed(0)
    n, c, h, w = shape["input"]
    out, (kh, kw) = shape["out_channels"], shape["kernel"]
    x = torch.randn(n, c, h, w, device=device, dtype=dtype).to(memory_format=torch.channels_last)
    weight = torch.randn(out, 1, kh, kw, device=device, dtype=dtype) / (kh * kw) ** 0.5
    scale, shift = (torch.randn(out, device=device, dtype=dtype) for _ in range(2))
    args = (tuple(shape["stride"]), tuple(shape["padding"]), tuple(shape["dilation"]))

    def affine(y: Any, s: Any, t: Any) -> Any:
        return torch.relu(y * s.reshape(1, -1, 1, 1) + t.reshape(1, -1, 1, 1))

    if form == "aten":
        def fn(x: Any) -> Any:
            return affine(torch.nn.functional.conv2d(torch.relu(x), weight, None, *args, groups=c), scale, shift)
    else:
        def fn(x: Any) -> Any:
            return affine(depthwise_taps(torch.relu(x), weight, None, *args, unrolled=form == "unrolled"),
                          scale, shift)
    with torch.no_grad():
        ref = affine(torch.nn.functional.conv2d(torch.relu(x.double()), weight.double(), None, *args, groups=c),
                     scale.double(), shift.double())
    return fn, x, ref


def measure(shapes: list[dict[str, Any]], forms: list[str], args: Any, out: Path, save: Any) -> dict[str, Any]:
    """Compile every form of every shape, then time them all in alternating rounds; ``save(results)`` after each
    shape's compiles (a run stopped part-way keeps them)."""
    import torch

    from opbench.profile.timer import cuda_event_samples

    dtype = getattr(torch, args.dtype)
    replays: dict[tuple[int, str], Any] = {}
    (out / "code").mkdir(exist_ok=True)
    for i, shape in enumerate(shapes):
        shape["forms"] = {}
        for form in forms[i % len(forms):] + forms[:i % len(forms)]:  # each form first in turn
            kind, settings = FORMS[form]
            fn, x, ref = _function(kind, shape, dtype, args.device)
            from torch._inductor.codecache import PyCodeCache

            known = len(PyCodeCache.modules)
            torch._dynamo.reset()  # the same code object compiles anew for each shape: no recompile limit
            with torch._inductor.config.patch(settings), torch.no_grad():
                compiled = torch.compile(fn)
                clock = time.perf_counter()
                got = compiled(x)
                torch.cuda.synchronize()
                compile_s = time.perf_counter() - clock
                clock = time.perf_counter()
                compiled(x)
                torch.cuda.synchronize()
                second_s = time.perf_counter() - clock
            if i == 0 and len(PyCodeCache.modules) > known:
                source = Path(PyCodeCache.modules[-1].__file__).read_text()
                (out / "code" / f"{form}.py").write_text(source)
            err = float((got.double() - ref).norm() / ref.norm())
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph), torch.no_grad():
                result = compiled(x)
            replays[(i, form)] = (graph, compiled, x, result)  # what the replay reads and writes stays allocated
            shape["forms"][form] = {"compile_s": round(compile_s, 3), "second_call_s": round(second_s, 4),
                                    "err": float(f"{err:.3g}")}
        print(f"shape {i + 1}/{len(shapes)} {shape['input']} k{shape['kernel']} s{shape['stride']}: " + ", ".join(
            f"{f} {v['compile_s']:.1f} s" for f, v in shape["forms"].items()), flush=True)
        save({"shapes": shapes[:i + 1]})
    samples: dict[tuple[int, str], list[float]] = {key: [] for key in replays}
    for _ in range(args.rounds):
        for key, (graph, *_) in replays.items():
            samples[key].append(statistics.median(cuda_event_samples(graph.replay, args.repeat, args.number)))
    for (i, form), values in samples.items():
        shapes[i]["forms"][form]["us"] = round(statistics.median(values) * 1e6, 3)
    totals = {form: {"compile_s": round(sum(s["forms"][form]["compile_s"] * s["count"] for s in shapes), 2),
                     "us": round(sum(s["forms"][form]["us"] * s["count"] for s in shapes), 2),
                     "max_err": max(s["forms"][form]["err"] for s in shapes)} for form in forms}
    return {"shapes": shapes, "totals_by_occurrence": totals}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    model_device_args(parser, "nasnet,mobilenet_v3_large")
    timing_args(parser)
    parser.add_argument("--forms", default=",".join(FORMS), help=f"comma-separated, of: {', '.join(FORMS)}")
    parser.add_argument("--max-shapes", type=int, default=0, help="only the first N shapes (0: all)")
    args = parser.parse_args()
    models = checked_models(args)
    forms = [f.strip() for f in args.forms.split(",") if f.strip()]
    if not forms or any(f not in FORMS for f in forms):
        bad_input(f"--forms: {args.forms!r} (accepted: {', '.join(FORMS)}, comma-separated)")
    if args.device != "cuda":
        bad_input("--device: this experiment times CUDA Graph replays (accepted: cuda)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    caches = tempfile.mkdtemp(prefix="inductor_", dir=os.environ.get("TMPDIR"))  # empty caches: cold compiles
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = caches
    os.environ["TRITON_CACHE_DIR"] = str(Path(caches) / "triton")
    import torch

    torch.compile(lambda t: t + 1)(torch.ones(1, device="cuda"))  # Inductor's and Triton's own start-up first
    shapes = shapes_of(models, args.batch, args.dtype)
    if args.max_shapes:
        shapes = shapes[:args.max_shapes]
    doc = experiment_doc("exp_depthwise_forms.py", args.device) | {"batch": args.batch, "dtype": args.dtype}
    path = out / "exp_depthwise_forms.json"

    def save(results: dict[str, Any]) -> None:
        path.write_text(json.dumps(doc | {"results": results}, indent=1) + "\n")

    doc["results"] = measure(shapes, forms, args, out, save)
    save(doc["results"])
    for form, total in doc["results"]["totals_by_occurrence"].items():
        print(f"{form}: compile {total['compile_s']} s, {total['us']} us per network, max err {total['max_err']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
