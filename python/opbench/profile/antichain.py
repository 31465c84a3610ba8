"""Co-run candidates: groups of operators that are independent in the DAG (antichains).

Groups are what a scheduler would really co-schedule: subsets of each wavefront (operators at the
same ASAP level, which is what greedy and IOS stages hold), then independent pairs from adjacent
levels (what Opara's streams overlap). Groups are listed round-robin across levels so that a
``limit`` samples the whole model, and a group is kept once per combination of kernels (tasks).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from ..ir.dag import levels as asap_levels
from ..ir.dag import reach_bits as reachability
from ..ir.graph import OpGraph

__all__ = ["asap_levels", "corun_groups", "independent", "reachability"]


def independent(reach: list[int], group: tuple[int, ...]) -> bool:
    """No operator of ``group`` reaches another."""
    return all(not (reach[a] >> b) & 1 and not (reach[b] >> a) & 1 for a, b in itertools.combinations(group, 2))


def corun_groups(graph: OpGraph, k: int = 4, limit: int = 200) -> list[tuple[int, ...]]:
    """Up to ``limit`` antichains of 2..k operators, largest wavefront subsets first per level."""
    reach = reachability(graph)
    levels = asap_levels(graph)

    def per_level(ops: list[int], nxt: list[int]) -> Iterator[tuple[int, ...]]:
        for size in range(min(k, len(ops)), 1, -1):
            yield from itertools.combinations(ops, size)
        for a in ops:
            for b in nxt:
                if independent(reach, (a, b)):
                    yield (a, b)

    streams = [per_level(ops, levels[i + 1] if i + 1 < len(levels) else []) for i, ops in enumerate(levels)]
    seen: set[tuple[str, ...]] = set()
    groups: list[tuple[int, ...]] = []
    while streams and len(groups) < limit:
        alive = []
        for gen in streams:
            for group in gen:
                sig = tuple(sorted(graph[i].task for i in group))
                if sig in seen or not independent(reach, group):
                    continue
                seen.add(sig)
                groups.append(tuple(sorted(group)))
                alive.append(gen)
                break
            if len(groups) >= limit:
                break
        streams = alive
    return groups
