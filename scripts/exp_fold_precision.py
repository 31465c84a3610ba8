"""How far a half-precision model run on the ATen path with its batch norms folded lands from the float32 model.

``TorchBackend(model, inputs, fold_bn=True)`` folds each eval batch norm into the convolution before it. This
script builds that backend from the model in ``--dtype`` twice, with the fold as the library does it (in float32,
rounded once to the model's dtype: ``opbench.ir.conv_relu.fold_into_conv``) and with every step of the fold in the
model's own dtype (what the ATen path did before the thirty-second session), runs the sequential schedule of each
and records the relative norm of its output's distance to the float32 model's output, beside the model's own run in
``--dtype`` (``model_own``). Writes ``OUT/exp_fold_precision.json`` after every model.

    PYTHONPATH=python python3 scripts/exp_fold_precision.py --out out --device cpu --dtype bfloat16 \\
        --models googlenet,resnet-18,inception_v3
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Any

from _cli import ROOT, checked_models, experiment_doc, measure_each, model_device_args

sys.path.insert(0, str(ROOT / "python"))


def fold_in_own_dtype(weight: Any, bias: Any | None, mean: Any, var: Any, eps: float, gamma: Any | None = None,
                      beta: Any | None = None) -> tuple[Any, Any]:
    """``fold_into_conv`` with every step in the parameters' own dtype (each product rounded)."""
    import torch

    scale = 1.0 / torch.sqrt(var + eps) if gamma is None else gamma / torch.sqrt(var + eps)
    folded = weight * scale.reshape(-1, *([1] * (weight.dim() - 1)))
    shift = ((bias if bias is not None else torch.zeros_like(mean)) - mean) * scale
    return folded, shift + beta if beta is not None else shift


def measure(name: str, args: Any) -> dict[str, Any]:
    """The float32 model's output, then the ATen path's with each fold and the model's own run in ``args.dtype``."""
    from unittest import mock

    import torch

    from opbench.ir import torch_graph
    from opbench.models import get_source
    from opbench.runtime.backend import TorchBackend
    from opbench.runtime.executor import ParallelExecutor
    from opbench.schedule import Sequential

    torch.manual_seed(0)
    model, x = get_source("local").torch_model(name, args.batch, dtype="float32")
    model, x = model.to(args.device).eval(), x.to(args.device)
    with torch.no_grad():
        reference = model(x).float()
    dtype = getattr(torch, args.dtype)
    half, xh = copy.deepcopy(model).to(dtype), x.to(dtype)

    def distance(out: Any) -> float:
        out = (out[0] if isinstance(out, list | tuple) else out).float()
        return float((out - reference).norm() / reference.norm())

    row: dict[str, Any] = {"model": name, "batch": args.batch, "dtype": args.dtype}
    with torch.no_grad():
        row["model_own"] = distance(half(xh))
    for label, fold in (("float32_once", torch_graph.fold_into_conv), ("own_dtype", fold_in_own_dtype)):
        with mock.patch.object(torch_graph, "fold_into_conv", fold):
            backend = TorchBackend(half, [xh], fold_bn=True)
        row[label] = distance(ParallelExecutor(backend, Sequential().schedule(backend.graph)).run())
        row["folded"] = len(backend.traced.aliases)
    print(f"{name} {args.dtype}: from the float32 model, folded in float32 {row['float32_once']:.4g}, folded in "
          f"{args.dtype} {row['own_dtype']:.4g}, the model's own run {row['model_own']:.4g} "
          f"({row['folded']} batch norms folded)", flush=True)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    model_device_args(parser, "googlenet,resnet-18,inception_v3")
    args = parser.parse_args()
    models = checked_models(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    measure_each(models, experiment_doc("exp_fold_precision.py", args.device), out / "exp_fold_precision.json",
                 lambda name: measure(name, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
