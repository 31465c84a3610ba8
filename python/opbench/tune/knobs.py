"""Schedule knobs: a MetaSchedule trace's decisions decoded into named, readable values.

A trace's JSON is ``[[instruction, ...], [[instruction_index, decision], ...]]`` where each
instruction is ``[kind, inputs, attrs, outputs]``. The knobs are the decisions of the sampling
instructions, named by what they control:

* ``tile.<block>.<loop>``: the factors of ``SamplePerfectTile`` on that loop of that block;
* ``unroll_explicit``, ``unroll_implicit``, ``vectorize``, ...: a ``SampleCategorical`` decision read
  by an annotation, as the chosen candidate value (other categorical choices: ``choice.<index>``);
* ``compute_at.<block>``: ``SampleComputeLocation``'s loop index (-1 root, -2 inlined);

and the fixed choices the rules made: ``parallel`` and ``vectorize`` extents, thread bindings
(``bind.<thread>``: how many loops are bound to it), cache stages (``cache_read``/``cache_write``)
and, on tensor cores, the intrinsics the schedule is tensorized with (``tensor_intrin``: e.g.
``wmma_sync_16x16x16_f16f16f32``, ``wmma_load_16x16x16_f16_a_shared_dyn``).
"""

from __future__ import annotations

import json
import math
from typing import Any

_SAMPLERS = ("SamplePerfectTile", "SampleCategorical", "SampleComputeLocation", "SamplePartitionedTile")


def to_python(obj: Any) -> Any:
    """A TVM trace JSON (ffi arrays, maps, integers, strings) as plain Python data."""
    if isinstance(obj, str | int | float | bool) or obj is None:
        return obj
    if hasattr(obj, "items"):
        return {str(k): to_python(v) for k, v in obj.items()}
    if hasattr(obj, "__iter__"):
        return [to_python(x) for x in obj]
    if hasattr(obj, "value"):
        return obj.value
    return str(obj)


def trace_json(trace: Any) -> list[Any]:
    """A ``Trace`` (or its JSON) as plain Python data."""
    if isinstance(trace, list):
        return trace
    return to_python(trace.as_json(remove_postproc=False))


def decode_knobs(trace: Any) -> dict[str, Any]:
    """The named knobs of a trace (see the module docstring)."""
    insts, decisions = trace_json(trace)
    decided = {int(i): d for i, d in decisions}
    names: dict[str, str] = {}  # random variable -> readable name
    consumers: dict[str, str] = {}  # sampled variable -> annotation key that reads it
    for kind, inputs, attrs, _outputs in insts:
        if kind == "Annotate" and len(inputs) == 2 and isinstance(inputs[1], str):
            consumers.setdefault(inputs[1], str(attrs[0]).removeprefix("meta_schedule."))
    knobs: dict[str, Any] = {}
    for index, (kind, inputs, attrs, outputs) in enumerate(insts):
        if kind == "EnterPostproc":
            break
        if kind == "GetSBlock" or kind == "GetBlock":
            names[outputs[0]] = str(attrs[0])
        elif kind == "GetLoops" and inputs:
            block = names.get(inputs[0], inputs[0])
            for i, out in enumerate(outputs):
                names[out] = f"{block}.l{i}"
        elif kind == "Split" and inputs:
            for i, out in enumerate(outputs):
                names[out] = f"{names.get(inputs[0], inputs[0])}.{i}"
        elif kind in ("CacheRead", "CacheWrite", "ReindexCacheRead", "ReindexCacheWrite"):
            key = "cache_read" if "Read" in kind else "cache_write"
            knobs[key] = knobs.get(key, 0) + 1
        elif kind == "Bind" and attrs:
            key = f"bind.{attrs[0]}"
            knobs[key] = knobs.get(key, 0) + 1
        elif kind == "Annotate" and len(inputs) == 2 and not isinstance(inputs[1], str) and attrs:
            key = str(attrs[0]).removeprefix("meta_schedule.")
            if key in ("parallel", "vectorize"):
                knobs[key] = inputs[1]
        elif kind == "Annotate" and attrs and str(attrs[0]) == "meta_schedule.auto_tensorize" and \
                isinstance(inputs[1], str) and inputs[1].startswith('"'):
            knobs.setdefault("tensor_intrin", []).append(json.loads(inputs[1]))
        if kind not in _SAMPLERS or index not in decided:
            continue
        decision = decided[index]
        if kind in ("SamplePerfectTile", "SamplePartitionedTile"):
            knobs[f"tile.{names.get(inputs[0], inputs[0])}"] = list(decision)
        elif kind == "SampleCategorical":
            candidates = attrs[0]
            value = candidates[decision] if 0 <= decision < len(candidates) else decision
            knobs[consumers.get(outputs[0], f"choice.{index}")] = value
        elif kind == "SampleComputeLocation":
            knobs[f"compute_at.{names.get(inputs[0], inputs[0])}"] = decision
    return knobs


def knob_vector(trace: Any, length: int = 64) -> list[float]:
    """The trace's decisions as a fixed-length numeric vector (tile factors as log2), for cost models."""
    insts, decisions = trace_json(trace)
    values: list[float] = []
    for index, decision in sorted((int(i), d) for i, d in decisions):
        kind = insts[index][0] if index < len(insts) else ""
        if isinstance(decision, list):
            values.extend(math.log2(max(int(x), 1)) for x in decision)
        else:
            values.append(float(decision) + (2.0 if kind == "SampleComputeLocation" else 0.0))
    values = values[:length]
    return values + [0.0] * (length - len(values))


def dumps(trace: Any) -> str:
    """A trace as compact JSON text (what the ``trials`` table stores)."""
    return json.dumps(trace_json(trace), separators=(",", ":"))
