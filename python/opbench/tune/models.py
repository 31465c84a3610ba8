"""Cost-model parts that MetaSchedule lacks, built on its extension points.

* :class:`KnobFeatures` (``PyFeatureExtractor``): a candidate's decoded knobs as one feature row,
  AutoTVM's ``knob`` features.
* :class:`IterVarFeatures` (``PyFeatureExtractor``): per-loop features of the scheduled program
  (extent, loop kind, depth) for its outermost loops, AutoTVM's ``itervar`` features.
* :class:`CurveFeatures` (``PyFeatureExtractor``): per-buffer touch and reuse curves over the loop
  nest (how many distinct elements each buffer touches, and how often they are reused, inside the
  innermost 1, 2, ... loops), sampled at fixed points, AutoTVM's ``curve`` features.
* :class:`RankXGBModel` (an ``XGBModel``): XGBoost trained with a pairwise ranking loss on the
  candidates' summed scores, AutoTVM's ``rank`` objective; search only needs their order.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.cost_model import XGBModel
from tvm.s_tir.meta_schedule.feature_extractor import PyFeatureExtractor

from .knobs import knob_vector

KNOB_LENGTH = 64
ITERVAR_LOOPS = 24
_KINDS = 5  # serial, parallel, vectorized, unrolled, thread binding


def _tensor(rows: np.ndarray) -> Any:
    import tvm

    return tvm.runtime.tensor(rows.astype("float32"))


@derived_object
class KnobFeatures(PyFeatureExtractor):
    """One row per candidate: its trace's decisions, tile factors as log2 (see ``knobs.knob_vector``)."""

    def extract_from(self, context: Any, candidates: list[Any]) -> list[Any]:
        return [_tensor(np.array([knob_vector(c.sch.trace, KNOB_LENGTH)])) for c in candidates]


def _loops(stmt: Any, depth: int, out: list[tuple[Any, int]]) -> None:
    from tvm import tirx

    if stmt is None or len(out) >= ITERVAR_LOOPS:
        return
    if isinstance(stmt, tirx.For):
        out.append((stmt, depth))
        _loops(stmt.body, depth + 1, out)
        return
    if isinstance(stmt, tirx.SeqStmt):
        for s in stmt.seq:
            _loops(s, depth, out)
        return
    for attr in ("block", "body", "init", "then_case", "else_case"):
        child = getattr(stmt, attr, None)
        if child is not None and child is not stmt:
            _loops(child, depth, out)


def itervar_row(func: Any) -> np.ndarray:
    """Features of the first loops of a scheduled PrimFunc: log2 extent, kind (one-hot), depth."""
    loops: list[tuple[Any, int]] = []
    _loops(func.body, 0, loops)
    row = np.zeros(ITERVAR_LOOPS * (2 + _KINDS), dtype="float32")
    for i, (loop, depth) in enumerate(loops):
        base = i * (2 + _KINDS)
        try:
            extent = int(loop.extent)
        except (TypeError, ValueError):
            extent = 1
        row[base] = math.log2(max(extent, 1) + 1)
        row[base + 1] = depth
        row[base + 2 + min(int(loop.kind), _KINDS - 1)] = 1.0
    return row


@derived_object
class IterVarFeatures(PyFeatureExtractor):
    """One row per candidate: :func:`itervar_row` of its scheduled program."""

    def extract_from(self, context: Any, candidates: list[Any]) -> list[Any]:
        return [_tensor(itervar_row(c.sch.mod["main"])[None, :]) for c in candidates]


CURVE_BUFFERS = 5
CURVE_POINTS = 8


def _vars(expr: Any) -> set[Any]:
    from tvm.tirx.analysis import undefined_vars

    return set(undefined_vars(expr))


def _loads(expr: Any, out: list[Any]) -> None:
    """Every ``BufferLoad`` inside an expression."""
    import tvm

    if type(expr).__name__ in ("BufferLoad", "TensorLoad"):  # the class name differs across TVM versions
        out.append(expr)
    for attr in ("a", "b", "value", "condition", "true_value", "false_value", "base", "stride"):
        child = getattr(expr, attr, None)
        if isinstance(child, tvm.ir.Expr):
            _loads(child, out)
    for attr in ("args", "indices"):
        for child in getattr(expr, attr, None) or ():
            if isinstance(child, tvm.ir.Expr):
                _loads(child, out)


