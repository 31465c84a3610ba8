"""Co-run predictor: a group of operators launched together on several streams.

Two XGBoost regressions over :func:`opbench.predict.features.corun_features`:

* ``concurrent``: ``log(concurrent time / reference)``; the group's time is that ratio times the
  reference, ``longest solo time ** 0.25 * solo sum ** 0.75`` (solo times measured, or from a latency
  predictor). A group takes about between its longest member and the sum of its members; a reference
  a quarter of the way (in logs) from the sum towards the longest member gave a lower held-out MAPE
  than the sum alone on both shipped H100 datasets and every fold seed tried (``docs/predictors.md``),
  and the longest member alone did worse on the float16/bfloat16 rows. Predictors saved before
  (without ``meta["concurrent_over"]``) keep the sum (:data:`OVER_SUM`);
* ``slowdown``: each member's ``log(slowdown)`` (its time in the group over its time alone) from its
  own share and the group's features.

Trained on the ``corun`` table, with each member's operator row (kind, FLOPs, bytes, kernel
resources) and the device's SM count. A group measured at more than :data:`OUTLIER_RATIO` times its
members' solo sum does not train (all train if too few others remain): 17 % of the float32 sampled-operator
groups and 15 of 424 model groups on the shipped H100 rows, up to 4.4x the sum for a googlenet convolution
beside a 2 us pooling. No feature tells such a group from its twins that take less than the sum, and
fitted, they pulled the predictions of other models' groups up to twice their time; held-out metrics still
count them.

A group whose concurrent time exceeds :data:`INCONSISTENT_RATIO` times its longest member's time *inside* the
group (each member timed by events around it in the same concurrent launch, its ``slowdowns``) does not train
either: its two measurements disagree. On the shipped float32 H100 rows the concurrent time is a median 0.98
times that longest member's time (90th percentile 1.21), and the 15 model groups above 1.5 times their solo sum
are all 1.56 to 4.4 times it; 27 of 424 model groups and 236 of 1,200 sampled groups are past the ratio.
Held-out metrics count every group, and report the consistent ones apart (``metrics_consistent``).

``also`` groups (:func:`evaluate`; ``opbench train --also``: the co-run rows of other datasets of the same
device, e.g. the float16/bfloat16 rows beside the float32 ones) train in every fold that does not hold their
model out, and are never tested.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..dataset import json_value, row_dtype
from ..errors import OpBenchError
from .base import Predictor, dataset_rows, open_dataset, xgb_regressor
from .features import corun_feature_names, corun_features, member_feature_names, member_features
from .latency import sampled
from .metrics import by_group, pairwise, regression_metrics
from .splits import check_split, folds, group_label

MIN_GROUPS = 20
#: a group whose concurrent time exceeds this many times its members' solo sum does not train (module docstring)
OUTLIER_RATIO = 1.5
#: a group whose concurrent time exceeds this many times its longest member's time inside the group does not train
INCONSISTENT_RATIO = 1.5
#: what the ``concurrent`` booster's ratio is over: ``max**0.25*sum**0.75`` of the solo times
#: (:data:`OVER_MIXED`), or their sum (a predictor file without ``concurrent_over``)
OVER_MIXED, OVER_SUM = "max**0.25*sum**0.75", "sum"
#: both boosters fit the absolute error of the log ratio (its median, not its mean): a few groups far from
#: their twins pull a squared-error fit towards them; on the shipped H100 rows this lowered the held-out
#: MAPE of every split (``docs/predictors.md``)
OBJECTIVE = "reg:absoluteerror"


def inside_ratio(group: dict[str, Any]) -> float | None:
    """The group's concurrent time over its longest member's time inside the group (the member's solo time
    times its slowdown there); ``None`` where the slowdowns were not measured."""
    slows = group.get("slowdowns") or []
    if len(slows) != len(group["solo_s"]) or not all(s and s > 0 for s in slows):
        return None
    return group["concurrent_s"] / max(s * t for s, t in zip(slows, group["solo_s"], strict=True))


def trains(group: dict[str, Any]) -> bool:
    """Whether a group is fit to train on: within :data:`OUTLIER_RATIO` of its members' solo sum and within
    :data:`INCONSISTENT_RATIO` of its longest member's time inside the group (module docstring)."""
    inside = inside_ratio(group)
    return group["concurrent_s"] <= OUTLIER_RATIO * sum(group["solo_s"]) and (inside is None or
                                                                             inside <= INCONSISTENT_RATIO)


