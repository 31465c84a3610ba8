"""Tuning-trial predictor: rank a task's candidate schedules (TenSet's setting).

Each stored trial (a MetaSchedule trace) is replayed on its task's module, and MetaSchedule's own
feature extractor (``PerStoreFeature``) describes it; MetaSchedule's ``XGBModel`` learns the
candidate's speed relative to its task's best (``best / latency``). The task modules come from
re-extracting the model each trial row names (its ``workload`` column; the caller does that, see
:func:`opbench.pipeline.train.task_modules`), so the dataset needs no copy of them.

The saved predictor is that ``XGBModel`` with its training data, in MetaSchedule's own file
format: ``--pretrained`` loads it as the tuning cost model, which predicts with it from the first
round and retrains on old and new measurements together as tuning goes on.
"""

from __future__ import annotations

import io
import logging
import types
import zipfile
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..dataset import json_value, row_dtype
from ..errors import OpBenchError
from .base import Predictor, dataset_rows, target_kind
from .metrics import by_group, pairwise, r2, rmse, top_k
from .splits import check_split, folds, group_label

log = logging.getLogger("opbench")
MIN_TASKS = 2
MIN_TRIALS = 2
DATA_BLOB = "trials_data.npz"  # the training data's arrays (NumPy's npz, read without pickle)


# the device limits MetaSchedule's GPU rules read, for replaying a GPU's trials without the GPU
_GPU_LIMITS = types.SimpleNamespace(max_threads_per_block=1024, max_shared_memory_per_block=49152, warp_size=32)


def target_for(target_json: str) -> Any:
    """The tuning target of a stored trial row (its canonical target), without needing its device here."""
    import tvm

    from ..runtime.target import tuning_target

    return tuning_target(tvm.target.Target(json_value(target_json)), _GPU_LIMITS)


def trial_features(mod: Any, target: Any, traces: Sequence[Any]) -> list[np.ndarray | None]:
    """``PerStoreFeature`` rows of each trace replayed on ``mod`` (None where it cannot be replayed)."""
    from tvm.s_tir import Schedule
    from tvm.s_tir.meta_schedule import TuneContext
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo
    from tvm.s_tir.meta_schedule.feature_extractor import PerStoreFeature
    from tvm.s_tir.meta_schedule.search_strategy import MeasureCandidate
    from tvm.s_tir.schedule import Trace

    from ..runtime.startup import import_tensor_intrinsics

    import_tensor_intrinsics()
    context = TuneContext(mod=mod, target=target)
    candidates, where = [], []
    for i, trace in enumerate(traces):
        try:
            sch = Schedule(mod)
            Trace.apply_json_to_schedule(json_value(trace), sch)
            candidates.append(MeasureCandidate(sch, ArgInfo.from_entry_func(sch.mod, remove_preproc=True)))
            where.append(i)
        except Exception:  # a trace from another TVM version or module
            continue
    out: list[np.ndarray | None] = [None] * len(traces)
    if candidates:
        for i, feats in zip(where, PerStoreFeature().extract_from(context, candidates), strict=True):
            out[i] = feats.numpy().astype("float32")
    return out


#: ``task_modules(rows)`` -> ``{(workload_id, task): (task module, tuning target)}`` for every task the
#: trial rows name (re-extracted from the models they name; :func:`opbench.pipeline.train.task_modules`)
TaskModules = Callable[[Sequence[dict[str, Any]]], dict[tuple[str, str], tuple[Any, Any]]]


def trial_examples(path: str, task_modules: TaskModules, device: str | None = None
                   ) -> tuple[dict[tuple[str, str], dict[str, Any]], str]:
    """Per task: its trials' features and latencies (``xs``, ``latency``), model, weight and group hash.

    The tasks' modules come from ``task_modules`` (the dataset holds no copy of them)."""
    from tvm.s_tir.meta_schedule.utils import shash2hex

    rows, device_name = dataset_rows(path, "trials", device)
    modules = task_modules(rows)
    by_task: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_task[(r["workload_id"], r["task"])].append(r)
    out = {}
    for key, trows in by_task.items():
        if key not in modules:
            continue
        mod, target = modules[key]
        feats = trial_features(mod, target, [r["trace"] for r in trows])
        kept = [(f, float(r["latency_median_s"])) for f, r in zip(feats, trows, strict=True) if f is not None]
        if len(kept) < MIN_TRIALS:
            continue
        out[key] = {"xs": [f for f, _ in kept], "latency": np.array([lat for _, lat in kept]),
                    "model": trows[0]["model"], "source": trows[0].get("source", ""),
                    "dtype": row_dtype(trows[0]), "workload_id": key[0], "task": key[1],
                    "weight": float(trows[0].get("task_weight") or 1), "group_hash": shash2hex(mod),
                    "target_kind": target_kind(trows[0]["target"])}
    return out, device_name


