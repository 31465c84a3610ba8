"""Feature vectors for the predictors.

An operator is described the same way whether it comes from a dataset row or from a freshly
extracted :class:`~opbench.ir.graph.OpNode` (``node.to_dict()``): its kind, the fused operators,
shapes, the main operator's attributes, FLOPs, bytes, arithmetic intensity, FLOPs per output element
and, for convolutions and matmuls, the rows, columns and reduction of the matrix product they compute. These *graph*
features need no compilation, so a model that was never built can be predicted. The *kernel*
features (grid, block, registers, shared memory, occupancy, SMs used) come from a compiled kernel
and are optional: a predictor trained with them needs them at prediction time. The *launch*
features (thread blocks, threads per block and their product) are the part of them that the default GPU schedule
decides before any code is generated (:func:`opbench.runtime.build.launch_dims`), so a
``graph+launch`` predictor still needs no compilation.

A co-run group is described by its members' solo latencies (sorted, padded), their sum, maximum
and balance, the summed graph features and, where known, the SMs the members occupy together.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..dataset import json_value
from ..ir.features import dtype_bytes

DTYPES = ("float32", "float16", "bfloat16")
KINDS = ["conv2d", "conv_transpose", "matmul", "pool", "softmax", "norm", "reduction", "concat", "transform",
         "elementwise"]
FEATURE_SETS = ("graph", "graph+launch", "graph+kernel")
LAUNCH_FEATURES = 3  # the first kernel features: thread blocks, threads per block, threads in all
_DIMS = 4  # shape dimensions kept per tensor (leading dimensions padded with 1)


def _log2(value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return math.nan
    return math.log2(v + 1.0) if v >= 0 else math.nan


def _dims(shape: Sequence[int] | None) -> list[float]:
    shape = list(shape or [])
    shape = [1] * max(0, _DIMS - len(shape)) + shape[-_DIMS:]
    return [_log2(d) for d in shape]


def _numel(shape: Sequence[int] | None) -> float:
    return float(np.prod(shape)) if shape else 1.0


def _pair(value: Any, default: int = 1) -> tuple[float, float]:
    if value is None:
        return float(default), float(default)
    if isinstance(value, int | float):
        return float(value), float(value)
    value = list(value)
    if not value:
        return float(default), float(default)
    return float(value[0]), float(value[-1] if len(value) > 1 else value[0])


def graph_feature_names() -> list[str]:
    """Names of :func:`graph_features`' entries, in order."""
    names = [f"kind={k}" for k in KINDS]
    names += ["fused_ops", "inputs", "outputs", "log2_flops", "log2_bytes", "intensity", "log2_out_elems",
              "log2_in0_elems", "log2_in_elems", "dtype_bytes", "out_rank"]
    names += [f"in0_d{i}" for i in range(_DIMS)] + [f"in1_d{i}" for i in range(_DIMS)]
    names += [f"out_d{i}" for i in range(_DIMS)]
    names += ["stride_h", "stride_w", "kernel_h", "kernel_w", "pad_sum", "dilation", "log2_groups", "depthwise",
              "log2_channels_per_group", "has_relu", "has_add", "has_bias_like"]
    names += ["log2_flops_per_out", "log2_gemm_m", "log2_gemm_n", "log2_gemm_k"]
    names += [f"dtype={d}" for d in DTYPES]
    return names


def gemm_dims(kind: str, out: Sequence[int], attrs: dict[str, Any], flops: float) -> tuple[float, float, float]:
    """A convolution's or matmul's sizes as the matrix product it computes: rows ``m`` (output pixels
    times batch), columns ``n`` (output channels) and reduction ``k`` (multiply-adds per output);
    NaN for other kinds. The default GPU schedules tile these three, so their sizes (not only their
    product) set how well the tiles fit."""
    elems = _numel(out)
    if kind in ("conv2d", "conv_transpose") and len(out) == 4:
        layout = str(attrs.get("out_layout") or attrs.get("data_layout") or "NCHW")
        n = float(out[layout.index("C")] if "C" in layout and len(layout) == 4 else out[1])
    elif kind == "matmul" and out:
        n = float(out[-1])
    else:
        return math.nan, math.nan, math.nan
    return elems / max(n, 1.0), n, flops / 2.0 / max(elems, 1.0)


