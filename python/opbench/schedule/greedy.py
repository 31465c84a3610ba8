# Greedy / wavefront: stage i holds the operators whose longest path from the inputs has length i
# (the ready set once stage i-1 is done). Each stage's operators are dealt round-robin onto at
# most k streams; stages run one after another, ordered by events on cross-stream edges.
"""Greedy wavefront scheduling."""

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
