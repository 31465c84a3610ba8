"""The schedulers' cost from predictors instead of measurements.

:class:`PredictedCost` is a :class:`~opbench.schedule.cost.SchedulingCost` whose operator latencies
come from a latency predictor (nothing is timed) and, with a co-run predictor, whose stages of
several concurrent groups last what the co-run predictor says: each group is one member, its solo
time the sum of its operators' predicted latencies, its features those of its longest operator.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..schedule.cost import SchedulingCost


def operator_dicts(graph: Any, resources: dict[int, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The operators of ``graph`` as predictor inputs (graph features and, where known, kernel resources)."""
    resources = resources or {}
    return [{**node.to_dict(), **resources.get(node.index, {})} for node in graph]


class PredictedCost(SchedulingCost):
    """Scheduling cost of ``graph`` from a latency predictor and, optionally, a co-run predictor."""

    def __init__(self, graph: Any, latency: Any, corun: Any = None, resources: dict[int, dict[str, Any]] | None = None,
                 device: dict[str, Any] | None = None, **options: Any) -> None:
        self.ops = operator_dicts(graph, resources)
        super().__init__(graph, [float(t) for t in latency.predict(self.ops)], resources,
                         **{**self.figures(device), **options})
        self.corun = corun
        self._stages: dict[tuple[tuple[int, ...], ...], float] = {}

    def stage_latency(self, groups: Sequence[Sequence[int]]) -> float:
        """The co-run predictor's time for a stage of several groups (else the base model's)."""
        if self.corun is None or len(groups) < 2:
            return super().stage_latency(groups)
        key = tuple(tuple(g) for g in groups)
        if key not in self._stages:
            solo = [sum(self.latency(i) for i in g) for g in groups]
            members = [self.ops[max(g, key=self.latency)] for g in groups]
            together = self.corun.concurrent(members, solo, self.sm_count)
            self._stages[key] = max(together, max(solo)) + self.fork_s * (len(groups) - 1)
        return self._stages[key]


def predicted_schedulers(names: Sequence[Any], latency: Any, corun: Any = None,
                         resources: dict[int, dict[str, Any]] | None = None,
                         device: dict[str, Any] | None = None) -> list[Any]:
    """``<name>-predicted`` schedulers: each builds its :class:`PredictedCost` while it schedules."""
    from ..schedule import WithCost

    def make(graph: Any) -> PredictedCost:
        return PredictedCost(graph, latency, corun, resources, device)

    return [WithCost(name, make, f"{getattr(name, 'name', name)}-predicted") for name in names]


__all__ = ["PredictedCost", "operator_dicts", "predicted_schedulers"]
