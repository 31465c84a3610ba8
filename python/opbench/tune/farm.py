"""The sampling pipeline: samplers and builders on every core, one measuring process per device.

``opbench sample`` spends its time in three places: drawing candidates (:mod:`.sampler`, CPU),
compiling them (CPU; on CUDA the kernel compiler), and timing them (the device). A tuning loop does
them one after another; here they overlap:

* **Workers** are long-lived child processes (``spawn``), each importing TVM once. A *builder*
  worker either samples a task (streaming each kept candidate back as soon as it is found) or
  compiles one candidate into a shared library (linked here, so that loading it is a ``dlopen``).
  A *measurer* worker per device (``--devices``: one per GPU, or one per group of cores on a CPU)
  loads a library, chooses ``number``/``repeat`` from a first quick timing, and times it.
* **The parent** keeps every worker busy: it starts a task's sampling when too few candidates wait
  to be built, keeps a bounded queue of built libraries ahead of the measurers, and hands each
  finished candidate to a sink (the dataset writer) at once: a crash loses nothing measured.
* **Remote devices.** With ``rpc`` (TVM's RPC tracker), each measurer is a session on one device that
  registered with the tracker under a key, on this host or another: builds stay here, each library is
  uploaded to the session's server, timed there and removed. Every session is a measurer of its own.
* **Limits.** Each build and each measurement has its own timeout: a worker past it is killed and
  restarted, and the candidate recorded as ``build_timeout`` or ``run_timeout``. A worker that dies
  records ``build_error``/``run_error`` with the reason. A child never outlives the parent (it is
  killed with it, and exits when its pipe closes).

Every figure the summary shows (records per second, where the time went, how busy each worker
was) is counted here: :class:`FarmStats`.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import logging
import math
import multiprocessing
import os
import random
import shutil
import signal
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import wait
from typing import Any

from .. import signals
from ..dataset.records import derived
from ..errors import first_line
from .sampler import Candidate, SampleStats

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------------
# what the parent hands in and gets back
@dataclasses.dataclass
class FarmTask:
    """One task to sample: its module, the target, what is already stored."""

    key: str  # the task's dataset key (workload_id of its rows)
    name: str
    mod: str  # tvm.ir.save_json of the task's IRModule
    target: str  # the tuning target as JSON
    space: str  # design space kind
    count: int  # candidates wanted
    args_info: list[Any]  # MetaSchedule ArgInfo JSON of the PrimFunc's arguments
    done: set[int] = dataclasses.field(default_factory=set)  # candidate indices already stored


@dataclasses.dataclass
class Timing:
    """How candidates are timed (:func:`measure_artifact`)."""

    repeat: int = 5  # timed samples per candidate (fast kernels get twice as many)
    min_repeat_ms: float = 2.0  # each sample lasts at least this long (``number`` chosen from a first timing)
    max_number: int = 10_000
    flush_l2: bool = False  # flush caches before every sample (then one call per sample)
    timer: str = "evaluator"  # or "graph": CUDA Graph replays timed with CUDA events (:func:`graph_samples`)
    fast_s: float = 20e-6  # a kernel faster than this gets ``2 * repeat`` samples


@dataclasses.dataclass
class FarmConfig:
    """How the pipeline runs."""

    target_kind: str  # "cuda" or "llvm"
    seed: int = 0
    builders: int = 0  # 0: every core not measuring
    devices: list[int | None] = dataclasses.field(default_factory=lambda: [None])
    timing: Timing = dataclasses.field(default_factory=Timing)
    build_timeout_s: float = 10.0
    run_timeout_s: float = 10.0
    audit: float = 0.0  # fraction of candidates measured a second time at the end
    compiler: str | None = None  # CUDA: "nvrtc-pch", "nvrtc" or "nvcc" (opbench.tune.measure.use_cuda_compiler)
    ahead: int = 0  # built or building candidates not yet measured, at most (0: 2 per builder, 8 per device)
    progress_s: float = 5.0
    time_limit_s: float | None = None  # then no new candidate starts; those built are measured (a re-run resumes)
    drain_s: float = 30.0  # past the time limit, at most this long to measure what is built; the rest is dropped
    rpc: dict[str, Any] | None = None  # RPC tracker (host, port, key, timeout_s): one measurer per ``devices`` entry


@dataclasses.dataclass
class Record:
    """One candidate's outcome, handed to the sink."""

    task: FarmTask
    candidate: Candidate
    build_status: str  # ok, build_error, build_timeout, run_error, run_timeout
    error: str | None = None
    run_secs: list[float] | None = None
    number: int | None = None
    repeats: int | None = None
    spread: float | None = None
    build_s: float | None = None
    device: int | None = None