# Shallower, slower-learning trees than MetaSchedule's defaults (depth 10, eta 0.2, min child weight 0):
# on 38 tuned GPU tasks of 5 models, held-out pairwise accuracy 0.72 -> 0.75 (by_task) and
# 0.78 -> 0.80 (within_task), two fold seeds each. MetaSchedule trains until the training error stops
# falling, so the deep default trees learn each task's 32 trials by heart.
XGB_PARAMS = {"max_depth": 6, "eta": 0.1, "min_child_weight": 1.0}


#: the features MetaSchedule's ``PerStoreFeature`` gives for each buffer store of a candidate (its default)
FEATURE_WIDTH = 164


def _xgb_model(seed: int = 0) -> Any:
    from tvm.s_tir.meta_schedule.cost_model import XGBModel
    from tvm.s_tir.meta_schedule.cost_model.xgb_model import XGBConfig

    return XGBModel(extractor="per-store-feature", config=XGBConfig(seed=seed, nthread=None, **XGB_PARAMS),
                    adaptive_training=True, verbose_eval=10**9)


def fit_xgb(tasks: Sequence[dict[str, Any]], seed: int = 0) -> Any:
    """MetaSchedule's ``XGBModel`` holding the tasks' data (one feature group per task) and trained on it."""
    from tvm.s_tir.meta_schedule.cost_model.xgb_model import FeatureGroup

    model = _xgb_model(seed)
    for t in tasks:
        model.data[t["group_hash"]] = FeatureGroup(group_hash=t["group_hash"], features=list(t["xs"]),
                                                   costs=t["latency"].astype("float32"))
        model.data_size += len(t["xs"])
    xs = [x for t in tasks for x in t["xs"]]
    ys = np.concatenate([t["latency"].min() / t["latency"] for t in tasks])
    model._train(xs=xs, ys=ys)  # noqa: SLF001 (MetaSchedule's training entry)
    model.last_train_size = model.data_size
    return model


class TrialsPredictor(Predictor):
    """MetaSchedule's ``XGBModel``, saved as data only: its booster in XGBoost's own format and its
    training data (per task: the candidates' features and costs) as plain NumPy arrays.

    MetaSchedule's own ``XGBModel.save`` writes the training data as a pickle, which runs code when
    it is loaded; a predictor file may come from anywhere, so it is never written or read that way
    (an older file that holds one is refused).
    """

    what = "trials"
    blob_names = (DATA_BLOB,)

    @classmethod
    def fit(cls, tasks: Sequence[dict[str, Any]], seed: int = 0, meta: dict[str, Any] | None = None
            ) -> TrialsPredictor:
        obj = cls({**(meta or {}), "features": "MetaSchedule PerStoreFeature",
                   "n_rows": sum(len(t["xs"]) for t in tasks), "tasks": len(tasks)})
        obj.set_model(fit_xgb(tasks, seed))
        return obj

    def set_model(self, model: Any) -> None:
        """Keep ``model`` (a trained ``XGBModel``) as this predictor's booster and arrays."""
        groups = list(model.data.values())
        arrays: dict[str, np.ndarray] = {}
        for i, group in enumerate(groups):
            feats = [np.asarray(f, dtype="float32").reshape(len(f), -1) for f in group.features]
            width = max((f.shape[1] for f in feats), default=0)
            arrays[f"rows{i}"] = np.array([len(f) for f in feats], dtype="int64")
            arrays[f"features{i}"] = (np.concatenate(feats) if feats else np.zeros((0, width), "float32"))
            arrays[f"costs{i}"] = np.asarray(group.costs, dtype="float32")
        buffer = io.BytesIO()
        np.savez_compressed(buffer, **arrays)
        self.meta["groups"] = [str(g.group_hash) for g in groups]
        self.blobs = {DATA_BLOB: buffer.getvalue()}
        self.boosters = {"trials": model.booster} if model.booster is not None else {}

    def validate(self) -> None:
        self.cost_model()

    def cost_model(self) -> Any:
        """A MetaSchedule ``XGBModel`` with this predictor's booster and training data (a fresh one per call)."""
        from tvm.s_tir.meta_schedule.cost_model.xgb_model import FeatureGroup

        model = _xgb_model()
        try:
            with np.load(io.BytesIO(self.blobs[DATA_BLOB]), allow_pickle=False) as arrays:
                for i, group_hash in enumerate(self.meta.get("groups", [])):
                    rows, feats = arrays[f"rows{i}"], arrays[f"features{i}"]
                    if feats.ndim != 2 or (len(feats) and feats.shape[1] != FEATURE_WIDTH) or \
                            int(rows.sum()) != len(feats) or len(arrays[f"costs{i}"]) != len(rows):
                        raise ValueError(f"group {i} holds features of shape {feats.shape} for {len(rows)} candidates "
                                         f"(accepted: {FEATURE_WIDTH} features per buffer store, as PerStoreFeature "
                                         "gives)")
                    features = np.split(feats.astype("float32"), np.cumsum(rows)[:-1]) if len(rows) else []
                    model.data[group_hash] = FeatureGroup(group_hash=str(group_hash), features=list(features),
                                                          costs=arrays[f"costs{i}"].astype("float32"))
                    model.data_size += len(features)
        except (KeyError, ValueError, OSError, zipfile.BadZipFile) as err:
            raise OpBenchError(f"trials predictor: its training data do not read ({err}); retrain it with "
                               "'opbench train --what trials'") from None
        if "trials" in self.boosters:
            width = self.boosters["trials"].num_features()
            if width != FEATURE_WIDTH:
                raise OpBenchError(f"trials predictor: its booster reads {width} features, not the {FEATURE_WIDTH} "
                                   "MetaSchedule's PerStoreFeature gives; retrain it with 'opbench train --what "
                                   "trials'")
            model.booster = self.boosters["trials"]
        model.last_train_size = model.data_size
        return model


