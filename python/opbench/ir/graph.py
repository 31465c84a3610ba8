"""The operator graph: one node per fused operator call of a lowered Relax ``main``."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterator
from typing import Any

from .dag import edges_of


@dataclasses.dataclass(frozen=True)
class ArgRef:
    """Where an operator argument comes from.

    ``kind`` is ``"input"`` (model input ``index``), ``"node"`` (output ``item`` of operator
    ``index``) or ``"const"`` (embedded weight ``index`` of :attr:`OpGraph.constants`). ``shape``, when
    given, reads that tensor through a view of this shape (a reshape that lowering left as a zero-copy
    ``vm.builtin.reshape`` between two kernels: same bytes, no kernel of its own).
    """

    kind: str
    index: int
    item: int = 0
    shape: tuple[int, ...] | None = None

    def to_list(self) -> list[Any]:
        return [self.kind, self.index, self.item] + ([list(self.shape)] if self.shape is not None else [])


@dataclasses.dataclass
class OpNode:
    """One operator: a call of a fused TIR function in ``main``.

    ``func`` names the PrimFunc in the lowered module; ``task`` is the structural hash shared by
    operators whose kernels are identical; ``ops`` lists the Relax operators fused into it.
    """

    index: int
    func: str
    task: str
    kind: str
    ops: list[str]
    attrs: dict[str, Any]
    args: list[ArgRef]
    input_shapes: list[tuple[int, ...]]
    input_dtypes: list[str]
    output_shapes: list[tuple[int, ...]]
    output_dtypes: list[str]
    flops: float
    bytes: int
    var_name: str = ""

    @property
    def arithmetic_intensity(self) -> float:
        """FLOPs per byte moved (inputs read once, outputs written once)."""
        return self.flops / self.bytes if self.bytes else 0.0

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["args"] = [a.to_list() for a in self.args]
        return data


@dataclasses.dataclass
class Task:
    """A unique kernel: the representative function and how many operators use it."""

    task: str
    func: str
    count: int
    nodes: list[int]


class OpGraph:
    """A DAG of operators in topological (program) order.

    Attributes
    ----------
    nodes:
        The operators; ``nodes[i].index == i``.
    input_specs:
        ``(name, shape, dtype)`` of each model input.
    constants:
        The embedded weights referenced by ``ArgRef("const", k)`` (runtime tensors).
    outputs:
        Where the model outputs come from.
    """

    def __init__(self, nodes: list[OpNode], input_specs: list[tuple[str, tuple[int, ...], str]],
                 constants: list[Any], outputs: list[ArgRef]) -> None:
        self.nodes = nodes
        self.input_specs = input_specs
        self.constants = constants
        self.outputs = outputs
        self._preds = [sorted({a.index for a in n.args if a.kind == "node"}) for n in nodes]
        self._succs: list[list[int]] = [[] for _ in nodes]
        for v, preds in enumerate(self._preds):
            for u in preds:
                self._succs[u].append(v)

    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[OpNode]:
        return iter(self.nodes)

    def __getitem__(self, index: int) -> OpNode:
        return self.nodes[index]

    def preds(self, index: int) -> list[int]:
        """Operators whose outputs ``index`` reads."""
        return self._preds[index]

    def succs(self, index: int) -> list[int]:
        """Operators that read an output of ``index``."""
        return self._succs[index]

    @property
    def edges(self) -> list[tuple[int, int]]:
        """Every edge (producer, consumer), by consumer."""
        return edges_of(self)

    def tasks(self) -> dict[str, Task]:
        """Unique kernels by structural hash, in order of first use."""
        out: dict[str, Task] = {}
        for node in self.nodes:
            task = out.setdefault(node.task, Task(node.task, node.func, 0, []))
            task.count += 1
            task.nodes.append(node.index)
        return out

    def fingerprint(self) -> str:
        """A digest of the graph's structure: every operator's kind, operators, shapes, dtypes and
        arguments, and the inputs' specs (not the weights' values). Schedules record it."""
        parts = [[list(map(str, spec)) for spec in self.input_specs]]
        for n in self.nodes:
            parts.append([n.kind, n.ops, [list(s) for s in n.input_shapes], n.input_dtypes,
                          [list(s) for s in n.output_shapes], n.output_dtypes, [a.to_list() for a in n.args]])
        parts.append([a.to_list() for a in self.outputs])
        return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:32]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable description (constants are described by shape, not stored)."""
        return {
            "inputs": [list(s) for s in self.input_specs],
            "nodes": [n.to_dict() for n in self.nodes],
            "outputs": [a.to_list() for a in self.outputs],
            "num_constants": len(self.constants),
        }


def recompiled(gm: Any) -> Any:
    """``gm`` (a ``torch.fx.GraphModule``) after a pass rewrote its graph: the graph checked, the submodules no
    node calls any more dropped, its code generated again."""
    gm.graph.lint()
    gm.delete_all_unused_submodules()
    gm.recompile()
    return gm
