"""PyTorch helpers shared by the torch-based sources: seeding, batch-norm calibration, export."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import OpBenchError, first_line


def import_torch() -> Any:
    """Import torch or explain how to install it."""
    try:
        import torch
    except ImportError:
        raise OpBenchError(
            "this model source needs PyTorch: pip install 'torch==2.14.1' 'torchvision==0.29.1'"
        ) from None
    return torch


def torch_dtype(dtype: str) -> Any:
    """The ``torch.dtype`` of a dtype name (``float32``, ``float16``, ``bfloat16``)."""
    return getattr(import_torch(), dtype)


def calibrate_batchnorm(module: Any, shape: Sequence[int], seed: int = 0, batch: int = 2) -> None:
    """Re-estimate batch-norm statistics on one random batch, then switch to eval mode.

    Randomly initialised networks with default statistics give almost the same output for any
    input (docs/architecture.md, "TVM facts"), which would make correctness checks meaningless.
    """
    torch = import_torch()
    bns = [m for m in module.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not bns:
        module.eval()
        return
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None  # cumulative average over the calibration batch
    gen = torch.Generator().manual_seed(seed + 1)
    module.train()
    with torch.no_grad():
        module(torch.randn((batch, *shape[1:]), generator=gen))
    module.eval()


def _cumsum_promoting(node: Any, importer: Any) -> Any:
    """``cumsum`` as torch defines it: bool and small integer inputs accumulate in int64.

    TVM's importer keeps the input dtype, so GPT-2's ``mask.cumsum(-1)`` (bool) stays bool and
    later fails in LLVM code generation (``t.MatchesCode(kDLFloat)``) and, worse, changes the
    meaning of the equality mask built from it.
    """
    from tvm import relax

    x = importer.env[node.args[0]]
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if "dtype" in node.kwargs and node.kwargs["dtype"] is not None:
        dtype = importer._convert_data_type(str(node.kwargs["dtype"]), importer.env)
    elif str(x.ty.dtype) in ("bool", "int8", "int16", "int32", "uint8"):
        dtype = "int64"
    else:
        dtype = None
    return importer.block_builder.emit(relax.op.cumsum(x, dim, dtype))


def export_to_relax(module: Any, example_args: Sequence[Any]) -> Any:
    """``torch.export`` a module and import it into a Relax IRModule (weights as constants).

    Raises
    ------
    OpBenchError
        When the model cannot be exported (graph breaks, data-dependent control flow) or
        imported; the message names the first unsupported construct.
    """
    torch = import_torch()
    from tvm.relax.frontend.torch import from_exported_program

    try:
        with torch.no_grad():
            program = torch.export.export(module, tuple(example_args))
    except Exception as err:  # torch raises many exception types here
        first = first_line(err)
        raise OpBenchError(f"torch.export failed for {type(module).__name__}: {first}") from err
    try:
        return from_exported_program(program, unwrap_unit_return_tuple=True,
                                     custom_convert_map={"cumsum.default": _cumsum_promoting})
    except Exception as err:
        first = first_line(err)
        raise OpBenchError(
            f"TVM's PyTorch importer failed for {type(module).__name__}: {first}"
        ) from err
