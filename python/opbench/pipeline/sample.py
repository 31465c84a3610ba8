"""The sampling job (``opbench sample``): tensor-program records at the machine's speed.

1. Every model of the job (names × batch sizes × dtypes) is loaded and its MetaSchedule tasks are
   extracted; tasks are de-duplicated across models by the structural hash of their module (and the
   target): each remembers which models use it and how often (``tasks`` table).
2. Each task gets ``per_task`` candidates, sampled without hardware (:mod:`opbench.tune.sampler`), built
   and measured through the pipeline of :mod:`opbench.tune.farm`; every candidate becomes a row of
   the ``trials`` table as soon as it is measured (or fails to build or run).
3. A resumed run (the same job again) samples the same candidates and measures only those not
   stored: no candidate is stored twice, and a killed run loses nothing it had stored.
4. ``export_database`` writes the records as MetaSchedule's ``JSONDatabase`` as well.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..dataset import Dataset, now
from ..dataset.records import TIMER_CHOICES, derived, sample_config
from ..dataset.store import model_key
from ..errors import OpBenchError
from ..models import check_dtype
from ..utils import digest
from .runs import recorded_run
from .spec import Spec, SpecError, check_devices, check_points, check_rpc

log = logging.getLogger(__name__)

MAX_PER_TASK = 100_000
COMPILERS = ("nvrtc-pch", "nvrtc", "nvcc")  # opbench.tune.measure.CUDA_COMPILERS


@dataclasses.dataclass(frozen=True)
class SampleJob(Spec):
    """What ``opbench sample`` does (every field has the command line's default).

    Attributes
    ----------
    models:
        Model names of ``source``; ``("all",)`` takes every model the source lists.
    source:
        The model source (``local``, ``simple``, ``transformers``, ``remoteonnx``).
    dtypes, batch_sizes:
        Every combination with every model is loaded; tasks shared between them are sampled once.
    target:
        ``llvm``, ``cuda`` or a JSON target.
    per_task:
        Distinct candidates sampled, built and measured for each task.
    seed:
        The sampling seed (the same seed samples the same candidates).
    devices:
        One measuring process per device: GPU indices on ``cuda``; on a CPU, that many workers each on
        its share of the cores. ``None``: one device.
    builders:
        Sampling and building processes (0: every core not measuring).
    repeat, min_repeat_ms, flush_l2:
        Timed samples per candidate, the least duration of one (``number`` is chosen from a first timing),
        and whether caches are flushed before each sample (then one call per sample).
    timer:
        ``evaluator``: TVM's ``time_evaluator``, back-to-back calls (every sample includes each call's
        launch). ``graph`` (cuda, local devices): the candidate's launches captured in a CUDA Graph and
        replayed, timed with CUDA events, as ``opbench collect`` times operators (a kernel of a few
        microseconds is then timed without its launch path). ``auto`` (the default): ``graph`` on a cuda
        target measured on this host, ``evaluator`` otherwise (:attr:`timer_used`). Records of the graph
        timer are filed under their own ``config`` (``sample:s<seed>:graph``): the same candidates can be
        measured both ways. On an H100 the graph timer put 88 % of microsecond kernels' records within a
        3 % repeat spread where ``time_evaluator`` put 49 %, and timed kernels under 5 us at 0.41x
        ``time_evaluator``'s figure (its launches); above 50 us the two agree within 0.3 %.
    build_timeout_s, run_timeout_s:
        Per candidate: a build or a measurement that takes longer is killed and recorded as a timeout.
    audit:
        Fraction of candidates measured a second time at the end (the summary reports the median and
        p95 of the relative difference).
    compiler:
        CUDA's kernel compiler: ``nvrtc-pch`` (NVRTC with the headers every kernel includes precompiled
        once per builder, :func:`opbench.tune.measure.use_cuda_compiler`; the default), ``nvrtc`` or
        ``nvcc`` (``None``: TVM's default, NVRTC).
    tasks_limit:
        Sample only the first N tasks (heaviest first, by uses × FLOPs).
    time_limit_s:
        Start no new candidate (and load no further model) after this many seconds of the job, loading
        models included (what is built is still measured; the same job again resumes).
    dataset:
        The SQLite dataset the rows go to.
    export_database:
        A folder to write the records to as MetaSchedule's ``JSONDatabase`` too.
    rpc_tracker, rpc_key, rpc_workers:
        Measure on the devices that registered with TVM's RPC tracker (``HOST:PORT``) under ``rpc_key``
        (one ``python -m tvm.exec.rpc_server --tracker HOST:PORT --key KEY --no-fork`` per GPU on each host):
        builds stay on this machine, each candidate's library is uploaded to a session's device and
        timed there. ``rpc_workers`` sessions measure at once (``None``: one per registered device).
    tasks_only:
        Extract and store every model's tasks, sample nothing: no device is needed (a CUDA target names
        its ``arch``), so a machine without the GPU prepares the job and the GPU's machine loads no model.
    """

    models: tuple[str, ...] = ("resnet-18",)
    source: str = "local"
    dtypes: tuple[str, ...] = ("float32",)
    batch_sizes: tuple[int, ...] = (1,)
    target: str = "llvm"
    per_task: int = 64
    seed: int = 0
    devices: tuple[int, ...] | None = None
    builders: int = 0
    repeat: int = 5
    min_repeat_ms: float = 2.0
    flush_l2: bool = False
    timer: str = "auto"
    build_timeout_s: float = 10.0
    run_timeout_s: float = 10.0
    audit: float = 0.0
    compiler: str | None = "nvrtc-pch"
    tasks_limit: int | None = None
    time_limit_s: float | None = None
    dataset: str = "data/opbench.sqlite"
    export_database: str | None = None
    rpc_tracker: str | None = None
    rpc_key: str | None = None
    rpc_workers: int | None = None
    tasks_only: bool = False

    def validate(self) -> None:
        """Check every field before any work (see :class:`~opbench.pipeline.spec.Spec`)."""
        if not self.models or any(not m.strip() for m in self.models):
            raise SpecError("models", "at least one model name is needed (or 'all')")
        if not 1 <= self.per_task <= MAX_PER_TASK:
            raise SpecError("per_task", f"must be between 1 and {MAX_PER_TASK}, got {self.per_task}")
        check_points(self.dtypes, self.batch_sizes)
        if self.seed < 0:
            raise SpecError("seed", f"must be 0 or more, got {self.seed}")
        check_devices(self.devices)
        if self.builders < 0:
            raise SpecError("builders", f"must be 0 (every free core) or more, got {self.builders}")
        if self.repeat < 1:
            raise SpecError("repeat", f"must be 1 or more, got {self.repeat}")
        for name in ("min_repeat_ms", "build_timeout_s", "run_timeout_s"):
            value = getattr(self, name)
            if not (value == value and 0 <= value < float("inf")) or (name != "min_repeat_ms" and value <= 0):
                raise SpecError(name, f"must be a finite positive number, got {value}")
        if not 0.0 <= self.audit <= 1.0:
            raise SpecError("audit", f"must be a fraction between 0 and 1, got {self.audit}")
        if self.compiler is not None and self.compiler not in COMPILERS:
            raise SpecError("compiler", f"unknown CUDA compiler {self.compiler!r} (accepted: {', '.join(COMPILERS)})")
        if self.time_limit_s is not None and not 0 < self.time_limit_s < float("inf"):
            raise SpecError("time_limit_s", f"must be a finite positive number, got {self.time_limit_s}")
        if self.timer not in TIMER_CHOICES:
            raise SpecError("timer", f"unknown timer {self.timer!r} (accepted: {', '.join(TIMER_CHOICES)})")
        if self.timer == "graph" and not self._local_cuda:
            raise SpecError("timer", "graph times CUDA Graph replays on this host's GPUs (accepted: a cuda target "
                                     "without rpc_tracker, or timer evaluator)")
        if self.tasks_limit is not None and self.tasks_limit < 1:
            raise SpecError("tasks_limit", f"must be 1 or more, got {self.tasks_limit}")
        if self.tasks_only:
            for name in ("rpc_tracker", "devices", "export_database"):
                if getattr(self, name) is not None:
                    raise SpecError(name, "measures, and tasks_only samples nothing (accepted: one or the other)")
        if self.rpc_tracker is not None:
            if self.devices is not None:
                raise SpecError("devices", "measuring devices are the RPC tracker's with rpc_tracker "
                                           "(accepted: rpc_workers, or no rpc_tracker)")
            if self.flush_l2:
                raise SpecError("flush_l2", "is not available on remote devices (accepted: no flush_l2 with "
                                            "rpc_tracker)")
        check_rpc(self.rpc_tracker, self.rpc_key, self.rpc_workers)

    @property
    def _local_cuda(self) -> bool:
        return "cuda" in str(self.target) and self.rpc_tracker is None

    @property
    def timer_used(self) -> str:
        """The timer that measures: :attr:`timer`, with ``auto`` resolved (``graph`` on a cuda target
        measured on this host, ``evaluator`` otherwise)."""
        if self.timer != "auto":
            return self.timer
        return "graph" if self._local_cuda else "evaluator"

    def rpc(self) -> Any:
        """The RPC devices (:class:`opbench.profile.rpc.RPCSpec`), or None without ``rpc_tracker``."""
        if self.rpc_tracker is None:
            return None
        from ..profile.rpc import RPCSpec

        return RPCSpec.parse(self.rpc_tracker, self.rpc_key, self.rpc_workers)


@dataclasses.dataclass
class SampledTask:
    """A task of the job: its key, module and the models that use it."""

    key: str
    name: str
    mod: Any
    dtype: str
    space: str
    flops: float
    uses: list[dict[str, Any]]

    @property
    def weight(self) -> int:
        return sum(int(u["weight"]) for u in self.uses)


@dataclasses.dataclass
class SampleResult:
    """What :func:`sample` did."""

    job: SampleJob
    run_id: int
    tasks: list[SampledTask]
    stats: Any  # opbench.tune.farm.FarmStats
    stored: int  # trial rows of this job's tasks in the dataset after the run
    exported: dict[str, Any] | None = None

    def summary(self) -> dict[str, Any]:
        """The JSON summary (``--json``)."""
        stats = self.stats.to_json()
        return {"run_id": self.run_id, "job": self.job.to_json(), "tasks": len(self.tasks),
                "models": sorted({u["model"] for t in self.tasks for u in t.uses}), "stored": self.stored,
                **stats, "exported": self.exported}


def check_job(job: SampleJob) -> list[tuple[str, int, str]]:
    """Validate ``job`` and every model it names (before any work); its (model, batch, dtype) points."""
    from ..models import check_fits, check_name, get_source
    from ..runtime.target import target_config

    job.validate()
    config = target_config(job.target)  # an unknown target is refused here
    if job.devices is not None and config.get("kind") == "cuda":
        from ..runtime.device import check_index

        for index in job.devices:
            check_index(index, "--devices")
    source = get_source(job.source)
    names = list(source.models()) if tuple(job.models) == ("all",) else list(job.models)
    for name in names:
        check_name(source, name)  # an unknown model is refused here, not when its turn comes
        for batch in job.batch_sizes:
            check_fits(job.source, name, batch)
    if job.export_database:
        check_export_folder(job.export_database)
    if job.rpc_tracker is not None:
        job.rpc().check()  # an unreachable tracker or a key no device registered with, before any work
    return [(n, b, check_dtype(d)) for n in names for b in job.batch_sizes for d in job.dtypes]


def check_export_folder(folder: str | Path) -> None:
    """Refuse, before any work, a folder that cannot take a MetaSchedule database: it must be new, empty, or
    a MetaSchedule database already (records are then added), and writable."""
    from ..tune.database import DATABASE_FILES, check_database

    path = Path(folder)
    if path.exists() and path.is_dir() and not any((path / n).exists() for n in DATABASE_FILES):
        if any(path.iterdir()):
            raise OpBenchError(f"--export-database {str(path)!r} is a folder with other files, not a MetaSchedule "
                               "database (accepted: a new or empty folder, or a MetaSchedule JSON database)")
        if not os.access(path, os.W_OK):
            raise OpBenchError(f"--export-database {str(path)!r} is not writable")
        return
    check_database(path, write=True)


def extract(job: SampleJob, points: list[tuple[str, int, str]], target: Any, dataset: Dataset | None = None,
            store: Callable[[list[SampledTask]], None] | None = None, deadline: float | None = None
            ) -> list[SampledTask]:
    """Every task of every point, de-duplicated by structural hash (module docstring, step 1). A point whose
    tasks ``dataset`` already holds (a resumed job, or records unpacked from a shipped folder) is not
    loaded again: its tasks come from the ``tasks`` table. ``store`` is given the tasks of each point
    extracted (so that a run stopped later extracts it no more); after ``deadline`` (``time.monotonic``)
    no further model is loaded."""
    import tvm_ffi

    from ..models import load_workload
    from ..runtime.target import canonical_target, tuning_target
    from ..tune.space import space_kind
    from ..utils import announced
    from .tune import extracted_tasks

    tasks: dict[str, SampledTask] = {}
    ms_target = tuning_target(target)
    wanted = {(job.source, name, batch, dtype) for name, batch, dtype in points}
    # every stored task's (name, dtype, space): a task keeps those it was first stored with, though another model
    # may call it otherwise, or use it at another precision (a kernel of integers only is the same at every one)
    first: dict[str, tuple[str, str, str]] = {}
    stored = _stored_tasks(dataset, canonical_target(ms_target), wanted, first) if dataset is not None else []
    for i, (name, batch, dtype) in enumerate(points, 1):
        point = (job.source, name, batch, dtype)
        known = [(t, u) for t in stored for u in t.uses if _point_of(u) == point]
        if known:
            for task, use in known:
                if task.key not in tasks:
                    tasks[task.key] = dataclasses.replace(task, uses=[])
                tasks[task.key].uses.append(use)
            log.info("[%d/%d] %s (batch %d, %s): %d tasks, from the dataset", i, len(points), name, batch, dtype,
                     len(known))
            continue
        if deadline is not None and time.monotonic() > deadline:
            log.warning("the time limit passed while extracting tasks: %d of %d models not loaded (the same job "
                        "again goes on from there)", len(points) - i + 1, len(points))
            break
        with announced(f"[{i}/{len(points)}] extracting the tasks of {name} (batch {batch}, {dtype})"):
            workload = load_workload(job.source, name, batch, dtype=dtype)
            extracted = extracted_tasks(workload, target)
        touched: dict[str, SampledTask] = {}
        for task in extracted:
            mod = task.dispatched[0]
            if not _static(mod):  # a kernel of symbolic shape: no arguments to time it with
                log.warning("%s: task %s has symbolic shapes; it is not sampled", name, task.task_name)
                continue
            key = digest({"task": format(tvm_ffi.structural_hash(mod) & (2**64 - 1), "016x"),
                          "target": canonical_target(ms_target)})
            use = {"model": workload.name, "requested": name, "source": workload.source,
                   "batch_size": workload.batch_size, "dtype": workload.dtype, "workload_id": workload.workload_id,
                   "task": task.task_name, "weight": int(task.weight)}
            if key not in tasks:
                if key in first:  # stored before, by another model or at another precision
                    task_name, task_dtype, space = first[key]
                else:
                    task_name, task_dtype, space = task.task_name, dtype, space_kind(target, dtype)
                tasks[key] = SampledTask(key, task_name, mod, task_dtype, space, _flops(mod), [])
            tasks[key].uses.append(use)
            touched[key] = tasks[key]
        if store is not None:
            store(list(touched.values()))
        log.info("%s (batch %d, %s): %d tasks, %d distinct so far", name, batch, dtype, len(extracted), len(tasks))
    ordered = sorted(tasks.values(), key=lambda t: -t.weight * max(t.flops, 1.0))
    return ordered[: job.tasks_limit] if job.tasks_limit else ordered


def _point_of(use: dict[str, Any]) -> tuple[Any, ...]:
    """The point (source, model as asked for, batch size, dtype) a task's recorded use came from."""
    return use["source"], use.get("requested", use["model"]), use["batch_size"], use["dtype"]


