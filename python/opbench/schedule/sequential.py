"""Sequential scheduling: the baseline every parallel schedule must beat, and the fallback.

Algorithm
---------
1. Put every operator on stream 0.
2. Launch in topological (program) order.
3. No events (one stream orders everything).
"""

from __future__ import annotations

from typing import Any

from .base import Schedule, Scheduler


class Sequential(Scheduler):
    name = "sequential"

    def schedule(self, graph: Any, cost: Any = None) -> Schedule:
        n = len(graph)
        return Schedule(self.name, [0] * n, list(range(n)), [], [[list(range(n))]] if n else [])
