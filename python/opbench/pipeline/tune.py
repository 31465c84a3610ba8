"""The tuning jobs: :func:`tune_workload` tunes every unique task of a model with MetaSchedule, one
task after another (the heaviest first), writing every measured candidate to the dataset's ``trials``
table and every record to the tuning database; :func:`tune_and_measure` is ``collect --iftune``: the
default kernels measured, the model tuned, the tuned kernels measured, and a tuned kernel that is not
faster than its default one left out.

It resumes: each task gets up to ``trials`` records in the database, counting those an earlier
(interrupted) run left there, so a re-run continues where the last one stopped.

Candidates are built here (see :mod:`opbench.tune.measure`) and measured by MetaSchedule's
``LocalRunner``, or by its ``RPCRunner`` on remote devices when the profiler is an RPC one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .. import signals
from ..dataset import Dataset, now
from ..errors import OpBenchError
from ..ir import extract_operators
from ..models import Workload
from ..profile.env import environment_tags
from ..runtime import is_gpu
from ..runtime.target import tuning_target
from ..tune import get_tuner
from .collect import measurement_key
from .runs import recorded_run
from .spec import Spec, SpecError, check_positive

log = logging.getLogger(__name__)


@dataclasses.dataclass
class TaskTuning:
    """One task's tuning in this run."""

    task: str
    weight: int
    before: int  # records already in the database
    trials: int  # measured in this run
    valid: int
    best_s: float | None
    seconds: float


@dataclasses.dataclass
class TuningRun:
    """What :func:`tune_workload` did."""

    tuner: str
    trials_per_task: int
    tasks: list[TaskTuning]
    seconds: float
    database: Path
    extracted: list[Any]  # MetaSchedule's ExtractedTask of every task, for applying the database

    @property
    def measured(self) -> int:
        return sum(t.trials for t in self.tasks)


@dataclasses.dataclass
class TaskResult:
    """One task of :func:`tune_and_measure`: default and tuned latency (seconds, as collected) and the tuning."""

    task: str
    uses: int
    default_s: float | None
    tuned_s: float | None
    trials: int
    trials_before: int
    valid: int
    best_trial_s: float | None
    kept: bool  # the tuned kernel is in the build (measured faster than the default one)
    seconds: float

    @property
    def speedup(self) -> float | None:
        return self.default_s / self.tuned_s if self.default_s and self.tuned_s else None


@dataclasses.dataclass
class TunedCollection:
    """What :func:`tune_and_measure` did: the default and tuned collections, the tuning run, every task."""

    default: Any  # CollectResult of the default kernels
    tuned: Any  # CollectResult of the tuned kernels (the default one when no tuned kernel is kept)
    run: TuningRun
    tasks: list[TaskResult]

    @property
    def model_default_s(self) -> float | None:
        return self.default.model_row["vm_latency_median_s"]

    @property
    def model_tuned_s(self) -> float | None:
        return self.tuned.model_row["vm_latency_median_s"]

    def summary(self) -> dict[str, Any]:
        """The ``tuning`` object of ``collect --json``."""
        d, t, run = self.model_default_s, self.model_tuned_s, self.run
        return {
            "tuner": run.tuner, "trials_per_task": run.trials_per_task,
            "tasks": [{"task": x.task, "func": x.task, "uses": x.uses, "default_s": x.default_s, "tuned_s": x.tuned_s,
                       "speedup": x.speedup, "trials": x.trials, "trials_before": x.trials_before, "valid": x.valid,
                       "best_trial_s": x.best_trial_s, "kept": x.kept, "seconds": x.seconds} for x in self.tasks],
            "database": str(run.database), "config": self.tuned.key["config"], "model_default_s": d,
            "model_tuned_s": t, "model_speedup": d / t if d and t else None, "tuning_s": run.seconds,
            "trials": run.measured, "trials_per_s": run.measured / run.seconds if run.seconds else None,
        }