@dataclasses.dataclass
class FarmStats:
    """Where the time went and how busy each worker was."""

    wall_s: float = 0.0
    records: int = 0
    ok: int = 0
    build_failures: int = 0
    build_timeouts: int = 0
    run_failures: int = 0
    skipped: int = 0  # candidates already stored (a resumed run)
    sampled: int = 0
    rejected: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    sample_s: float = 0.0
    build_s: float = 0.0
    measure_s: float = 0.0
    queue_wait_s: float = 0.0  # built candidates waiting for a measurer, summed
    write_s: float = 0.0
    builder_busy_s: float = 0.0
    builders: int = 0
    device_busy_s: dict[str, float] = dataclasses.field(default_factory=dict)
    audit: list[float] = dataclasses.field(default_factory=list)  # relative differences of the audit pass
    tasks_exhausted: int = 0

    @property
    def records_per_s(self) -> float:
        return self.records / self.wall_s if self.wall_s else 0.0

    def to_json(self) -> dict[str, Any]:
        wall = self.wall_s or 1e-9
        audit = sorted(self.audit)
        return {
            "wall_s": self.wall_s, "records": self.records, "ok": self.ok, "records_per_s": self.records_per_s,
            "build_failures": self.build_failures, "build_timeouts": self.build_timeouts,
            "build_timeout_share": self.build_timeouts / max(self.records, 1),
            "run_failures": self.run_failures, "skipped": self.skipped, "sampled": self.sampled,
            "rejected": dict(self.rejected), "rejected_total": sum(self.rejected.values()),
            "tasks_exhausted": self.tasks_exhausted,
            "seconds": {"sample": self.sample_s, "build": self.build_s, "queue_wait": self.queue_wait_s,
                        "measure": self.measure_s, "write": self.write_s},
            "builders": self.builders, "builder_busy": self.builder_busy_s / (wall * max(self.builders, 1)),
            "device_busy": {k: v / wall for k, v in self.device_busy_s.items()},
            "audit": {"n": len(audit), "median": statistics.median(audit) if audit else None,
                      "p95": audit[min(len(audit) - 1, math.ceil(0.95 * len(audit)) - 1)] if audit else None},
        }


