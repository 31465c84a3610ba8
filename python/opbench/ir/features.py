"""Operator features: kind, attributes, FLOPs and bytes."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

# relax op name (without "relax.") -> kind, in priority order: the first match decides
_KIND_RULES: list[tuple[str, str]] = [
    (r"conv\dd_transpose", "conv_transpose"),
    (r"^nn\.conv\dd$", "conv2d"),
    (r"^(matmul|nn\.linear|nn\.dense|linear|dense)$", "matmul"),
    (r"pool", "pool"),
    (r"softmax", "softmax"),
    (r"norm", "norm"),
    (r"^(sum|mean|max|min|prod|argmax|argmin|variance|std|cumsum)$", "reduction"),
    (r"^concat$", "concat"),
    (r"^(take|gather_elements|gather_nd|strided_slice|dynamic_strided_slice|split|reshape|"
     r"permute_dims|flatten|squeeze|expand_dims|broadcast_to|tile|repeat|layout_transform|"
     r"image\.resize2d|nn\.pad)$", "transform"),
]

# fallbacks on TIR function names when the Relax operators are unknown
_NAME_RULES: list[tuple[str, str]] = [
    (r"conv", "conv2d"),
    (r"matmul|dense|linear", "matmul"),
    (r"pool", "pool"),
    (r"softmax", "softmax"),
    (r"norm", "norm"),
    (r"concat", "concat"),
    (r"sum|mean|max\b|min\b|reduce", "reduction"),
    (r"reshape|transpose|take|slice|split|squeeze|flatten|permute", "transform"),
]

_DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int8": 1, "uint8": 1,
                "int16": 2, "int32": 4, "int64": 8, "bool": 1, "uint16": 2, "uint32": 4, "uint64": 8,
                "float8_e4m3fn": 1, "float8_e5m2": 1, "complex64": 8, "complex128": 16}


def classify(ops: list[str], func_name: str) -> str:
    """The operator kind from the fused Relax operators (else from the function name)."""
    for pattern, kind in _KIND_RULES:
        if any(re.search(pattern, op) for op in ops):
            return kind
    if ops:
        return "elementwise"
    base = func_name.lower()
    for pattern, kind in _NAME_RULES:
        if re.search(pattern, base):
            return kind
    return "elementwise"


def main_op(ops: list[str], kind: str) -> int:
    """Index in ``ops`` of the operator that gave the node its kind (its attributes are kept)."""
    for pattern, rule_kind in _KIND_RULES:
        if rule_kind == kind:
            for i, op in enumerate(ops):
                if re.search(pattern, op):
                    return i
    return 0


def attrs_to_dict(attrs: Any) -> dict[str, Any]:
    """A Relax op's attributes as plain Python values."""
    if attrs is None:
        return {}
    out: dict[str, Any] = {}
    skip = {"get_int", "get_int_tuple", "get_str", "id_", "is_", "same_as", "keys", "items", "get"}
    for key in dir(attrs):
        if key.startswith("_") or key in skip:
            continue
        try:
            value = getattr(attrs, key)
        except Exception:  # some reflection fields cannot be read from Python
            continue
        if callable(value):
            continue
        out[key] = to_plain(value)
    return out


def to_plain(value: Any) -> Any:
    """Convert TVM containers and scalars to JSON-friendly Python values."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if hasattr(value, "value") and isinstance(value.value, int | float):
        return value.value
    try:
        return [to_plain(v) for v in value]
    except TypeError:
        return str(value)


def dtype_name(dtype: Any) -> str:
    """A dtype's plain name (``float16``) from TVM's, NumPy's or PyTorch's spelling (``torch.float16``)."""
    return str(dtype).removeprefix("torch.")


def dtype_bytes(dtype: Any) -> int:
    """Bytes per element of ``dtype`` (any spelling :func:`dtype_name` reads; 4 when unknown)."""
    return _DTYPE_BYTES.get(dtype_name(dtype), 4)


def tensor_bytes(shape: tuple[int, ...], dtype: Any) -> int:
    """Bytes of a dense tensor."""
    return int(np.prod(shape, dtype=np.int64)) * dtype_bytes(dtype)


def estimate_flops(prim_func: Any) -> float:
    """FLOPs of a PrimFunc by TVM's TIR analysis (0.0 where it cannot tell)."""
    import tvm
    from tvm.s_tir.analysis import estimate_tir_flops

    try:
        return float(estimate_tir_flops(tvm.IRModule({"main": prim_func})))
    except Exception:  # analysis does not support every loop nest
        return 0.0
