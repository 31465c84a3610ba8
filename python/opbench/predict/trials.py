"""Tuning-trial predictor: rank a task's candidate schedules (TenSet's setting).

Each stored trial (a MetaSchedule trace) is replayed on its task's module, and MetaSchedule's own
feature extractor (``PerStoreFeature``) describes it. The model is MetaSchedule's ``XGBModel`` (trees
over each buffer store's features, a candidate's score the sum over its stores) with one change, its
loss (:func:`ranking_model`): instead of a squared error on the candidate's speed relative to its
task's best (``best / latency``), a pairwise logistic loss between candidates *of the same task*, each
pair weighted by how far apart the two are (``|log latency ratio|``, at most 1), since only the order
inside a task is used and speeds of different tasks are not comparable. The task modules come from
re-extracting the model each trial row names (its ``workload`` column; the caller does that, see
:func:`opbench.pipeline.train.task_modules`), so the dataset needs no copy of them.

The saved predictor is that ``XGBModel``'s booster with its training data, as data only
(:class:`TrialsPredictor`): ``--pretrained`` tunes with the booster, frozen, and a small booster of each
task's own measurements on top of it (:func:`pretrained_model`), so that it predicts from the first round
and learns the task at hand as tuning goes on.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import logging
import sqlite3
import tempfile
import types
import zipfile
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..dataset import json_value, row_dtype
from ..dataset.records import TIMERS, timer_of
from ..errors import OpBenchError
from ..utils import cache_root, digest, worker_count, written_whole
from .base import Predictor, dataset_rows, target_kind
from .metrics import by_group, pairwise, top_k
from .splits import check_split, folds, group_label

log = logging.getLogger(__name__)
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


def trace_key(trace: str) -> str:
    """The key of a stored candidate (its trace as JSON) in the per-task caches: 24 hex digits of its SHA-256."""
    return hashlib.sha256(trace.encode()).hexdigest()[:24]


def _feature_cache(mod_json: str, target_json: str) -> Path:
    """The cache file of one task's candidate features (its module, target, TVM version and extractor)."""
    import tvm

    key = digest({"mod": hashlib.sha256(mod_json.encode()).hexdigest(), "target": target_json,
                  "tvm": tvm.__version__, "features": "PerStoreFeature", "width": FEATURE_WIDTH})
    return cache_root() / "trial-features" / f"{key}.npz"


def cached_features(mod_json: str, target_json: str, traces: Sequence[str]) -> list[np.ndarray | None]:
    """:func:`trial_features` of a task stored as JSON, kept in ``$OPBENCH_CACHE/trial-features``: a
    candidate's features are computed once per module, target and TVM version (a cache file that does
    not read is computed again; one that cannot be written leaves the features uncached)."""
    import tvm

    path = _feature_cache(mod_json, target_json)
    known: dict[str, np.ndarray | None] = {}
    if path.is_file():
        try:
            with np.load(path, allow_pickle=False) as arrays:
                rows, feats = arrays["rows"], arrays["features"]
                parts = np.split(feats, np.cumsum(np.maximum(rows, 0))[:-1]) if len(rows) else []
                known = {str(k): (p if n >= 0 else None) for k, n, p in zip(arrays["keys"], rows, parts, strict=True)}
        except (KeyError, ValueError, OSError, zipfile.BadZipFile):
            known = {}
    keys = [trace_key(t) for t in traces]
    missing = {k: t for k, t in zip(keys, traces, strict=True) if k not in known}
    if missing:
        computed = trial_features(tvm.ir.load_json(mod_json), target_for(target_json), list(missing.values()))
        known.update(zip(missing, computed, strict=True))
        _write_cache(path, known)
    return [known[k] for k in keys]


def feature_jobs(jobs: int | None = None) -> int:
    """Worker processes that compute features: ``jobs``, or ``$OPBENCH_FEATURE_JOBS``, or one per core this
    process may run on, at most 16 (each worker imports TVM: about 0.4 GB)."""
    import os

    def default() -> int:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        return min(cores, 16)

    return worker_count(jobs, "OPBENCH_FEATURE_JOBS", default)


def _task_features_job(item: tuple[Any, str, str, list[str]]) -> tuple[Any, list[np.ndarray | None]]:
    """A worker's job: one task's :func:`cached_features` (computed, then written to the cache)."""
    key, mod_json, target_json, traces = item
    return key, cached_features(mod_json, target_json, traces)


def features_in_workers(todo: dict[Any, tuple[str, str, list[str]]], jobs: int | None = None
                        ) -> dict[Any, list[np.ndarray | None]]:
    """:func:`cached_features` of the tasks in ``todo`` (key -> module JSON, target JSON, traces) that have no
    cache file yet, computed in :func:`feature_jobs` worker processes; the rest are left to the caller.

    The first read of the shipped records computes every candidate's features (a trace replayed and
    ``PerStoreFeature`` run on it: about 35 minutes for 100,000 records on one core); the tasks are
    independent, so each worker takes one task at a time. Nothing is done with fewer than two workers, or
    with fewer cold tasks than twice the workers (a worker's start, importing TVM, would cost more). A
    worker that dies ends the pool: the tasks it did not return are computed by the caller.
    """
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    jobs = feature_jobs(jobs)
    if jobs < 2:  # nothing to start: the caller's own loop hashes and reads each task's cache file once
        return {}
    cold = [key for key, (mod_json, target_json, _) in todo.items()
            if not _feature_cache(mod_json, target_json).is_file()]
    if len(cold) < 2 * jobs:
        return {}
    log.info("trials: features of %d tasks in %d processes", len(cold), jobs)
    out: dict[Any, list[np.ndarray | None]] = {}
    try:
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            for key, feats in pool.map(_task_features_job, [(k, *todo[k]) for k in cold], chunksize=4):
                out[key] = feats
                if len(out) % 200 == 0:
                    log.info("trials: features of %d of %d tasks (%d processes)", len(out), len(cold), jobs)
    except BrokenProcessPool as err:
        log.warning("trials: a feature worker died (%s); the %d tasks left are computed here", err,
                    len(cold) - len(out))
    return out