def _stored_tasks(dataset: Dataset, target_json: str, points: set[tuple[Any, ...]],
                  first: dict[str, tuple[str, str, str]] | None = None) -> list[SampledTask]:
    """The tasks a dataset holds for this target that one of ``points`` uses, with every use recorded;
    ``first`` is given every stored task's name, dtype and space (by key), used or not.

    Only those tasks' modules are parsed: a records folder holds the tasks of every job of a collection,
    and parsing them all costs seconds per thousand."""
    import tvm

    out = []
    for row in dataset.rows("tasks", {"target": target_json}):
        if first is not None:
            first[row["workload_id"]] = (row["task"], row["dtype"], row["space"])
        uses = json.loads(row["uses"]) if row["uses"] else []
        if any(_point_of(u) in points for u in uses):
            out.append(SampledTask(row["workload_id"], row["task"], tvm.ir.load_json(row["mod"]), row["dtype"],
                                   row["space"], float(row["flops"] or 0.0), uses))
    return out


def _flops(mod: Any) -> float:
    try:
        from tvm.s_tir.analysis import estimate_tir_flops

        return float(estimate_tir_flops(mod))
    except Exception:  # an operator the estimate does not cover
        return 0.0


def _static(mod: Any) -> bool:
    """Whether the task's arguments have constant shapes (a task of symbolic shape cannot be given
    arguments, so no candidate of it can be timed)."""
    try:
        info = _args_info(mod)
    except (TypeError, ValueError):  # "Cannot convert from type Array[ir.Var] to Array<ir.IntImm>"
        return False
    return all(all(isinstance(d, int) for d in arg[2]) for arg in info if isinstance(arg, list) and len(arg) > 2)


