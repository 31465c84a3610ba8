"""Sweeps: ``collect`` over the cross product of models, batch sizes and dtypes, each point in its own
process, spread over GPUs (one worker per GPU), resumable.

Each point runs as ``opbench collect`` with one model, one batch size and one dtype, in a child
process whose ``CUDA_VISIBLE_DEVICES`` names its worker's GPU: a crash, an out-of-memory kill or a hung
point costs that point, never the sweep or the rows other points wrote (every point writes its rows to
the dataset as it measures them; SQLite's write-ahead log lets points on several GPUs write one file).

A sweep is a :class:`SweepJob` (a :class:`~opbench.pipeline.collect.CollectJob` and where its state goes);
each point's process receives the job narrowed to its point as a spec file. The sweep's state (each
finished point: exit status, summary, seconds) is a JSON file beside the dataset, named after a digest
of the job's fields other than the points'; the same job again (by flags, ``--config`` or
:func:`sweep`) skips the points that finished and runs the rest (points that crashed or were interrupted
run again). Each point's output goes to a log file beside the state file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .. import signals
from ..errors import OpBenchError
from ..utils import digest
from .collect import CollectJob
from .spec import Spec, SpecError

log = logging.getLogger(__name__)

#: what a state file says it is (files of earlier versions say nothing, and are read by their shape)
STATE_FORMAT = "opbench-sweep-state"
#: seconds the points' processes get to save their work and exit after the sweep is interrupted
STOP_GRACE_S = 30.0

#: exit statuses of ``opbench collect`` a sweep treats as finished (0 ok, 3 finished with failed operators)
FINISHED = (0, 3)


@dataclasses.dataclass(frozen=True)
class Point:
    """One point of a sweep: a model at one batch size and dtype."""

    model: str
    batch: int
    dtype: str

    @property
    def label(self) -> str:
        return f"{self.model} batch {self.batch} {self.dtype}"

    @property
    def key(self) -> str:
        return f"{self.model}|{self.batch}|{self.dtype}"

    def flags(self) -> list[str]:
        return ["--modelname", self.model, "--batchsize", str(self.batch), "--dtype", self.dtype]


def cross(models: Sequence[str], batches: Sequence[int], dtypes: Sequence[str]) -> list[Point]:
    """Every (model, batch, dtype), models outermost."""
    return [Point(m, b, d) for m, b, d in itertools.product(models, batches, dtypes)]


#: flags of collect that name the point, its device or its JSON: a point's command sets them itself
POINT_FLAGS: dict[str, bool | str] = {
    "--modelname": True, "--batchsize": True, "--dtype": True, "--devices": True, "--device": True,
    "--json": "optional", "--sweep-state": True, "--point-timeout": True, "-q": False, "--quiet": False,
    "--debug": False, "collect": False}


def strip_flags(argv: Sequence[str], flags: dict[str, bool | str] = POINT_FLAGS) -> list[str]:
    """``argv`` without ``flags`` (each ``True`` when it takes a value, as ``--flag V`` or ``--flag=V``;
    ``"optional"`` when it may)."""
    out: list[str] = []
    skip = pending_optional = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if pending_optional:  # a flag whose value is optional (--json [FILE]) took this one if it is a value
            pending_optional = False
            if arg == "-" or not arg.startswith("-"):
                continue
        name = arg.split("=", 1)[0]
        if name in flags:
            if flags[name] == "optional":
                pending_optional = "=" not in arg
            else:
                skip = bool(flags[name]) and "=" not in arg
            continue
        out.append(arg)
    return out


def state_path(dataset: str | Path, base_argv: Sequence[str]) -> Path:
    """The default state file of a sweep: beside the dataset, named after the command's other flags."""
    dataset = Path(dataset)
    stem = dataset.name.split(".")[0] or "opbench"
    return dataset.with_name(f"{stem}.sweep-{digest(sorted(base_argv))[:10]}.json")