def _write_cache(path: Path, known: dict[str, np.ndarray | None]) -> None:
    rows = np.array([-1 if f is None else len(f) for f in known.values()], dtype="int64")
    feats = [f for f in known.values() if f is not None]
    arrays = {"keys": np.array(list(known), dtype="U24"), "rows": rows,
              "features": np.concatenate(feats).astype("float32") if feats else np.zeros((0, FEATURE_WIDTH), "float32")}
    try:
        with written_whole(path) as part, open(part, "wb") as f:
            np.savez_compressed(f, **arrays)
    except OSError as err:  # a read-only home: the features are computed again next time
        log.debug("feature cache not written (%s)", err)


def _task_rows(source: str) -> dict[str, dict[str, Any]]:
    """The ``tasks`` table of a dataset or records folder by ``workload_id``."""
    if Path(source).is_dir():
        from ..dataset import records

        rows = records.read_rows(source, "tasks")
    else:
        from .base import open_dataset

        with open_dataset(source) as ds:
            try:
                rows = ds.rows("tasks")
            except sqlite3.OperationalError:  # a dataset older than the tasks table
                rows = []
    return {r["workload_id"]: r for r in rows}


def _sampled_task(task: dict[str, Any], trows: list[dict[str, Any]]) -> dict[str, Any]:
    """What a sampled task's rows do not say: the models that use it (its ``uses``), its dtype and weight."""
    uses = json_value(task.get("uses")) or []
    models = sorted({str(u["model"]) for u in uses}) or [str(trows[0]["model"])]
    return {"model": "+".join(models), "models": models, "source": "task",
            "groups": frozenset(f"{u.get('source', '')}:{u['model']}" for u in uses) or None,
            "dtype": task.get("dtype") or row_dtype(trows[0]),
            "weight": float(sum(int(u.get("weight") or 1) for u in uses) or trows[0].get("task_weight") or 1)}


