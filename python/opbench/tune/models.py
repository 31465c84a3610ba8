"""Cost-model parts that MetaSchedule lacks, built on its extension points.

* :class:`KnobFeatures` (``PyFeatureExtractor``): a candidate's decoded knobs as one feature row,
  AutoTVM's ``knob`` features.
* :class:`IterVarFeatures` (``PyFeatureExtractor``): per-loop features of the scheduled program
  (extent, loop kind, depth) for its outermost loops, AutoTVM's ``itervar`` features.
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


class RankXGBModel(XGBModel):
    """XGBoost with a pairwise logistic ranking loss over candidates (rows of one candidate sum)."""

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