def check_state(path: Path, base_argv: Sequence[str]) -> dict[str, Any]:
    """The sweep state in ``path`` (empty when there is none yet), refused unless it is a state of this very
    sweep: any other file (a user's JSON, a state of another command) or a corrupt one is an error naming it,
    and its bytes stay as they are."""
    path = Path(path)
    if not path.exists():
        return {"points": {}}
    where = f"--sweep-state {str(path)!r}"
    if not path.is_file():
        raise OpBenchError(f"{where} is not a file (accepted: a sweep state file, or a new path)")
    try:
        if path.stat().st_size > 64 << 20:
            raise ValueError("larger than 64 MiB")
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as err:
        raise OpBenchError(f"{where} cannot be read as a sweep state ({type(err).__name__}); to start the sweep "
                           "over, delete it or give another --sweep-state FILE") from None
    points = data.get("points") if isinstance(data, dict) else None
    command = data.get("command") if isinstance(data, dict) else None
    if not isinstance(points, dict) or not isinstance(command, list) or \
            data.get("format", STATE_FORMAT) != STATE_FORMAT or \
            not all(isinstance(r, dict) for r in points.values()):
        raise OpBenchError(f"{where} is not an OpBench sweep state (accepted: a file an earlier run of this sweep "
                           "wrote, or a new path); it was left as it is")
    if command != list(base_argv):
        raise OpBenchError(f"{where} is the state of another sweep ({' '.join(map(str, command))[:120]}); give "
                           "this sweep its own --sweep-state FILE (or none: one is named after its flags)")
    return data


def point_command(base_argv: Sequence[str], point: Point, json_path: Path) -> list[str]:
    """The child process's command: ``opbench collect`` with the point's flags, quiet, JSON to a file."""
    return [sys.executable, "-m", "opbench", "collect", *base_argv, *point.flags(), "-q",
            "--json", str(json_path)]


def spec_command(job: Any, passthrough: Sequence[str]) -> Callable[[Sequence[str], Point, Path], list[str]]:
    """Points' commands that receive their job as a spec: the sweep's :class:`~opbench.pipeline.collect.CollectJob`
    narrowed to the point (one model, batch size and dtype; no ``devices``) is written beside the point's JSON
    and run with ``opbench collect --config``; ``passthrough`` are the command line's flags that are not the
    job's (a download cache, ``--schedule``, ``-v``)."""

    def command(_base: Sequence[str], point: Point, json_path: Path) -> list[str]:
        spec = json_path.with_name(json_path.stem + ".job.json")
        dataclasses.replace(job, models=(point.model,), batch_sizes=(point.batch,), dtypes=(point.dtype,),
                            devices=None).save(spec)
        return [sys.executable, "-m", "opbench", "collect", "--config", str(spec), *passthrough, "-q",
                "--json", str(json_path)]

    return command


def _describe(code: int, log_path: Path) -> str:
    """What a child's exit status means, with its last error line."""
    if code in FINISHED:
        return "ok" if code == 0 else "finished, some operators failed"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"crashed ({name})"
    if code in (130, 143):
        return "interrupted"
    last = ""
    try:
        lines = [line.strip() for line in log_path.read_text(errors="replace").splitlines() if line.strip()]
        errors = [line for line in lines if "error" in line.lower()]
        last = (errors or lines or [""])[-1]
    except OSError:
        pass
    return f"failed (exit {code}){': ' + last[:160] if last else ''}"


