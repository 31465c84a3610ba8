"""Operator latency predictor: one operator's latency on one device from its features.

XGBoost regression on ``log(latency)`` over :mod:`opbench.predict.features`: ``graph`` features,
``graph+launch`` (default; adds the default schedule's thread blocks, threads per block and threads in all, known
without compiling) or ``graph+kernel`` (adds the compiled kernel's resources).

Two boosters, averaged in log space: one on its own, and one that corrects a log-linear baseline
(least squares of ``log(latency)`` on log FLOPs, log bytes and the log of the threads launched,
:func:`~opbench.predict.features.baseline_columns`), given to XGBoost as the base margin. Trees
alone cannot go beyond the latencies they were trained on; the baseline extrapolates, so an operator
larger than any in the training rows (mobilenet's depthwise convolutions, 451,584 thread blocks) is
not clipped to the largest one seen. The trees alone are closer on operators like those they saw;
the average keeps most of both. Each of the two is trained :data:`SEEDS` times with other random
row and column samples and all are averaged: a single booster's held-out share within ±10 % moved
by up to 6 points from one seed to the next.
Trained on the ``operators`` table's rows of one device and one kernel configuration
(``default`` kernels unless told).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..dataset import row_dtype
from ..errors import OpBenchError
from .base import Predictor, dataset_rows, xgb_regressor
from .features import FEATURE_SETS, baseline_columns, operator_feature_names, operator_matrix, task_signature
from .metrics import by_group, regression_metrics
from .splits import check_split, folds, group_label

MIN_ROWS = 20
#: a row whose repeats disagree by more than this (``(max - min) / min``) does not train: something else ran on
#: the device while it was timed (a max pool measured at 35-60 us where the same operator takes 10 us elsewhere)
UNSTABLE_SPREAD = 0.2
SEEDS = 2  # boosters of each kind, trained with seeds seed, seed + 1, ...


class LatencyPredictor(Predictor):
    """Predicts seconds per operator; ``meta['feature_set']`` says which features it needs."""

    what = "latency"

    @classmethod
    def fit(cls, ops: Sequence[dict[str, Any]], feature_set: str = "graph+launch", seed: int = 0,
            meta: dict[str, Any] | None = None) -> LatencyPredictor:
        """Train on operator rows (``latency_median_s`` and the feature columns); rows whose repeats disagree
        by more than :data:`UNSTABLE_SPREAD` are left out (all are kept if too few would remain)."""
        kept = [r for r in ops if stable(r)]
        ops = kept if len(kept) >= MIN_ROWS else list(ops)
        y = np.log(np.array([float(r["latency_median_s"]) for r in ops]))
        base = baseline_columns(ops, feature_set)
        fill = [float(np.nanmean(c)) if np.isfinite(c).any() else 0.0 for c in base.T]
        base = np.where(np.isnan(base), fill, base)
        coef, *_ = np.linalg.lstsq(base, y, rcond=None)
        obj = cls({**(meta or {}), "feature_set": feature_set, "features": operator_feature_names(feature_set),
                   "n_rows": len(ops), "baseline": {"coef": coef.tolist(), "fill": fill},
                   "latency_range_s": [float(np.exp(y.min())), float(np.exp(y.max()))]})
        x = operator_matrix(ops, feature_set)
        for i in range(SEEDS):
            suffix = f".{i}" if i else ""
            obj.boosters["latency" + suffix] = xgb_regressor(x, y, seed=seed + i, margin=base @ coef)
            obj.boosters["latency_trees" + suffix] = xgb_regressor(x, y, seed=seed + i)
        return obj

    def baseline(self, ops: Sequence[dict[str, Any]]) -> np.ndarray | None:
        """The log-linear baseline (log seconds) under the trees; None for a predictor without one."""
        fit = self.meta.get("baseline")
        if not fit:
            return None
        base = baseline_columns(ops, self.feature_set)
        return np.where(np.isnan(base), fit["fill"], base) @ np.asarray(fit["coef"])

    @property
    def feature_set(self) -> str:
        return str(self.meta.get("feature_set", "graph"))

    def predict(self, ops: Sequence[dict[str, Any]]) -> np.ndarray:
        """Seconds per operator (dataset rows or ``OpNode.to_dict()``, with kernel resources when the
        predictor was trained with them)."""
        if self.meta.get("features") != operator_feature_names(self.feature_set):
            raise OpBenchError("this latency predictor was trained by an older OpBench with other features: "
                               "train it again with 'opbench train --what latency'")
        if self.feature_set == "graph+kernel":
            missing = [i for i, op in enumerate(ops) if op.get("threads") is None and op.get("grid") is None]
            if missing:
                raise OpBenchError(f"this latency predictor needs kernel resources (trained with graph+kernel "
                                   f"features), which {len(missing)} operator(s) lack: compile them first, or "
                                   "train with --features graph+launch")
        x = operator_matrix(ops, self.feature_set)
        margin = self.baseline(ops)
        log_s = [self.booster_predict(name, x, None if name.startswith("latency_trees") else margin)
                 for name in self.boosters]
        return np.exp(np.mean(log_s, axis=0))


def latency_rows(path: str, device: str | None = None, config: str = "default") -> tuple[list[dict[str, Any]], str]:
    """The measured operator rows of one device and kernel configuration."""
    rows, device_name = dataset_rows(path, "operators", device)
    configs = sorted({str(r.get("config")) for r in rows if r.get("config") is not None})
    if rows and config not in configs:
        raise OpBenchError(f"--config {config!r}: no operator rows of {device_name} have it (accepted: "
                           f"{', '.join(configs)})")
    rows = [r for r in rows if r.get("config") == config and r.get("latency_median_s")]
    return rows, device_name


def stable(row: dict[str, Any]) -> bool:
    """Whether a row's repeats agree within :data:`UNSTABLE_SPREAD` (rows without min/max count as stable)."""
    low, high = row.get("latency_min_s"), row.get("latency_max_s")
    if not low or high is None:
        return True
    return (float(high) - float(low)) / float(low) <= UNSTABLE_SPREAD


