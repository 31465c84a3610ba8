"""Critical-first launch order on top of any schedule: the ready operator with the longest way to the end goes first.

Algorithm
---------
1. Each operator's rank: its latency plus the largest rank of its successors (HEFT's upward rank: the longest
   chain from it to an output, by the given operator latencies).
2. List scheduling over the schedule's own streams: each operator keeps its stream; repeatedly launch, of the
   operators whose producers are all launched, the one of highest rank (ties: the schedule's own order). So
   at every fork the branch with the longest way to the end is launched first, and on each stream its
   operators queue ahead of a shorter branch's.
3. Events again for every cross-stream edge of the transitive reduction (the order no longer orders what the
   schedule's own events assumed), and IOS's stages dropped (the launch order no longer follows them).

The GPU starts the thread blocks of kernels that are ready together roughly in launch order, so the operators
that decide the end get the SMs first, and the short branches fill what they leave. Whether a CUDA Graph's
replay keeps that order is what measuring the variant tells (``scripts/exp_launch_order.py``).
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Callable
from typing import Any

from .base import Schedule, Scheduler, cross_stream_events

#: the suffix of a critical-first variant's name
SUFFIX = "+critical-first"


def upward_ranks(graph: Any, latency: Callable[[int], float]) -> list[float]:
    """Each operator's latency plus the largest rank of its successors (operators in topological index order)."""
    ranks = [0.0] * len(graph)
    for op in reversed(range(len(graph))):
        ranks[op] = latency(op) + max((ranks[s] for s in graph.succs(op)), default=0.0)
    return ranks


def critical_first(schedule: Schedule, graph: Any, latency: Callable[[int], float]) -> Schedule:
    """``schedule`` with the launch order of the module docstring (streams kept, events made again), named
    ``schedule.name + SUFFIX``; checked against ``graph``."""
    ranks = upward_ranks(graph, latency)
    position = {op: i for i, op in enumerate(schedule.order)}
    waiting = [len(graph.preds(op)) for op in range(len(graph))]
    ready = [(-ranks[op], position[op], op) for op in range(len(graph)) if not waiting[op]]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        op = heapq.heappop(ready)[2]
        order.append(op)
        for s in graph.succs(op):
            waiting[s] -= 1
            if not waiting[s]:
                heapq.heappush(ready, (-ranks[s], position[s], s))
    return dataclasses.replace(
        schedule, name=schedule.name + SUFFIX, order=order, events=cross_stream_events(graph, schedule.stream_of),
        stages=None, meta={**schedule.meta, "order": "critical-first"}).validate(graph)


class CriticalFirst(Scheduler):
    """Another scheduler's streams in critical-first launch order (:func:`critical_first`), by the cost's
    operator latencies; named ``inner.name + SUFFIX`` (``opara+critical-first``), as :func:`opbench.schedule.
    get_scheduler` takes it."""

    def __init__(self, inner: Scheduler) -> None:
        self.inner = inner
        self.name = inner.name + SUFFIX

    def schedule(self, graph: Any, cost: Any = None) -> Schedule:
        from .cost import SchedulingCost

        latency = cost.latency if isinstance(cost, SchedulingCost) else SchedulingCost(graph).latency
        return critical_first(self.inner.schedule(graph, cost), graph, latency)


__all__ = ["SUFFIX", "CriticalFirst", "critical_first", "upward_ranks"]