def trial_examples(path: str, task_modules: TaskModules, device: str | None = None, jobs: int | None = None
                   ) -> tuple[dict[tuple[str, str], dict[str, Any]], str]:
    """Per task: its trials' features and latencies (``xs``, ``latency``), model(s), weight, group hash and
    each candidate's :func:`trace_key` (``trace_keys``).

    ``path`` is a dataset or a records folder. Rows of tuning runs name their model: their tasks'
    modules come from ``task_modules`` (re-extracted). Sampled rows (``opbench sample``, source
    ``task``) name a task of the ``tasks`` table, which holds its module and the models that use it;
    their features are cached (:func:`cached_features`), those of tasks not cached yet computed in
    ``jobs`` worker processes (:func:`features_in_workers`).
    """
    from tvm.s_tir.meta_schedule.utils import shash2hex

    rows, device_name = dataset_rows(path, "trials", device)
    sampled = [r for r in rows if r.get("source") == "task"]
    tuned = [r for r in rows if r.get("source") != "task"]
    modules = task_modules(tuned) if tuned else {}
    tasks = _task_rows(path) if sampled else {}
    by_task: dict[tuple[str, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:  # a task's candidates timed another way (``--timer graph``) rank among themselves
        timer = timer_of(r.get("config"))
        by_task[(r["workload_id"], r["task"]) + (() if timer == TIMERS[0] else (timer,))].append(r)
    computed = features_in_workers({key: (tasks[key[0]]["mod"], tasks[key[0]]["target"], [r["trace"] for r in trows])
                                    for key, trows in by_task.items()
                                    if trows[0].get("source") == "task" and key[0] in tasks}, jobs)
    out = {}
    for n, (key, trows) in enumerate(by_task.items()):
        task = tasks.get(key[0]) if trows[0].get("source") == "task" else None
        if task is not None:
            import tvm

            feats = computed.pop(key, None) or cached_features(task["mod"], task["target"], [r["trace"] for r in trows])
            mod = tvm.ir.load_json(task["mod"])
            info = _sampled_task(task, trows)
        elif key[:2] in modules:
            mod, target = modules[key[:2]]
            feats = trial_features(mod, target, [r["trace"] for r in trows])
            info = {"model": trows[0]["model"], "models": [trows[0]["model"]], "source": trows[0].get("source", ""),
                    "groups": None, "dtype": row_dtype(trows[0]), "weight": float(trows[0].get("task_weight") or 1)}
        else:
            continue
        if n and n % 100 == 0:
            log.info("trials: features of %d of %d tasks", n, len(by_task))
        kept = [(f, float(r["latency_median_s"]), r["trace"]) for f, r in zip(feats, trows, strict=True)
                if f is not None]
        if len(kept) < MIN_TRIALS:
            continue
        out[key] = {"xs": [f for f, _, _ in kept], "latency": np.array([lat for _, lat, _ in kept]), **info,
                    "trace_keys": [trace_key(t) for _, _, t in kept],
                    "workload_id": key[0], "task": key[1], "group_hash": shash2hex(mod),
                    "target_kind": target_kind(trows[0]["target"])}
    return out, device_name


# Slower-learning trees than MetaSchedule's defaults (depth 10, eta 0.2, min child weight 0). On 38 tuned
# GPU tasks of 5 models, depth 6 raised held-out pairwise accuracy 0.72 -> 0.75 (by_task) and
# 0.78 -> 0.80 (within_task), two fold seeds each: MetaSchedule trains until the training error stops
# falling, so the deep default trees learn each task's 32 trials by heart. On the 49,269 shipped records
# (held-out models, fold seed 0, ranking loss) depth 8 with 600 rounds gave 0.818 against 0.810 for depth 6
# with 300; depth 10 with 600 rounds 0.818 in twice the time.
XGB_PARAMS = {"max_depth": 8, "eta": 0.1, "min_child_weight": 1.0}


#: the features MetaSchedule's ``PerStoreFeature`` gives for each buffer store of a candidate (its default)
FEATURE_WIDTH = 164


#: boosting rounds of the ranking loss (no early stopping: the training loss of a ranking keeps falling);
#: with depth 6 on the fewer records shipped then, 150 / 300 / 600 rounds gave held-out pairwise 0.772 / 0.774 /
#: 0.774; on the 49,269 records of the eleventh session depth 8 and 600 rounds gained 0.008 (above)
RANK_ROUNDS = 600
#: a task's pairs: all of them up to this many candidates, above it this many random pairs per candidate
RANK_PAIRS = 64


def task_pairs(sizes: Sequence[int], ys: np.ndarray, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The training pairs of the ranking loss: indices ``i, j`` into the candidates (tasks laid end to end,
    ``sizes`` candidates each) of two candidates of the same task whose normalised speeds ``ys`` differ,
    and each pair's weight, ``|log(ys[i] / ys[j])|`` capped at 1 (a failed candidate, speed 0, counts 1).
    A task of more than ``2 * RANK_PAIRS + 1`` candidates gives ``RANK_PAIRS`` random pairs per candidate."""
    rng = np.random.default_rng(seed)
    first, second = [], []
    start = 0
    for m in sizes:
        if m * (m - 1) // 2 <= RANK_PAIRS * m:
            a, b = np.triu_indices(m, 1)
        else:
            a, b = rng.integers(0, m, RANK_PAIRS * m), rng.integers(0, m, RANK_PAIRS * m)
        first.append(a + start)
        second.append(b + start)
        start += m
    i = np.concatenate(first) if first else np.zeros(0, "int64")
    j = np.concatenate(second) if second else np.zeros(0, "int64")
    if start != len(ys):
        raise ValueError(f"{len(ys)} speeds for tasks of {start} candidates")
    keep = ys[i] != ys[j]
    i, j = i[keep], j[keep]
    with np.errstate(divide="ignore"):
        weight = np.minimum(np.abs(np.log(np.maximum(ys[i], 0.0)) - np.log(np.maximum(ys[j], 0.0))), 1.0)
    return i, j, weight


def pair_gradients(score: np.ndarray, i: np.ndarray, j: np.ndarray, sign: np.ndarray, weight: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
    """The gradient and (positive) Hessian diagonal, per candidate, of the weighted pairwise logistic loss
    ``sum weight * log(1 + exp(-sign * (score[i] - score[j])))`` (``sign`` +1 where ``i`` is the faster)."""
    n = len(score)
    p = 1.0 / (1.0 + np.exp(np.clip(sign * (score[i] - score[j]), -30, 30)))
    grad, hess = np.zeros(n), np.zeros(n)
    np.add.at(grad, i, -sign * p * weight)
    np.add.at(grad, j, sign * p * weight)
    curve = p * (1 - p) * weight
    np.add.at(hess, i, curve)
    np.add.at(hess, j, curve)
    return grad, np.maximum(hess, 1e-6)


@functools.cache
def ranking_model() -> type:
    """MetaSchedule's ``XGBModel`` trained with the pairwise ranking loss inside each task (module docstring).

    Its training data are MetaSchedule's: one ``FeatureGroup`` per task in ``data``, laid end to end in
    ``_train`` (as ``XGBModel.update`` does when it retrains during tuning), so that pairs never cross tasks.
    Predicting is ``XGBModel``'s (a score per candidate: higher is faster)."""
    from tvm.s_tir.meta_schedule.cost_model import XGBModel

    class TaskRankXGBModel(XGBModel):
        def _train(self, xs: list[np.ndarray], ys: np.ndarray) -> None:  # noqa: N803 (MetaSchedule's names)
            sizes = [len(g.features) for g in self.data.values()]
            if sum(sizes) != len(xs):  # not the groups' data: one task
                sizes = [len(xs)]
            booster = rank_booster(self.config.to_dict(), xs, ys, sizes, RANK_ROUNDS)
            if booster is not None:
                self.booster = booster

    return TaskRankXGBModel


def rank_booster(config: dict[str, Any], xs: Sequence[np.ndarray], ys: np.ndarray, sizes: Sequence[int], rounds: int,
                 base: Any = None) -> Any:
    """An XGBoost booster on MetaSchedule's per-store features ``xs`` (a candidate's score the sum over its
    stores) trained with the pairwise loss inside each task (``sizes`` candidates each, laid end to end;
    ``ys`` their speeds, ``best / latency``); with ``base``, another such booster, the new trees fit on top
    of its scores (their sum is the model). None when no two candidates of a task differ."""
    import xgboost as xgb
    from tvm.s_tir.meta_schedule.cost_model.xgb_model import PackSum

    ys = np.nan_to_num(np.asarray(ys, dtype="float64"))
    i, j, weight = task_pairs(sizes, ys, int(config.get("seed", 0)))
    if not len(i):  # nothing to rank
        return None
    packed = PackSum(xs=list(xs), ys=None)
    if base is not None:
        packed.dmatrix.set_base_margin(base.predict(packed.dmatrix, output_margin=True))
    ids, n = packed.ids, len(ys)
    sign = np.where(ys[i] > ys[j], 1.0, -1.0)

    def objective(preds: np.ndarray, _data: Any) -> tuple[np.ndarray, np.ndarray]:
        grad, hess = pair_gradients(np.bincount(ids, weights=preds, minlength=n), i, j, sign, weight)
        return grad[ids], hess[ids]

    return xgb.train(config, packed.dmatrix, num_boost_round=rounds, obj=objective)


def booster_scores(xs: Sequence[np.ndarray], boosters: Sequence[Any]) -> np.ndarray:
    """Each candidate's score (higher is faster) from its per-store features ``xs``: the sum over its stores of
    ``boosters`` stacked, each one's trees on top of the ones before (their margins), as :func:`rank_booster`
    with ``base`` trains them."""
    from tvm.s_tir.meta_schedule.cost_model.xgb_model import PackSum

    if not len(xs):
        return np.zeros(0)
    packed = PackSum(xs=list(xs), ys=None)
    margin = None
    for booster in boosters:
        if margin is not None:
            packed.dmatrix.set_base_margin(margin)
        margin = booster.predict(packed.dmatrix, output_margin=True)
    return packed.predict_with_score(margin)


def feature_key(x: np.ndarray) -> bytes:
    """A candidate's per-store features as bytes: equal for two programs the cost model cannot tell apart."""
    return repr(x.shape).encode() + np.ascontiguousarray(x, dtype="float32").tobytes()


def demote_twins(scores: np.ndarray, xs: Sequence[np.ndarray], measured: set[bytes]) -> np.ndarray:
    """``scores`` with every *twin* moved below all the other candidates, keeping the twins' own order.

    A twin has the same features (:func:`feature_key`) as a candidate already measured on the task
    (``measured``) or as a higher-scored candidate of the same call. On the H100 a pretrained tuner spent
    31 of 64 trials of one resnet-50 task on such twins (33 distinct feature sets), measuring families of
    programs the model scores alike and that ran alike (docs/results.md). MetaSchedule picks the highest
    scores of a round and samples the evolution's parents in proportion to them, so twins are picked last
    and mutated less; the measured programs stay in the population."""
    out = np.asarray(scores, dtype="float64").copy()
    if not len(out):
        return out
    drop = float(out.max() - out.min())
    drop += 1e-3 * drop + 1e-9  # below the lowest candidate that is not a twin
    seen = set(measured)
    for i in np.argsort(-out, kind="stable"):
        key = feature_key(xs[i])
        if key in seen:
            out[i] -= drop
        else:
            seen.add(key)
    return out


#: the per-task boosters of a pretrained cost model (:func:`pretrained_model`): rounds, depth, and how much the
#: task's candidates grow before its booster is trained again (MetaSchedule's adaptive training: a fifth)
TASK_ROUNDS, TASK_DEPTH, TASK_GROWTH = 50, 4, 0.2


def pretrained_model() -> type:
    """MetaSchedule's ``XGBModel`` made of a frozen pretrained booster (its ``booster``, a trials predictor's) and,
    for each task tuned, a small booster fitted on that task's own measurements on top of the pretrained
    scores (the pairwise loss inside the task, :data:`TASK_ROUNDS` rounds of depth :data:`TASK_DEPTH`).

    It predicts with the pretrained booster from the first round; after each measured batch the task's
    booster learns where the pretrained order was wrong on this task. Candidates whose features equal a
    measured candidate's, or a better-scored one's of the same call, rank below every other
    (:func:`demote_twins`): the model cannot tell them apart, so measuring them teaches it nothing.
    (``XGBModel`` itself retrains on old and new data together, and only after the data grew by a fifth:
    with a pretrained model's 100,000 candidates, never during a task's tuning.) ``score`` and ``learn``
    take features directly (a search simulated on recorded candidates uses them); ``predict`` and ``update``
    are MetaSchedule's."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.cost_model import XGBModel
    from tvm.s_tir.meta_schedule.cost_model.xgb_model import FeatureGroup
    from tvm.s_tir.meta_schedule.utils import shash2hex

    # derived from the undecorated class: MetaSchedule calls the methods of what derived_object wraps, so a
    # plain subclass of the decorated XGBModel would tune with XGBModel's own predict and update
    @derived_object
    class PretrainedXGBModel(XGBModel._cls):  # noqa: SLF001
        task_boosters: dict[str, Any]
        task_trained: dict[str, int]
        measured_keys: dict[str, set[bytes]]

        def score(self, group_hash: str, xs: Sequence[np.ndarray]) -> np.ndarray:
            """Scores (higher is faster) of a task's candidates from their per-store features."""
            own = self.task_boosters.get(group_hash)
            return booster_scores(xs, [self.booster] if own is None else [self.booster, own])

        def learn(self, group_hash: str, xs: Sequence[np.ndarray], costs: np.ndarray) -> None:
            """Add a task's measured candidates (seconds; failures a large cost) and train its booster again
            once they grew by :data:`TASK_GROWTH`."""
            group = self.data.get(group_hash)
            if group is None:
                group = self.data[group_hash] = FeatureGroup(group_hash=group_hash, features=list(xs),
                                                             costs=np.asarray(costs, dtype="float32"))
            else:
                group.append(list(xs), np.asarray(costs, dtype="float32"))
            self.data_size += len(xs)
            self.measured_keys.setdefault(group_hash, set()).update(feature_key(x) for x in xs)
            seen = self.task_trained.get(group_hash, 0)
            if len(group.features) - seen < max(1, TASK_GROWTH * seen):
                return
            self.task_trained[group_hash] = len(group.features)
            with np.errstate(divide="ignore", invalid="ignore"):
                ys = np.divide(group.min_cost, group.costs, out=np.zeros_like(group.costs), where=group.costs != 0)
            config = {**self.config.to_dict(), "max_depth": TASK_DEPTH}
            own = rank_booster(config, group.features, ys, [len(ys)], TASK_ROUNDS, base=self.booster)
            if own is not None:
                self.task_boosters[group_hash] = own

        def predict(self, context: Any, candidates: list[Any]) -> np.ndarray:
            xs = [x.numpy().astype("float32") for x in self.extractor.extract_from(context, candidates)]
            group_hash = shash2hex(context.mod)
            return demote_twins(self.score(group_hash, xs), xs, self.measured_keys.get(group_hash, set()))

        def update(self, context: Any, candidates: list[Any], results: list[Any]) -> None:
            xs = [x.numpy().astype("float32") for x in self.extractor.extract_from(context, candidates)]
            costs = [float(np.median([float(s) for s in r.run_secs])) if r.run_secs else 1e10 for r in results]
            kept = [k for k, x in enumerate(xs) if len(x)]
            if kept:
                self.learn(shash2hex(context.mod), [xs[k] for k in kept], np.array([costs[k] for k in kept]))

    return PretrainedXGBModel


@functools.cache
def _pretrained_class() -> type:
    return pretrained_model()


#: the losses a trials model can train with: ``rank`` (the default, module docstring) or ``squared``
#: (MetaSchedule's own: squared error on ``best / latency``, for comparison)
LOSSES = ("rank", "squared")
#: what :func:`evaluate` compares: the xgboost model with either loss, and ``mlp``, MetaSchedule's own MLP
#: cost model (``SegmentSumMLP`` trained by its ``SegmentSumMLPTrainer`` with its defaults: LambdaRank loss,
#: 50 epochs, a fifth of the tasks held back to keep the epoch of least loss), on the same features
COMPARED = (*LOSSES, "mlp")


def _xgb_model(seed: int = 0, loss: str = "rank") -> Any:
    from tvm.s_tir.meta_schedule.cost_model import XGBModel
    from tvm.s_tir.meta_schedule.cost_model.xgb_model import XGBConfig

    if loss not in LOSSES:
        raise OpBenchError(f"unknown loss '{loss}' of the trials model (accepted: {', '.join(LOSSES)})")
    kind = ranking_model() if loss == "rank" else XGBModel
    return kind(extractor="per-store-feature", config=XGBConfig(seed=seed, nthread=None, **XGB_PARAMS),
                adaptive_training=True, verbose_eval=10**9)


def _add_groups(data: dict[str, Any], tasks: Sequence[dict[str, Any]], group_cls: type,
                features: Callable[[Sequence[Any]], list[Any]] = list) -> int:
    """Put the tasks' candidates into ``data`` as MetaSchedule's cost models hold them, one ``group_cls``
    (the XGB or the MLP model's ``FeatureGroup``) per task module: two tasks of one module (another
    target's) are one group, as in tuning. Returns how many candidates were added."""
    added = 0
    for t in tasks:
        xs, costs = features(t["xs"]), t["latency"].astype("float32")
        group = data.get(t["group_hash"])
        if group is None:
            data[t["group_hash"]] = group_cls(group_hash=t["group_hash"], features=xs, costs=costs)
        else:
            group.append(xs, costs)
        added += len(xs)
    return added


def fit_xgb(tasks: Sequence[dict[str, Any]], seed: int = 0, loss: str = "rank") -> Any:
    """MetaSchedule's ``XGBModel`` holding the tasks' data (one feature group per task) and trained on it."""
    from tvm.s_tir.meta_schedule.cost_model.xgb_model import FeatureGroup

    model = _xgb_model(seed, loss)
    model.data_size += _add_groups(model.data, tasks, FeatureGroup)
    xs = [x for g in model.data.values() for x in g.features]
    ys = np.concatenate([g.min_cost / g.costs for g in model.data.values()])
    model._train(xs=xs, ys=ys)  # noqa: SLF001 (MetaSchedule's training entry)
    model.last_train_size = model.data_size
    return model


class _MLPRanker:
    """A trained ``SegmentSumMLPTrainer`` behind ``XGBModel``'s ``_predict(xs=...)`` (what evaluation calls)."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def _predict(self, xs: Sequence[np.ndarray]) -> np.ndarray:
        # one batch: its loader scales the features by their maximum (as MetaSchedule's prediction does), and
        # a batch of one would come back as a scalar
        self.trainer.batch_size = max(len(xs), 2)
        return np.atleast_1d(self.trainer.predict_incremental([np.asarray(x, dtype="float32") for x in xs]))


@contextlib.contextmanager
def _step_lr_without_verbose() -> Iterator[None]:
    """MetaSchedule's trainer builds ``StepLR(..., verbose=True)``, an argument current PyTorch removed (a
    ``TypeError``): while it trains, the scheduler takes and ignores it."""
    import torch

    base = torch.optim.lr_scheduler.StepLR

    class StepLR(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, verbose: Any = None, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)

    torch.optim.lr_scheduler.StepLR = StepLR
    try:
        yield
    finally:
        torch.optim.lr_scheduler.StepLR = base


def fit_mlp(tasks: Sequence[dict[str, Any]], seed: int = 0) -> _MLPRanker:
    """MetaSchedule's MLP cost model (:data:`COMPARED`) trained on the tasks (one feature group per task, as
    :func:`fit_xgb` holds them), for comparison with the xgboost model; needs PyTorch."""
    import random
    import unittest.mock  # not at the module's top: importing it loads asyncio, and only this comparison needs it

    try:
        import torch
        from tvm.s_tir.meta_schedule.cost_model.mlp_model import (
            FeatureGroup,
            SegmentSumMLPConfig,
            SegmentSumMLPTrainer,
            State,
            TrainerConfig,
        )
    except ImportError as err:
        raise OpBenchError(f"MetaSchedule's MLP cost model needs PyTorch ({err}): pip install torch") from None
    torch.manual_seed(seed)
    random.seed(seed)  # the trainer's choice of the tasks it holds back
    state = State(SegmentSumMLPConfig(input_dim=FEATURE_WIDTH))
    state.data_size += _add_groups(state.data, tasks, FeatureGroup,
                                   lambda xs: [np.asarray(x, dtype="float32") for x in xs])
    trainer = SegmentSumMLPTrainer(TrainerConfig(), state)
    trainer.device = "cpu"  # the same on every machine
    # its trainer keeps the best epoch's weights in a temporary file that it never removes (about 1 MB per
    # training): here that file lands in a folder of ours, removed afterwards
    with _step_lr_without_verbose(), tempfile.TemporaryDirectory(prefix="opbench-mlp-") as folder, \
            unittest.mock.patch.object(tempfile, "tempdir", folder):
        trainer.train_full()
    return _MLPRanker(trainer)


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
        obj = cls({**(meta or {}), "features": "MetaSchedule PerStoreFeature", "loss": "pairwise inside each task",
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

    def tuning_model(self, seed: int = 0) -> Any:
        """The cost model ``--pretrained`` tunes with (:func:`pretrained_model`): this predictor's booster,
        frozen, and a booster of each task's own measurements on top of it (a fresh model per call)."""
        from tvm.s_tir.meta_schedule.cost_model.xgb_model import XGBConfig

        booster = self._booster()
        model = _pretrained_class()(extractor="per-store-feature", config=XGBConfig(seed=seed, nthread=None,
                                                                                      **XGB_PARAMS),
                                    num_warmup_samples=0, verbose_eval=10**9)
        model.booster, model.task_boosters, model.task_trained, model.measured_keys = booster, {}, {}, {}
        return model

    def _booster(self) -> Any:
        """The trials booster, checked to read MetaSchedule's per-store features."""
        if "trials" not in self.boosters:
            raise OpBenchError("trials predictor: it holds no booster; retrain it with 'opbench train --what trials'")
        width = self.boosters["trials"].num_features()
        if width != FEATURE_WIDTH:
            raise OpBenchError(f"trials predictor: its booster reads {width} features, not the {FEATURE_WIDTH} "
                               "MetaSchedule's PerStoreFeature gives; retrain it with 'opbench train --what "
                               "trials'")
        return self.boosters["trials"]

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
            model.booster = self._booster()
        model.last_train_size = model.data_size
        return model


def _labels(items: list[dict[str, Any]], entries: list[tuple[int, int]], split: str) -> list[Any]:
    """Each candidate's group for ``split``: its task, or its task's model(s) or dtype."""
    def label(item: dict[str, Any]) -> Any:
        if split == "by_model" and item.get("groups"):
            return item["groups"]  # every model that uses the task (see opbench.predict.splits)
        return group_label(item, split)

    per_task = [label(item) if split in ("by_model", "by_dtype") else t for t, item in enumerate(items)]
    return [per_task[t] for t, _ in entries]


#: trains a ranking model on a fold's tasks (their ``xs`` and ``latency``) with a seed; the model scores
#: candidates with ``_predict(xs=...)`` (higher is faster), as MetaSchedule's cost models do
Fit = Callable[[list[dict[str, Any]], int], Any]


def _cross_validate(items: list[dict[str, Any]], entries: list[tuple[int, int]], labels: list[Any], split: str,
                    k: int, seed: int, limit: int | None = None, loss: str = "rank", fit: Fit | None = None
                    ) -> tuple[np.ndarray, list[int], list[dict[str, Any]]]:
    """Held-out scores of every candidate (NaN where no fold tests it), each fold's training size, and what
    each fold trained and tested on (tasks and models); ``limit``: each fold trains on at most that many
    candidates, drawn at random from its training side; ``fit``: the model, instead of ``loss``'s."""
    scores = np.full(len(entries), np.nan)
    n_train = []
    detail = []
    rng = np.random.default_rng(seed)
    for train, test in folds(labels, split, k, seed):
        if limit is not None and len(train) > limit:
            train = np.sort(rng.choice(train, size=limit, replace=False))
        chosen: dict[int, list[int]] = defaultdict(list)
        for i in train:
            t, c = entries[i]
            chosen[t].append(c)
        part = [{**items[t], "xs": [items[t]["xs"][c] for c in cs], "latency": items[t]["latency"][cs]}
                for t, cs in chosen.items() if len(cs) >= MIN_TRIALS]
        if not part:
            continue
        model = fit(part, seed) if fit is not None else fit_mlp(part, seed) if loss == "mlp" \
            else fit_xgb(part, seed, loss)
        scores[test] = model._predict(xs=[items[entries[i][0]]["xs"][entries[i][1]] for i in test])  # noqa: SLF001
        n_train.append(sum(len(p["xs"]) for p in part))
        tested = sorted({entries[i][0] for i in test})
        detail.append({"train_tasks": sorted(f"{p['workload_id']}/{p['task']}" for p in part),
                       "test_tasks": sorted(f"{items[t]['workload_id']}/{items[t]['task']}" for t in tested),
                       "train_models": sorted({m for p in part for m in p["models"]}),
                       "test_models": sorted({m for t in tested for m in items[t]["models"]})})
    return scores, n_train, detail


def _ranking(items: list[dict[str, Any]], entries: list[tuple[int, int]], scores: np.ndarray,
             where: np.ndarray) -> dict[str, Any]:
    """Pairwise accuracy, top-1 and top-5 over the candidates in ``where`` (inside each task)."""
    idx = np.flatnonzero(where)
    latency = np.array([items[entries[i][0]]["latency"][entries[i][1]] for i in idx])
    groups = [entries[i][0] for i in idx]
    weights = {t: items[t]["weight"] for t in set(groups)}
    sc = scores[idx]
    # a score ranks a task's candidates and is no speed: no error against the speeds (rmse, r2)
    return {"mape": None, "within_10pct": None, "rmse": None, "r2": None,
            "pairwise": pairwise(-latency, sc, groups), "top1": top_k(latency, sc, groups, 1, weights),
            "top5": top_k(latency, sc, groups, 5, weights), "tasks": len(set(groups)), "candidates": len(idx)}


def _entries(tasks: dict[tuple[str, str], dict[str, Any]], split: str) -> tuple[list[dict[str, Any]], list[Any],
                                                                                 list[Any]]:
    check_split(split)
    items = list(tasks.values())
    if len(items) < MIN_TASKS:
        raise OpBenchError(f"too few tuned tasks with at least {MIN_TRIALS} valid trials: {len(items)} "
                           f"(needed: at least {MIN_TASKS}; tune with --iftune true, or sample with opbench sample)")
    entries = [(t, c) for t, item in enumerate(items) for c in range(len(item["xs"]))]
    return items, entries, _labels(items, entries, split)


def evaluate(tasks: dict[tuple[str, str], dict[str, Any]], split: str, k: int = 5, seed: int = 0,
             loss: str = "rank", fit: Fit | None = None) -> dict[str, Any]:
    """Cross-validated ranking metrics: pairwise, top-1 and top-5 inside each held-out task, overall and
    by dtype. With ``by_model``, a task that a held-out model shares with a training model is neither
    trained on nor tested in that fold (``untested`` counts the candidates no fold could test). ``loss``:
    one of :data:`COMPARED` (``mlp``: MetaSchedule's MLP cost model instead of the xgboost one); ``fit``:
    another model (:data:`Fit`) trained and tested on the same folds instead."""
    if loss not in COMPARED:
        raise OpBenchError(f"unknown trials model '{loss}' (accepted: {', '.join(COMPARED)})")
    items, entries, labels = _entries(tasks, split)
    scores, n_train, detail = _cross_validate(items, entries, labels, split, k, seed, loss=loss, fit=fit)
    tested = ~np.isnan(scores)
    dtypes = np.array([items[t]["dtype"] for t, _ in entries])
    metrics = _ranking(items, entries, scores, tested)
    by_dtype = {str(d): _ranking(items, entries, scores, tested & (dtypes == d))
                for d in sorted(set(dtypes[tested]))}
    held_out = []
    for t, idx in by_group([t for t, _ in entries]).items():
        idx = [i for i in idx if tested[i]]
        if not idx:
            continue
        item = items[t]
        latency = item["latency"][[entries[i][1] for i in idx]]
        held_out.append({"model": item["model"], "task": item["task"], "dtype": item["dtype"], "trials": len(idx),
                         "pairwise": pairwise(-latency, scores[idx], [t] * len(idx)),
                         "top1": top_k(latency, scores[idx], [t] * len(idx), 1)})
    return {"n_train": int(np.mean(n_train)) if n_train else 0, "n_test": int(tested.sum()),
            "untested": int((~tested).sum()), "folds": len(n_train), "metrics": metrics, "by_dtype": by_dtype,
            "per_kind": {}, "held_out": held_out,
            "fold_models": [{"test": d["test_models"], "train": d["train_models"]} for d in detail],
            "fold_tasks": [{"test": d["test_tasks"], "train": d["train_tasks"]} for d in detail]}


def learning_curve(tasks: dict[tuple[str, str], dict[str, Any]], sizes: Sequence[int], split: str = "by_model",
                   k: int = 5, seed: int = 0) -> list[dict[str, Any]]:
    """:func:`evaluate`'s overall metrics with each fold trained on at most ``size`` candidates (drawn at
    random from its training side) for each of ``sizes``: how the ranking improves with more records."""
    items, entries, labels = _entries(tasks, split)
    out = []
    for size in sizes:
        scores, n_train, _ = _cross_validate(items, entries, labels, split, k, seed, limit=int(size))
        out.append({"records": int(size), "n_train": int(np.mean(n_train)) if n_train else 0,
                    **_ranking(items, entries, scores, ~np.isnan(scores))})
    return out


#: the arms of :func:`simulate_search`: the pretrained booster alone, with each task's own booster on top
#: (what ``--pretrained`` tunes with), a task's own booster alone (trained from its first batch on), and random
SEARCH_ARMS = ("pretrained", "pretrained+task", "task", "random")


def simulate_search(tasks: Sequence[dict[str, Any]], predictor: TrialsPredictor | None, arm: str, batch: int = 8,
                    budget: int = 32, seed: int = 0) -> dict[str, Any]:
    """A search simulated on recorded candidates: for each task (``xs``, ``latency``, ``group_hash``), pick
    ``batch`` candidates at a time by the arm's scores among those not picked yet, reveal their measured
    latencies, let the model learn them, until ``budget`` are picked; the best latency found after each pick
    over the task's best recorded one. Returns the mean of that ratio's logarithm turned back into a ratio
    (a geometric mean) after each pick and the share of tasks whose best was found (``found``)."""
    if arm not in SEARCH_ARMS:
        raise OpBenchError(f"unknown search arm '{arm}' (accepted: {', '.join(SEARCH_ARMS)})")
    if arm.startswith("pretrained") and predictor is None:
        raise OpBenchError(f"the '{arm}' arm needs a trials predictor")
    rng = np.random.default_rng(seed)
    logs, found = [], []
    for t in tasks:
        latency = np.where(np.isfinite(t["latency"]) & (t["latency"] > 0), t["latency"], 1e10)
        n = min(budget, len(latency))
        model = predictor.tuning_model(seed) if predictor is not None and arm.startswith("pretrained") else None
        own: Any = None
        left, best = list(range(len(latency))), []
        while len(best) < n:
            if arm == "random" or (arm == "task" and own is None):
                order = rng.permutation(len(left))
            elif arm == "task":
                order = np.argsort(-booster_scores([t["xs"][i] for i in left], [own]), kind="stable")
            else:
                order = np.argsort(-model.score(t["group_hash"], [t["xs"][i] for i in left]), kind="stable")
            chosen = [left[k] for k in order[:min(batch, n - len(best))]]
            left = [i for i in left if i not in chosen]
            for i in chosen:
                best.append(min(best[-1], latency[i]) if best else latency[i])
            if arm == "pretrained+task":
                model.learn(t["group_hash"], [t["xs"][i] for i in chosen], latency[chosen])
            elif arm == "task":
                picked = [i for i in range(len(latency)) if i not in left]
                ys = latency[picked].min() / latency[picked]
                own = rank_booster({**XGB_PARAMS, "max_depth": TASK_DEPTH, "seed": seed}, [t["xs"][i] for i in picked],
                                   ys, [len(picked)], TASK_ROUNDS) or own
        logs.append(np.log(np.array(best) / latency.min()))
        found.append(np.array(best) <= latency.min())
    depth = min((len(v) for v in logs), default=0)
    return {"arm": arm, "tasks": len(logs), "batch": batch, "budget": depth,
            "best_over_task_best": [float(np.exp(np.mean([v[k] for v in logs]))) for k in range(depth)],
            "found": [float(np.mean([v[k] for v in found])) for k in range(depth)]}


__all__ = ["COMPARED", "SEARCH_ARMS", "XGB_PARAMS", "Fit", "TaskModules", "TrialsPredictor", "cached_features",
           "booster_scores", "demote_twins", "evaluate", "feature_key", "fit_mlp", "fit_xgb", "learning_curve",
           "pair_gradients", "pretrained_model", "rank_booster", "ranking_model", "simulate_search", "target_for",
           "task_pairs", "trial_examples", "trial_features"]
