"""The collection job: extract a model's operators, compile them once, check them against the
Relax VM, time every operator and the whole model, and write each row as soon as it is measured.

Rows are keyed by the workload's fingerprint, the device's fingerprint and the measurement variant
(see :mod:`opbench.dataset.schema`). A re-run skips operators already measured under the same key;
the ``models`` row (whole-model VM latency) is written only by a run that measured operators, with
``force``, or when the model has no row yet, so it always describes the same run as the operators.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from .. import signals
from ..dataset import Dataset, model_key, now
from ..errors import OpBenchError
from ..ir import OpGraph
from ..models import Workload
from ..profile.base import LocalProfiler, Profiler
from ..profile.env import environment_tags
from ..profile.timer import Timing, TimingConfig
from ..runtime import OperatorKernels, canonical_target, flatten_outputs, relative_error
from ..utils import device_lock
from .compare import DEFAULT_SCHEDULERS, CompareOptions
from .runs import recorded_run
from .spec import MeasureSpec, ModelSpec, Spec, SpecError, check_devices, check_points, check_rpc

log = logging.getLogger(__name__)


@dataclasses.dataclass
class CollectOptions:
    """Options of :func:`collect`.

    ``database`` is a tuning database folder: each task's best record replaces its default kernel
    (the rows' ``config`` is then ``db:<digest>``), except the tasks named in ``exclude``.
    """

    timing: TimingConfig = dataclasses.field(default_factory=TimingConfig)
    force: bool = False
    check: bool = True
    tolerance: float | None = None
    progress: bool = True
    seed: int = 0
    measure_vm: bool = True
    database: str | Path | None = None
    exclude: set[str] = dataclasses.field(default_factory=set)


@dataclasses.dataclass(frozen=True)
class CollectJob(Spec):
    """A collection as plain data: which models, how they are measured, tuned and compared.

    ``opbench collect --config job.json`` loads one (flags given on the command line override its fields),
    ``job.save(path)`` writes one; :meth:`validate` names the field that is wrong. Several models, batch
    sizes or dtypes make a sweep (every combination, each point in its own process).

    Attributes
    ----------
    models, source, target, batch_sizes, dtypes:
        What is measured, and on what (``target``: ``llvm``, ``cuda`` or a JSON target).
    image_size, seqlen, seed, sha256:
        How models are built (input size, sequence length, the seed of weights and inputs, an ONNX
        file's expected digest).
    devices:
        GPUs a sweep spreads over (one worker each).
    repeat, warmup, min_repeat_ms, flush_l2, check, corun, corun_k, corun_limit, force:
        Measurement: samples per operator, untimed calls, least duration of a sample, caches flushed,
        the replay checked against the Relax VM, co-run groups (largest, how many), re-measure rows
        already stored.
    tune, tuner, trials, predictor, tune_tasks, tune_time_s, database:
        Tuning with MetaSchedule before measuring (every trial kept), and a predictor for its cost
        model or for ``cost="predicted"``.
    rpc_tracker, rpc_key, rpc_workers:
        Measure on devices registered with a TVM RPC tracker (builds stay here).
    compare, schedulers, compare_repeat, compare_number, cost, ios_cost, ios_time_limit_s, sm_partition:
        Parallel schedules of the collected kernels, measured side by side.
    dataset:
        The SQLite dataset (``None``: ``$OPBENCH_DATASET``, else ``data/opbench.sqlite``).
    """

    models: tuple[str, ...] = ("resnet-18",)
    source: str = "local"
    target: str = "llvm"
    batch_sizes: tuple[int, ...] = (1,)
    dtypes: tuple[str, ...] = ("float32",)
    image_size: int | None = None
    seqlen: int = 128
    seed: int = 0
    sha256: str | None = None
    devices: tuple[int, ...] | None = None
    repeat: int = 10
    warmup: int = 1
    min_repeat_ms: float = 5.0
    flush_l2: bool = False
    check: bool = True
    corun: bool = False
    corun_k: int = 4
    corun_limit: int = 200
    force: bool = False
    tune: bool = False
    tuner: str = "xgb"
    trials: int = 64
    predictor: str | None = None
    tune_tasks: int | None = None
    tune_time_s: float | None = None
    database: str | None = None
    rpc_tracker: str | None = None
    rpc_key: str | None = None
    rpc_workers: int | None = None
    compare: bool = False
    schedulers: tuple[str, ...] = DEFAULT_SCHEDULERS
    compare_repeat: int = 10
    compare_number: int = 20
    cost: str = "measured"
    ios_cost: str = "model"
    ios_time_limit_s: float = 60.0
    sm_partition: str = "off"
    dataset: str | None = None

    def validate(self) -> None:
        """Check every field before any work (see :class:`~opbench.pipeline.spec.Spec`)."""
        from ..models import SOURCE_KINDS
        from ..tune.tuners import TUNERS

        if self.source not in SOURCE_KINDS:
            raise SpecError("source", f"unknown source {self.source!r} (accepted: {', '.join(SOURCE_KINDS.kinds())})")
        if not self.models or any(not m.strip() for m in self.models):
            raise SpecError("models", "at least one model name is needed")
        check_points(self.dtypes, self.batch_sizes)
        for name in ("seqlen", "repeat", "corun_k", "corun_limit", "trials", "compare_repeat", "compare_number"):
            if getattr(self, name) < 1:
                raise SpecError(name, f"must be 1 or more, got {getattr(self, name)}")
        for name in ("image_size", "tune_tasks"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise SpecError(name, f"must be 1 or more, got {getattr(self, name)}")
        for name in ("seed", "warmup"):
            if getattr(self, name) < 0:
                raise SpecError(name, f"must be 0 or more, got {getattr(self, name)}")
        for name in ("min_repeat_ms", "tune_time_s", "ios_time_limit_s"):
            value = getattr(self, name)
            if value is not None and not (0 <= value < float("inf") and (name == "min_repeat_ms" or value > 0)):
                raise SpecError(name, f"must be a finite positive number, got {value}")
        check_devices(self.devices)
        if self.tuner not in TUNERS:
            raise SpecError("tuner", f"unknown tuner {self.tuner!r} (accepted: {', '.join(TUNERS)})")
        try:
            self.compare_options().validate()
        except SpecError as err:
            raise SpecError(COMPARE_FIELDS.get(err.field, err.field), err.message) from None
        check_rpc(self.rpc_tracker, self.rpc_key, self.rpc_workers)

    def compare_options(self) -> CompareOptions:
        """What ``compare`` runs on the collected kernels."""
        return CompareOptions(self.schedulers, self.cost, self.ios_cost, self.predictor, self.ios_time_limit_s,
                              self.compare_repeat, self.compare_number, sm_partition=self.sm_partition)

    def model_specs(self) -> list[ModelSpec]:
        """Every model the job loads: each model at each batch size and dtype, models outermost."""
        return [ModelSpec(name=m, source=self.source, batch_size=b, dtype=d, image_size=self.image_size,
                          seqlen=self.seqlen, seed=self.seed, sha256=self.sha256)
                for m in self.models for b in self.batch_sizes for d in self.dtypes]

    def measure_spec(self) -> MeasureSpec:
        """How the job times operators."""
        return MeasureSpec(target=self.target, warmup=self.warmup, repeat=self.repeat,
                           min_repeat_ms=self.min_repeat_ms, flush_l2=self.flush_l2, corun_k=self.corun_k,
                           corun_limit=self.corun_limit if self.corun else 0, rpc_tracker=self.rpc_tracker,
                           rpc_key=self.rpc_key, rpc_workers=self.rpc_workers)


#: CompareOptions fields named otherwise in a CollectJob
COMPARE_FIELDS = {"repeat": "compare_repeat", "number": "compare_number"}


#: how far the per-operator replay may differ from the Relax VM, by dtype (relative error)
REPLAY_TOLERANCE = {"float32": 1e-5, "float16": 1e-2, "bfloat16": 5e-2}


@dataclasses.dataclass
class CollectResult:
    """What a collection did; ``rows`` are the operator rows of this model now in the dataset.

    ``kernels``, ``built``, ``inputs`` and ``values`` (the replayed operators' outputs by index) stay
    usable where the kernels ran on this machine (None after a remote collection); ``resources`` are
    the kernels' resources by operator index; ``corun`` summarises the co-run groups (empty without).
    """

    workload: Workload
    graph: OpGraph
    rows: list[dict[str, Any]]
    model_row: dict[str, Any]
    measured: int
    skipped: int
    failed: int
    compile_s: float
    measure_s: float
    dataset_path: str
    run_id: int = 0
    key: dict[str, Any] = dataclasses.field(default_factory=dict)
    tags: dict[str, Any] = dataclasses.field(default_factory=dict)
    model_row_written: bool = True
    resources: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)
    corun: dict[str, Any] = dataclasses.field(default_factory=dict)
    phases_s: dict[str, float] = dataclasses.field(default_factory=dict)
    kernels: OperatorKernels | None = None
    built: Any = None
    inputs: list[Any] | None = None
    values: dict[int, list[Any]] | None = None


class PhaseClock:
    """Seconds spent in each phase of a job, in order: one clock, read as each phase ends."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, phase: str) -> None:
        """Charge the time since the last lap (or the clock's start) to ``phase``."""
        now_ = time.perf_counter()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + now_ - self._last
        self._last = now_


def progress(items: Iterable[Any], enabled: bool, desc: str, total: int, unit: str = "op") -> Iterator[Any]:
    """A progress bar on a terminal; plain log lines (about every tenth) when stderr is not one."""
    if not enabled:
        yield from items
        return
    if sys.stderr.isatty():
        from tqdm import tqdm

        yield from tqdm(items, desc=desc, total=total, unit=unit, file=sys.stderr, leave=True, dynamic_ncols=True)
        return
    step = max(1, total // 10) if total >= 20 else max(total, 1)
    start = time.perf_counter()
    for i, item in enumerate(items):
        yield item
        if (i + 1) % step == 0 or i + 1 == total:
            log.info("%s: %d/%d %ss (%.1f s)", desc, i + 1, total, unit, time.perf_counter() - start)


def operator_row(node: Any, graph: OpGraph, task_uses: int) -> dict[str, Any]:
    """The feature columns of an operator row."""
    return {
        "op_index": node.index, "func": node.func, "task": node.task, "task_uses": task_uses,
        "kind": node.kind, "ops": node.ops, "attrs": node.attrs,
        "input_shapes": node.input_shapes, "input_dtypes": node.input_dtypes,
        "output_shapes": node.output_shapes, "output_dtypes": node.output_dtypes,
        "preds": graph.preds(node.index), "flops": node.flops, "bytes": node.bytes,
        "arithmetic_intensity": node.arithmetic_intensity,
    }


def _throughput(row: dict[str, Any], timing: Timing) -> None:
    median = timing.median
    row["gflops"] = row["flops"] / median / 1e9 if median > 0 else None
    row["gbytes_per_s"] = row["bytes"] / median / 1e9 if median > 0 else None


def measurement_key(workload: Workload, target: Any, config: str = "default", l2_flush: bool = False,
                    device: dict[str, Any] | None = None) -> dict[str, Any]:
    """The dataset key of ``workload`` measured on ``target``, with its readable columns.

    ``device`` is the measuring device's fingerprint when it is not this machine (a remote device
    over RPC, see :meth:`opbench.profile.Profiler.device`).
    """
    from ..profile.env import device_id, device_name

    return model_key(workload.workload_id, device_id(target, device), config, l2_flush,
                     source=workload.source, model=workload.name, batch_size=workload.batch_size,
                     workload=workload.readable(), target=canonical_target(target),
                     device_name=device["device_name"] if device else device_name(target), dtype=workload.dtype)


def _phase(message: str, *args: Any) -> None:
    signals.check()
    log.info(message, *args)


def collect(workload: Workload, target: Any, dataset: Dataset, options: CollectOptions | None = None,
            command: str = "", profiler: Profiler | None = None) -> CollectResult:
    """Measure every operator of ``workload`` on ``target`` and write the rows to ``dataset``.

    Parameters
    ----------
    profiler:
        Where and how to time (:mod:`opbench.profile.base`): the CUDA profiler on GPUs, an RPC
        profiler for remote devices; default: TVM's ``time_evaluator`` on this machine.
    """
    from .compile import compile_workload

    options = options or CollectOptions()
    profiler = profiler or LocalProfiler()
    clock = PhaseClock()
    tags = {**environment_tags(target), **profiler.tags()}
    with recorded_run(dataset, command, {**tags, **profiler.run_facts()}) as run, contextlib.ExitStack() as measuring:
        run_id = run.run_id
        _phase("%s: extracting operators and compiling for %s", workload.name, target.kind.name)
        compiled = compile_workload(workload, target, options.database, options.exclude,
                                    device=getattr(profiler, "remote", None))
        graph, built = compiled.graph, compiled.built
        clock.lap("compile")  # extraction, lowering and the build (compile_s: the build alone)
        key = measurement_key(workload, target, compiled.config, options.timing.flush_l2, profiler.device(target))
        _phase("%s: %d operators, %d unique tasks; compiled in %.1f s", workload.name, len(graph),
               len(graph.tasks()), built.compile_seconds)
        measuring.enter_context(device_lock(f"measuring {workload.name}"))  # $OPBENCH_DEVICE_LOCK
        built = profiler.place(built)
        kernels = OperatorKernels(graph, built)
        try:
            inputs = kernels.to_device(workload.example_inputs(options.seed))
            outputs, values = kernels.replay(inputs)
        except Exception as err:
            if "out of memory" in str(err).lower():
                raise OpBenchError(f"out of device memory running {workload.name} at batch size "
                                   f"{workload.batch_size}; try a smaller --batchsize") from None
            raise
        vm = built.vm()
        error = None
        if options.check:
            _phase("checking the per-operator replay against the Relax VM")
            error = relative_error(outputs, flatten_outputs(vm["main"](*inputs)))
            if error > (options.tolerance if options.tolerance is not None else REPLAY_TOLERANCE[workload.dtype]):
                log.warning("per-operator replay differs from the Relax VM: relative error %.3g", error)
        resources = profiler.resources(kernels)
        clock.lap("check")  # the kernels placed, replayed once, checked against the VM, their resources read
        tasks = graph.tasks()
        timed: dict[str, tuple[Timing | None, str | None]] = {}
        measured = skipped = failed = 0
        start = time.perf_counter()
        base = {**key, **tags, "run_id": run_id}
        signals.check()
        for node in progress(graph, options.progress, workload.name, len(graph)):
            signals.check()
            if not options.force and dataset.has("operators", {**key, "op_index": node.index}):
                skipped += 1
                continue
            if node.task not in timed:
                try:
                    args = kernels.args_for(node.index, inputs, values)
                    outs = kernels.allocate_outputs(node.index)
                    timing = profiler.time(kernels, node.index, args, outs, options.timing)
                    timed[node.task] = (timing, None)
                except Exception as err:  # a kernel that fails is recorded, the run goes on
                    signals.check()
                    timed[node.task] = (None, f"{type(err).__name__}: {str(err).strip()[:500]}")
            timing, err_text = timed[node.task]
            row = {**base, **operator_row(node, graph, tasks[node.task].count),
                   **resources.get(node.index, {}), "measured_at": now()}
            if timing is not None:
                row.update(timing.columns(), status="ok", error=None)
                _throughput(row, timing)
                measured += 1
            else:
                row.update(status="failed", error=err_text)
                failed += 1
            dataset.put("operators", row)
        measure_s = time.perf_counter() - start
        clock.lap("measure")
        rows = dataset.rows("operators", key_only(key))
        corun_summary = {}
        if profiler.corun_limit:
            _phase("measuring co-run groups")
            corun_summary = _collect_coruns(kernels, inputs, values, profiler, dataset, options, key,
                                            {**tags, "run_id": run_id})
            clock.lap("corun")
        existing = dataset.rows("models", key_only(key))
        write_model = bool(measured or failed or options.force or not existing)
        if write_model:
            vm_timing = None
            if options.measure_vm:
                _phase("timing the whole model in the Relax VM")
                vm_timing = profiler.time_model(built, inputs, options.timing)
            tags.update(profiler.end_tags())
            model_row = {
                **key, **tags, "run_id": run_id, "num_ops": len(graph), "unique_tasks": len(tasks),
                "sum_op_latency_s": sum(r["latency_median_s"] or 0.0 for r in rows),
                "vm_latency_median_s": vm_timing.median if vm_timing else None,
                "vm_latency_std_s": vm_timing.std if vm_timing else None,
                **(vm_timing.percentiles("vm_latency") if vm_timing else {}),
                **(vm_timing.energy_columns("vm_") if vm_timing else {}),
                "replay_rel_error": error, "compile_s": built.compile_seconds, "measure_s": measure_s,
                "provenance": workload.provenance,
                "status": "ok" if not any(r["status"] != "ok" for r in rows) else "partial",
                "measured_at": now(),
            }
            dataset.put("models", model_row)
        else:
            model_row = existing[-1]
            log.info("nothing new to measure: the %d operators are in the dataset from run %s "
                     "(--force measures again)", len(rows), model_row["run_id"])
        clock.lap("model")  # the whole model timed in the Relax VM and its row written
        result = CollectResult(workload, graph, rows, model_row, measured, skipped, failed,
                               built.compile_seconds, measure_s, str(dataset.path), run_id, key, tags,
                               write_model, resources, corun_summary, clock.seconds)
        if built.device.dlpack_device_type() < 128:  # kernels on this machine stay usable (--ifcompare)
            result.kernels, result.built, result.inputs, result.values = kernels, built, inputs, values
        else:  # remote: nothing keeps the session, so the device is free after this collection
            del kernels, built, inputs, values, vm, outputs
            profiler.release()
        run.status = "ok" if not failed else "partial"
        return result


def key_only(key: dict[str, Any]) -> dict[str, Any]:
    """The key columns of a measurement key (without its readable columns)."""
    from ..dataset.schema import KEY_COLUMNS

    return {c: key[c] for c in KEY_COLUMNS}


def _collect_coruns(kernels: OperatorKernels, inputs: Any, values: Any, profiler: Profiler, dataset: Dataset,
                    options: CollectOptions, key: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """Measure co-run groups from the antichains of the model's graph (``kernels.graph``) and write one row per
    group."""
    from ..profile.antichain import corun_groups

    graph = kernels.graph
    groups = corun_groups(graph, profiler.corun_k, profiler.corun_limit)
    start = time.perf_counter()
    measured = skipped = failed = 0
    for group in progress(groups, options.progress, "co-run", len(groups), unit="group"):
        signals.check()
        gkey = "-".join(str(i) for i in group)
        if not options.force and dataset.has("corun", {**key, "group_key": gkey}):
            skipped += 1
            continue
        row = {**key, **base, "group_key": gkey, "group_size": len(group), "op_indices": list(group),
               "kinds": [graph[i].kind for i in group],
               "features": [{k: v for k, v in graph[i].to_dict().items() if k not in ("args",)} for i in group],
               "measured_at": now()}
        try:
            row.update(profiler.corun(kernels, group, inputs, values, options.timing))
            measured += 1
        except Exception as err:  # a group that fails is recorded, the run goes on
            signals.check()
            row.update(status="failed", error=f"{type(err).__name__}: {str(err).strip()[:500]}")
            failed += 1
        dataset.put("corun", row)
    return {"corun_groups": len(groups), "corun_measured": measured, "corun_skipped": skipped,
            "corun_failed": failed, "corun_s": time.perf_counter() - start}


__all__ = ["CollectJob", "CollectOptions", "CollectResult", "collect", "measurement_key", "progress"]
