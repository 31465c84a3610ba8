"""Search strategies that MetaSchedule lacks, built on its ``PySearchStrategy`` extension point.

:class:`GridSearch` walks a task's design space exhaustively, as AutoTVM's grid-search tuner walks
its config space: every sketch's sampling decisions (each tiling of every ``SamplePerfectTile``,
each candidate of every ``SampleCategorical``) are digits of one mixed-radix grid index, the last
decision varying fastest, and candidates are taken in index order (sketches interleaved). A
compute location depends on the loops chosen before it, so it stays as the sketch sampled it.
Candidates that postprocessing rejects are skipped; no cost model is consulted. A re-run continues
the walk after the candidates its database already holds.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from typing import Any

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.search_strategy import PySearchStrategy

from .space import _divisors, perfect_tilings


def nth_tiling(extent: int, parts: int, max_innermost: int, index: int) -> list[int]:
    """The ``index``-th ordered factorization of ``extent`` into ``parts`` factors (the order that
    :func:`~opbench.tune.space.perfect_tilings` counts), the innermost at most ``max_innermost``."""
    if parts == 1:
        return [extent]
    for d in _divisors(extent):
        count = perfect_tilings(extent // d, parts - 1, max_innermost)
        if index < count:
            return [d, *nth_tiling(extent // d, parts - 1, max_innermost, index)]
        index -= count
    raise IndexError("tiling index out of range")


class _Grid:
    """One sketch's decision grid: ``(instruction, domain size, decode)`` per digit."""

    def __init__(self, sketch: Any) -> None:
        self.sketch = sketch
        trace = sketch.trace
        self.digits: list[tuple[Any, int, Any]] = []
        for inst in trace.insts:
            kind = inst.kind.name
            decision = trace.decisions.get(inst) if inst in trace.decisions else None
            if kind == "SamplePerfectTile" and decision is not None:
                parts, inner = int(inst.attrs[0]), int(inst.attrs[1])
                extent = math.prod(int(x) for x in decision)
                count = perfect_tilings(extent, parts, inner)
                if count:
                    self.digits.append((inst, count, functools.partial(nth_tiling, extent, parts, inner)))
            elif kind == "SampleCategorical" and decision is not None:
                self.digits.append((inst, len(inst.attrs[0]), int))
        self.size = math.prod(n for _, n, _ in self.digits)

    def decisions(self, index: int) -> dict[Any, Any]:
        """Decisions at grid position ``index`` (last digit fastest)."""
        chosen = {}
        for inst, count, decode in reversed(self.digits):
            index, digit = divmod(index, count)
            chosen[inst] = decode(digit)
        return chosen


@derived_object
class GridSearch(PySearchStrategy):
    """Exhaustive walk over the design space's decisions (see the module docstring)."""

    MAX_REJECTED = 4096  # grid positions tried per batch before the walk gives up

    def __init__(self) -> None:
        super().__init__()
        self.context: Any = None
        self.grids: list[_Grid] = []
        self.walk: Iterator[tuple[_Grid, int]] | None = None
        self.left = 0
        self.per_iter = 0

    def _initialize_with_tune_context(self, context: Any) -> None:
        self.context = context

    def pre_tuning(self, max_trials: int, num_trials_per_iter: int, design_spaces: list[Any],
                   database: Any = None, cost_model: Any = None) -> None:
        self.grids = [g for g in (_Grid(s) for s in design_spaces) if g.size]
        done = 0
        if database is not None and database.has_workload(self.context.mod):
            done = len(database.get_top_k(database.commit_workload(self.context.mod), 1 << 30))
        self.walk = self._positions(done)
        self.left, self.per_iter = max_trials, num_trials_per_iter

    def _positions(self, skip: int) -> Iterator[tuple[_Grid, int]]:
        """Grid positions, sketches interleaved, after the first ``skip``."""
        biggest = max((g.size for g in self.grids), default=0)
        seen = 0
        for index in range(biggest):
            for grid in self.grids:
                if index < grid.size:
                    if seen >= skip:
                        yield grid, index
                    seen += 1

    def post_tuning(self) -> None:
        self.walk = None

    def _candidate(self, grid: _Grid, index: int) -> Any:
        from tvm.s_tir import Schedule
        from tvm.s_tir.meta_schedule.arg_info import ArgInfo
        from tvm.s_tir.meta_schedule.search_strategy import MeasureCandidate

        chosen = grid.decisions(index)
        sch = Schedule(self.context.mod, debug_mask="all")
        try:
            grid.sketch.trace.apply_to_schedule(
                sch, remove_postproc=True,
                decision_provider=lambda inst, _inputs, _attrs, decision: chosen.get(inst, decision))
        except Exception:  # a decision the sketch cannot take (e.g. a compute location it no longer has)
            return None
        for postproc in self.context.space_generator.postprocs:
            if not postproc.apply(sch):
                return None
        return MeasureCandidate(sch, ArgInfo.from_entry_func(sch.mod, remove_preproc=True))

    def generate_measure_candidates(self) -> list[Any] | None:
        if self.walk is None or self.left <= 0:
            return None
        batch, rejected = [], 0
        for grid, index in self.walk:
            candidate = self._candidate(grid, index)
            if candidate is not None:
                batch.append(candidate)
                if len(batch) >= min(self.per_iter, self.left):
                    break
            else:
                rejected += 1
                if rejected >= self.MAX_REJECTED:  # a corner of the grid that postprocessing rejects
                    break
        if not batch:
            return None
        self.left -= len(batch)
        return batch

    def notify_runner_results(self, measure_candidates: list[Any], results: list[Any]) -> None:
        pass

    def clone(self) -> Any:
        return GridSearch()


__all__ = ["GridSearch", "nth_tiling"]
