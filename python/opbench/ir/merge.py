"""IOS's merge as a Relax pass: sibling convolutions become one wider convolution.

Convolutions of one Relax function that read the same variable with the same attributes (strides,
padding, dilation, layouts, one group) and constant weights of the same kernel shape are replaced
by one convolution on their concatenated weights (output channels); each former convolution's
result becomes a channel slice of the merged output (``strided_slice``), so everything after it
(bias, activation) is unchanged. The pass runs before lowering, so the merged convolution is
compiled and tuned like any other operator.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import tvm
from tvm import ir, relax
from tvm.relax.expr_functor import PyExprMutator, mutator

_CONV2D = ir.Op.get("relax.nn.conv2d")


def _ints(values: Any) -> tuple[int, ...]:
    return tuple(int(v) for v in values)


def _key(call: Any) -> tuple[Any, ...] | None:
    """What two convolutions must share to be merged, or None for one that cannot be."""
    data, weight = call.args
    a = call.attrs
    if not isinstance(data, relax.Var) or not isinstance(weight, ir.GenericConst) or int(a.groups) != 1:
        return None
    if str(a.data_layout) != "NCHW" or str(a.kernel_layout) != "OIHW":
        return None
    shape = tuple(weight.value.shape)
    return (data, shape[1:], str(weight.value.dtype), _ints(a.strides), _ints(a.padding), _ints(a.dilation),
            str(a.out_layout), str(a.out_dtype))


def conv_bindings(func: relax.Function) -> list[Any]:
    """Every ``conv2d`` binding of ``func``, in program order."""
    body = func.body
    if not isinstance(body, relax.SeqExpr):
        return []
    return [b for block in body.blocks for b in block.bindings
            if isinstance(getattr(b, "value", None), relax.Call) and b.value.op == _CONV2D]


def sibling_groups(func: relax.Function) -> list[list[Any]]:
    """Bindings of mergeable convolutions in ``func``, groups of two or more, in program order."""
    groups: dict[tuple[Any, ...], list[Any]] = {}
    body = func.body
    if not isinstance(body, relax.SeqExpr):
        return []
    for block in body.blocks:
        for binding in block.bindings:
            value = getattr(binding, "value", None)
            if isinstance(value, relax.Call) and value.op == _CONV2D:
                key = _key(value)
                if key is not None:
                    groups.setdefault((id(block), *key), []).append(binding)
    return [g for g in groups.values() if len(g) > 1]


@mutator
class _Merger(PyExprMutator):
    def __init__(self, mod: tvm.IRModule, groups: list[list[Any]]) -> None:
        super().__init__(mod)
        self.first = {g[0].var: g for g in groups}
        self.later = {b.var for g in groups for b in g[1:]}

    def visit_var_binding_(self, binding: Any) -> None:
        var = binding.var
        if var in self.later:  # emitted with the first member of its group
            return
        if var not in self.first:
            super().visit_var_binding_(binding)
            return
        group = self.first[var]
        calls = [b.value for b in group]
        weights = [c.args[1].value.numpy() for c in calls]
        a = calls[0].attrs
        merged = self.builder_.emit(relax.op.nn.conv2d(
            self.visit_expr(calls[0].args[0]), relax.const(np.concatenate(weights, axis=0)),
            strides=_ints(a.strides), padding=_ints(a.padding), dilation=_ints(a.dilation), groups=1,
            data_layout="NCHW", kernel_layout="OIHW", out_layout=str(a.out_layout), out_dtype=a.out_dtype))
        start = 0
        for b, w in zip(group, weights, strict=True):
            part = self.builder_.emit(relax.op.strided_slice(merged, axes=[1], begin=[start], end=[start + w.shape[0]]))
            start += w.shape[0]
            self.set_var_remap(b.var, part)


def merge_sibling_convs(mod: tvm.IRModule, func_name: str = "main",
                        only: Sequence[int] | None = None) -> tuple[tvm.IRModule, int]:
    """``mod`` with IOS's merge applied to ``func_name``; also returns how many groups were merged.

    ``only``: the groups to merge, as positions in :func:`sibling_groups`'s list (default: all)."""
    func = mod[func_name]
    groups = sibling_groups(func)
    if only is not None:
        groups = [groups[i] for i in only]
    if not groups:
        return mod, 0
    out = tvm.IRModule(dict(mod.functions))
    out[func_name] = _Merger(mod, groups).visit_expr(func)
    return out, len(groups)