def _args_info(mod: Any) -> list[Any]:
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    from ..tune.knobs import to_python

    return [to_python(a.as_json()) for a in ArgInfo.from_entry_func(mod, remove_preproc=True)]


def sample(job: SampleJob, command: str = "") -> SampleResult:
    """Run a sampling job (see the module docstring); every field of ``job`` is checked first."""
    import tvm

    from ..profile.env import device_id, environment_tags
    from ..runtime.target import canonical_target, is_gpu, resolve_target, tuning_target
    from ..tune.farm import Farm, FarmConfig, FarmStats, FarmTask, Record, Timing
    from ..tune.knobs import decode_knobs

    points = check_job(job)
    rpc = job.rpc()
    target = resolve_target(job.target, local_device=rpc is None and not job.tasks_only)
    config = sample_config(job.seed, job.timer_used)
    tags = environment_tags(target)
    if job.tasks_only:  # no device: the tasks are extracted for the target's design spaces and stored
        ms_target, devices, device_tags, dev_id = tuning_target(target), [], {}, ""
    elif rpc is None:
        ms_target = tuning_target(target)
        devices: list[int | None] = list(job.devices) if job.devices is not None else [None]
        # each GPU's own columns (name, SMs, driver, CUDA, clock at the start, UUID) on the rows it measured
        device_tags = {d: (_gpu_tags(d) if is_gpu(target) else {"gpu_uuid": None}) for d in devices}
        dev_id = device_id(target)
    else:  # the remote devices: their name and limits read through one session, their key in the rows
        from ..profile.rpc import RPCProfiler

        remote = RPCProfiler(rpc, target)
        ms_target = tuning_target(target, remote.remote)
        devices = [None] * (rpc.workers or remote.registered)
        device_tags = {None: {"gpu_uuid": None}}
        dev_id = device_id(target, remote.device(target))
        tags = {**tags, **remote.tags()}
        remote.release()
        log.info("sample: candidates measured on %d device%s with key '%s' at %s", len(devices),
                 "s" if len(devices) != 1 else "", rpc.key, rpc.address)
    target_json = canonical_target(ms_target)
    start = time.monotonic()
    with Dataset(job.dataset) as dataset, recorded_run(dataset, command, tags) as run:
        encoded: dict[str, tuple[str, list[Any]]] = {}  # each task's module and arguments, computed once

        def encode(task: SampledTask) -> tuple[str, list[Any]]:
            if task.key not in encoded:
                encoded[task.key] = tvm.ir.save_json(task.mod), _args_info(task.mod)
            return encoded[task.key]

        def store(touched: list[SampledTask]) -> None:  # one transaction per model: its tasks, or none
            dataset.put_many("tasks", [_task_row(dataset, t, ms_target, run.run_id, *encode(t)) for t in touched],
                             replace=True)

        tasks = extract(job, points, target, dataset, store, start + job.time_limit_s if job.time_limit_s else None)
        log.info("%d distinct tasks from %d models%s", len(tasks), len(points),
                 "" if job.tasks_only else f"; {job.per_task} candidates each")
        if job.tasks_only:  # the tasks are stored (extract); nothing is sampled
            stats, stored = FarmStats(), 0
        else:
            farm_tasks = []  # every task's row is stored: as its model was extracted, or before (from the dataset)
            ran_out = 0
            for task in tasks:
                mod_json, args_info = encode(task)
                key = model_key(task.key, dev_id, config, job.flush_l2)
                done = {r["trial"] for r in dataset.rows("trials", {**key, "tuner": "sample"})}
                count = sampled_before(dataset, task.key, job)
                ran_out += count < job.per_task
                farm_tasks.append(FarmTask(task.key, task.name, mod_json, target_json, task.space, count,
                                           args_info, done))
            if ran_out:
                log.info("sample: %d tasks ran out of distinct candidates in an earlier run with seed %d; they are "
                         "not sampled again (a larger --per-task or another --seed samples them anew)", ran_out,
                         job.seed)
            by_key = {t.key: t for t in tasks}

            def row_key(task: FarmTask) -> dict[str, Any]:
                sampled = by_key[task.key]
                return {**model_key(task.key, dev_id, config, job.flush_l2), "source": "task", "model": task.name,
                        "batch_size": None, "workload": json.dumps({"task": task.name, "key": task.key}),
                        "target": canonical_target(target), "device_name": tags["device_name"], "dtype": sampled.dtype,
                        "task": task.name, "task_weight": sampled.weight, "tuner": "sample"}

            # a candidate that failed to build reached no device (its record has none): no GPU's columns
            unmeasured: dict[str, Any] = {"gpu_uuid": None}

            def sink(record: Record) -> None:
                candidate = record.candidate
                try:
                    knobs = decode_knobs(json.loads(candidate.trace))
                except Exception as err:  # knobs are extra columns: never lose the record for them
                    knobs = {"decode_error": f"{type(err).__name__}: {err}"}
                secs = record.run_secs
                dataset.put("trials", {
                    **row_key(record.task), **tags, "run_id": run.run_id, "trial": candidate.index,
                    "trace": candidate.trace, "knobs": knobs, "build_status": record.build_status,
                    "error": record.error,
                    "run_secs": secs, "latency_median_s": derived(secs)["latency_median_s"],
                    "seed": job.seed, "origin": candidate.origin, "sketch": candidate.sketch,
                    "candidate_hash": candidate.shash, "number": record.number, "repeats": record.repeats,
                    "spread": record.spread, "build_s": record.build_s, **device_tags.get(record.device, unmeasured),
                    "measured_at": now()})

            def on_audit(task: FarmTask, candidate: Any, secs: list[float]) -> None:
                dataset.update("trials", {"audit_secs": secs}, {**model_key(task.key, dev_id, config, job.flush_l2),
                                                                "tuner": "sample", "trial": candidate.index})

            def on_sampled(task: FarmTask, stats: dict[str, Any]) -> None:
                _note_sampling(dataset, task.key, job, stats)

            farm = Farm(FarmConfig(target.kind.name, job.seed, job.builders, devices,
                                   Timing(job.repeat, job.min_repeat_ms, flush_l2=job.flush_l2, timer=job.timer_used),
                                   job.build_timeout_s, job.run_timeout_s, job.audit, job.compiler,
                                   time_limit_s=max(0.0, job.time_limit_s - (time.monotonic() - start))
                                   if job.time_limit_s else None,
                                   rpc=None if rpc is None else {"host": rpc.host, "port": rpc.port, "key": rpc.key,
                                                                 "timeout_s": rpc.timeout_s}), sink,
                        on_sampled, on_audit)
            stats = farm.run(farm_tasks)
            stored = sum(dataset.count("trials", {**model_key(t.key, dev_id, config, job.flush_l2), "tuner": "sample"})
                         for t in tasks)
        run.status = "ok"
    exported = export_database(job.dataset, job.export_database, [t.key for t in tasks], ms_target) \
        if job.export_database else None
    return SampleResult(job, run.run_id, tasks, stats, stored, exported)


