"""Compiler-fused regions as kernels: a torch model cut into regions, each compiled by PyTorch's
Inductor, launched one region at a time on the streams a schedule gives.

:class:`FusedBackend` traces the model into a ``torch.fx`` graph (``torch.fx`` where it can, else
``torch.export``), cuts it into regions (:mod:`opbench.ir.regions`), splits the graph into one
submodule per region (``torch.fx.passes.split_module``) and compiles each with
``torch.compile(region, dynamic=False, fullgraph=True)``: Inductor's kernels, without CUDA Graphs
of its own, so that the executor captures every region of every stream in one CUDA Graph.
Regions of identical structure compile once (Inductor's graph cache, which also makes a second
build in a new process fast). With ``merge``, IOS's merge is written into the traced graph before it is
cut (:func:`opbench.ir.torch_graph.merge_into_graph`): sibling convolutions that read one input become
one wider convolution that Inductor compiles into its region, so fewer and larger kernels run. A region
Inductor cannot compile runs its ATen operators, logged once.
To the schedulers and the executor the regions are ordinary operators: it is a
:class:`~opbench.runtime.backend.TorchBackend` over the split graph.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import OpBenchError, first_line
from ..ir.regions import CUTS, cut_regions, fx_operator_dag, region_of
from ..ir.torch_graph import fx_module, merge_into_graph
from .backend import TorchBackend

log = logging.getLogger(__name__)


def compile_region(region: Any, inputs: Sequence[Any], name: str) -> tuple[Any, str | None]:
    """``region`` compiled by Inductor and run once on ``inputs`` (compiling it), or the region itself
    with the reason when Inductor cannot compile it."""
    import torch

    compiled = torch.compile(region, dynamic=False, fullgraph=True)
    try:
        with torch.no_grad():
            compiled(*inputs)
        return compiled, None
    except Exception as err:  # a region Inductor cannot take runs its ATen operators
        first = first_line(err)
        return region, f"{type(err).__name__}: {first[:200]}"


class FusedBackend(TorchBackend):
    """A torch model's regions, each compiled by Inductor (see the module docstring).

    Parameters
    ----------
    cut:
        How to cut (:data:`opbench.ir.regions.CUTS`); ``blocks`` weighs ``costs``, each traced
        operator's seconds (:func:`opbench.pipeline.compile.torch_backend` times them alone), or a
        callable that gives them for the traced (and merged) ``GraphModule``.
    regions:
        A cut made earlier, as lists of traced node names (a saved schedule's ``meta["regions"]``):
        no cut is computed.
    trace:
        ``auto`` (``torch.fx``, else ``torch.export``), ``fx`` or ``export``.
    merge:
        IOS's merge before the cut: ``True`` merges every group of sibling convolutions, a list of groups
        (node names of the traced graph) those groups; a saved schedule's ``meta["merged"]`` again.

    Attributes
    ----------
    regions:
        The cut: the traced node names of each region, in launch order.
    compile_s:
        Seconds spent compiling the regions.
    fallbacks:
        Region name -> why it runs its ATen operators.
    merged_groups:
        The groups of sibling convolutions merged, by node name (empty without ``merge``).
    """

    name = "fused"

    def __init__(self, model: Any, inputs: Sequence[Any], cut: str = "branches",
                 regions: Sequence[Sequence[str]] | None = None, trace: str = "auto",
                 costs: Sequence[float] | Callable[[Any], Sequence[float]] | None = None, min_gain_s: float = 5e-6,
                 merge: bool | Sequence[Sequence[str]] = False) -> None:
        import torch
        from torch.fx.interpreter import Interpreter
        from torch.fx.passes.split_module import split_module

        if cut not in CUTS:
            raise OpBenchError(f"unknown region cut '{cut}' (accepted: {', '.join(CUTS)})")
        gm, self.source_trace = fx_module(model, inputs, trace)
        self._merged = merge_into_graph(gm, inputs, None if merge is True else merge) if merge else []
        ops, preds = fx_operator_dag(gm.graph)
        if callable(costs):
            costs = costs(gm)
        if regions is not None:
            index = {n.name: i for i, n in enumerate(ops)}
            missing = [name for region in regions for name in region if name not in index]
            if missing or sorted(i for r in regions for i in (index[n] for n in r)) != list(range(len(ops))):
                raise OpBenchError("the saved region cut does not match this model's traced graph "
                                   f"({len(missing)} unknown operators): make the schedule again")
            cut_ops = [sorted(index[name] for name in region) for region in regions]
        else:
            cut_ops = cut_regions(preds, cut, costs, min_gain_s)
        self.cut = cut if regions is None else "saved"
        self.regions = [[ops[i].name for i in region] for region in cut_ops]
        split = split_module(gm, gm, region_of(ops, cut_ops))
        # each region's inputs, from one eager run of the split graph (the compiler's example inputs)
        seen: dict[str, list[Any]] = {}

        class Recorder(Interpreter):
            def call_module(self, target: Any, args: Any, kwargs: Any) -> Any:
                seen[target] = list(args)
                return super().call_module(target, args, kwargs)

        with torch.no_grad():
            Recorder(split).run(*inputs)
        start = time.perf_counter()
        compiled: dict[str, Any] = {}
        self.fallbacks: dict[str, str] = {}
        for name, region in split.named_children():
            if name not in seen:
                continue
            compiled[name], why = compile_region(region, seen[name], name)
            if why is not None:
                self.fallbacks[name] = why
                log.warning("region %s runs its ATen operators: Inductor cannot compile it (%s)", name, why)
        self.compile_s = time.perf_counter() - start
        super().__init__(split, inputs, trace="graph")
        flops = self._region_flops(gm, inputs, cut_ops)
        for node in list(self.traced.modules):
            if node.target in compiled:
                self.traced.modules[node] = compiled[node.target]
        for op in self.graph:  # regions: their operators' FLOPs (the split graph knows only the regions)
            if op.var_name in flops:
                op.flops = flops[op.var_name]
                op.kind = "region"

    @property
    def merged_groups(self) -> list[list[str]]:
        """The groups of sibling convolutions merged before the cut, by node name of the traced graph."""
        return self._merged

    def schedule_meta(self) -> dict[str, Any]:
        return {"kernels": self.name, "cut": self.cut, "regions": self.regions, "merged": self.merged_groups}

    def _region_flops(self, gm: Any, inputs: Sequence[Any], cut_ops: list[list[int]]) -> dict[str, float]:
        """FLOPs of each region's call in the split graph, summed over its traced operators."""
        from ..ir.torch_graph import TorchGraph

        traced = TorchGraph(gm, inputs, trace="graph").graph
        calls = [n for n in self.traced.ops if n.op == "call_module" and str(n.target).startswith("submod_")]
        by_region = {int(str(n.target).rsplit("_", 1)[1]): n.name for n in calls}
        return {by_region[r]: sum(traced[i].flops for i in ops) for r, ops in enumerate(cut_ops) if r in by_region}


__all__ = ["FusedBackend", "compile_region", "fx_module"]  # fx_module: opbench.ir.torch_graph's
