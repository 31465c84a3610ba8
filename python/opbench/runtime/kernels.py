"""Per-operator kernels: call any operator on its own, or replay all of them in order."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import tvm

from ..ir.graph import ArgRef, OpGraph
from .build import BuiltModule


def flatten_outputs(value: Any) -> list[Any]:
    """A VM result (tensor or nested tuple of tensors) as a flat list."""
    if isinstance(value, tvm.runtime.Tensor):
        return [value]
    return [t for v in value for t in flatten_outputs(v)]


class OperatorKernels:
    """The compiled kernel of every operator of an :class:`OpGraph`.

    Each operator is called destination-passing style, ``kernel(*inputs, *outputs)``; outputs
    are allocated here. :meth:`replay` runs all operators in topological order.
    """

    def __init__(self, graph: OpGraph, built: BuiltModule) -> None:
        self.graph = graph
        self.built = built
        self.device = built.device
        self.funcs = {}
        cpu = self.device.dlpack_device_type() == 1
        for node in graph:
            if node.func not in self.funcs:
                func = built.kernel(node.func)
                if cpu:  # kernels on several host threads (the CPU executor) then really run side by side
                    func.release_gil = True
                self.funcs[node.func] = func
        self._consts: dict[int, Any] = {}

    def constant(self, index: int) -> Any:
        """Weight ``index`` on the device (copied once)."""
        if index not in self._consts:
            self._consts[index] = tvm.runtime.tensor(self.graph.constants[index].numpy(), self.device)
        return self._consts[index]

    def allocate_outputs(self, index: int) -> list[Any]:
        """Fresh output tensors of operator ``index``."""
        node = self.graph[index]
        return [tvm.runtime.empty(s, d, self.device)
                for s, d in zip(node.output_shapes, node.output_dtypes, strict=True)]

    def resolve(self, ref: ArgRef, inputs: Sequence[Any], values: dict[int, list[Any]]) -> Any:
        """The tensor an argument refers to (a view of it where the argument is a reshape)."""
        if ref.kind == "input":
            tensor = inputs[ref.index]
        elif ref.kind == "const":
            tensor = self.constant(ref.index)
        else:
            tensor = values[ref.index][ref.item]
        return tensor if ref.shape is None else tensor._create_view(ref.shape)  # noqa: SLF001 (TVM's view)

    def args_for(self, index: int, inputs: Sequence[Any], values: dict[int, list[Any]]) -> list[Any]:
        """The argument tensors of operator ``index``."""
        return [self.resolve(a, inputs, values) for a in self.graph[index].args]

    def call(self, index: int, args: Sequence[Any], outputs: Sequence[Any]) -> None:
        """Run operator ``index`` on prepared tensors."""
        self.funcs[self.graph[index].func](*args, *outputs)

    def to_device(self, inputs: Sequence[Any]) -> list[Any]:
        """Host arrays as device tensors."""
        return [x if isinstance(x, tvm.runtime.Tensor) else tvm.runtime.tensor(np.asarray(x), self.device)
                for x in inputs]

    def replay(self, inputs: Sequence[Any]) -> tuple[list[Any], dict[int, list[Any]]]:
        """Run every operator in topological order.

        Returns
        -------
        outputs, values:
            The model outputs (device tensors) and every operator's outputs by index.
        """
        inputs = self.to_device(inputs)
        values: dict[int, list[Any]] = {}
        for node in self.graph:
            outs = self.allocate_outputs(node.index)
            self.call(node.index, self.args_for(node.index, inputs, values), outs)
            values[node.index] = outs
        outputs = [self.resolve(r, inputs, values) for r in self.graph.outputs]
        return outputs, values


def relative_error(actual: Sequence[Any], expected: Sequence[Any]) -> float:
    """max |a - b| / max |b| over all outputs (0 when both are all zero)."""
    worst = 0.0
    for a, b in zip(actual, expected, strict=True):
        a = a.numpy() if hasattr(a, "numpy") else np.asarray(a)
        b = b.numpy() if hasattr(b, "numpy") else np.asarray(b)
        if a.shape != b.shape:
            return float("inf")
        scale = float(np.max(np.abs(b))) if b.size else 0.0
        diff = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if b.size else 0.0
        worst = max(worst, diff / scale if scale else diff)
    return worst