def _gpu_tags(index: int | None) -> dict[str, Any]:
    """A GPU's environment columns; its UUID alone where PyTorch cannot read the rest (columns are extras: the
    job goes on without them)."""
    from ..profile.cuda import gpu_tags
    from ..runtime.device import gpu_uuid

    try:
        return gpu_tags(index)
    except Exception as err:
        log.debug("GPU columns unavailable: %s", err)
        return {"gpu_uuid": gpu_uuid(index)}


def _task_row(dataset: Dataset, task: SampledTask, ms_target: Any, run_id: int, mod_json: str,
              args_info: list[Any]) -> dict[str, Any]:
    """The task's row: its module once, and the union of the models that use it."""
    from ..runtime.target import canonical_target

    (old,) = dataset.rows("tasks", {"workload_id": task.key}) or [None]
    uses = json.loads(old["uses"]) if old and old["uses"] else []
    for use in task.uses:
        if use not in uses:
            uses.append(use)
    kept = old or {"task": task.name, "dtype": task.dtype, "space": task.space}  # as it was first stored
    return {"workload_id": task.key, "run_id": run_id, "task": kept["task"], "target": canonical_target(ms_target),
            "dtype": kept["dtype"], "space": kept["space"], "mod": mod_json, "args_info": args_info,
            "flops": task.flops, "uses": uses,
            "sampling": json.loads(old["sampling"]) if old and old["sampling"] else {},
            "created_at": old["created_at"] if old else now()}