def graph_features(op: dict[str, Any]) -> list[float]:
    """The compile-free features of one operator (a dataset row or ``OpNode.to_dict()``)."""
    kind = op.get("kind") or "elementwise"
    ops = json_value(op.get("ops")) or []
    attrs = json_value(op.get("attrs")) or {}
    ins = json_value(op.get("input_shapes")) or []
    outs = json_value(op.get("output_shapes")) or []
    in_dtypes = json_value(op.get("input_dtypes"))
    dtypes = json_value(op.get("output_dtypes")) or in_dtypes or ["float32"]
    flops = float(op.get("flops") or 0.0)
    nbytes = float(op.get("bytes") or 0.0)
    intensity = op.get("arithmetic_intensity")
    if intensity is None:
        intensity = flops / nbytes if nbytes else 0.0
    in0 = ins[0] if ins else []
    in1 = ins[1] if len(ins) > 1 else []
    out0 = outs[0] if outs else []
    row = [1.0 if kind == k else 0.0 for k in KINDS]
    row += [float(len(ops)), float(len(ins)), float(len(outs)), _log2(flops), _log2(nbytes), float(intensity),
            _log2(_numel(out0)), _log2(_numel(in0)), _log2(sum(_numel(s) for s in ins)),
            float(dtype_bytes(dtypes[0])), float(len(out0))]
    row += _dims(in0) + _dims(in1) + _dims(out0)
    stride = _pair(attrs.get("strides"))
    if kind in ("conv2d", "conv_transpose") and len(in1) >= 4:
        kernel = (float(in1[-2]), float(in1[-1]))
    else:
        kernel = _pair(attrs.get("pool_size"), 0)
    padding = attrs.get("padding") or []
    pad_sum = float(sum(padding)) if isinstance(padding, list) else float(padding or 0)
    dilation = max(_pair(attrs.get("dilation")))
    groups = float(attrs.get("groups") or 1)
    channels = float(in0[1]) if len(in0) >= 2 else 1.0
    depthwise = 1.0 if kind == "conv2d" and groups > 1 and groups == channels else 0.0
    names = " ".join(ops)
    row += [*stride, *kernel, pad_sum, dilation, _log2(groups), depthwise, _log2(channels / groups),
            1.0 if "relu" in names else 0.0, 1.0 if " add" in f" {names}" else 0.0,
            1.0 if ("multiply" in names or "subtract" in names) else 0.0]
    m, n, k = gemm_dims(kind, out0, attrs, flops)
    row += [_log2(flops / max(_numel(out0), 1.0)), _log2(m), _log2(n), _log2(k)]
    compute = (in_dtypes or dtypes)[0]  # the precision the operator computes in: its first input's
    row += [1.0 if compute == d else 0.0 for d in DTYPES]
    return row


def kernel_feature_names() -> list[str]:
    """Names of :func:`kernel_features`' entries, in order."""
    return ["log2_blocks", "threads", "log2_threads_total", "registers", "log2_smem", "occupancy", "sms_used",
            "num_kernels"]


def _blocks(op: dict[str, Any]) -> float:
    """Thread blocks of all of an operator's kernels; NaN where its grid is unknown."""
    grid = json_value(op.get("grid"))
    return sum(_numel(g) for g in grid) if grid else math.nan


def kernel_features(op: dict[str, Any]) -> list[float]:
    """Features of the compiled kernel(s) of one operator; NaN where unknown."""
    blocks = _blocks(op)
    smem = (op.get("static_smem") or 0) + (op.get("dynamic_smem") or 0) if op.get("threads") is not None else None

    def num(key: str) -> float:
        value = op.get(key)
        return math.nan if value is None else float(value)

    return [_log2(blocks), num("threads"), _log2(blocks * num("threads")), num("registers"), _log2(smem),
            num("occupancy"), num("sms_used"), num("num_kernels")]


def _extra(feature_set: str) -> int:
    return {"graph": 0, "graph+launch": LAUNCH_FEATURES, "graph+kernel": len(kernel_feature_names())}[feature_set]


def operator_feature_names(feature_set: str = "graph") -> list[str]:
    """The column names of :func:`operator_matrix` for a feature set."""
    return graph_feature_names() + kernel_feature_names()[:_extra(feature_set)]


def operator_matrix(ops: Sequence[dict[str, Any]], feature_set: str = "graph") -> np.ndarray:
    """One feature row per operator."""
    extra = _extra(feature_set)
    width = len(graph_feature_names()) + extra
    rows = [graph_features(op) + (kernel_features(op)[:extra] if extra else []) for op in ops]
    return np.asarray(rows, dtype="float64").reshape(len(rows), width)