# ---------------------------------------------------------------------------------------------------
# the child side
def _die_with_parent() -> None:
    """Linux: this process gets SIGKILL when its parent dies (no orphan keeps building or measuring)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _serve(conn: Any, role: str, cores: list[int] | None = None) -> None:
    """A worker's loop: receive ``(job_id, kind, kwargs)``, send ``(job_id, kind, payload)`` messages.

    A worker runs on ``cores`` when given; builders run at a lower priority, so that a measurer sharing a
    core with them is not delayed (a short kernel's time is mostly its launch, which a busy core stretches).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides; Ctrl-C reaches the whole group
    _die_with_parent()
    with contextlib.suppress(OSError, AttributeError):
        if cores:
            os.sched_setaffinity(0, cores)
        if role == "build":
            os.nice(10)
    logging.basicConfig(level=logging.WARNING, format="opbench worker: %(message)s")
    jobs: dict[str, Callable[..., Any]] = {"sample": _job_sample, "build": _job_build, "measure": _job_measure}
    import tvm  # noqa: F401  (once per worker; the first job's timeout starts when this is done)

    if role == "build":
        from ..runtime.startup import import_tensor_intrinsics
        from .measure import use_cuda_compiler

        import_tensor_intrinsics()
        use_cuda_compiler(os.environ.get("OPBENCH_CUDA_COMPILER") or None)
    conn.send((0, "ready", None))
    while True:
        try:
            job_id, kind, kwargs = conn.recv()
        except (EOFError, OSError):
            return  # the parent is gone
        try:
            for message in jobs[kind](**kwargs):
                conn.send((job_id, *message))
        except Exception as err:  # a job's failure is the candidate's, never the worker's
            from .measure import exception_text

            conn.send((job_id, "error", exception_text(err)))


def _job_sample(mod: str, target: str, count: int, seed: int, space: str) -> Iterator[tuple[str, Any]]:
    import tvm

    from .sampler import sample_task

    stats = SampleStats()
    module = tvm.ir.load_json(mod)
    for candidate in sample_task(module, tvm.target.Target(json.loads(target)), count, seed, space, stats=stats):
        yield "candidate", candidate
    yield "done", stats.to_json()


def _job_build(mod: str, target: str, path: str) -> Iterator[tuple[str, Any]]:
    import tvm

    from .measure import build_to_file

    start = time.perf_counter()
    # a shared library, linked here: the measurer only loads it
    error = build_to_file(tvm.ir.load_json(mod), tvm.target.Target(json.loads(target)), path)
    yield "done", {"path": None if error else path, "error": error, "seconds": time.perf_counter() - start}


_ARGS: dict[str, Any] = {}  # a measurer's argument buffers by signature (candidates of a task share them)
_FLUSH: list[Any] = []


_SESSION: list[Any] = []  # a remote measurer's RPC session, opened by its first job


def _job_measure(path: str, args_info: list[Any], timing: dict[str, Any], kind: str,
                 rpc: dict[str, Any] | None = None) -> Iterator[tuple[str, Any]]:
    start = time.perf_counter()
    result = measure_artifact(path, args_info, Timing(**timing), kind, rpc)
    result["seconds"] = time.perf_counter() - start
    yield "done", result


def _device(kind: str, rpc: dict[str, Any] | None = None) -> tuple[Any, Any]:
    """``(RPC session or None, device)``: this machine's device, or the remote one of this measurer's session."""
    import tvm

    if rpc is None:
        return None, (tvm.cuda(0) if kind == "cuda" else tvm.cpu(0))
    if not _SESSION:
        from ..profile.rpc import RPCSpec

        spec = RPCSpec(rpc["host"], int(rpc["port"]), rpc["key"], timeout_s=float(rpc.get("timeout_s", 10.0)),
                       session_s=0)  # the session lives as long as this measurer
        _SESSION.append(spec.session())
        _ARGS.clear()
    session = _SESSION[0]
    return session, (session.cuda(0) if kind == "cuda" else session.cpu(0))


def _arguments(args_info: list[Any], dev: Any, session: Any = None) -> list[Any]:
    """Random arguments for a PrimFunc (MetaSchedule's ArgInfo JSON), reused for equal signatures; on the
    session's device when remote. Integer arguments hold valid indices (:func:`index_values`)."""
    key = json.dumps(args_info)
    if key not in _ARGS:
        if len(_ARGS) > 64:
            _ARGS.clear()
        if session is None:
            from tvm.s_tir.meta_schedule.runner.local_runner import default_alloc_argument

            args = default_alloc_argument(dev, args_info, 1)[0]
        else:
            from tvm.s_tir.meta_schedule.runner.rpc_runner import default_alloc_argument as remote_alloc

            args = remote_alloc(session, dev, args_info, 1)[0]
        for arg, values in zip(args, index_values(args_info), strict=True):
            if values is not None:
                arg.copyfrom(values)
        _ARGS[key] = args
    return _ARGS[key]


def index_values(args_info: list[Any], seed: int = 0) -> list[Any]:
    """Values for a PrimFunc's integer arguments that are valid indices, ``None`` for the others.

    MetaSchedule fills every argument with random bits, so the indices of ``take``, ``gather`` or an
    embedding point far outside their tensor: the kernel reads out of bounds (on a GPU an illegal
    address, which also ends the measuring process). An integer argument here holds uniform values in
    ``[0, m)``, where ``m`` is the smallest extent of any axis of any argument: a valid index into every
    axis of every tensor the function takes, whichever axis it indexes.
    """
    import numpy as np

    tensors = [(str(info[1]), [int(d) for d in info[2]]) for info in args_info]
    extents = [d for _, shape in tensors for d in shape if d > 0]
    bound = max(1, min(extents, default=1))
    rng = np.random.default_rng(seed)
    out: list[Any] = []
    for dtype, shape in tensors:
        if dtype.startswith(("int", "uint")):
            out.append(rng.integers(0, bound, size=shape).astype(dtype))
        else:
            out.append(None)
    return out


def _flush_function(dev: Any) -> str:
    """The name of a global function that evicts the device's caches before a timed sample."""
    if dev.dlpack_device_type() % 128 == 1:
        return "cache_flush_cpu_non_first_arg"
    if not _FLUSH:
        import tvm
        import tvm_ffi

        size = max(int(getattr(dev, "l2_cache_size_bytes", 0) or 0), 64 << 20) * 2
        buffer = tvm.runtime.empty((size // 4,), "float32", dev)
        zeros = tvm.runtime.empty((size // 4,), "float32", dev)

        def flush(*_args: Any) -> None:
            zeros.copyto(buffer)  # a device-to-device copy of twice the L2 size

        tvm_ffi.register_global_func("opbench.sample.flush_l2", flush, override=True)
        _FLUSH.extend([buffer, zeros, flush])
    return "opbench.sample.flush_l2"


def calls_per_sample(per_call: Callable[[int], float], timing: Timing) -> tuple[int, float]:
    """Calls per timed sample so that one lasts at least ``timing.min_repeat_ms``, and the seconds of one call.

    ``per_call(n)`` times one sample of ``n`` calls and returns seconds per call. One call alone overstates a
    short kernel (its launch is not hidden behind the previous one's execution: on the H100 a kernel of a few
    microseconds timed 2.7x its steady time), so the number it suggests is checked with one sample of that
    many calls and chosen again from it, until it settles. In the H100 records whose number came from one
    call, the unsteady ones' samples lasted 0.75 ms at the median against 2 ms asked for, and 53 % of the
    records with samples under 1.5 ms had a spread within 3 %, against 96 % of those with longer samples.
    With ``flush_l2`` every sample is one call (after a flush).
    """
    target = timing.min_repeat_ms * 1e-3

    def calls(seconds: float) -> int:
        return max(1, min(timing.max_number, math.ceil(target / max(seconds, 1e-9))))

    seconds = per_call(1)
    if timing.flush_l2:
        return 1, seconds
    number = calls(seconds)
    for _ in range(3):  # each probe's sample is at most min_repeat_ms; it settles in one or two
        if not 1 < number < timing.max_number:
            break
        seconds = per_call(number)
        again = calls(seconds)
        if again <= number * 1.05:
            break
        number = again
    return number, seconds


_GRAPH_PROFILER: list[Any] = []  # this measuring process's CUDA profiler, made at its first graph timing


def graph_samples(func: Any, args: Sequence[Any], timing: Timing) -> tuple[list[float], int, int]:
    """Seconds per call of ``func(*args)`` from CUDA Graph replays (the operator timer of ``opbench collect``,
    :meth:`opbench.profile.cuda.CudaProfiler.time_launch`: a short kernel is captured several times over in
    one graph, replays per sample grown to ``min_repeat_ms``); a kernel under ``fast_s`` is timed again with
    twice the samples. Returns the samples, the calls per sample and how many samples."""
    from ..profile.timer import TimingConfig

    if not _GRAPH_PROFILER:
        from ..profile.cuda import CudaProfiler

        _GRAPH_PROFILER.append(CudaProfiler(corun_k=1))
    profiler = _GRAPH_PROFILER[0]

    def once(repeat: int) -> Any:
        config = TimingConfig(warmup=1, repeat=repeat, number=1, min_repeat_ms=timing.min_repeat_ms,
                              flush_l2=timing.flush_l2)
        return profiler.time_launch(lambda: func(*args), config)

    result = once(timing.repeat)
    if result.median < timing.fast_s:
        result = once(2 * timing.repeat)
    return [float(s) for s in result.samples], int(result.number), len(result.samples)


def measure_artifact(path: str, args_info: list[Any], timing: Timing, kind: str,
                     rpc: dict[str, Any] | None = None) -> dict[str, Any]:
    """Load the library at ``path`` and time its function (in a measurer worker; with ``rpc``, on the
    remote device of this worker's session: uploaded, timed there, removed).

    ``number`` is chosen so that a sample lasts at least ``timing.min_repeat_ms``
    (:func:`calls_per_sample`); a kernel faster than ``timing.fast_s`` gets twice the samples. With
    ``flush_l2`` every sample is one call after a cache flush. Returns ``run_secs`` (one per sample),
    ``number``, ``repeats``, ``spread`` ((max - min) / median of the samples), or ``error``.
    """
    import tvm

    from .measure import exception_text

    remote_name = None
    try:
        session, dev = _device(kind, rpc)
        if session is None:
            mod = tvm.runtime.load_module(path)
        else:
            remote_name = os.path.basename(path)
            session.upload(path, remote_name)
            mod = session.load_module(remote_name)
        args = _arguments(args_info, dev, session)
        name = mod.entry_name  # "main", also for a remote module
        if timing.timer == "graph" and session is None and kind == "cuda":
            secs, number, repeat = graph_samples(mod.get_function(name), args, timing)
        else:
            def per_call(number: int) -> float:
                return float(mod.time_evaluator(name, dev, number=number, repeat=1)(*args).results[0])

            preproc = _flush_function(dev) if timing.flush_l2 else ""
            number, seconds = calls_per_sample(per_call, timing)
            repeat = timing.repeat * (2 if seconds < timing.fast_s else 1)
            evaluator = mod.time_evaluator(name, dev, number=number, repeat=repeat, f_preproc=preproc)
            secs = [float(s) for s in evaluator(*args).results]
    except Exception as err:
        if rpc is not None:
            _SESSION.clear()  # a broken connection: the next job opens a new session
        return {"error": exception_text(err)}
    finally:
        if remote_name is not None and _SESSION:
            with contextlib.suppress(Exception):
                _SESSION[0].remove(remote_name)
    return {"run_secs": secs, "number": number, "repeats": repeat, "spread": derived(secs)["spread"]}


# ---------------------------------------------------------------------------------------------------
# the parent side
class Worker:
    """One child process serving jobs (see the module docstring); restarted after a kill."""

    def __init__(self, name: str, role: str, env: dict[str, str], device: int | None = None,
                 cores: list[int] | None = None) -> None:
        self.name, self.role, self.env, self.device, self.cores = name, role, env, device, cores
        self.proc: Any = None
        self.conn: Any = None
        self.job: dict[str, Any] | None = None  # the job in flight
        self.busy_s = 0.0
        self.ready = False  # the process has imported TVM (its start-up counts against no job's timeout)

    def start(self) -> None:
        context = multiprocessing.get_context("spawn")
        parent, child = context.Pipe()
        saved = dict(os.environ)
        os.environ.clear()
        os.environ.update(self.env)  # a spawned child starts from this process's environment
        try:
            self.proc = context.Process(target=_serve, args=(child, self.role, self.cores), name=self.name,
                                        daemon=True)
            self.proc.start()
        finally:
            os.environ.clear()
            os.environ.update(saved)
        child.close()
        self.conn = parent
        self.ready = False

    def submit(self, job_id: int, job_kind: str, timeout: float | None, /, **kwargs: Any) -> None:
        """Send a job; ``_context`` (not sent) is kept with it for the parent."""
        if self.proc is None:
            self.start()
        now = time.perf_counter()
        context = kwargs.pop("_context", {})
        self.job = {**context, "id": job_id, "kind": job_kind, "started": now, "timeout": timeout,
                    "deadline": now + timeout if timeout and self.ready else None}
        self.conn.send((job_id, job_kind, kwargs))

    def finish(self) -> dict[str, Any]:
        job, self.job = self.job, None
        assert job is not None
        self.busy_s += time.perf_counter() - job["started"]
        return job

    def kill(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(Exception):
                self.proc.kill()
                self.proc.join(5)
            with contextlib.suppress(Exception):
                self.conn.close()
        self.proc = self.conn = None

    @property
    def idle(self) -> bool:
        return self.job is None


def _restart_after(worker: Worker, error: str | None) -> None:
    """Restart a measurer whose kernel failed on the GPU: a CUDA error (an illegal address, a launch failure)
    leaves the process's context unusable, and every later candidate would fail with it. Other errors (a
    library that does not load) leave the process as it is: a restart costs seconds."""
    if error and "cuda" in error.lower():
        worker.kill()


def _builder_env(compiler: str | None) -> dict[str, str]:
    env = {**os.environ, "TVM_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    if compiler:
        env["OPBENCH_CUDA_COMPILER"] = compiler  # read by the builder (_serve)
    return env


def _measurer_env(kind: str, device: int | None, cores: list[int] | None) -> dict[str, str]:
    from ..runtime.device import child_env, cpu_child_env

    if kind == "cuda":
        return child_env(device) if device is not None else dict(os.environ)
    return cpu_child_env(cores) if cores is not None else dict(os.environ)


class Farm:
    """Runs :class:`FarmTask` s through samplers, builders and measurers (see the module docstring).

    ``sink(record)`` is called in this process for every candidate, in the order they finish;
    ``on_sampled(task, stats)`` once a task's sampling is done; ``on_audit(task, candidate, secs)``
    for each candidate of the audit pass.
    """

    def __init__(self, config: FarmConfig, sink: Callable[[Record], None],
                 on_sampled: Callable[[FarmTask, dict[str, Any]], None] | None = None,
                 on_audit: Callable[[FarmTask, Candidate, list[float]], None] | None = None) -> None:
        self.config = config
        self.sink, self.on_sampled, self.on_audit = sink, on_sampled, on_audit
        self.stats = FarmStats()
        self._next_id = 0

    def _id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _workers(self) -> tuple[list[Worker], list[Worker]]:
        from ..runtime.device import cpu_groups

        config = self.config
        devices = config.devices or [None]
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
            list(range(os.cpu_count() or 1))
        cpu = config.target_kind != "cuda"
        if config.rpc is not None:  # one measurer per remote session; every core here builds
            measurers = [Worker(f"rpc{i}", "measure", dict(os.environ)) for i in range(len(devices))]
            builders = config.builders or max(1, len(cores))
            return [Worker(f"build{i}", "build", _builder_env(config.compiler)) for i in range(builders)], measurers
        if cpu:  # a CPU measurer uses its group of cores (all of them for one device)
            groups: list[Any] = cpu_groups(len(devices)) if len(devices) > 1 else [None] * len(devices)
            spare = None
        else:  # a GPU's measurer gets a core of its own, from the last; the builders share the rest
            own = len(cores) > len(devices) + 1
            groups = [[cores[-1 - i]] if own else None for i in range(len(devices))]
            spare = cores[: len(cores) - len(devices)] if own else None
        measurers = [Worker(f"{'cpu' if cpu else 'gpu'}{'' if d is None else d}", "measure",
                            _measurer_env(config.target_kind, d, g if cpu else None), d, None if cpu else g)
                     for d, g in zip(devices, groups, strict=True)]
        builders = config.builders or max(1, len(cores) - (len(devices) if not cpu else 0))
        return [Worker(f"build{i}", "build", _builder_env(config.compiler), cores=spare) for i in range(builders)], \
            measurers

    def run(self, tasks: list[FarmTask]) -> FarmStats:
        """Sample, build and measure every task; returns the statistics (also on an interrupt, as
        ``self.stats``, with every finished record already handed to the sink)."""
        builders, measurers = self._workers()
        self.stats.builders = len(builders)
        workdir = tempfile.mkdtemp(prefix="opbench-sample-")
        start = time.perf_counter()
        try:
            self._loop(tasks, builders, measurers, workdir, start)
        finally:
            for worker in builders + measurers:
                worker.kill()
            shutil.rmtree(workdir, ignore_errors=True)
            self.stats.wall_s = time.perf_counter() - start
            self.stats.builder_busy_s = sum(w.busy_s for w in builders)
            self.stats.device_busy_s = {w.name: w.busy_s for w in measurers}
        return self.stats

    def _loop(self, tasks: list[FarmTask], builders: list[Worker], measurers: list[Worker], workdir: str,
              start: float) -> None:
        config, stats = self.config, self.stats
        pending = collections.deque(t for t in tasks if len(t.done) < t.count)
        stats.skipped += sum(min(len(t.done), t.count) for t in tasks if len(t.done) >= t.count)
        to_build: collections.deque = collections.deque()  # (task, candidate)
        built: collections.deque = collections.deque()  # dicts: task, candidate, path, build_s, built_at[, first]
        audit: list[dict[str, Any]] = []  # built entries of the audit pass, with the first median
        audit_rng = random.Random(config.seed)
        ahead = config.ahead or max(2 * len(builders), 8 * len(measurers))
        sampling = 0
        max_samplers = max(1, len(builders) // 2)
        last_report = time.perf_counter()
        audit_phase = False
        while True:
            signals.check()
            if config.time_limit_s is not None and time.perf_counter() - start > config.time_limit_s + config.drain_s:
                dropped = len(built) + sum(1 for w in builders + measurers if w.job and w.job["kind"] != "sample")
                log.info("sample: %.0f s past the time limit; %d built candidates are not measured (a re-run "
                         "samples them again)", config.drain_s, dropped)
                return
            if config.time_limit_s is not None and not audit_phase and (pending or to_build or sampling) and \
                    time.perf_counter() - start > config.time_limit_s:
                log.info("sample: time limit of %.0f s reached; measuring what is built (a re-run resumes)",
                         config.time_limit_s)
                pending.clear()
                to_build.clear()
                for worker in builders:
                    if worker.job and worker.job["kind"] == "sample":
                        worker.finish()
                        worker.kill()
            # 1. samplers: when the queue of candidates to build runs short
            for worker in builders:
                if not worker.idle or not pending or sampling >= max_samplers:
                    continue
                if len(to_build) >= 2 * len(builders) and sampling:
                    break
                task = pending.popleft()
                worker.submit(self._id(), "sample", None, mod=task.mod, target=task.target, count=task.count,
                              seed=config.seed, space=task.space, _context={"task": task})
                sampling += 1
            # 2. builders: keep at most ``ahead`` built candidates waiting
            building = sum(1 for w in builders if w.job and w.job["kind"] == "build")
            for worker in builders:
                if not worker.idle or not to_build or len(built) + building >= ahead:
                    continue
                task, candidate = to_build.popleft()
                path = os.path.join(workdir, f"{task.key[:12]}-{candidate.index}.so")
                worker.submit(self._id(), "build", config.build_timeout_s, mod=candidate.mod, target=task.target,
                              path=path, _context={"task": task, "candidate": candidate})
                building += 1
            # 3. measurers: the least busy so far takes the next candidate (in a fixed order the first device
            # took most of them: 1,354 against 408 records on two H100s whose builders were the limit)
            for worker in sorted(measurers, key=lambda w: w.busy_s):
                if not worker.idle or not built:
                    continue
                item = built.popleft()
                stats.queue_wait_s += time.perf_counter() - item["built_at"]
                worker.submit(self._id(), "measure", config.run_timeout_s, path=item["path"],
                              args_info=item["task"].args_info, timing=dataclasses.asdict(config.timing),
                              kind=config.target_kind, rpc=config.rpc, _context=item)
            busy = [w for w in builders + measurers if not w.idle]
            if not busy:
                if pending or to_build or built:
                    continue
                if audit and not audit_phase:  # the second pass, once every candidate was measured
                    audit_phase = True
                    built.extend({**item, "built_at": time.perf_counter()} for item in audit)
                    audit.clear()
                    continue
                return
            self._receive(busy, to_build, built, audit, audit_rng)
            sampling = sum(1 for w in builders if w.job and w.job["kind"] == "sample")
            self._timeouts(busy)
            if time.perf_counter() - last_report >= config.progress_s:
                last_report = time.perf_counter()
                self._progress(start, builders, measurers, len(pending), len(to_build), len(built))

    def _receive(self, busy: list[Worker], to_build: collections.deque, built: collections.deque,
                 audit: list[Any], audit_rng: random.Random) -> None:
        ready = wait([w.conn for w in busy], timeout=0.2)
        for worker in busy:
            if worker.conn not in ready:
                continue
            try:
                _job_id, kind, payload = worker.conn.recv()
            except (EOFError, OSError):  # the worker died (killed by the system, a crash in native code)
                self._failed(worker, "worker process died")
                continue
            job = worker.job
            assert job is not None
            if kind == "ready":  # the job's timeout counts from now
                worker.ready = True
                if job["timeout"]:
                    job["deadline"] = time.perf_counter() + job["timeout"]
                continue
            if job["kind"] == "sample":
                self._sample_message(worker, kind, payload, to_build)
            elif job["kind"] == "build":
                worker.finish()
                if kind == "error":
                    payload = {"path": None, "error": payload, "seconds": time.perf_counter() - job["started"]}
                self.stats.build_s += payload["seconds"]
                if payload["path"] is None:
                    self._record(Record(job["task"], job["candidate"], "build_error", payload["error"],
                                        build_s=payload["seconds"]))
                else:
                    built.append({"task": job["task"], "candidate": job["candidate"], "path": payload["path"],
                                  "build_s": payload["seconds"], "built_at": time.perf_counter()})
            else:
                self._measured(worker, kind, payload, audit, audit_rng)

    def _sample_message(self, worker: Worker, kind: str, payload: Any, to_build: collections.deque) -> None:
        task = worker.job["task"]  # type: ignore[index]
        if kind == "candidate":
            self.stats.sampled += 1
            if payload.index in task.done:
                self.stats.skipped += 1
            else:
                to_build.append((task, payload))
            return
        worker.finish()
        if kind == "error":
            log.warning("%s: sampling failed: %s", task.name, first_line(payload))
            payload = {"rejected": {}, "seconds": 0.0, "exhausted": True, "error": payload}
        self.stats.sample_s += payload.get("seconds", 0.0)
        self.stats.rejected.update(payload.get("rejected", {}))
        self.stats.tasks_exhausted += bool(payload.get("exhausted"))
        if self.on_sampled is not None:
            self.on_sampled(task, payload)

    def _measured(self, worker: Worker, kind: str, payload: Any, audit: list[Any], audit_rng: random.Random) -> None:
        job = worker.finish()
        task, candidate, path = job["task"], job["candidate"], job["path"]
        if kind == "error":
            payload = {"error": payload, "seconds": time.perf_counter() - job["started"]}
        self.stats.measure_s += payload.get("seconds", 0.0)
        device = worker.device
        if "first" in job:  # the audit pass
            if payload.get("run_secs"):
                first = job["first"]
                if self.on_audit is not None:
                    self.on_audit(task, candidate, payload["run_secs"])
                if first:
                    self.stats.audit.append(abs(statistics.median(payload["run_secs"]) - first) / first)
            else:
                _restart_after(worker, payload.get("error"))
            with contextlib.suppress(OSError):
                os.remove(path)
            return
        if payload.get("error"):
            _restart_after(worker, payload["error"])
            record = Record(task, candidate, "run_error", payload["error"], build_s=job["build_s"], device=device)
        else:
            record = Record(task, candidate, "ok", None, payload["run_secs"], payload["number"], payload["repeats"],
                            payload["spread"], job["build_s"], device)
        self._record(record)
        if record.build_status == "ok" and self.config.audit > 0 and audit_rng.random() < self.config.audit:
            audit.append({"task": task, "candidate": candidate, "path": path, "build_s": job["build_s"],
                          "first": statistics.median(record.run_secs or [0.0])})
        else:
            with contextlib.suppress(OSError):
                os.remove(path)

    def _record(self, record: Record) -> None:
        stats = self.stats
        stats.records += 1
        stats.ok += record.build_status == "ok"
        stats.build_failures += record.build_status.startswith("build")
        stats.build_timeouts += record.build_status == "build_timeout"
        stats.run_failures += record.build_status.startswith("run")
        start = time.perf_counter()
        self.sink(record)
        stats.write_s += time.perf_counter() - start

    def _failed(self, worker: Worker, why: str, timeout: bool = False) -> None:
        """A worker killed or dead in the middle of a job: the job's candidate is recorded as failed."""
        job = worker.finish()
        worker.kill()
        kind = job["kind"]
        if kind == "sample":
            log.warning("%s: sampling stopped: %s", job["task"].name, why)
            self.stats.tasks_exhausted += 1
            return
        status = ("build" if kind == "build" else "run") + ("_timeout" if timeout else "_error")
        if kind == "measure" and "first" in job:
            return
        if kind == "build":
            self.stats.build_s += time.perf_counter() - job["started"]
        else:
            self.stats.measure_s += time.perf_counter() - job["started"]
        self._record(Record(job["task"], job["candidate"], status, why, device=worker.device,
                            build_s=job.get("build_s") if kind == "measure" else time.perf_counter() - job["started"]))

    def _timeouts(self, busy: list[Worker]) -> None:
        now = time.perf_counter()
        for worker in busy:
            job = worker.job
            if job is not None and job["deadline"] is not None and now > job["deadline"]:
                limit = job["deadline"] - job["started"]
                what = "build" if job["kind"] == "build" else "run"
                self._failed(worker, f"{what} timeout: killed after {limit:g} s", timeout=True)

    def _progress(self, start: float, builders: list[Worker], measurers: list[Worker], pending: int,
                  to_build: int, built: int) -> None:
        stats = self.stats
        wall = time.perf_counter() - start
        running = sum(w.busy_s + (time.perf_counter() - w.job["started"] if w.job else 0.0) for w in builders)
        devices = ", ".join(f"{w.name} {100 * (w.busy_s / wall):.0f}%" for w in measurers)
        log.info("sample: %d records (%.1f/s), %d build failures, %d rejected; builders %.0f%% busy, %s; "
                 "%d tasks to sample, %d to build, %d waiting to be measured", stats.records,
                 stats.records / wall if wall else 0.0, stats.build_failures, sum(stats.rejected.values()),
                 100 * running / (wall * max(len(builders), 1)), devices, pending, to_build, built)


__all__ = ["Farm", "FarmConfig", "FarmStats", "FarmTask", "Record", "Timing", "index_values", "measure_artifact"]
