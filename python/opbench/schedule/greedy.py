"""Greedy (wavefront) scheduling.

Algorithm
---------
1. Level every operator by its longest path from the inputs (ASAP levels): level i is the ready
   set once levels 0..i-1 are done.
2. Each level is a stage; deal its operators round-robin onto at most ``max_streams`` streams.
3. Run the stages one after another: launch order is level by level, and every cross-stream
   edge of the transitive reduction gets an event.
"""

from __future__ import annotations

from typing import Any

from ..ir.dag import levels
from .base import Schedule, Scheduler, from_stages


class Greedy(Scheduler):
    name = "greedy"

    def __init__(self, max_streams: int = 4) -> None:
        self.max_streams = max(1, max_streams)

    def schedule(self, graph: Any, cost: Any = None) -> Schedule:
        stages = []
        for ops in levels(graph):
            k = min(self.max_streams, len(ops))
            stages.append([ops[i::k] for i in range(k)])
        return from_stages(self.name, graph, stages, {"max_streams": self.max_streams})