def _reference(solo_s: Sequence[float], over: str) -> float:
    """The solo time the ``concurrent`` ratio multiplies (:data:`OVER_MIXED` or :data:`OVER_SUM`)."""
    total = float(sum(solo_s))
    return float(max(solo_s)) ** 0.25 * total ** 0.75 if over == OVER_MIXED else total


class CorunPredictor(Predictor):
    """Predicts a co-run group's concurrent seconds and each member's slowdown."""

    what = "corun"

    @classmethod
    def fit(cls, groups: Sequence[dict[str, Any]], seed: int = 0, meta: dict[str, Any] | None = None
            ) -> CorunPredictor:
        """Train on co-run examples (see :func:`corun_examples`), those that :func:`trains` admits (all of
        them if fewer than :data:`MIN_GROUPS` would remain)."""
        kept = [g for g in groups if trains(g)]
        left_out = len(groups) - len(kept) if len(kept) >= MIN_GROUPS else 0
        groups = kept if left_out else list(groups)
        x, y, xm, ym = [], [], [], []
        for g in groups:
            feats = corun_features(g["members"], g["solo_s"], g["device_sms"])
            x.append(feats)
            y.append(np.log(g["concurrent_s"] / _reference(g["solo_s"], OVER_MIXED)))
            for member, solo, slow in zip(g["members"], g["solo_s"], g["slowdowns"] or [], strict=False):
                if slow and slow > 0:
                    xm.append(member_features(feats, member, solo, g["solo_s"], g["device_sms"]))
                    ym.append(np.log(slow))
        obj = cls({**(meta or {}), "features": corun_feature_names(), "member_features": member_feature_names(),
                   "n_rows": len(groups), "left_out_untrainable": left_out, "concurrent_over": OVER_MIXED})
        fit = {"rounds": 300, "seed": seed, "max_depth": 5, "objective": OBJECTIVE}
        obj.boosters["concurrent"] = xgb_regressor(np.array(x), np.array(y), **fit)
        if xm:
            obj.boosters["slowdown"] = xgb_regressor(np.array(xm), np.array(ym), **fit)
        return obj

    def predict(self, members: Sequence[dict[str, Any]], solo_s: Sequence[float], device_sms: float | None = None
                ) -> tuple[float, list[float]]:
        """Seconds the group takes together and each member's slowdown."""
        return self.predict_many([{"members": members, "solo_s": list(solo_s), "device_sms": device_sms}])[0]

    def concurrent(self, members: Sequence[dict[str, Any]], solo_s: Sequence[float],
                   device_sms: float | None = None) -> float:
        """Seconds the group takes together (without the members' slowdowns)."""
        feats = corun_features(members, solo_s, device_sms)
        return float(np.exp(self.booster_predict("concurrent", np.array([feats]))[0]) * _reference(solo_s, self.over))

    @property
    def over(self) -> str:
        """What the ``concurrent`` ratio is over (:data:`OVER_MIXED`; :data:`OVER_SUM` in older files)."""
        return str(self.meta.get("concurrent_over", OVER_SUM))

    def predict_many(self, groups: Sequence[dict[str, Any]]) -> list[tuple[float, list[float]]]:
        """:meth:`predict` for many groups at once (one booster call each)."""
        feats = [corun_features(g["members"], g["solo_s"], g.get("device_sms")) for g in groups]
        ratio = np.exp(self.booster_predict("concurrent", np.array(feats)))
        rows, owner = [], []
        for k, (g, f) in enumerate(zip(groups, feats, strict=True)):
            for member, solo in zip(g["members"], g["solo_s"], strict=True):
                rows.append(member_features(f, member, solo, g["solo_s"], g.get("device_sms")))
                owner.append(k)
        slow = (np.exp(self.booster_predict("slowdown", np.array(rows))) if "slowdown" in self.boosters and rows
                else np.ones(len(rows)))
        out: list[tuple[float, list[float]]] = [(float(r * _reference(g["solo_s"], self.over)), [])
                                                for r, g in zip(ratio, groups, strict=True)]
        for k, s in zip(owner, slow, strict=True):
            out[k][1].append(float(s))
        return out


