"""Design spaces as JSON: what MetaSchedule can choose for each task (``opbench configspace``).

For every task, each sketch of MetaSchedule's design space (``post-order-apply`` with the target's
default rules) is listed with its trace and every sampling instruction with its domain:

* ``SamplePerfectTile``: the loop extent, the number of factors, the largest innermost factor, and
  how many tilings that allows (ordered factorizations of the extent);
* ``SampleCategorical``: the candidate values and their probabilities;
* ``SampleComputeLocation``: the block it places (its domain depends on the loops sampled before it,
  so it is not counted).

``space_size`` is the product of the counted domains of a sketch (a lower bound when the sketch
also samples compute locations); a task's size is the sum over its sketches.
"""

from __future__ import annotations

import functools
import logging
import math
import re
from typing import Any

from .knobs import trace_json

log = logging.getLogger(__name__)


@functools.cache
def _divisors(n: int) -> tuple[int, ...]:
    return tuple(d for d in range(1, n + 1) if n % d == 0)


@functools.cache
def perfect_tilings(extent: int, parts: int, max_innermost: int) -> int:
    """Ordered ways to write ``extent`` as a product of ``parts`` factors, the last ≤ ``max_innermost``."""
    if parts == 1:
        return 1 if extent <= max_innermost or max_innermost <= 0 else 0
    return sum(perfect_tilings(extent // d, parts - 1, max_innermost) for d in _divisors(extent))


def sketch_space(trace: Any) -> dict[str, Any]:
    """The sampling instructions of one sketch with their domains (see the module docstring)."""
    insts, decisions = trace_json(trace)
    decided = {int(i): d for i, d in decisions}
    names: dict[str, str] = {}
    samples = []
    size = 1
    partial = False
    for index, (kind, inputs, attrs, outputs) in enumerate(insts):
        if kind in ("GetSBlock", "GetBlock"):
            names[outputs[0]] = str(attrs[0])
        elif kind == "GetLoops" and inputs:
            for i, out in enumerate(outputs):
                names[out] = f"{names.get(inputs[0], inputs[0])}.l{i}"
        if kind == "SamplePerfectTile":
            parts, innermost = int(attrs[0]), int(attrs[1])
            extent = math.prod(int(x) for x in decided.get(index, [1]))
            count = perfect_tilings(extent, parts, innermost)
            size *= max(count, 1)
            samples.append({"instruction": index, "kind": kind, "loop": names.get(inputs[0], inputs[0]),
                            "extent": extent, "factors": parts, "max_innermost_factor": innermost,
                            "choices": count})
        elif kind == "SampleCategorical":
            candidates, probs = attrs[0], attrs[1]
            size *= max(len(candidates), 1)
            samples.append({"instruction": index, "kind": kind, "candidates": candidates, "probs": probs,
                            "choices": len(candidates)})
        elif kind == "SampleComputeLocation":
            partial = True
            samples.append({"instruction": index, "kind": kind, "block": names.get(inputs[0], inputs[0]),
                            "choices": None})
    return {"samples": samples, "space_size": size, "size_is_lower_bound": partial,
            "trace": [insts, [[i, d] for i, d in sorted(decided.items())]]}


#: the dtypes MetaSchedule 0.27 can tensorize on CUDA tensor cores (WMMA intrinsics; none for bfloat16)
TENSOR_CORE_DTYPES = ("float16",)
_said: set[str] = set()


def space_kind(target: Any, dtype: str) -> str:
    """``cuda-tensorcore`` where MetaSchedule can put ``dtype``'s matmuls and convolutions on tensor cores
    (float16 on a CUDA target of sm_70 or later), else ``default``, with one INFO line saying why a
    half-precision workload gets no tensor cores."""
    if dtype not in ("float16", "bfloat16"):
        return "default"
    arch = str(target.attrs.get("arch", "")) if target.kind.name == "cuda" else ""
    version = re.fullmatch(r"sm_(\d+)[a-z]?", arch)  # sm_90, sm_90a (Hopper's arch-specific features)
    major = int(version.group(1)) // 10 if version else 0
    if target.kind.name != "cuda":
        reason = f"the {target.kind.name} target has no tensor cores"
    elif major < 7:
        reason = f"{arch or 'this GPU'} has no tensor cores"
    elif dtype not in TENSOR_CORE_DTYPES:
        reason = f"MetaSchedule has no {dtype} tensor-core intrinsics (float16 only: WMMA)"
    else:
        return "cuda-tensorcore"
    line = f"tuning {dtype} with the ordinary design space: {reason}"
    if line not in _said:
        _said.add(line)
        log.info("%s", line)
    return "default"


def design_space(kind: str) -> Any:
    """A new space generator of ``kind`` (``default``: the target's own rules; ``cuda-tensorcore``)."""
    if kind == "default":
        return "post-order-apply"
    from tvm.s_tir import meta_schedule as ms

    return ms.space_generator.PostOrderApply(sch_rules=kind, postprocs=kind, mutator_probs=kind)


def task_space(mod: Any, target: Any, name: str, kind: str = "default", seed: int = 1) -> dict[str, Any]:
    """Every sketch of one task's design space (``kind``: see :func:`space_kind`). Generating the tensor-core
    space draws random decisions; ``seed`` fixes them, so that the same task gives the same sketches (an
    unseeded draw failed a ``compute-at`` of ios_block's float16 convolution about one time in four)."""
    from tvm.s_tir import meta_schedule as ms

    from ..runtime.startup import import_tensor_intrinsics

    import_tensor_intrinsics()
    context = ms.TuneContext(mod=mod, target=target, space_generator=design_space(kind), task_name=name,
                             rand_state=max(1, int(seed)))
    sketches = [sketch_space(sch.trace) for sch in context.generate_design_space()]
    return {"task": name, "sketches": sketches, "space_size": sum(s["space_size"] for s in sketches)}
