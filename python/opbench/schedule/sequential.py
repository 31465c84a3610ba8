# Sequential: every operator on one stream, in topological (program) order. No events. The
# baseline every parallel schedule must beat, and the fallback when none does.
"""Sequential scheduling."""

from __future__ import annotations

from typing import Any

from .base import Schedule, Scheduler


class Sequential(Scheduler):
    name = "sequential"

    def schedule(self, graph: Any, cost: Any = None) -> Schedule:
        n = len(graph)
        return Schedule(self.name, [0] * n, list(range(n)), [], [[list(range(n))]] if n else [])