class Sweep:
    """Run every point in its own process, one worker per device, keeping the state for a resume.

    Parameters
    ----------
    base_argv:
        ``collect``'s flags other than the point's (:func:`strip_flags` of the command line).
    points:
        What to measure.
    devices:
        GPU indices (one worker each, the child sees only its GPU), or ``[None]`` for one worker that
        keeps this process's environment (a CPU sweep, or one GPU). With ``cpu``, worker numbers instead:
        the cores are split into that many groups (:func:`opbench.runtime.device.cpu_groups`) and each
        worker's points run pinned to its group, their thread pools sized to it.
    state:
        The state file (:func:`state_path`).
    command:
        Makes a point's command (default :func:`point_command`).
    timeout:
        Seconds a point may run before it is killed (None: no limit).
    """

    def __init__(self, base_argv: Sequence[str], points: Sequence[Point], devices: Sequence[int | None],
                 state: Path, command: Callable[[Sequence[str], Point, Path], list[str]] = point_command,
                 timeout: float | None = None, progress: bool = True, cpu: bool = False) -> None:
        from ..runtime.device import cpu_groups

        self.base_argv, self.points, self.devices = list(base_argv), list(points), list(devices) or [None]
        self.cores = dict(zip(self.devices, cpu_groups(len(self.devices)), strict=True)) \
            if cpu and self.devices != [None] else {}
        self.state_file, self.command, self.timeout, self.progress = Path(state), command, timeout, progress
        self.logs = self.state_file.with_suffix("")
        self.state = check_state(self.state_file, self.base_argv)
        self._lock = threading.Lock()
        self._children: dict[str, subprocess.Popen] = {}  # the points running now, by key
        self._stop = threading.Event()
        self._done = 0
        self.resumed = 0

    # state ------------------------------------------------------------------------------------------------
    def _save(self) -> None:
        self.state["command"] = self.base_argv
        self.state["format"] = STATE_FORMAT
        tmp = self.state_file.with_name(self.state_file.name + ".tmp")
        tmp.write_text(json.dumps(self.state, indent=1, default=str) + "\n")
        os.replace(tmp, self.state_file)

    def finished(self, point: Point) -> bool:
        """True when an earlier run of this sweep finished ``point`` (it is not run again)."""
        return self.state["points"].get(point.key, {}).get("exit") in FINISHED

    # running ----------------------------------------------------------------------------------------------
    def run(self) -> list[dict[str, Any]]:
        """Run the points not finished yet; every point's record (earlier ones marked ``resumed``)."""
        self.logs.mkdir(parents=True, exist_ok=True)
        todo = [p for p in self.points if not self.finished(p)]
        self.resumed = len(self.points) - len(todo)
        if len(todo) < len(self.points):
            log.info("sweep: %d of %d points finished in an earlier run (%s), %d to run",
                     len(self.points) - len(todo), len(self.points), self.state_file, len(todo))
        work: queue.Queue[Point] = queue.Queue()
        for p in todo:
            work.put(p)
        self._total = len(todo)
        # The main thread waits on events, not Thread.join: on Python 3.11 a KeyboardInterrupt that lands
        # inside join() marks a running thread stopped, and a later join() would return before the worker
        # recorded its point.
        done = [threading.Event() for _ in self.devices[:max(1, len(todo))]]
        for device, event in zip(self.devices, done, strict=False):  # a worker per device, at most a point each
            threading.Thread(target=self._worker, args=(device, work, event), daemon=True).start()
        try:
            for event in done:
                while not event.wait(0.2):
                    pass
        except KeyboardInterrupt:
            self._stop.set()
            self._stop_children(signals.received() or signal.SIGINT)
            for event in done:
                event.wait(STOP_GRACE_S + 5)
            raise
        return self.records()

    def _stop_children(self, signum: int) -> None:
        """Hand the sweep's signal to every running point (each saves what it finished and exits), and kill
        any that has not exited within :data:`STOP_GRACE_S`: no point outlives the sweep."""
        with self._lock:
            children = list(self._children.values())
        for child in children:
            with contextlib.suppress(OSError):
                child.send_signal(signum)
        deadline = time.monotonic() + STOP_GRACE_S
        for child in children:
            try:
                child.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()

    def _worker(self, device: int | None, work: queue.Queue[Point], done: threading.Event) -> None:
        try:
            self._work(device, work)
        finally:
            done.set()

    def _work(self, device: int | None, work: queue.Queue[Point]) -> None:
        from ..runtime.device import child_env, cpu_child_env

        cores = self.cores.get(device)
        if cores is not None:
            env = cpu_child_env(cores)
        else:
            env = child_env(device) if device is not None else dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2]),
                                                          env.get("PYTHONPATH")]))
        while not self._stop.is_set():
            try:
                point = work.get_nowait()
            except queue.Empty:
                return
            self._run_point(point, device, env)

    def _run_point(self, point: Point, device: int | None, env: dict[str, str]) -> None:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in point.key.replace("|", "-"))[-80:]
        json_path, log_path = self.logs / f"{safe}.json", self.logs / f"{safe}.log"
        json_path.unlink(missing_ok=True)
        start = time.monotonic()
        with open(log_path, "w") as out:
            with self._lock:
                if self._stop.is_set():
                    return
                child = subprocess.Popen(self.command(self.base_argv, point, json_path), stdout=out,
                                         stderr=subprocess.STDOUT, env=env)
                self._children[point.key] = child
            cores = self.cores.get(device)
            if cores and hasattr(os, "sched_setaffinity"):  # the child has one thread yet: all later ones inherit
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(child.pid, cores)
            try:  # a Ctrl-C reaches the child too (one process group): it saves what it finished and exits
                code = child.wait(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                child.kill()
                code = child.wait()
                out.write(f"\nopbench sweep: killed after {self.timeout:g} s\n")
            finally:
                with self._lock:
                    self._children.pop(point.key, None)
        if self._stop.is_set() and code not in FINISHED:  # stopped by the sweep: by its signal, handled or not
            signum = signals.received() or signal.SIGINT
            code = 128 + signum if code >= 0 or -code == signum else code
        seconds = time.monotonic() - start
        summary = None
        try:
            summary = json.loads(json_path.read_text())
        except (OSError, ValueError):
            pass
        record = {"model": point.model, "batch": point.batch, "dtype": point.dtype, "device": device,
                  "cores": self.cores.get(device), "exit": code, "status": _describe(code, log_path),
                  "seconds": round(seconds, 1), "log": str(log_path), "summary": summary}
        with self._lock:
            self.state["points"][point.key] = record
            self._save()
            self._done += 1
            if self.progress:
                where = "" if device is None else f" on {_where(record)}"
                log.info("[%d/%d] %s%s: %s (%.0f s)", self._done, self._total, point.label, where,
                         record["status"], seconds)
        if code in (130, 143):
            self._stop.set()

    def records(self) -> list[dict[str, Any]]:
        """Every point's record in sweep order (None where a point has not run)."""
        out = []
        for p in self.points:
            rec = self.state["points"].get(p.key)
            out.append(rec if rec is not None else {"model": p.model, "batch": p.batch, "dtype": p.dtype,
                                                     "device": None, "exit": None, "status": "not run",
                                                     "seconds": None, "summary": None})
        return out


def _where(record: dict[str, Any]) -> str:
    """Where a point ran: ``GPU 1``, ``cores 0-7`` (a CPU worker's group) or ``-``."""
    if record.get("cores"):
        cores = record["cores"]
        return f"cores {cores[0]}-{cores[-1]}" if len(cores) > 1 else f"core {cores[0]}"
    return "-" if record.get("device") is None else f"GPU {record['device']}"


def format_sweep(records: Sequence[dict[str, Any]]) -> str:
    """The sweep's summary table: one line per point."""
    head = (f"{'model':<22}{'batch':>6}{'dtype':>10}{'device':>11}{'ops':>6}{'failed':>7}{'sum ops ms':>12}"
            f"{'VM ms':>10}{'VM p90 ms':>11}{'seconds':>9}  status")
    lines = [head, "-" * len(head)]

    def num(value: Any, fmt: str, width: int) -> str:
        return f"{value:>{width}{fmt}}" if isinstance(value, int | float) else f"{'-':>{width}}"

    for r in records:
        s = r.get("summary") or {}
        lines.append(f"{str(r['model'])[:21]:<22}{r['batch']:>6}{r['dtype']:>10}{_where(r):>11}"
                     f"{num(s.get('operators'), 'd', 6)}{num(s.get('failed'), 'd', 7)}"
                     f"{num(s.get('sum_op_latency_ms'), '.3f', 12)}{num(s.get('vm_latency_ms'), '.3f', 10)}"
                     f"{num(s.get('vm_latency_p90_ms'), '.3f', 11)}{num(r.get('seconds'), '.0f', 9)}  {r['status']}")
    return "\n".join(lines)


#: CollectJob fields a point sets itself (they are not the sweep's identity: a larger sweep resumes a smaller one)
POINT_FIELDS = ("models", "batch_sizes", "dtypes", "devices")


@dataclasses.dataclass(frozen=True)
class SweepJob(Spec):
    """A collection over several points (every model x batch size x dtype of ``job``), each point in its own
    process, one worker per device of ``job.devices``; resumable (:func:`sweep` runs one).

    Attributes
    ----------
    job:
        The collection; each point's process receives it narrowed to the point.
    state:
        The state file (``None``: beside the dataset, named after the job: :meth:`state_file`).
    point_timeout_s:
        Seconds a point may run before it is killed (``None``: no limit).
    flags:
        Command-line flags of ``opbench collect`` that are not fields of the job, given to every point's
        process as they are (``--cache-dir DIR``, ``--schedule FILE``).
    """

    job: CollectJob = dataclasses.field(default_factory=CollectJob)
    state: str | None = None
    point_timeout_s: float | None = None
    flags: tuple[str, ...] = ()

    def validate(self) -> None:
        """Check the job and the sweep's own fields (see :class:`~opbench.pipeline.spec.Spec`)."""
        try:
            self.job.validate()
        except SpecError as err:
            raise SpecError(f"job.{err.field}", err.message) from None
        if self.point_timeout_s is not None and not 0 < self.point_timeout_s < float("inf"):
            raise SpecError("point_timeout_s", f"must be a finite positive number, got {self.point_timeout_s}")
        if self.state is not None and Path(self.state).is_dir():
            raise SpecError("state", f"{self.state!r} is a folder (accepted: a state file, or a new path)")

    def points(self) -> list[Point]:
        """Every (model, batch, dtype) of the job, models outermost."""
        return cross(self.job.models, self.job.batch_sizes, self.job.dtypes)

    def identity(self) -> list[str]:
        """What makes two runs the same sweep, as its state file records it: the job's fields other than the
        points' (``field=value``, sorted) and the passed-through flags. The same job given by flags or by
        ``--config`` is the same sweep."""
        fields = {k: v for k, v in self.job.to_json().items() if k not in POINT_FIELDS}
        return [f"{k}={json.dumps(v)}" for k, v in sorted(fields.items())] + list(self.flags)

    def state_file(self, dataset: str | Path) -> Path:
        """``state``, or a file beside ``dataset`` named after :meth:`identity`."""
        return Path(self.state) if self.state else state_path(dataset, self.identity())


@dataclasses.dataclass
class SweepResult:
    """What :func:`sweep` did: every point's record (in sweep order), the state file, the dataset, and how many
    points an earlier run had finished."""

    records: list[dict[str, Any]]
    state: Path
    dataset: str
    resumed: int

    @property
    def finished(self) -> int:
        """Points finished (this run or an earlier one)."""
        return sum(1 for r in self.records if r["exit"] in FINISHED)

    def table(self) -> str:
        """The summary table, one line per point (:func:`format_sweep`)."""
        return format_sweep(self.records)


def sweep(spec: SweepJob, progress: bool = True) -> SweepResult:
    """Run ``spec``'s points not finished yet, each as ``opbench collect --config`` of the job narrowed to it, in
    its own process, one worker per ``job.devices`` (GPU indices on ``cuda``; numbers of CPU workers, each on
    its share of the cores, otherwise). ``opbench.sweep`` is this. A bad field raises
    :class:`~opbench.pipeline.spec.SpecError` and a state file of another sweep :class:`OpBenchError`, both
    before any work; the same job again runs only the points not finished."""
    from ..dataset import default_path
    from ..runtime.device import check_index
    from ..runtime.target import target_config

    spec.validate()
    job = spec.job
    cpu = target_config(job.target).get("kind") != "cuda"  # read without the GPU: the points' processes use it
    devices: list[int | None] = [None] if job.devices is None else list(job.devices)
    if job.devices is not None and not cpu:  # GPU indices; on a CPU they number workers (cpu_groups checks them)
        for index in job.devices:
            try:
                check_index(index, "GPU")
            except OpBenchError as err:
                raise SpecError("job.devices", str(err)) from None
    if job.tune and len(devices) > 1:
        raise OpBenchError("tuning with several devices: the workers would share one tuning database; tune on one "
                           "GPU first, then sweep the tuned kernels with a database")
    dataset = job.dataset or default_path()
    job = dataclasses.replace(job, dataset=dataset)
    spec = dataclasses.replace(spec, job=job)
    state, identity, points = spec.state_file(dataset), spec.identity(), spec.points()
    check_state(state, identity)  # a file that is not this sweep's state is refused before any work, untouched
    where = "" if devices == [None] else (f" on {len(devices)} CPU workers" if cpu else
                                          f" on GPUs {','.join(map(str, devices))}")
    log.info("sweep: %d points (%d models x %d batch sizes x %d dtypes)%s, each in its own process; state in %s",
             len(points), len(job.models), len(job.batch_sizes), len(job.dtypes), where, state)
    runner = Sweep(identity, points, devices, state, command=spec_command(job, spec.flags),
                   timeout=spec.point_timeout_s, progress=progress, cpu=cpu)
    records = runner.run()
    return SweepResult(records, state, dataset, runner.resumed)


__all__ = ["FINISHED", "POINT_FIELDS", "POINT_FLAGS", "Point", "Sweep", "SweepJob", "SweepResult", "check_state",
           "cross", "format_sweep", "point_command", "spec_command", "state_path", "strip_flags", "sweep"]
