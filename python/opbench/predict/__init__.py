"""Learned predictors on the dataset (XGBoost): operator latency, co-run interference, tuning trials.

* :mod:`~opbench.predict.latency`: one operator's latency from its features.
* :mod:`~opbench.predict.corun`: a co-run group's concurrent time and its members' slowdowns.
* :mod:`~opbench.predict.trials`: a candidate schedule's speed relative to its task's best, from
  MetaSchedule's own features (usable as the tuning cost model, ``--pretrained``).

:func:`train` cross-validates on held-out groups (:mod:`~opbench.predict.splits`), reports the
metrics of :mod:`~opbench.predict.metrics`, then fits the saved predictor on every row.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from ..errors import OpBenchError
from .base import WHATS, Predictor, load_predictor, target_kind
from .splits import SPLITS

log = logging.getLogger(__name__)


#: the fewest held-out groups (models for by_model) a predictor is trained on
MIN_GROUPS = 3
#: a held-out MAPE above this is reported as beyond reason (a warning; the predictor is still written)
MAX_SANE_MAPE = 1.0


def train(dataset: str | Path, what: str, split: str = "by_model", out: str | Path | None = None, folds: int = 5,
          seed: int = 0, device: str | None = None, features: str | None = None, config: str = "default",
          exclude: list[str] | None = None, task_modules: Any = None, also: list[str] | None = None
          ) -> dict[str, Any]:
    """Train a ``what`` predictor on ``dataset``, report held-out metrics, save it to ``out``.

    ``task_modules`` (:data:`opbench.predict.trials.TaskModules`) gives the trials predictor the tuning
    tasks its rows name; :func:`opbench.pipeline.train.train` passes the one that re-extracts them.

    Returns the report: ``{"what", "split", "n_train", "n_test", "metrics", "per_kind", "held_out",
    ...}`` (``n_train`` is the mean training size of the folds, ``n_test`` every held-out item).
    ``exclude`` names models whose rows are left out entirely (to test the predictor on them later).
    ``features`` (latency): default ``graph+launch`` where the rows have launch dimensions, else ``graph``.
    ``also`` (corun only): more datasets of the same device whose groups train in every fold that does not hold
    their model out, and the saved predictor; they are never tested.
    """
    from . import corun, latency, trials
    from .features import FEATURE_SETS

    if what not in WHATS:
        raise OpBenchError(f"unknown --what '{what}' (accepted: {', '.join(WHATS)})")
    if split not in SPLITS:
        raise OpBenchError(f"unknown --split '{split}' (accepted: {', '.join(SPLITS)})")
    if features is not None and features not in FEATURE_SETS:
        raise OpBenchError(f"unknown --features '{features}' (accepted: {', '.join(FEATURE_SETS)})")
    if folds < 2:
        raise OpBenchError(f"--folds must be at least 2, got {folds}")
    if also and what != "corun":
        raise OpBenchError(f"--also is only for --what corun (its co-run groups), not --what {what}")
    for path in also or []:
        if not Path(path).is_file():
            raise OpBenchError(f"--also dataset '{path}' not found")
    start = time.perf_counter()
    skip = set(exclude or [])
    # the dataset's file name only: a predictor file names no folder of the machine that trained it
    meta: dict[str, Any] = {"dataset": Path(dataset).name, "split": split, "seed": seed, "excluded": sorted(skip)}
    model: Predictor
    if what == "latency":
        rows, device_name = latency.latency_rows(str(dataset), device, config)
        rows = [r for r in rows if r["model"] not in skip]
        launched = any(r.get("grid") for r in rows)
        if features is None:  # launch dimensions where the rows have them (GPU rows), else graph features
            features = "graph+launch" if launched else "graph"
        elif features != "graph" and not launched:
            raise OpBenchError(f"--features {features} needs kernel launch dimensions, which these rows lack "
                               "(measured on a CPU, or by an older OpBench): use --features graph")
        log.info("latency: %d operator rows on %s; up to %d folds, %s split", len(rows), device_name, folds, split)
        report = latency.evaluate(rows, split, folds, features, seed)
        kind = target_kind(rows[0]["target"])
        meta.update(config=config)
        fitted = lambda m: latency.LatencyPredictor.fit(rows, features, seed, m)  # noqa: E731
    elif what == "corun":
        groups, device_name = corun.corun_examples(str(dataset), device)
        groups = [g for g in groups if g["model"] not in skip]
        more = []
        for path in also or []:  # the same device's groups in other datasets
            more += [g for g in corun.corun_examples(str(path), device_name)[0] if g["model"] not in skip]
        log.info("corun: %d co-run groups on %s (and %d more that only train); up to %d folds, %s split",
                 len(groups), device_name, len(more), folds, split)
        report = corun.evaluate(groups, split, folds, seed, also=more)
        kind = target_kind(groups[0]["members"][0]["target"])
        meta.update(also=[Path(p).name for p in also or []])
        fitted = lambda m: corun.CorunPredictor.fit(groups + more, seed, m)  # noqa: E731
    else:
        if task_modules is None:
            raise OpBenchError("the trials predictor needs the tasks' modules: train it with "
                               "opbench.pipeline.train.train (or 'opbench train')")
        tasks, device_name = trials.trial_examples(str(dataset), task_modules, device)
        tasks = {k: t for k, t in tasks.items() if not skip & set(t["models"])}  # a shared task too
        log.info("trials: %d tasks, %d candidates on %s; up to %d folds, %s split", len(tasks),
                 sum(len(t["xs"]) for t in tasks.values()), device_name, folds, split)
        report = trials.evaluate(tasks, split, folds, seed)
        report.pop("fold_tasks", None)  # every task key of every fold: for tests, too long for a report
        kind = next(iter(tasks.values()))["target_kind"]
        fitted = lambda m: trials.TrialsPredictor.fit(list(tasks.values()), seed, m)  # noqa: E731
    if report["folds"] < min(MIN_GROUPS, folds):  # fewer groups than folds asked for, and fewer than three
        raise OpBenchError(f"too little data for a {what} predictor: the {split} split finds {report['folds']} groups "
                           f"to hold out (needed: at least {MIN_GROUPS}, each held out against two others or more; "
                           "collect more models, or use --split by_task)")
    mape = report["metrics"].get("mape")
    if mape is not None and mape > MAX_SANE_MAPE:
        log.warning("%s predictor: held-out MAPE %.0f%% is beyond reason; its predictions are not to be trusted "
                    "(collect more models, or models like the ones to predict)", what, 100 * mape)
    meta.update(device_name=device_name, target_kind=kind, metrics=report["metrics"])
    predicted, held = report.pop("predicted", None), report.pop("predicted_rows", None)
    result = {"what": what, "split": split, **report, "device_name": device_name, "target_kind": kind,
              "features": features if what == "latency" else None}
    if out is not None:
        model = fitted(meta)
        model.save(out)
        result["model_file"] = str(out)
        if held is not None:  # the latency predictor's held-out rows, in the order of their predictions
            result["heldout_file"] = str(write_heldout(out, result, held, predicted))
    result["seconds"] = time.perf_counter() - start
    return result


def heldout_path(predictor: str | Path) -> Path:
    """Where :func:`train` stores a latency predictor's held-out predictions: ``<predictor>.heldout.json``."""
    return Path(f"{predictor}.heldout.json")