def corun_examples(path: str, device: str | None = None) -> tuple[list[dict[str, Any]], str]:
    """The co-run groups of one device with their members' operator rows."""
    with open_dataset(path) as ds:
        rows, device_name = dataset_rows(ds, "corun", device)
        ops, _ = dataset_rows(ds, "operators", device_name or None)
    by_key = {(o["workload_id"], o["device_id"], o["config"], o["l2_flush"], o["op_index"]): o for o in ops}
    out = []
    for r in rows:
        idx = json_value(r["op_indices"]) or []
        members = [by_key.get((r["workload_id"], r["device_id"], r["config"], r["l2_flush"], i)) for i in idx]
        solo = json_value(r["solo_s"]) or []
        if not r.get("concurrent_s") or any(m is None for m in members) or len(solo) != len(members) or \
                not all(s and s > 0 for s in solo):
            continue
        out.append({"workload_id": r["workload_id"], "model": r["model"], "source": r["source"],
                    "dtype": row_dtype(r),
                    "group_key": r["group_key"], "members": members, "solo_s": [float(s) for s in solo],
                    "concurrent_s": float(r["concurrent_s"]), "sequential_s": r.get("sequential_s"),
                    "slowdowns": json_value(r.get("slowdowns")), "device_sms": r.get("gpu_sm_count"),
                    "kinds": json_value(r["kinds"])})
    return out, device_name


def evaluate(groups: Sequence[dict[str, Any]], split: str, k: int = 5, seed: int = 0,
             also: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """Cross-validated held-out metrics of the concurrent time (pairwise inside each model).

    ``also``: more groups that train in every fold not holding out their group (their model for
    ``by_model``), and are never tested; sampled ones train in every fold."""
    check_split(split)
    if len(groups) < MIN_GROUPS:
        raise OpBenchError(f"too few measured co-run groups for training: {len(groups)} (needed: at least "
                           f"{MIN_GROUPS}; collect with --corun on a GPU)")
    extra = [g for g in [*groups, *also] if sampled(g)]
    more = [g for g in also if not sampled(g)]
    groups = [g for g in groups if not sampled(g)]
    if len(groups) < 2:
        raise OpBenchError(f"too few co-run groups of models to hold out: {len(groups)} (needed: at least 2)")

    def label(g: dict[str, Any]) -> Any:
        return group_label(g, split) if split in ("by_model", "by_dtype") else "+".join(sorted(g["kinds"]))

    labels = [label(g) for g in groups]
    more_labels = [label(g) for g in more]
    predicted = np.zeros(len(groups))
    slow_err: list[float] = []
    n_train = []
    for train, test in folds(labels, split, k, seed):
        held = {labels[i] for i in test}
        others = [g for g, lab in zip(more, more_labels, strict=True) if lab not in held]
        model = CorunPredictor.fit([groups[i] for i in train] + extra + others, seed)
        for i, (conc, slows) in zip(test, model.predict_many([groups[i] for i in test]), strict=True):
            predicted[i] = conc
            measured = groups[i]["slowdowns"] or []
            slow_err += [abs(p - m) / m for p, m in zip(slows, measured, strict=False) if m]
        n_train.append(len(train) + len(extra) + len(others))
    measured = np.array([g["concurrent_s"] for g in groups])
    models = [g["workload_id"] for g in groups]
    metrics = regression_metrics(measured, predicted, models)
    fine = [i for i, g in enumerate(groups) if (inside_ratio(g) or 0.0) <= INCONSISTENT_RATIO]
    consistent = regression_metrics(measured[fine], predicted[fine], [models[i] for i in fine]) if fine else None
    seq = np.array([sum(g["solo_s"]) for g in groups])
    per_kind: dict[str, Any] = {}
    for size, idx in sorted(by_group([len(g["members"]) for g in groups]).items()):
        sub = regression_metrics(measured[idx], predicted[idx], [models[i] for i in idx])
        per_kind[f"{size} operators"] = {"n": len(idx), "mape": sub["mape"], "within_10pct": sub["within_10pct"]}
    held_out = []
    for wid, idx in by_group(models).items():
        sub = regression_metrics(measured[idx], predicted[idx], [wid] * len(idx))
        held_out.append({"model": groups[idx[0]]["model"], "workload_id": wid, "groups": len(idx),
                         "mape": sub["mape"], "pairwise": sub["pairwise"]})
    extra_metrics = {"speedup_pairwise": pairwise(seq / measured, seq / predicted, models),
                     "slowdown_mape": float(np.mean(slow_err)) if slow_err else None}
    return {"n_train": int(np.mean(n_train)), "n_test": len(groups), "n_sampled": len(extra), "folds": len(n_train),
            "n_also": len(also), "metrics": metrics, "metrics_consistent": consistent,
            "n_inconsistent": len(groups) - len(fine),
            "extra_metrics": extra_metrics, "per_kind": per_kind, "held_out": held_out, "predicted": predicted}


__all__ = ["INCONSISTENT_RATIO", "MIN_GROUPS", "OUTLIER_RATIO", "CorunPredictor", "corun_examples", "evaluate",
           "inside_ratio", "trains"]