def _accesses(func: Any) -> list[tuple[str, list[tuple[Any, int]], set[Any]]]:
    """Every buffer access: (buffer name, enclosing loops outer to inner with extents, loop
    variables its indices depend on); block variables are traced to the loops bound to them."""
    from tvm import tirx

    out: list[tuple[str, list[tuple[Any, int]], set[Any]]] = []

    def loop_vars(indices: Any, binding: dict[Any, set[Any]]) -> set[Any]:
        found: set[Any] = set()
        for index in indices:
            for v in _vars(index):
                found |= binding.get(v, {v})
        return found

    def visit(node: Any, loops: list[tuple[Any, int]], binding: dict[Any, set[Any]]) -> None:
        if isinstance(node, tirx.For):
            try:
                extent = int(node.extent)
            except (TypeError, ValueError):
                extent = 1
            visit(node.body, [*loops, (node.loop_var, extent)], binding)
        elif isinstance(node, tirx.SeqStmt):
            for child in node.seq:
                visit(child, loops, binding)
        elif hasattr(node, "iter_values") and hasattr(node, "block"):  # a block realize: bind its vars
            inner = dict(binding)
            for iv, value in zip(node.block.iter_vars, node.iter_values, strict=False):
                inner[iv.var] = set().union(*(binding.get(v, {v}) for v in _vars(value))) if _vars(value) else set()
            visit(node.block, loops, inner)
        elif isinstance(node, tirx.BufferStore):
            out.append((node.buffer.name, loops, loop_vars(node.indices, binding)))
            loads: list[Any] = []
            _loads(node.value, loads)
            for load in loads:
                source = getattr(load, "buffer", None) or getattr(load, "source", None)  # BufferLoad / TensorLoad
                out.append((str(getattr(source, "name", source)), loops, loop_vars(load.indices, binding)))
        else:
            for attr in ("body", "block", "init", "then_case", "else_case"):
                child = getattr(node, attr, None)
                if child is not None and child is not node:
                    visit(child, loops, binding)

    visit(func.body, [], {})
    return out


def curve_row(func: Any) -> np.ndarray:
    """Touch and reuse curves of a scheduled PrimFunc's buffers (see the module docstring).

    For an access inside loops ``l_1 .. l_n`` (outer to inner), level ``k`` covers the ``k``
    innermost loops: the elements touched there are the product of the extents of those loops
    the indices depend on, the reuse the product of the others. Each curve is sampled at levels
    1..``CURVE_POINTS`` as log2(1 + value); a buffer accessed several times keeps the largest.
    """
    curves: dict[str, np.ndarray] = {}
    for name, loops, used in _accesses(func):
        touched = reuse = 1
        points = np.zeros((CURVE_POINTS, 2), dtype="float64")
        inner = list(reversed(loops))
        for k in range(CURVE_POINTS):
            if k < len(inner):
                var, extent = inner[k]
                if var in used:
                    touched *= extent
                else:
                    reuse *= extent
            points[k] = (math.log2(1 + touched), math.log2(1 + reuse))
        curves[name] = np.maximum(curves.get(name, points), points)
    ranked = sorted(curves.values(), key=lambda c: -c[-1, 0])[:CURVE_BUFFERS]
    row = np.zeros((CURVE_BUFFERS, CURVE_POINTS, 2), dtype="float32")
    for i, curve in enumerate(ranked):
        row[i] = curve
    return row.reshape(-1)


@derived_object
class CurveFeatures(PyFeatureExtractor):
    """One row per candidate: :func:`curve_row` of its scheduled program."""

    def extract_from(self, context: Any, candidates: list[Any]) -> list[Any]:
        return [_tensor(curve_row(c.sch.mod["main"])[None, :]) for c in candidates]


@derived_object
class RankXGBModel(XGBModel._cls):  # noqa: SLF001
    """XGBoost with a pairwise logistic ranking loss over candidates (rows of one candidate sum).

    Derived from the class that ``XGBModel``'s ``derived_object`` wraps: MetaSchedule calls the methods of
    the wrapped object, so a plain subclass of ``XGBModel`` tunes with XGBModel's own ``_train`` (squared
    error), which ``xgb-rank`` did until 2026-11-28."""

    rounds = 120

    def _train(self, xs: list[np.ndarray], ys: np.ndarray) -> None:  # noqa: N803 (MetaSchedule's names)
        import xgboost as xgb
        from tvm.s_tir.meta_schedule.cost_model.xgb_model import PackSum

        packed = PackSum(xs=xs, ys=ys)
        ids, n = packed.ids, len(ys)
        ys = np.asarray(ys, dtype="float64")
        rng = np.random.default_rng(0)

        def objective(preds: np.ndarray, _data: Any) -> tuple[np.ndarray, np.ndarray]:
            score = np.bincount(ids, weights=preds, minlength=n)
            i, j = rng.integers(0, n, 16 * n), rng.integers(0, n, 16 * n)
            keep = ys[i] != ys[j]
            i, j = i[keep], j[keep]
            sign = np.where(ys[i] > ys[j], 1.0, -1.0)
            p = 1.0 / (1.0 + np.exp(np.clip(sign * (score[i] - score[j]), -30, 30)))
            grad, hess = np.zeros(n), np.zeros(n)
            np.add.at(grad, i, -sign * p)
            np.add.at(grad, j, sign * p)
            np.add.at(hess, i, p * (1 - p))
            np.add.at(hess, j, p * (1 - p))
            return grad[ids], np.maximum(hess[ids], 1e-6)

        self.booster = xgb.train(self.config.to_dict(), packed.dmatrix, num_boost_round=self.rounds,
                                 obj=objective)