def write_heldout(predictor: str | Path, result: dict[str, Any], rows: list[dict[str, Any]], predicted: Any) -> Path:
    """Store each operator's held-out prediction (made by a fold that never saw its group) beside the
    predictor, for ``opbench report``: the report then draws them without training anything."""
    import json

    path = heldout_path(predictor)
    keep = ("workload_id", "device_id", "config", "op_index", "model", "batch_size", "dtype", "kind")
    data = {"what": "latency", "split": result["split"], "folds": result.get("folds"),
            "features": result.get("features"), "device_name": result["device_name"], "metrics": result["metrics"],
            "rows": [{**{k: r.get(k) for k in keep}, "measured_s": r["latency_median_s"], "predicted_s": float(p)}
                     for r, p in zip(rows, predicted, strict=True)]}
    path.write_text(json.dumps(data) + "\n")
    return path


def read_heldout(path: str | Path) -> dict[str, Any]:
    """Held-out predictions stored by :func:`train` (``path``: the file, or the predictor beside it)."""
    path = Path(path)
    if not path.name.endswith(".heldout.json"):
        path = heldout_path(path)
    from ..utils import read_json

    accepted = "made by 'opbench train --what latency --out FILE' beside FILE"
    if not path.is_file():
        raise OpBenchError(f"no held-out predictions at '{path}' ({accepted})")
    data = read_json(path, f"held-out predictions {str(path)!r}")
    rows = data.get("rows")
    if data.get("what") != "latency" or not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise OpBenchError(f"'{path}' is not a file of held-out predictions ({accepted})")
    return data


__all__ = ["SPLITS", "WHATS", "Predictor", "heldout_path", "load_predictor", "read_heldout", "train",
           "write_heldout"]
