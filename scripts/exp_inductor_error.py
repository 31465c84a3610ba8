"""Why Inductor's outputs differ from eager's on some float32 models (inception_v3: 0.026, max-abs relative).

In PyTorch's default precision, cuDNN convolutions may use TF32 (``torch.backends.cudnn.allow_tf32``, on by
default), and Inductor may change the convolutions' memory layout to channels-last
(``torch._inductor.config.layout_optimization``, on by default), so cuDNN may pick other algorithms than eager
does, each rounding in TF32 its own way. This script compiles each model with ``torch.compile`` under the four
combinations of those two switches and compares the outputs of eager and compiled with a float64 reference
computed on the CPU (the same weights and inputs), so that each switch's share of the difference shows:

* ``eager_vs_fp64`` and ``compiled_vs_fp64``: how far each is from the exact result;
* ``compiled_vs_eager``: what the capturer's ``error`` column reports for Inductor's candidates.

If the difference is TF32 rounding, it falls to about 1e-5 with TF32 off, and eager is then as far from the
float64 result as the compiled model is with it on. Writes ``OUT/exp_inductor_error.json`` after every model.

    PYTHONUNBUFFERED=1 PYTHONPATH=python python3 scripts/exp_inductor_error.py --out out --models inception_v3
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

from _cli import ROOT, checked_models, experiment_doc, measure_each, model_device_args
from bench_fused import relative_err

sys.path.insert(0, str(ROOT / "python"))


def measure(name: str, batch: int, device: str) -> list[dict]:
    """One row per (TF32, layout optimization) setting: the three errors of ``name`` at ``batch``."""
    import torch

    from opbench.models import get_source

    torch.manual_seed(0)
    model, x = get_source("local").torch_model(name, batch, dtype="float32")
    model = model.eval()
    with torch.no_grad():
        exact = copy.deepcopy(model).double()(x.double())  # the float64 reference, on the CPU
    model, x = model.to(device), x.to(device)
    rows = []
    for tf32 in (True, False):
        for layout in (True, False):
            torch.backends.cudnn.allow_tf32 = tf32
            torch._dynamo.reset()
            torch._inductor.config.layout_optimization = layout
            start = time.perf_counter()
            with torch.no_grad():
                eager = model(x)
                compiled = torch.compile(model)(x)
            rows.append({"model": name, "batch": batch, "device": device, "cudnn_tf32": tf32,
                         "layout_optimization": layout, "compile_s": time.perf_counter() - start,
                         "eager_vs_fp64": relative_err(eager, exact), "compiled_vs_fp64": relative_err(compiled, exact),
                         "compiled_vs_eager": relative_err(compiled, eager)})
            print(f"{name}:{batch} tf32 {tf32!s:<5} layout {layout!s:<5}  eager-fp64 {rows[-1]['eager_vs_fp64']:.2e}"
                  f"  compiled-fp64 {rows[-1]['compiled_vs_fp64']:.2e}  compiled-eager "
                  f"{rows[-1]['compiled_vs_eager']:.2e}", flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    model_device_args(parser, "inception_v3,googlenet,resnet-50", dtype=False)  # float32: TF32 is the question
    args = parser.parse_args()
    models = checked_models(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    measure_each(models, experiment_doc("exp_inductor_error.py", args.device), out / "exp_inductor_error.json",
                 lambda name: measure(name, args.batch, args.device))
    return 0


if __name__ == "__main__":
    sys.exit(main())
