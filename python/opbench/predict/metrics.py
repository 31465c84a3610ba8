"""Held-out metrics of the predictors (defined in ``docs/predictors.md``).

* ``mape``: mean of ``|predicted - measured| / measured`` over latencies (seconds), not over
  relative speeds.
* ``within_10pct``: share of predictions within ±10 % of the measurement (nn-Meter's measure).
* ``rmse``, ``r2``: root mean squared error and the coefficient of determination of the quantity
  the model predicts (latency in milliseconds; for ``trials`` the candidate's speed relative to
  its task's best).
* ``pairwise``: over every pair of items in the same group (task or model) with different
  measurements, the share the prediction orders the same way.
* ``top1``, ``top5``: TenSet's top-k score: for each task, the best measured latency over the
  best measured latency among the k candidates predicted best, combined over tasks as
  ``sum(w * best) / sum(w * best_in_top_k)`` with the task's weight ``w`` (its uses in the model).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Sequence

import numpy as np


def by_group(groups: Sequence[Hashable]) -> dict[Hashable, list[int]]:
    """Item indices per group, groups in order of first appearance."""
    out: dict[Hashable, list[int]] = defaultdict(list)
    for i, g in enumerate(groups):
        out[g].append(i)
    return dict(out)


def _arrays(measured: Sequence[float], predicted: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    y = np.asarray(measured, dtype="float64")
    p = np.asarray(predicted, dtype="float64")
    if y.shape != p.shape:
        raise ValueError(f"measured and predicted differ in length ({y.size} and {p.size})")
    return y, p


def mape(measured: Sequence[float], predicted: Sequence[float]) -> float | None:
    """Mean absolute percentage error as a fraction (0.1 = 10 %); None when empty."""
    y, p = _arrays(measured, predicted)
    return float(np.mean(np.abs(p - y) / np.abs(y))) if y.size else None


def within(measured: Sequence[float], predicted: Sequence[float], tolerance: float = 0.10) -> float | None:
    """Share of predictions within ``±tolerance`` of the measurement."""
    y, p = _arrays(measured, predicted)
    return float(np.mean(np.abs(p - y) <= tolerance * np.abs(y))) if y.size else None


def rmse(measured: Sequence[float], predicted: Sequence[float]) -> float | None:
    """Root mean squared error."""
    y, p = _arrays(measured, predicted)
    return float(np.sqrt(np.mean((p - y) ** 2))) if y.size else None


def r2(measured: Sequence[float], predicted: Sequence[float]) -> float | None:
    """Coefficient of determination (None with fewer than two distinct measurements)."""
    y, p = _arrays(measured, predicted)
    if y.size < 2 or np.all(y == y[0]):
        return None
    return float(1.0 - np.sum((p - y) ** 2) / np.sum((y - y.mean()) ** 2))


def pair_counts(measured: Sequence[float], predicted: Sequence[float], groups: Sequence[Hashable],
                tie: float = 0.0) -> tuple[int, int]:
    """Pairs of one group's items that ``predicted`` orders as ``measured`` does, and all pairs compared: a
    pair whose measurements differ by at most ``tie`` of the larger (0: equal ones) is left out."""
    y, p = _arrays(measured, predicted)
    right = total = 0
    for idx in by_group(groups).values():
        if len(idx) < 2:
            continue
        yy, pp = y[idx], p[idx]
        dy = np.sign(yy[:, None] - yy[None, :])
        dp = np.sign(pp[:, None] - pp[None, :])
        apart = np.abs(yy[:, None] - yy[None, :]) > tie * np.maximum(np.abs(yy[:, None]), np.abs(yy[None, :]))
        upper = np.triu(np.ones_like(dy, dtype=bool), 1) & (dy != 0) & apart
        total += int(upper.sum())
        right += int((dy[upper] == dp[upper]).sum())
    return right, total


def pairwise(measured: Sequence[float], predicted: Sequence[float], groups: Sequence[Hashable],
             tie: float = 0.0) -> float | None:
    """Pairwise ranking accuracy inside each group (None when no group has two different items; ``tie``:
    :func:`pair_counts`)."""
    right, total = pair_counts(measured, predicted, groups, tie)
    return right / total if total else None


def top_k(latency: Sequence[float], score: Sequence[float], groups: Sequence[Hashable], k: int,
          weights: dict[Hashable, float] | None = None) -> float | None:
    """TenSet's top-k score: ``score`` is higher for candidates predicted faster."""
    lat = np.asarray(latency, dtype="float64")
    sc = np.asarray(score, dtype="float64")
    best_sum = chosen_sum = 0.0
    for g, idx in by_group(groups).items():
        w = (weights or {}).get(g, 1.0)
        order = np.argsort(-sc[idx], kind="stable")[:k]
        best_sum += w * float(lat[idx].min())
        chosen_sum += w * float(lat[np.asarray(idx)[order]].min())
    return best_sum / chosen_sum if chosen_sum else None


def regression_metrics(measured: Sequence[float], predicted: Sequence[float], groups: Sequence[Hashable],
                       scale: float = 1e3) -> dict[str, float | None]:
    """The metrics of a latency-like prediction (seconds); rmse in ``1/scale`` seconds (ms)."""
    y, p = _arrays(measured, predicted)
    return {"mape": mape(y, p), "within_10pct": within(y, p), "rmse": rmse(y * scale, p * scale),
            "r2": r2(y, p), "pairwise": pairwise(y, p, groups), "top1": None, "top5": None}


__all__ = ["by_group", "mape", "pairwise", "r2", "regression_metrics", "rmse", "top_k", "within"]