def _task_latency(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Median latency of each task (by its fused function name) from operator rows."""
    return {r["func"]: r["latency_median_s"] for r in rows if r["latency_median_s"] is not None}


@dataclasses.dataclass(frozen=True)
class TuneSpec(Spec):
    """How a model is tuned (``collect --iftune``'s knobs, one object).

    Attributes
    ----------
    database:
        The tuning database folder (MetaSchedule's JSON files; one tuning run at a time).
    tuner:
        A tuner's name (:data:`opbench.tune.TUNERS`), or from Python a :class:`~opbench.tune.tuners.Tuner`
        (a pretrained one; such a spec does not go to JSON).
    trials:
        Measured candidates per task.
    tasks_limit:
        Tune only the heaviest ``tasks_limit`` tasks (the others keep default kernels).
    time_limit_s:
        Seconds of tuning after which no new task starts (a re-run continues).
    """

    database: str | Path = "data/opbench.tuning"
    tuner: Any = "xgb"
    trials: int = 64
    tasks_limit: int | None = None
    time_limit_s: float | None = None

    def validate(self) -> None:
        """Check every field (see :class:`~opbench.pipeline.spec.Spec`)."""
        from ..tune.tuners import TUNERS

        if isinstance(self.tuner, str) and self.tuner not in TUNERS:
            raise SpecError("tuner", f"unknown tuner {self.tuner!r} (accepted: {', '.join(TUNERS)})")
        check_positive(self, ("trials", "tasks_limit"))
        if self.time_limit_s is not None and not 0 < self.time_limit_s < float("inf"):
            raise SpecError("time_limit_s", f"must be a finite positive number, got {self.time_limit_s}")
        if not str(self.database).strip():
            raise SpecError("database", "a folder is needed")


def tune_and_measure(workload: Workload, target: Any, dataset: Dataset, options: Any, tune: TuneSpec,
                     command: str = "", profiler: Any = None) -> TunedCollection:
    """Measure the default kernels, tune (:func:`tune_workload`, heaviest tasks first by the default
    latencies just measured), measure the tuned kernels; a tuned kernel measured no faster than its
    default one is dropped and the model measured again without it.

    ``options`` are the collections' :class:`~opbench.pipeline.collect.CollectOptions` (their
    ``database`` and ``exclude`` are set here).
    """
    from ..tune.database import applied_database
    from .collect import collect

    def measure(database: Path | None, exclude: set[str] | None = None) -> Any:
        return collect(workload, target, dataset, dataclasses.replace(options, database=database,
                                                                      exclude=exclude or set()),
                       command=command, profiler=profiler)

    database_dir = Path(tune.database)
    log.info("1/3 measuring the default kernels")
    default = measure(None)
    before = _task_latency(default.rows)
    tune = dataclasses.replace(tune, tuner=get_tuner(tune.tuner))
    log.info("2/3 tuning with '%s', %d trials per task", tune.tuner.name, tune.trials)
    run = tune_workload(workload, target, dataset, tune, order=before, command=command, profiler=profiler)
    log.info("3/3 measuring the tuned kernels")
    applied = applied_database(database_dir, run.extracted, target)
    tuned, dropped, rejected = default, set(), {}  # rejected: a dropped task's tuned time, as measured
    if applied is not None:
        tuned = measure(database_dir)
        after = _task_latency(tuned.rows)
        dropped = {t for t in applied.tasks if t in after and t in before and after[t] >= before[t]}
        rejected = {t: after[t] for t in dropped}
        if dropped:
            log.info("%d tuned kernels are not faster than the default ones; measuring without them: %s",
                     len(dropped), ", ".join(sorted(dropped)))
            applied = applied_database(database_dir, run.extracted, target, exclude=dropped)
            tuned = measure(database_dir, dropped) if applied is not None else default
    after = {**_task_latency(tuned.rows), **rejected}
    tasks = [TaskResult(t.task, t.weight, before.get(t.task), after.get(t.task), t.trials, t.before, t.valid, t.best_s,
                        t.task not in dropped and applied is not None and t.task in applied.tasks, t.seconds)
             for t in run.tasks]
    return TunedCollection(default, tuned, run, tasks)


def load_pretrained(tuner: Any, path: str | Path, target_kind: str | None = None) -> Any:
    """``tuner`` starting from the trials predictor in ``path`` (``opbench train --what trials``),
    checked to be one and trained for ``target_kind`` (``--pretrained``)."""
    from ..predict import load_predictor
    from ..tune import pretrained_tuner

    predictor = load_predictor(path, "trials")
    predictor.check_device(None, target_kind)
    return pretrained_tuner(tuner, predictor.tuning_model, str(path))


def _check_tuning_deps() -> None:
    missing = []
    for module in ("xgboost", "cloudpickle"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise OpBenchError(f"tuning needs {', '.join(missing)}: pip install 'opbench[tune]'")


def _evaluator() -> Any:
    from tvm.s_tir.meta_schedule.runner import EvaluatorConfig

    return EvaluatorConfig(number=3, repeat=3, min_repeat_ms=0, enable_cpu_cache_flush=False)


def _runner(target: Any, profiler: Any = None) -> Any:
    from ..tune.measure import CheckedRunner

    timeout = 60 if is_gpu(target) else 30
    spec = getattr(profiler, "spec", None)
    if spec is not None:  # an RPC profiler: MetaSchedule's RPCRunner on the same tracker and key
        return CheckedRunner(spec.runner(_evaluator(), timeout_sec=timeout))
    from tvm.s_tir.meta_schedule.runner import LocalRunner

    return CheckedRunner(LocalRunner(timeout_sec=timeout, evaluator_config=_evaluator()))


def _builder(target: Any) -> Any:
    """On GPUs, a pool of worker processes (one per core) that lives for the tuning run; on CPUs,
    builds in this process (the cores are busy measuring, and workers would only add start-up)."""
    from ..tune.measure import InProcessBuilder, PoolBuilder

    if is_gpu(target):
        return PoolBuilder(max_workers=os.cpu_count() or 1)
    return InProcessBuilder()


def tune_workload(workload: Workload, target: Any, dataset: Dataset, tune: TuneSpec,
                  order: dict[str, float] | None = None, command: str = "", profiler: Any = None) -> TuningRun:
    """Tune every unique task of ``workload`` for ``target`` as ``tune`` says (see the module docstring).

    Parameters
    ----------
    order:
        Optional default latency of each task (by fused function name): heavier tasks go first (and
        ``tune.tasks_limit`` keeps the heaviest).
    profiler:
        The collection's profiler; an RPC profiler sends the candidates to its remote devices.
    """
    from ..tune.database import database_lock

    tune.validate()
    tune = dataclasses.replace(tune, tuner=get_tuner(tune.tuner), database=Path(tune.database))
    if tune.trials < 1:
        raise OpBenchError(f"--trials must be a positive integer, got {tune.trials}")
    _check_tuning_deps()
    with database_lock(tune.database):  # one tuning run per database folder
        return _tune(workload, target, dataset, tune, order, command, profiler)


def _tune(workload: Workload, target: Any, dataset: Dataset, tune: TuneSpec, order: dict[str, float] | None,
          command: str, profiler: Any) -> TuningRun:
    database_dir, tuner, trials = Path(tune.database), tune.tuner, tune.trials
    tasks_limit, time_limit = tune.tasks_limit, tune.time_limit_s
    from tvm.s_tir import meta_schedule as ms

    from ..runtime.startup import import_tensor_intrinsics
    from ..tune.database import WriteCheck, open_database, records_for, valid_secs
    from ..tune.measure import CheckedCostModel, SignalCheck, TrialRecorder
    from ..tune.space import space_kind

    database = open_database(database_dir)
    written = WriteCheck(database_dir)  # MetaSchedule does not report a failed write (a full disk)
    device = profiler.device(target) if profiler is not None else None
    key = {**measurement_key(workload, target, device=device), "config": "tuning"}
    tags = {**environment_tags(target), **(profiler.tags() if profiler is not None else {})}
    start = time.perf_counter()
    done: list[TaskTuning] = []
    with recorded_run(dataset, command, tags) as run:
        run_id = run.run_id
        log.info("%s: extracting tuning tasks", workload.name)
        import_tensor_intrinsics()
        extracted = extracted_tasks(workload, target, getattr(profiler, "remote", None))
        signals.check()
        weight = {t.task_name: int(t.weight) for t in extracted}
        ranked = sorted(extracted, key=lambda t: -(order or {}).get(t.task_name, 0.0) * weight[t.task_name])
        chosen = ranked[:tasks_limit] if tasks_limit else ranked
        total = len(chosen)
        space = space_kind(target, workload.dtype)
        log.info("tuning %d of %d tasks with '%s', up to %d trials each%s; database %s", total, len(extracted),
                 tuner.name, trials, " on tensor cores" if space != "default" else "", database_dir)
        work_dir = str(database_dir / "logs")
        parts: list[Any] = []  # the builder's and runner's worker processes, stopped however the run ends
        if profiler is not None:
            profiler.release()  # a remote profiler's session would keep one device from the runner
        try:
            with signals.deferred():  # a half-made runner would leave its worker process to Python's exit
                parts += [_builder(target), _runner(target, profiler)]  # one of each for every task
            builder, runner = parts
            cost_model = CheckedCostModel(tuner.cost_model())  # shared by the tasks (see opbench.tune.tuners)
            tuning_start = time.perf_counter()
            for i, task in enumerate(chosen, 1):
                signals.check()
                if time_limit is not None and time.perf_counter() - tuning_start >= time_limit:
                    log.info("tuning time limit of %.0f s reached: %d of %d tasks not tuned this run (a re-run "
                             "continues)", time_limit, total - i + 1, total)
                    break
                mod = task.dispatched[0]
                earlier = records_for(database, mod)
                valid_before = [statistics.median(s) for s in (valid_secs(r) for r in earlier) if s]
                remaining = trials - len(earlier)
                if remaining <= 0:
                    log.info("task %d/%d %s: %d trials already in the database", i, total, task.task_name, len(earlier))
                    done.append(TaskTuning(task.task_name, weight[task.task_name], len(earlier), 0,
                                           len(valid_before), min(valid_before, default=None), 0.0))
                    continue
                task_start = time.perf_counter()
                base = {**key, **tags, "run_id": run_id, "task": task.task_name, "task_weight": weight[task.task_name],
                        "tuner": tuner.name}

                def sink(row: dict[str, Any], base: dict[str, Any] = base) -> None:
                    # numbered by the dataset: trial rows of runs at once never share a number
                    dataset.append("trials", {**base, **row, "measured_at": now()}, "trial")

                def report(rec: TrialRecorder, i: int = i, name: str = task.task_name, remaining: int = remaining,
                           task_start: float = task_start) -> None:
                    elapsed = time.perf_counter() - start
                    done_trials = sum(t.trials for t in done) + rec.measured
                    written.check(done_trials - rec.batch)  # the records of the batches before this one
                    left = trials * (total - i) + max(remaining - rec.measured, 0)
                    eta = elapsed / max(done_trials, 1) * left
                    best = "-" if rec.best_s is None else f"{rec.best_s * 1e3:.4f} ms"
                    log.info("task %d/%d %s: %d/%d trials, %d valid, best %s; %.0f s so far, about %.0f s left",
                             i, total, name, rec.measured, remaining, rec.valid, best, elapsed, eta)

                recorder = TrialRecorder(sink, best_s=min(valid_before, default=None), on_batch=report)
                strategy = tuner.strategy(trials)
                _quiet_metaschedule()
                contexts = _tune_contexts(ms, task, work_dir, space, strategy)
                # the rows first: a batch whose rows cannot be written adds no record to the database
                callbacks = [recorder, *ms.measure_callback.MeasureCallback.create("default"), SignalCheck()]
                try:
                    with signals.deferred(), _logging_errors_quiet():  # signals: stop at a safe point
                        ms.tune.tune_tasks(tasks=contexts, task_weights=[1.0], work_dir=work_dir,
                                           max_trials_global=remaining, max_trials_per_task=remaining,
                                           num_trials_per_iter=min(tuner.trials_per_iter, remaining), builder=builder,
                                           runner=runner, database=database, cost_model=cost_model,
                                           measure_callbacks=callbacks, task_scheduler="round-robin")
                except Exception:
                    if recorder.failure is not None:
                        raise recorder.failure from None
                    raise
                written.check(sum(t.trials for t in done) + recorder.measured)
                done.append(TaskTuning(task.task_name, weight[task.task_name], len(earlier), recorder.measured,
                                       recorder.valid + len(valid_before), recorder.best_s,
                                       time.perf_counter() - task_start))
        finally:
            for part in parts:
                if hasattr(part, "close"):
                    part.close()
        run.status = "ok"
        return TuningRun(tuner.name, trials, done, time.perf_counter() - start, database_dir, extracted)


def _tune_contexts(ms: Any, task: Any, work_dir: str, space: str, strategy: Any) -> list[Any]:
    """The task's tune context in design space ``space``; where MetaSchedule cannot build that space
    for this task (its tensor-core rules raise on some fused operators), the ordinary space, with one
    warning naming the task."""
    from ..tune.space import design_space

    def contexts(kind: str) -> list[Any]:
        made, _weights = ms.relax_integration.extracted_tasks_to_tune_contexts(
            [task], work_dir, space=design_space(kind), strategy=strategy, num_threads="physical")
        return made

    made = contexts(space)
    if space == "default":
        return made
    try:
        made[0].generate_design_space()
    except Exception as err:  # a ScheduleError inside a tensor-core rule
        log.warning("%s: no %s design space (%s: %s); tuned with the ordinary one", task.task_name, space,
                    type(err).__name__, str(err).strip().splitlines()[0] if str(err).strip() else "")
        return contexts("default")
    return made


@contextlib.contextmanager
def _logging_errors_quiet() -> Iterator[None]:
    """MetaSchedule's file logs (``logs/`` in the database folder) cannot be written on a full disk:
    each record would print a traceback. Those failures pass silently; the database and dataset
    writes report a full disk once."""
    saved = logging.raiseExceptions
    logging.raiseExceptions = False
    try:
        yield
    finally:
        logging.raiseExceptions = saved


def _quiet_metaschedule() -> None:
    """MetaSchedule's console log follows ours (its tables only with -v; its log files keep everything).

    Set before every tuning call, since each call reconfigures MetaSchedule's loggers; handlers
    without a name (a test harness's) are dropped, as MetaSchedule's logging configuration cannot
    name them and fails.
    """
    ms_log = logging.getLogger("tvm.s_tir.meta_schedule")
    ms_log.setLevel(logging.DEBUG if log.getEffectiveLevel() <= logging.DEBUG else logging.WARNING)
    for handler in list(ms_log.handlers):
        if handler.get_name() is None:
            ms_log.removeHandler(handler)


def extracted_tasks(workload: Workload, target: Any, device: Any = None) -> list[Any]:
    """MetaSchedule's tasks of ``workload`` (for applying a database without tuning)."""
    from tvm.s_tir import meta_schedule as ms

    lowered, _graph = extract_operators(workload.mod, target)
    return list(ms.relax_integration.extract_tasks(lowered, tuning_target(target, device)))