def evaluate(tasks: dict[tuple[str, str], dict[str, Any]], split: str, k: int = 5, seed: int = 0
             ) -> dict[str, Any]:
    """Cross-validated ranking metrics: pairwise, top-1 and top-5 inside each held-out task."""
    check_split(split)
    items = list(tasks.values())
    if len(items) < MIN_TASKS:
        raise OpBenchError(f"too few tuned tasks with at least {MIN_TRIALS} valid trials: {len(items)} "
                           f"(needed: at least {MIN_TASKS}; tune with --iftune true)")
    # one entry per candidate: (task index, candidate index)
    entries = [(t, c) for t, item in enumerate(items) for c in range(len(item["xs"]))]
    labels = [group_label(items[t], split) if split in ("by_model", "by_dtype") else t for t, _ in entries]
    scores = np.zeros(len(entries))
    n_train = []
    for train, test in folds(labels, split, k, seed):
        chosen: dict[int, list[int]] = defaultdict(list)
        for i in train:
            t, c = entries[i]
            chosen[t].append(c)
        part = [{**items[t], "xs": [items[t]["xs"][c] for c in cs], "latency": items[t]["latency"][cs]}
                for t, cs in chosen.items()]
        model = fit_xgb(part, seed)
        scores[test] = model._predict(xs=[items[entries[i][0]]["xs"][entries[i][1]] for i in test])  # noqa: SLF001
        n_train.append(len(train))
    latency = np.array([items[t]["latency"][c] for t, c in entries])
    groups = [t for t, _ in entries]
    ratio = np.array([items[t]["latency"].min() / items[t]["latency"][c] for t, c in entries])
    weights = {t: items[t]["weight"] for t in range(len(items))}
    metrics = {"mape": None, "within_10pct": None, "rmse": rmse(ratio, scores), "r2": r2(ratio, scores),
               "pairwise": pairwise(-latency, scores, groups), "top1": top_k(latency, scores, groups, 1, weights),
               "top5": top_k(latency, scores, groups, 5, weights)}
    held_out = []
    for t, idx in by_group(groups).items():
        item = items[t]
        held_out.append({"model": item["model"], "task": item["task"], "trials": len(idx),
                         "pairwise": pairwise(-latency[idx], scores[idx], [t] * len(idx)),
                         "top1": top_k(latency[idx], scores[idx], [t] * len(idx), 1)})
    return {"n_train": int(np.mean(n_train)), "n_test": len(entries), "folds": len(n_train), "metrics": metrics,
            "per_kind": {}, "held_out": held_out}


__all__ = ["XGB_PARAMS", "TaskModules", "TrialsPredictor", "evaluate", "fit_xgb", "target_for", "trial_examples",
           "trial_features"]
