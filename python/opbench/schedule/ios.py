"""IOS dynamic-programming scheduling (Ding et al., MLSys 2021).

Algorithm
---------
1. Split the graph into blocks at operators that every other operator depends on or is depended
   on by; cut blocks longer than ``max_block`` in topological chunks.
2. Within a block, a state S is the set of operators not yet scheduled; an ending E of S is a
   non-empty subset with no edge from E into S - E.
3. cost[S] = min over endings E of cost[S - E] + latency(stage E), memoised; cost[{}] = 0.
4. A stage runs the weakly connected components of E as groups, one stream each (IOS's
   "concurrent" strategy), pruned to at most r operators per group and s groups per stage (IOS's
   defaults r=3, s=8).
5. Stage latency comes from a cost function, memoised: the scheduling cost's prediction, measured
   stage times, or any callable.
6. Merge (IOS's second strategy), when a merge cost is given: a stage whose operators are
   independent of each other and can run as one merged operator (sibling convolutions on one
   input) costs the lesser of its concurrent latency and the merged operator's; the stages where
   merging wins are listed in ``meta["merged"]`` and ``meta["strategies"]`` says each stage's.
7. Past the time limit, the remaining states take one operator per stage.
8. The stages run one after another; cross-stream edges get events. A merged stage is one group
   (its operators in order on one stream) until the backend runs it as one operator.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from ..ir.dag import reach_bits
from .base import Schedule, Scheduler, from_stages
from .cost import SchedulingCost


def split_blocks(graph: Any, max_block: int) -> list[list[int]]:
    """Blocks of consecutive operators, cut after operators comparable with all others."""
    n = len(graph)
    reach = reach_bits(graph)
    ancestors = [0] * n
    for u in range(n):
        bits = reach[u]
        while bits:
            low = bits & -bits
            ancestors[low.bit_length() - 1] |= 1 << u
            bits ^= low
    everyone = (1 << n) - 1
    blocks, current = [], []
    for v in range(n):
        current.append(v)
        cut = (reach[v] | ancestors[v] | (1 << v)) == everyone
        if cut or len(current) >= max_block:
            blocks.append(current)
            current = []
    if current:
        blocks.append(current)
    return blocks


def components(ops: list[int], graph: Any) -> list[list[int]]:
    """Weakly connected components of the subgraph induced by ``ops``, each in topological order."""
    members = set(ops)
    parent = {v: v for v in ops}

    def find(v: int) -> int:
        while parent[v] != v:
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v

    for v in ops:
        for u in graph.preds(v):
            if u in members:
                parent[find(u)] = find(v)
    groups: dict[int, list[int]] = {}
    for v in sorted(ops):
        groups.setdefault(find(v), []).append(v)
    return list(groups.values())


class IOS(Scheduler):
    """IOS's dynamic programme (see the module comment).

    Parameters
    ----------
    r, s:
        At most ``r`` operators per group and ``s`` groups per stage.
    max_block:
        Blocks longer than this are cut in topological chunks.
    time_limit_s:
        Past this, remaining states take one operator per stage.
    stage_cost:
        ``stage_cost(groups) -> seconds``, used instead of the cost given to :meth:`schedule`
        (e.g. measured stages, ``opbench.profile.schedule.measured_stage_cost``).
    merge:
        ``merge(ops) -> seconds or None``: what operators ``ops`` take run as one merged operator,
        None where they cannot merge (e.g. ``opbench.profile.schedule.merge_cost``). Without it,
        every stage is concurrent.
    name:
        The schedule's name (default ``ios``).
    """

    name = "ios"

    def __init__(self, r: int = 3, s: int = 8, max_block: int = 16, time_limit_s: float = 100.0,
                 stage_cost: Callable[[list[list[int]]], float] | None = None, name: str | None = None,
                 merge: Callable[[tuple[int, ...]], float | None] | None = None) -> None:
        self.r, self.s, self.max_block, self.time_limit_s = r, s, max_block, time_limit_s
        self.stage_cost = stage_cost
        self.merge = merge
        if name:
            self.name = name

    def schedule(self, graph: Any, cost: SchedulingCost | Callable[[list[list[int]]], float] | None = None) -> Schedule:
        """The DP's schedule of ``graph``; stage latency from ``stage_cost``, else ``cost``."""
        stage_cost = self.stage_cost or (cost.stage_latency if isinstance(cost, SchedulingCost) else cost)
        stage_cost = stage_cost or SchedulingCost(graph).stage_latency
        memo_stage: dict[tuple[int, ...], tuple[float, list[list[int]], str]] = {}

        def stage(ops: tuple[int, ...]) -> tuple[float, list[list[int]], str]:
            if ops not in memo_stage:
                groups = components(list(ops), graph)
                if len(groups) > self.s or any(len(g) > self.r for g in groups):
                    memo_stage[ops] = (float("inf"), groups, "concurrent")
                else:
                    memo_stage[ops] = (stage_cost(groups), groups, "concurrent")
                if self.merge is not None and len(ops) > 1 and len(groups) == len(ops):
                    merged = self.merge(ops)
                    if merged is not None and merged < memo_stage[ops][0]:
                        memo_stage[ops] = (merged, [list(ops)], "merge")
            return memo_stage[ops]

        deadline = time.perf_counter() + self.time_limit_s
        stages: list[list[list[int]]] = []
        strategies: list[str] = []
        total = 0.0
        for block in split_blocks(graph, self.max_block):
            cost_b, ends = self._solve_block(graph, block, stage, stage_cost, deadline)
            total += cost_b
            for end in ends:
                _, groups, strategy = stage(end)
                stages.append(groups)
                strategies.append(strategy if len(groups) > 1 or strategy == "merge" else "sequential")
        meta = {"r": self.r, "s": self.s, "predicted_s": total, "stage_evaluations": len(memo_stage),
                "timed_out": time.perf_counter() > deadline}
        if self.merge is not None:
            meta["merged"] = [st[0] for st, how in zip(stages, strategies, strict=True) if how == "merge"]
            meta["strategies"] = strategies
        return from_stages(self.name, graph, stages, meta)

    def _solve_block(self, graph: Any, block: list[int], stage: Callable[[tuple[int, ...]], Any],
                     stage_cost: Callable[[list[list[int]]], float],
                     deadline: float) -> tuple[float, tuple[tuple[int, ...], ...]]:
        """The DP over endings for one block: (cost, endings from first stage to last)."""
        block_set = set(block)
        succ_in = {v: [w for w in graph.succs(v) if w in block_set] for v in block}
        limit = self.r * self.s

        def endings(state: frozenset[int]) -> list[tuple[int, ...]]:
            ops = sorted(state, reverse=True)
            found: list[tuple[int, ...]] = []

            def rec(k: int, chosen: list[int], chosen_set: set[int]) -> None:
                if k == len(ops):
                    if chosen:
                        found.append(tuple(sorted(chosen)))
                    return
                v = ops[k]
                if len(chosen) < limit and all(w in chosen_set or w not in state for w in succ_in[v]):
                    chosen.append(v)
                    chosen_set.add(v)
                    rec(k + 1, chosen, chosen_set)
                    chosen.pop()
                    chosen_set.discard(v)
                rec(k + 1, chosen, chosen_set)

            rec(0, [], set())
            return found

        @functools.cache
        def best(state: frozenset[int]) -> tuple[float, tuple[tuple[int, ...], ...]]:
            if not state:
                return 0.0, ()
            if time.perf_counter() > deadline:  # out of time: one operator per stage
                v = max(state)
                rest = best(state - {v})
                return rest[0] + stage_cost([[v]]), (*rest[1], (v,))
            result: tuple[float, tuple[tuple[int, ...], ...]] = (float("inf"), ())
            for end in endings(state):
                lat = stage(end)[0]
                if lat == float("inf"):
                    continue
                rest = best(state - frozenset(end))
                if rest[0] + lat < result[0]:
                    result = (rest[0] + lat, (*rest[1], end))
            return result

        return best(frozenset(block))
