"""The training job: a predictor trained on a dataset (:func:`opbench.predict.train`), with what the
predictors cannot load themselves: the tuning tasks of the models that trial rows name, re-extracted
here (the dataset keeps each trial's trace, not the task's module).
"""

from __future__ import annotations

import dataclasses
import logging
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from ..dataset import json_value
from ..ir import extract_operators
from ..models import load_workload
from ..predict.trials import target_for
from .spec import Spec, SpecError

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TrainJob(Spec):
    """A predictor to train, as plain data (``opbench train``'s flags, one field each).

    Attributes
    ----------
    dataset:
        A dataset file (SQLite, or gzipped) or a records folder.
    what:
        ``latency``, ``corun`` or ``trials``.
    split:
        How rows are held out: ``by_model``, ``by_task``, ... (:data:`opbench.predict.SPLITS`).
    out:
        Where the trained predictor is saved (``None``: not saved).
    folds, seed:
        Cross-validation folds and the seed of their assignment.
    device:
        Train on the rows of this device only (``None``: the device most rows name).
    features:
        The latency predictor's feature set (``None``: the best the rows allow).
    config:
        Which kernels' rows: ``default``, or a tuning database's ``db:<digest>``.
    exclude:
        Models whose rows are left out entirely (to test on them later).
    also:
        More datasets of the same device whose co-run groups train too (``corun`` only): each trains in every
        fold that does not hold its model out, and is never tested (e.g. the float16/bfloat16 rows beside
        the float32 ones).
    """

    dataset: str = "data/opbench.sqlite"
    what: str = "latency"
    split: str = "by_model"
    out: str | None = None
    folds: int = 5
    seed: int = 0
    device: str | None = None
    features: str | None = None
    config: str = "default"
    exclude: tuple[str, ...] = ()
    also: tuple[str, ...] = ()

    def validate(self) -> None:
        """Check every field before any work (see :class:`~opbench.pipeline.spec.Spec`)."""
        from ..predict import SPLITS, WHATS

        if self.what not in WHATS:
            raise SpecError("what", f"unknown predictor {self.what!r} (accepted: {', '.join(WHATS)})")
        if self.split not in SPLITS:
            raise SpecError("split", f"unknown split {self.split!r} (accepted: {', '.join(SPLITS)})")
        if self.folds < 2:
            raise SpecError("folds", f"must be 2 or more, got {self.folds}")
        if self.seed < 0:
            raise SpecError("seed", f"must be 0 or more, got {self.seed}")
        if self.also and self.what != "corun":
            raise SpecError("also", f"only for --what corun (its co-run groups), not --what {self.what}")


def train(job: TrainJob) -> dict[str, Any]:
    """:func:`opbench.predict.train` for ``job``, with the trials predictor's tasks loaded by :func:`task_modules`."""
    from ..predict import train as fit

    job.validate()
    return fit(job.dataset, job.what, job.split, job.out, job.folds, job.seed, job.device, job.features, job.config,
               list(job.exclude) or None, task_modules=task_modules, also=list(job.also) or None)


def task_modules(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, str], tuple[Any, Any]]:
    """``(workload_id, task) -> (task module, tuning target)`` for every task the rows name."""
    from tvm.s_tir import meta_schedule as ms

    wanted: dict[str, set[str]] = defaultdict(set)
    first: dict[str, dict[str, Any]] = {}
    for r in rows:
        wanted[r["workload_id"]].add(r["task"])
        first.setdefault(r["workload_id"], r)
    out = {}
    for wid, tasks in wanted.items():
        row = first[wid]
        fp = json_value(row["workload"]) or {}
        options = dict(fp.get("options") or {})
        target = target_for(row["target"])
        log.info("re-extracting the tasks of %s (%s) for %d trial task(s)", fp.get("model"), fp.get("source"),
                 len(tasks))
        name = fp["model"]
        if fp["source"] == "simple":  # its options are part of the name: matmul:n=32
            extra = ",".join(f"{k}={v}" for k, v in options.items() if k != "seed")
            name, options = (f"{name}:{extra}" if extra else name), {"seed": options.get("seed", 0)}
        try:
            workload = load_workload(fp["source"], name, fp.get("batch_size", 1), **options)
        except Exception as err:  # a model that cannot be loaded here: its trials are skipped
            log.warning("cannot load %s to replay its trials: %s", fp.get("model"), err)
            continue
        if workload.workload_id != wid:
            log.warning("%s loads as another workload here (%s, not %s): its trials are skipped",
                        fp.get("model"), workload.workload_id, wid)
            continue
        lowered, _graph = extract_operators(workload.mod, target)
        for task in ms.relax_integration.extract_tasks(lowered, target):
            if task.task_name in tasks:
                out[(wid, task.task_name)] = (task.dispatched[0], target)
    return out


__all__ = ["TrainJob", "task_modules", "train"]