def sampled(row: dict[str, Any]) -> bool:
    """Whether a row is a sampled operator (the ``simple`` model ``kernels``): such rows train every
    fold and are never held out, since no user's model is made of them."""
    return row.get("source") == "simple" and row.get("model") == "kernels"


def group_of(rows: Sequence[dict[str, Any]], split: str) -> list[str]:
    """Each row's group for ``split``: its model or precision, or its task signature."""
    if split in ("by_model", "by_dtype"):
        return [group_label(r, split) for r in rows]
    return [task_signature(r) for r in rows]


def evaluate(rows: Sequence[dict[str, Any]], split: str, k: int = 5, feature_set: str = "graph+launch", seed: int = 0
             ) -> dict[str, Any]:
    """Cross-validated held-out metrics (see :mod:`opbench.predict.splits`); ``predicted`` holds each
    held-out operator's prediction, in the order of ``predicted_rows`` (the rows of models, sampled-kernel
    rows left out: those only ever train)."""
    check_split(split)
    if feature_set not in FEATURE_SETS:
        raise OpBenchError(f"unknown --features '{feature_set}' (accepted: {', '.join(FEATURE_SETS)})")
    if len(rows) < MIN_ROWS:
        raise OpBenchError(f"too few measured operator rows for training: {len(rows)} (needed: at least {MIN_ROWS})")
    extra = [r for r in rows if sampled(r)]
    rows = [r for r in rows if not sampled(r)]
    if len(rows) < 2:
        raise OpBenchError(f"too few measured operator rows of models to hold out: {len(rows)} (needed: at least 2)")
    groups = group_of(rows, split)
    predicted = np.zeros(len(rows))
    n_train = []
    for train, test in folds(groups, split, k, seed):
        model = LatencyPredictor.fit([rows[i] for i in train] + extra, feature_set, seed)
        predicted[test] = model.predict([rows[i] for i in test])
        n_train.append(len(train) + len(extra))
    measured = np.array([float(r["latency_median_s"]) for r in rows])
    model_groups = [r["workload_id"] for r in rows]
    metrics = regression_metrics(measured, predicted, model_groups)
    def per(labels: Sequence[str]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for label, idx in sorted(by_group(labels).items()):
            sub = regression_metrics(measured[idx], predicted[idx], [model_groups[i] for i in idx])
            out[label] = {"n": len(idx), "mape": sub["mape"], "within_10pct": sub["within_10pct"]}
        return out

    held_out = []
    for wid, idx in by_group(model_groups).items():
        m, p = float(measured[idx].sum()), float(predicted[idx].sum())
        first = rows[idx[0]]
        held_out.append({"model": first["model"], "workload_id": wid, "batch_size": first.get("batch_size"),
                         "dtype": row_dtype(first), "operators": len(idx),
                         "measured_sum_ms": m * 1e3, "predicted_sum_ms": p * 1e3, "error": (p - m) / m})
    return {"n_train": int(np.mean(n_train)), "n_test": len(rows), "n_sampled": len(extra), "folds": len(n_train),
            "metrics": metrics,
            "per_kind": per([r["kind"] for r in rows]), "per_dtype": per([row_dtype(r) for r in rows]),
            "per_model": per([r["model"] for r in rows]),
            "held_out": sorted(held_out, key=lambda h: (h["model"], h["dtype"], h["batch_size"] or 0)),
            "predicted": predicted, "predicted_rows": rows}


def predict_workload(workload: Any, target: Any, predictor: LatencyPredictor) -> list[dict[str, Any]]:
    """Every operator of ``workload`` with its predicted latency: extraction (lowering and fusion) and,
    for ``graph+launch`` features on a GPU target, the default schedule's launch dimensions; nothing is
    compiled or run."""
    from ..ir import extract_operators
    from ..runtime.build import launch_dims

    lowered, graph = extract_operators(workload.mod, target)
    ops = [node.to_dict() for node in graph]
    if predictor.feature_set == "graph+launch":
        launches = launch_dims(lowered, target)
        for op in ops:
            op.update(launches.get(op["func"], {}))
    seconds = predictor.predict(ops)
    low, high = predictor.meta.get("latency_range_s") or (0.0, float("inf"))
    return [{"op_index": op["index"], "func": op["func"], "kind": op["kind"],
             "output_shapes": op["output_shapes"],
             "flops": op["flops"], "bytes": op["bytes"], "predicted_ms": float(t) * 1e3,
             "outside_training_range": not low <= float(t) <= high}
            for op, t in zip(ops, seconds, strict=True)]


__all__ = ["MIN_ROWS", "SEEDS", "UNSTABLE_SPREAD", "LatencyPredictor", "evaluate", "group_of", "latency_rows",
           "predict_workload", "sampled", "stable"]
