"""The tuning job: tune every unique task of a model with MetaSchedule, one task after another
(the heaviest first), writing every measured candidate to the dataset's ``trials`` table and every
record to the tuning database.

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
from .collect import measurement_key
from .runs import recorded_run

log = logging.getLogger("opbench")


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


def tuning_target(target: Any, device: Any = None) -> Any:
    """The target MetaSchedule tunes for: the collection target, with the core count on CPUs
    (its parallel rules need ``num-cores``) and the device's limits on GPUs (``device``: the
    measuring device, remote or this machine's)."""
    import tvm

    if is_gpu(target):
        # MetaSchedule's GPU rules and its VerifyGPUCode check read the device's limits from the target
        dev = device if device is not None else tvm.cuda(0)
        config = {**target.export(), "max_threads_per_block": int(dev.max_threads_per_block),
                  "max_shared_memory_per_block": int(dev.max_shared_memory_per_block),
                  "thread_warp_size": int(dev.warp_size), "max_num_threads": int(dev.max_threads_per_block)}
        config["keys"] = list(config.get("keys", ()))
        return tvm.target.Target({k: v for k, v in config.items() if k != "tag"})
    if "num-cores" in target.attrs:
        return target
    config = {"kind": "llvm", **{k: v for k, v in target.export().items() if k in ("mcpu", "mtriple", "mattr")}}
    config["num-cores"] = max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)
    return tvm.target.Target(config)


def tune_workload(workload: Workload, target: Any, dataset: Dataset, database_dir: str | Path, tuner: Any = "xgb",
                  trials: int = 64, order: dict[str, float] | None = None, tasks_limit: int | None = None,
                  command: str = "", profiler: Any = None, time_limit: float | None = None) -> TuningRun:
    """Tune every unique task of ``workload`` for ``target`` (see the module docstring).

    Parameters
    ----------
    order:
        Optional default latency of each task (by fused function name): heavier tasks go first.
    tasks_limit:
        Tune only the first ``tasks_limit`` tasks in that order (the others keep default kernels).
    profiler:
        The collection's profiler; an RPC profiler sends the candidates to its remote devices.
    time_limit:
        Seconds of tuning after which no new task is started (a re-run continues).
    """
    from ..tune import get_tuner
    from ..tune.database import database_lock

    tuner = get_tuner(tuner)
    if trials < 1:
        raise OpBenchError(f"--trials must be a positive integer, got {trials}")
    _check_tuning_deps()
    database_dir = Path(database_dir)
    with database_lock(database_dir):  # one tuning run per database folder
        return _tune(workload, target, dataset, database_dir, tuner, trials, order, tasks_limit, command, profiler,
                     time_limit)


def _tune(workload: Workload, target: Any, dataset: Dataset, database_dir: Path, tuner: Any, trials: int,
          order: dict[str, float] | None, tasks_limit: int | None, command: str, profiler: Any,
          time_limit: float | None) -> TuningRun:
    from tvm.s_tir import meta_schedule as ms

    from ..runtime.startup import import_tensor_intrinsics
    from ..tune.database import WriteCheck, open_database, records_for, valid_secs
    from ..tune.measure import CheckedCostModel, SignalCheck, TrialRecorder

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
        log.info("tuning %d of %d tasks with '%s', up to %d trials each; database %s", total, len(extracted),
                 tuner.name, trials, database_dir)
        work_dir = str(database_dir / "logs")
        parts: list[Any] = []  # the builder's and runner's worker processes, stopped however the run ends
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
                contexts, _weights = ms.relax_integration.extracted_tasks_to_tune_contexts(
                    [task], work_dir, strategy=strategy, num_threads="physical")
                # the rows first: a batch whose rows cannot be written adds no record to the database
                callbacks = [recorder, *ms.measure_callback.MeasureCallback.create("default"), SignalCheck()]
                try:
                    with signals.deferred(), _logging_errors_quiet():  # signals: stop at a safe point
                        ms.tune.tune_tasks(tasks=contexts, task_weights=[1.0], work_dir=work_dir,
                                           max_trials_global=remaining, max_trials_per_task=remaining,
                                           num_trials_per_iter=min(64, remaining), builder=builder,
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