def baseline_columns(ops: Sequence[dict[str, Any]], feature_set: str = "graph") -> np.ndarray:
    """Columns of the log-linear baseline that the latency trees correct: 1, log FLOPs, log bytes,
    and the log of all threads launched (thread blocks times threads per block) with launch or kernel
    features, else the log of the output elements. NaN where a value is unknown."""
    rows = []
    for op in ops:
        flops, nbytes = float(op.get("flops") or 0.0), float(op.get("bytes") or 0.0)
        if feature_set == "graph":
            outs = json_value(op.get("output_shapes")) or []
            size = _numel(outs[0]) if outs else 1.0
        else:
            threads = op.get("threads")
            size = _blocks(op) * float(threads) if threads is not None else math.nan
        rows.append([1.0, math.log1p(flops), math.log1p(nbytes), math.log1p(size)])
    return np.asarray(rows, dtype="float64").reshape(len(rows), 4)


def task_signature(op: dict[str, Any]) -> str:
    """What makes two operators the same computation across models: kind, fused operators, shapes,
    dtypes and attributes (the ``by_task`` split's group)."""
    from ..utils import digest

    return digest([op.get("kind"), *(json_value(op.get(k)) for k in ("ops", "input_shapes", "output_shapes",
                                                                      "input_dtypes", "attrs"))])


CORUN_SLOTS = 4  # members whose solo times are kept, largest first


def corun_feature_names() -> list[str]:
    """Names of :func:`corun_features`' entries, in order."""
    names = ["size", "log_sum_solo", "log_max_solo", "max_over_sum", "min_over_max"]
    names += [f"solo_share{i}" for i in range(CORUN_SLOTS)]
    names += ["log2_sum_flops", "log2_sum_bytes", "log2_max_flops", "sum_sms_over_device", "max_sms_over_device",
              "sum_blocks_log2"]
    names += [f"kinds={k}" for k in KINDS]
    return names


def corun_features(members: Sequence[dict[str, Any]], solo_s: Sequence[float], device_sms: float | None
                   ) -> list[float]:
    """Features of a co-run group from its members (operator dicts) and their solo latencies."""
    solo = [max(float(s), 1e-9) for s in solo_s]
    total, top = sum(solo), max(solo)
    shares = sorted((s / total for s in solo), reverse=True)[:CORUN_SLOTS]
    shares += [0.0] * (CORUN_SLOTS - len(shares))
    flops = [float(m.get("flops") or 0.0) for m in members]
    nbytes = [float(m.get("bytes") or 0.0) for m in members]
    sms = [m.get("sms_used") for m in members]
    if device_sms and all(s is not None for s in sms):
        sum_sms, max_sms = sum(sms) / device_sms, max(sms) / device_sms
    else:
        sum_sms = max_sms = math.nan
    blocks = sum(_blocks(m) for m in members)  # NaN when any member's grid is unknown
    kinds = [m.get("kind") for m in members]
    row = [float(len(solo)), math.log(total), math.log(top), top / total, min(solo) / top, *shares,
           _log2(sum(flops)), _log2(sum(nbytes)), _log2(max(flops)), sum_sms, max_sms, _log2(blocks)]
    row += [float(kinds.count(k)) for k in KINDS]
    return row


def member_feature_names() -> list[str]:
    """Names of :func:`member_features`' entries (one member of a co-run group), in order."""
    return ["own_solo_share", "own_log_solo", "others_log_sum_solo", "own_sms_over_device", *corun_feature_names()]


def member_features(group: list[float], own: dict[str, Any], own_solo: float, solo_s: Sequence[float],
                    device_sms: float | None) -> list[float]:
    """Features of one member of a co-run group (for its slowdown), ``group`` from :func:`corun_features`."""
    total = sum(max(float(s), 1e-9) for s in solo_s)
    own_solo = max(float(own_solo), 1e-9)
    others = max(total - own_solo, 1e-9)
    sms = own.get("sms_used")
    return [own_solo / total, math.log(own_solo), math.log(others),
            sms / device_sms if (device_sms and sms is not None) else math.nan, *group]


__all__ = ["CORUN_SLOTS", "FEATURE_SETS", "KINDS", "LAUNCH_FEATURES", "corun_feature_names", "corun_features",
           "gemm_dims", "graph_feature_names", "graph_features", "kernel_feature_names", "kernel_features",
           "member_feature_names", "member_features", "operator_feature_names", "operator_matrix",
           "task_signature"]