def sampled_before(dataset: Dataset, key: str, job: SampleJob) -> int:
    """How many candidates the task can still give for ``job``: ``job.per_task``, or fewer when an earlier run
    with the same seed and at least as many candidates asked for ran out of distinct ones (or could not sample
    the task at all).

    Sampling is deterministic for a seed and prefix-stable (:mod:`opbench.tune.sampler`), so that run's
    ``kept`` candidates are all this seed gives: sampling the task again would spend its whole attempt budget
    on duplicates and rejections for nothing.
    """
    spent = _sampling_notes(dataset, key).get(f"seed={job.seed}") or {}
    if spent.get("exhausted") and int(spent.get("per_task") or 0) >= job.per_task:
        return min(job.per_task, int(spent.get("kept") or 0))
    return job.per_task


def _sampling_notes(dataset: Dataset, key: str) -> dict[str, Any]:
    """The ``sampling`` entry of the task's ``tasks`` row (what each seed's sampling cost), empty when none."""
    (row,) = dataset.rows("tasks", {"workload_id": key}) or [None]
    return json.loads(row["sampling"]) if row and row["sampling"] else {}


def _note_sampling(dataset: Dataset, key: str, job: SampleJob, stats: dict[str, Any]) -> None:
    """What sampling the task cost (attempts, rejections by reason), per seed, in its ``tasks`` row."""
    sampling = _sampling_notes(dataset, key)
    sampling[f"seed={job.seed}"] = {**stats, "per_task": job.per_task}
    dataset.update("tasks", {"sampling": sampling}, {"workload_id": key})


