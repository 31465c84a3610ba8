"""Opara scheduling (Chen et al., 2023): stream allocation and resource-aware launch order.

Algorithm 1, stream allocation
------------------------------
1. Visit operators in topological order.
2. An operator takes the stream of its first predecessor that has not yet handed its stream to
   another successor (and marks it handed);
3. else it reuses a stream whose last operator is one of its ancestors (that stream is finished
   for it);
4. else it opens a new stream, up to a cap;
5. else it joins the stream whose last operator came earliest.
6. Every cross-stream edge of the transitive reduction becomes an event.

Algorithm 2, launch order
-------------------------
1. Keep two ready queues: memory-bound and compute-bound operators (arithmetic intensity,
   FLOPs per byte, against the device's ridge point).
2. Alternate between the queues.
3. From the chosen queue launch the ready operator with the smallest resource demand (shared
   memory, threads in flight, registers, from the compiled kernel where known).
"""

from __future__ import annotations

from typing import Any

from ..ir.dag import reach_bits
from .base import Schedule, Scheduler, cross_stream_events
from .cost import SchedulingCost


def allocate_streams(graph: Any, max_streams: int) -> list[int]:
    """Opara's Alg. 1 with a stream cap and reuse of finished streams."""
    n = len(graph)
    reach = reach_bits(graph)
    handed = [False] * n
    stream_of = [-1] * n
    last: list[int] = []
    for v in range(n):
        stream = None
        for u in graph.preds(v):
            if not handed[u]:
                handed[u] = True
                stream = stream_of[u]
                break
        if stream is None:
            stream = next((s for s, op in enumerate(last) if (reach[op] >> v) & 1), None)
        if stream is None and len(last) < max_streams:
            last.append(v)
            stream = len(last) - 1
        if stream is None:
            stream = min(range(len(last)), key=lambda s: last[s])
        stream_of[v] = stream
        last[stream] = v
    return stream_of


def launch_order(graph: Any, cost: SchedulingCost) -> list[int]:
    """Opara's Alg. 2: alternate memory- and compute-bound ready queues, smallest demand first."""
    n = len(graph)
    missing = [len(graph.preds(v)) for v in range(n)]
    ready = {v for v in range(n) if missing[v] == 0}
    order: list[int] = []
    want_compute = True
    while ready:
        compute = [v for v in ready if cost.compute_bound(v)]
        memory = [v for v in ready if not cost.compute_bound(v)]
        queue = (compute or memory) if want_compute else (memory or compute)
        v = min(queue, key=lambda op: (cost.resource_key(op), op))
        want_compute = not cost.compute_bound(v)
        ready.remove(v)
        order.append(v)
        for w in graph.succs(v):
            missing[w] -= 1
            if missing[w] == 0:
                ready.add(w)
    return order


class Opara(Scheduler):
    name = "opara"

    def __init__(self, max_streams: int = 32, reorder: bool = True) -> None:
        self.max_streams = max(1, max_streams)
        self.reorder = reorder

    def schedule(self, graph: Any, cost: SchedulingCost | None = None) -> Schedule:
        stream_of = allocate_streams(graph, self.max_streams)
        order = launch_order(graph, cost or SchedulingCost(graph)) if self.reorder else list(range(len(graph)))
        return Schedule(self.name, stream_of, order, cross_stream_events(graph, stream_of), None,
                        {"max_streams": self.max_streams, "reorder": self.reorder})
