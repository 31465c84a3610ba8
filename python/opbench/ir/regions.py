"""Cutting a model's operator graph into regions for a compiler to fuse, keeping the parallelism.

A region is a connected set of operators that a compiler (PyTorch's Inductor) turns into fused
kernels; the regions are then ordinary operators to the schedulers and the executor. Big regions
fuse more; small ones leave more to run side by side. The cuts:

``branches`` (series contraction). Start with one region per operator and repeat until nothing
changes:

1. build the region graph (an edge where an operator of one region reads an output of another)
   and take its transitive reduction;
2. merge a region ``u`` with ``v`` where ``u``'s only successor is ``v`` and ``v``'s only
   predecessor is ``u``: nothing can run beside either of them that could not run beside the
   merged region, so merging loses no parallelism (and cannot close a cycle: every path from ``u``
   goes through ``v``).

The fixpoint has one region per parallel branch and one per stretch between a join and the next
fork: an inception block gives one region per branch and one for its concatenation and what
follows up to the next block's fork; a chain (a ResNet, whose shortcuts join without work of their
own) gives one region.

``blocks`` starts from ``branches`` and merges every fork-join block whose branches are not worth
running side by side: with each operator's time (``costs``), a block whose parallel branches would
save less than ``min_gain_s`` over running them one after another (the sum of its branches less the
longest, less one launch gap per extra stream) becomes one region; the series contraction then
runs again.

``whole``: one region.

After any cut, :func:`split_heavy` may cut a heavy region (by a weight per operator) into consecutive pieces, so
that separate compiler processes compile them at once: each piece starts at an operator that reads its input from
memory in any case (a convolution, a library call), and exactly one tensor passes from the operators before it to
those from it on, so no fusion and no parallelism is lost. Splitting a region by its operators' topological order
keeps the region graph acyclic: a path from a piece back to an earlier one would be a path out of the region and
into it again, which no cut above makes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import OpBenchError

CUTS = ("branches", "blocks", "whole")
#: a torch model's kernels: PyTorch's own, one per traced call (aten); regions compiled by Inductor (fused)
KERNELS = ("aten", "fused")


class _Regions:
    """Union of operators into regions over a DAG given as predecessor lists in topological order."""

    def __init__(self, preds: Sequence[Sequence[int]]) -> None:
        self.preds = [sorted(set(p)) for p in preds]
        self.region = list(range(len(preds)))  # operator -> its region's id (the id of its first operator)

    def graph(self) -> tuple[dict[int, list[int]], dict[int, set[int]], dict[int, set[int]]]:
        """(members, predecessors, successors) of every region, by region id."""
        members: dict[int, list[int]] = {}
        for op, r in enumerate(self.region):
            members.setdefault(r, []).append(op)
        preds = {r: set() for r in members}
        succs = {r: set() for r in members}
        for op, ps in enumerate(self.preds):
            for p in ps:
                a, b = self.region[p], self.region[op]
                if a != b:
                    preds[b].add(a)
                    succs[a].add(b)
        return members, preds, succs

    def reduced(self) -> tuple[dict[int, list[int]], dict[int, set[int]], dict[int, set[int]]]:
        """The region graph's transitive reduction: (members, predecessors, successors)."""
        members, _preds, succs = self.graph()
        order = self.topological(succs)
        reach: dict[int, set[int]] = {}
        for r in reversed(order):
            reach[r] = set()
            for s in succs[r]:
                reach[r] |= {s} | reach[s]
        red_s = {r: {s for s in succs[r] if not any(s in reach[t] for t in succs[r] if t != s)} for r in succs}
        red_p: dict[int, set[int]] = {r: set() for r in succs}
        for r, ss in red_s.items():
            for s in ss:
                red_p[s].add(r)
        return members, red_p, red_s

    @staticmethod
    def topological(succs: dict[int, set[int]]) -> list[int]:
        indegree = {r: 0 for r in succs}
        for ss in succs.values():
            for s in ss:
                indegree[s] += 1
        ready = sorted(r for r, d in indegree.items() if d == 0)
        order = []
        while ready:
            r = ready.pop(0)
            order.append(r)
            for s in sorted(succs[r]):
                indegree[s] -= 1
                if indegree[s] == 0:
                    ready.append(s)
        if len(order) != len(succs):
            raise OpBenchError("region cut: the region graph has a cycle (a bug in the cut)")
        return order

    def merge(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Merge each pair of regions (and what the pairs chain together) into one."""
        parent: dict[int, int] = {}

        def root(r: int) -> int:
            while parent.get(r, r) != r:
                r = parent[r]
            return r

        for a, b in pairs:
            ra, rb = root(a), root(b)
            if ra != rb:
                parent[max(ra, rb)] = min(ra, rb)
        self.region = [root(r) for r in self.region]

    def series(self) -> None:
        """Merge along edges that are a region's only successor and its successor's only predecessor
        (all such edges of the reduced graph at once, then again on the new graph)."""
        while True:
            _, preds, succs = self.reduced()
            pairs = [(r, next(iter(succs[r]))) for r in succs
                     if len(succs[r]) == 1 and len(preds[next(iter(succs[r]))]) == 1]
            if not pairs:
                return
            self.merge(pairs)

    def regions(self) -> list[list[int]]:
        members, _, succs = self.graph()
        return [members[r] for r in self.topological(succs)]


def cut_regions(preds: Sequence[Sequence[int]], cut: str = "branches", costs: Sequence[float] | None = None,
                min_gain_s: float = 5e-6) -> list[list[int]]:
    """The regions of the DAG whose operator ``i`` reads the outputs of ``preds[i]`` (operators in a
    topological order), each a sorted list of operators, the regions in a topological order (see
    the module docstring for ``cut``; ``blocks`` needs ``costs``, each operator's seconds)."""
    if cut not in CUTS:
        raise OpBenchError(f"unknown region cut '{cut}' (accepted: {', '.join(CUTS)})")
    regions = _Regions(preds)
    if not preds:
        return []
    if cut == "whole":
        return [list(range(len(preds)))]
    regions.series()
    if cut == "blocks":
        if costs is None or len(costs) != len(preds):
            raise OpBenchError("the 'blocks' cut needs each operator's time")
        while _merge_one_block(regions, costs, min_gain_s):
            regions.series()
    return regions.regions()


def _merge_one_block(regions: _Regions, costs: Sequence[float], min_gain_s: float) -> bool:
    """Merge the first fork-join block (a region with several successors, its branches, their common
    join) whose parallel branches save less than ``min_gain_s``; True if one was merged."""
    members, preds, succs = regions.reduced()
    time = {r: sum(costs[op] for op in ops) for r, ops in members.items()}
    for fork in regions.topological(succs):
        branches = succs[fork]
        if len(branches) < 2:
            continue
        joins = {s for b in branches for s in succs[b]}
        # a simple block: every branch is one region between the fork and one common join
        if len(joins) != 1 or any(preds[b] != {fork} or succs[b] != joins for b in branches):
            continue
        (join,) = joins
        if preds[join] != set(branches):
            continue
        gain = sum(time[b] for b in branches) - max(time[b] for b in branches) - min_gain_s * (len(branches) - 1)
        if gain < min_gain_s:
            regions.merge([(fork, b) for b in branches] + [(fork, join)])
            return True
    return False


def split_heavy(regions: Sequence[Sequence[int]], preds: Sequence[Sequence[int]], weights: Sequence[float],
                starts: Sequence[bool], limit: float) -> list[list[int]]:
    """``regions`` (as :func:`cut_regions` gives them), each one weighing over ``limit`` cut into consecutive pieces.

    Parameters
    ----------
    regions:
        Sorted operator lists in a topological order; each region convex (every cut of :data:`CUTS` is).
    preds:
        The DAG: operator ``i`` reads the outputs of ``preds[i]``.
    weights:
        Each operator's weight (what compiling it costs, in any unit).
    starts:
        Whether a piece may start at each operator (it reads its input from memory in any case).
    limit:
        The most a region may weigh before it is cut (``<= 0``: no region is cut).

    Returns
    -------
    The regions, heavy ones replaced by their pieces (in order), as sorted operator lists in a topological order.
    A region weighing ``W`` is cut into ``ceil(W / limit)`` pieces where it can be: at the allowed boundaries
    (``starts``, exactly one tensor crossing) whose weight before them is nearest to equal shares; one without
    such a boundary stays whole.
    """
    out: list[list[int]] = []
    for region in regions:
        total = sum(weights[op] for op in region)
        if limit <= 0 or total <= limit:
            out.append(list(region))
            continue
        position = {op: p for p, op in enumerate(region)}
        last = {op: -1 for op in region}  # each operator's last reader in the region, by position
        for p, op in enumerate(region):
            for q in preds[op]:
                if q in position:
                    last[q] = p
        after: list[float] = []  # the weight of region[:p + 1]
        allowed: list[int] = []  # the boundaries p (a piece starting at region[p]) a piece may start at
        live = 0  # the tensors of region[:p] that region[p:] reads
        running = 0.0
        for p, op in enumerate(region):
            if p:
                prev = region[p - 1]
                live += last[prev] >= p  # the operator just passed, if read from here on
                live -= sum(1 for q in set(preds[prev]) if q in position and last[q] == p - 1)  # read last just now
                if starts[op] and live == 1:
                    allowed.append(p)
            running += weights[op]
            after.append(running)
        pieces = math.ceil(total / limit)
        cuts: list[int] = []  # increasing: a share's nearest boundary, unless an earlier share took it
        for j in range(1, pieces if allowed else 1):
            best = min(allowed, key=lambda p: abs(after[p - 1] - j * total / pieces))
            if not cuts or best > cuts[-1]:
                cuts.append(best)
        for a, b in zip([0, *cuts], [*cuts, len(region)], strict=True):
            out.append(list(region[a:b]))
    return out


def fx_operator_dag(graph: Any) -> tuple[list[Any], list[list[int]]]:
    """The operators of a ``torch.fx`` graph (call_function, call_method, call_module nodes, in graph
    order) and, for each, the operators whose outputs it reads."""
    ops = [n for n in graph.nodes if n.op in ("call_function", "call_method", "call_module")]
    index = {n: i for i, n in enumerate(ops)}
    return ops, [sorted({index[a] for a in n.all_input_nodes if a in index}) for n in ops]


def region_of(ops: Sequence[Any], regions: Sequence[Sequence[int]]) -> Callable[[Any], int]:
    """``node -> region number`` for ``torch.fx.passes.split_module``: operators by their region; the
    nodes that are no operators (``get_attr``) go with the first operator that reads them."""
    where = {ops[op]: r for r, members in enumerate(regions) for op in members}

    def partition(node: Any) -> int:
        if node in where:
            return where[node]
        users = [where[u] for u in node.users if u in where]
        return min(users) if users else 0

    return partition


__all__ = ["CUTS", "cut_regions", "fx_operator_dag", "region_of", "split_heavy"]