def export_database(dataset_path: str | Path, folder: str | Path, keys: list[str] | None = None,
                    ms_target: Any = None) -> dict[str, Any]:
    """Write the sampled records of the tasks ``keys`` (default: every sampled task) to ``folder`` as
    MetaSchedule's ``JSONDatabase``; records already there are not added again. Returns the counts."""
    import tvm
    from tvm.s_tir.meta_schedule.database import JSONDatabase, TuningRecord

    from ..runtime.startup import import_tensor_intrinsics

    check_export_folder(folder)
    Path(folder).mkdir(parents=True, exist_ok=True)
    import_tensor_intrinsics()
    database = JSONDatabase(work_dir=str(folder), allow_missing=True)
    have = {_record_key(r) for r in database.get_all_tuning_records()}
    added = skipped = 0
    with Dataset(dataset_path, readonly=True) as dataset:
        for task in dataset.rows("tasks"):
            if keys is not None and task["workload_id"] not in keys:
                continue
            workload = database.commit_workload(tvm.ir.load_json(task["mod"]))
            target = json.loads(task["target"])
            args_info = json.loads(task["args_info"])
            for row in dataset.rows("trials", {"workload_id": task["workload_id"], "tuner": "sample",
                                               "build_status": "ok"}):
                record = TuningRecord.from_json([json.loads(row["trace"]), json.loads(row["run_secs"]), target,
                                                 args_info], workload)
                if _record_key(record) in have:
                    skipped += 1
                    continue
                database.commit_tuning_record(record)
                have.add(_record_key(record))
                added += 1
    return {"folder": str(folder), "records": added, "already_there": skipped}


def _record_key(record: Any) -> tuple[int, str]:
    import tvm_ffi

    from ..tune.knobs import dumps

    return tvm_ffi.structural_hash(record.workload.mod), dumps(record.trace)


__all__ = ["SampleJob", "SampleResult", "SampledTask", "check_job", "export_database", "sample"]
