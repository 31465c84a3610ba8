"""SM partitioning on top of any schedule: the critical path keeps the SMs it needs.

Algorithm
---------
1. The critical path: the longest dependency chain by the cost's operator latencies.
2. Main streams: the stream running the largest share of the critical path's time, and every other
   stream running at least ``main_share`` of it. Side streams: the other streams with operators.
   A schedule without side streams gets no partition.
3. Each side stream's demand in SMs: the time-weighted mean of its operators' demand (the cost's
   fraction of the GPU an operator fills: thread blocks over what the SMs hold at its occupancy, or
   output elements over thread slots) times the SM count, at least one granule.
4. For each budget ``B`` (a fraction of the SMs, rounded down to whole granules), three layouts:
   ``shared``: the main streams keep the whole GPU, the side streams share one group of ``B`` SMs;
   ``each``: the main streams keep the whole GPU, each side stream gets its own group, ``B`` split
   in proportion to the demands (whole granules, at least one each, largest remainders first; only
   where ``B`` holds a granule per side stream); ``split``: the main streams get the SMs the side
   streams' shared group does not (``P - B``, where ``P`` is what partitions can take: no SM shared).
5. Every variant is predicted with the cost's simulation (which confines each stream to its share)
   and the distinct variants are returned best first. The simulation shares SMs like a fluid, so it
   ranks layouts within a budget but cannot see the contention a partition removes (in the fluid, a
   partition only idles SMs): :meth:`SmPartitioner.candidates` therefore takes the best predicted
   variant of each budget, and measuring them picks the one to keep.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from .base import Schedule
from .cost import SchedulingCost

#: the side streams' budgets tried, as fractions of the SMs
BUDGETS = (0.125, 0.25, 0.5)
LAYOUTS = ("shared", "each", "split")


def critical_ops(graph: Any, latency: Any) -> list[int]:
    """The longest dependency chain of ``graph`` by ``latency(op)`` (operators in topological index order)."""
    n = len(graph)
    if n == 0:
        return []
    finish = [0.0] * n
    came: list[int | None] = [None] * n
    for op in range(n):
        preds = graph.preds(op)
        if preds:
            came[op] = max(preds, key=lambda p: finish[p])
            finish[op] = finish[came[op]]
        finish[op] += latency(op)
    last: int | None = max(range(n), key=lambda op: finish[op])
    path: list[int] = []
    while last is not None:
        path.append(last)
        last = came[last]
    return path[::-1]


def _split_budget(budget: int, demands: Sequence[float], granule: int) -> list[int] | None:
    """``budget`` SMs in whole granules, in proportion to ``demands``, at least one granule each."""
    granules = budget // granule
    if granules < len(demands):
        return None
    total = sum(demands) or 1.0
    want = [granules * d / total for d in demands]
    got = [max(1, math.floor(w)) for w in want]
    while sum(got) > granules:  # the minimums overshot: take from the largest
        got[max(range(len(got)), key=lambda i: got[i])] -= 1
    order = sorted(range(len(want)), key=lambda i: want[i] - math.floor(want[i]), reverse=True)
    for i in order[:granules - sum(got)]:
        got[i] += 1
    return [g * granule for g in got]


class SmPartitioner:
    """Partitioned variants of a schedule (see the module docstring).

    Parameters
    ----------
    sm_count, granularity:
        The device's SMs and the granule its partitions come in.
    budgets:
        The side streams' budgets, as fractions of ``sm_count``.
    layouts:
        Which of ``shared``, ``each``, ``split`` to make.
    main_share:
        A stream running at least this share of the critical path's time is a main stream.
    partitionable:
        How many SMs partitions can take together (default: ``sm_count`` in whole granules).
    """

    def __init__(self, sm_count: int, granularity: int, budgets: Sequence[float] = BUDGETS,
                 layouts: Sequence[str] = LAYOUTS, main_share: float = 0.35, partitionable: int | None = None) -> None:
        self.sm_count, self.granularity = sm_count, max(1, granularity)
        self.partitionable = partitionable or sm_count // self.granularity * self.granularity
        self.budgets, self.layouts, self.main_share = list(budgets), list(layouts), main_share

    def roles(self, schedule: Schedule, cost: SchedulingCost) -> tuple[list[int], list[int]]:
        """The main streams and the side streams of ``schedule`` (steps 1-2)."""
        path = critical_ops(cost.graph, cost.latency)
        on_path: dict[int, float] = {}
        for op in path:
            s = schedule.stream_of[op]
            on_path[s] = on_path.get(s, 0.0) + cost.latency(op)
        used = sorted(set(schedule.stream_of))
        total = sum(on_path.values()) or 1.0
        top = max(used, key=lambda s: (on_path.get(s, 0.0), -s))
        main = [s for s in used if s == top or on_path.get(s, 0.0) >= self.main_share * total]
        return main, [s for s in used if s not in main]

    def demand_sms(self, schedule: Schedule, cost: SchedulingCost, stream: int) -> float:
        """The SMs a stream's operators fill, time-weighted (step 3)."""
        ops = [op for op, s in enumerate(schedule.stream_of) if s == stream]
        time = sum(cost.latency(op) for op in ops) or 1.0
        mean = sum(cost.demand(op) * cost.latency(op) for op in ops) / time
        return max(float(self.granularity), mean * self.sm_count)

    def variants(self, schedule: Schedule, cost: SchedulingCost) -> list[tuple[Schedule, float]]:
        """Distinct partitioned variants of ``schedule`` with their predicted seconds, best first."""
        main, side = self.roles(schedule, cost)
        if not side:
            return []
        streams = max(schedule.stream_of) + 1
        demands = [self.demand_sms(schedule, cost, s) for s in side]
        out: dict[tuple[Any, ...], tuple[Schedule, float]] = {}
        for fraction in self.budgets:
            budget = int(self.sm_count * fraction) // self.granularity * self.granularity
            if budget < self.granularity or budget >= self.partitionable:
                continue
            for layout in self.layouts:
                group_of: list[int | None] = [None] * streams
                if layout == "each":
                    sizes = _split_budget(budget, demands, self.granularity)
                    if sizes is None or len(side) == 1:
                        continue
                    for g, s in enumerate(side):
                        group_of[s] = g
                    groups = sizes
                else:
                    for s in side:
                        group_of[s] = 0
                    groups = [budget]
                    if layout == "split":
                        groups.append((self.partitionable - budget) // self.granularity * self.granularity)
                        for s in main:
                            group_of[s] = 1
                key = (tuple(groups), tuple(group_of))
                if key in out:
                    continue
                plan = schedule.with_partition(groups, group_of, f"{schedule.name}+sm-{layout}{budget}")
                plan.meta = {**schedule.meta, "sm_layout": layout, "sm_budget": budget}
                out[key] = (plan, cost.predict(plan))
        return sorted(out.values(), key=lambda pair: pair[1])

    def candidates(self, schedule: Schedule, cost: SchedulingCost, top: int = 3) -> list[tuple[Schedule, float]]:
        """The variants worth measuring: the best predicted of each budget, at most ``top``, best first."""
        best: dict[int, tuple[Schedule, float]] = {}
        for plan, predicted in self.variants(schedule, cost):
            best.setdefault(plan.meta["sm_budget"], (plan, predicted))
        return sorted(best.values(), key=lambda pair: pair[1])[:top]


__all__ = ["BUDGETS", "LAYOUTS", "SmPartitioner", "critical_ops"]
