"""DAG helpers over any graph with ``len``, ``preds`` and ``succs`` whose operators are numbered in
topological order (``OpGraph`` is one): edges, reachability, transitive reduction, ASAP levels.

Schedulers (``schedule/``) and co-run candidates (``profile/antichain.py``) both build on these.
"""

from __future__ import annotations

from typing import Protocol


class DAG(Protocol):
    """What the helpers (and the schedulers) need of a graph."""

    def __len__(self) -> int: ...

    def preds(self, index: int) -> list[int]: ...

    def succs(self, index: int) -> list[int]: ...


def edges_of(graph: DAG) -> list[tuple[int, int]]:
    """Every edge (producer, consumer), by consumer."""
    return [(u, v) for v in range(len(graph)) for u in graph.preds(v)]


def reach_bits(graph: DAG) -> list[int]:
    """Bitset of descendants of each operator (operators are in topological order)."""
    reach = [0] * len(graph)
    for i in reversed(range(len(graph))):
        bits = 0
        for j in graph.succs(i):
            bits |= (1 << j) | reach[j]
        reach[i] = bits
    return reach


def transitive_reduction(graph: DAG) -> list[tuple[int, int]]:
    """Edges (u, v) not implied by a longer path u -> w -> v."""
    reach = reach_bits(graph)
    out = []
    for u in range(len(graph)):
        succs = graph.succs(u)
        implied = 0
        for w in succs:
            implied |= reach[w]
        out.extend((u, v) for v in succs if not (implied >> v) & 1)
    return out


def levels(graph: DAG) -> list[list[int]]:
    """Operators grouped by longest path from the inputs (ASAP levels)."""
    level = [0] * len(graph)
    for v in range(len(graph)):
        level[v] = max((level[u] + 1 for u in graph.preds(v)), default=0)
    out: list[list[int]] = [[] for _ in range(max(level, default=-1) + 1)]
    for v, lv in enumerate(level):
        out[lv].append(v)
    return out
