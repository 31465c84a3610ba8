"""Measurement on remote devices through TVM's RPC tracker.

Devices register with a tracker under a key (``python -m tvm.exec.rpc_tracker`` and
``python -m tvm.exec.rpc_server --tracker HOST:PORT --key KEY --no-fork`` on each GPU). OpBench compiles
here and measures there:

* tuning: MetaSchedule's own ``RPCRunner`` measures every candidate, up to ``workers`` sessions at
  once (one per free device);
* collection: :class:`RPCProfiler` uploads the compiled model, replays its operators on the remote
  device, checks them against the remote Relax VM and times each kernel and the whole model with
  TVM's ``time_evaluator`` there.

Every connection has a time limit: an unreachable tracker, a key no server registered with, or a
key whose servers are all busy end in a one-line error instead of a hang.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import itertools
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ..errors import OpBenchError, first_line
from .base import Profiler
from .timer import Timing, TimingConfig, time_evaluator

T = TypeVar("T")
log = logging.getLogger(__name__)


def _within(seconds: float, what: str, call: Callable[[], T]) -> T:
    """``call()`` in a daemon thread, or a one-line error after ``seconds``."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as err:  # handed to the caller's thread
            box["error"] = err

    thread = threading.Thread(target=run, daemon=True, name="opbench-rpc")
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise OpBenchError(f"{what}: no answer within {seconds:g} s")
    if "error" in box:
        err = box["error"]
        first = first_line(err)
        raise OpBenchError(f"{what}: {first}") from None
    return box["value"]


def tracker_address(text: str) -> tuple[str, int] | None:
    """``HOST:PORT`` of an RPC tracker as ``(host, port)`` (brackets of an IPv6 host removed), or None when
    it is not one."""
    text = str(text).strip()
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or any(c.isspace() for c in text):
        return None
    return host.strip("[]"), int(port)


def valid_key(key: str | None) -> bool:
    """Whether ``key`` can be a device key of the tracker (not empty, no spaces or ':')."""
    return bool(key) and bool(str(key).strip()) and not any(c.isspace() or c == ":" for c in str(key))


# Kept sessions ------------------------------------------------------------------------------------------
# MetaSchedule's RPCRunner opens a session for every candidate. A GPU's server must not fork
# (``server_args``), so each session is a new interpreter that imports TVM and creates a CUDA context:
# 5-8 s per candidate on an H100 host, against well under a second of measuring. The functions below,
# given to the runner, keep one session per runner worker process (each worker measures one candidate at
# a time) and open a new one only when the kept one failed or nears its time limit on the server. Each
# candidate is uploaded under a name of its own: the runner names every artifact alike, and a server
# that loaded a library from a path would be handed the same library again for a new file there.

#: the life a kept session asks the tracker for (the server ends a session older than this)
KEPT_SESSION_S = 300.0
_kept: dict[tuple[str, int, str], tuple[Any, float]] = {}  # (host, port, key): the session, when it opened
_uploaded: dict[str, str] = {}  # the runner's remote path -> this candidate's own name there
_uploads = itertools.count()


@contextlib.contextmanager
def _forgotten_on_failure(session: Any) -> Any:
    """A session that failed at anything is not kept: the next candidate gets a new one."""
    try:
        yield
    except BaseException:
        for where, (kept, _) in list(_kept.items()):
            if kept is session:
                del _kept[where]
        raise


def kept_session(rpc_config: Any) -> Any:
    """``f_create_session`` of MetaSchedule's ``RPCRunner``: this worker's kept session, or a new one when
    it has none, the kept one no longer answers, or it would reach its time limit during the next
    candidate."""
    where = (rpc_config.tracker_host, rpc_config.tracker_port, rpc_config.tracker_key)
    per_candidate = float(rpc_config.session_timeout_sec or 60)
    limit = max(KEPT_SESSION_S, 3 * per_candidate)
    kept = _kept.get(where)
    if kept is not None and time.monotonic() - kept[1] < limit - per_candidate - 5:
        try:
            kept[0].get_function("tvm.rpc.server.remove")  # a round trip: a session its server ended is
            # not handed out (a function every server has; the cleanup calls it)
            return kept[0]
        except Exception:
            pass
    _kept.pop(where, None)  # released: the server serves the next session
    session = rpc_config.connect_tracker().request(key=rpc_config.tracker_key, priority=rpc_config.session_priority,
                                                   session_timeout=int(limit))
    _kept[where] = (session, time.monotonic())
    return session


def kept_upload(session: Any, local_path: str, remote_path: str) -> Any:
    """``f_upload_module``: the candidate uploaded under a name of its own and loaded."""
    name = f"c{next(_uploads)}-{remote_path}"
    _uploaded[remote_path] = name
    with _forgotten_on_failure(session):
        session.upload(local_path, name)
        return session.load_module(name)


def kept_alloc_argument(session: Any, device: Any, args_info: Any, alloc_repeat: int) -> Any:
    """``f_alloc_argument``: MetaSchedule's, and a session that failed is not kept."""
    from tvm.s_tir.meta_schedule.runner.rpc_runner import default_alloc_argument

    with _forgotten_on_failure(session):
        return default_alloc_argument(session, device, args_info, alloc_repeat)


def kept_run_evaluator(session: Any, rt_mod: Any, device: Any, evaluator_config: Any, repeated_args: Any) -> Any:
    """``f_run_evaluator``: MetaSchedule's, and a session that failed (a kernel's fault stays with its CUDA
    context) is not kept."""
    from tvm.s_tir.meta_schedule.runner.rpc_runner import default_run_evaluator

    with _forgotten_on_failure(session):
        return default_run_evaluator(session, rt_mod, device, evaluator_config, repeated_args)


def kept_cleanup(session: Any, remote_path: str | None) -> None:
    """``f_cleanup``: the candidate's files removed; the session and its folder stay."""
    name = _uploaded.pop(remote_path, None) if remote_path else None
    if session is None or name is None:
        return
    # a session that cannot remove a file serves no next candidate; the candidate's own result stands
    with contextlib.suppress(BaseException), _forgotten_on_failure(session):
        session.remove(name)
        session.remove(name + ".so")


@dataclasses.dataclass(frozen=True)
class RPCSpec:
    """Where remote devices are: a tracker address and the key they registered with.

    Attributes
    ----------
    workers:
        Candidates measured at once while tuning (at most one per registered device); None: one per
        device registered with the key when tuning starts.
    timeout_s:
        Limit on connecting to the tracker and on waiting for a free device
        (``$OPBENCH_RPC_TIMEOUT``, default 10 s).
    session_s:
        Limit on one session's life (a candidate's measurement while tuning; a whole collection).
    """

    host: str
    port: int
    key: str
    workers: int | None = None
    timeout_s: float = 10.0
    session_s: int = 600

    @classmethod
    def parse(cls, tracker: str, key: str | None, workers: int | None = None) -> RPCSpec:
        """Check ``--rpc-tracker HOST:PORT``, ``--rpc-key`` and ``--rpc-workers``."""
        address = tracker_address(tracker)
        if address is None:
            raise OpBenchError(f"bad --rpc-tracker {str(tracker).strip()!r} (accepted: HOST:PORT, e.g. 127.0.0.1:9190)")
        if not valid_key(key):
            raise OpBenchError("--rpc-tracker needs --rpc-key KEY, the key the remote devices registered with "
                               "(no spaces or ':')")
        if workers is not None and workers < 1:
            raise OpBenchError(f"--rpc-workers must be a positive integer, got {workers}")
        raw = os.environ.get("OPBENCH_RPC_TIMEOUT", "10")
        try:
            timeout = float(raw)
            assert timeout > 0
        except (ValueError, AssertionError):
            raise OpBenchError(f"bad $OPBENCH_RPC_TIMEOUT {raw!r} (accepted: seconds > 0)") from None
        return cls(*address, str(key), workers, timeout)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def _tracker(self) -> Any:
        from tvm import rpc

        if not logging.getLogger("opbench").isEnabledFor(logging.DEBUG):  # TVM's "retry in 5 secs" lines
            logging.getLogger("RPCServer").setLevel(logging.ERROR)
        return _within(self.timeout_s, f"RPC tracker {self.address} unreachable",
                       lambda: rpc.connect_tracker(self.host, self.port))

    def check(self) -> int:
        """How many devices registered with the key; a one-line error when none did or the tracker
        does not answer. A server registers again after each session it served, so a key missing for a
        moment is asked for again, for up to ``timeout_s``."""
        tracker = self._tracker()
        deadline = time.monotonic() + self.timeout_s
        while True:
            summary = _within(self.timeout_s, f"RPC tracker {self.address} did not answer", tracker.summary)
            keys = [str(s.get("key", "")).split(":", 1)[-1] for s in summary.get("server_info", [])]
            found = sum(k == self.key for k in keys)
            if found or time.monotonic() >= deadline:
                break
            time.sleep(0.5)
        if not found:
            known = ", ".join(sorted(set(keys))) or "none"
            raise OpBenchError(f"no device registered with key '{self.key}' at RPC tracker {self.address} "
                               f"(keys there: {known})")
        return found

    def session(self) -> Any:
        """A session on one free device with the key."""
        tracker = self._tracker()
        return _within(self.timeout_s, f"no free device with key '{self.key}' at RPC tracker {self.address}",
                       lambda: tracker.request(self.key, priority=1, session_timeout=self.session_s))

    def runner(self, evaluator_config: Any, timeout_sec: float = 60) -> Any:
        """MetaSchedule's ``RPCRunner`` for these devices (``timeout_sec`` bounds each candidate), each of
        its workers keeping one session across candidates (:func:`kept_session`) unless there are more
        workers than devices."""
        from tvm.s_tir.meta_schedule.runner import RPCConfig, RPCRunner

        config = RPCConfig(tracker_host=self.host, tracker_port=self.port, tracker_key=self.key,
                           session_timeout_sec=int(max(timeout_sec, self.timeout_s)))
        devices = self.check()
        workers = self.workers or devices
        log.info("tuning: candidates measured on up to %d device%s with key '%s' at %s", workers,
                 "s" if workers != 1 else "", self.key, self.address)
        kept = {"f_create_session": kept_session, "f_upload_module": kept_upload,
                "f_alloc_argument": kept_alloc_argument, "f_run_evaluator": kept_run_evaluator,
                "f_cleanup": kept_cleanup}
        # with more workers than devices, a kept session would hold a device that another worker waits for
        return RPCRunner(rpc_config=config, evaluator_config=evaluator_config, max_workers=workers,
                         **(kept if workers <= devices else {}))


class RemoteModule:
    """A compiled model (:class:`~opbench.runtime.BuiltModule`) loaded on a remote device: the same
    ``library``, ``kernel``, ``device`` and ``vm`` as a local one, served over RPC."""

    def __init__(self, built: Any, session: Any, device: Any) -> None:
        from tvm import relax

        self.target, self.compile_seconds, self.scheduled = built.target, built.compile_seconds, built.scheduled
        self.device = device
        with tempfile.TemporaryDirectory(prefix="opbench-rpc-") as folder:  # the device keeps its own copies
            lib_path, vm_path = os.path.join(folder, "kernels.so"), os.path.join(folder, "model.so")
            built.library.export_library(lib_path)
            built.executable.export_library(vm_path)
            for path in (lib_path, vm_path):
                session.upload(path)
        self.library = session.load_module("kernels.so")
        self._vm = relax.VirtualMachine(session.load_module("model.so"), device)

    def kernel(self, name: str) -> Any:
        return self.library.get_function(name)

    def vm(self) -> Any:
        return self._vm

    def device_source(self) -> str:
        return ""


class RPCProfiler(Profiler):
    """Times on a remote device of :class:`RPCSpec` (see the module docstring).

    A session holds one device for as long as it lives: it is opened for each collection and
    released after it (:meth:`release`), so that tuning in between finds the device free.
    """

    name = "rpc"

    def __init__(self, spec: RPCSpec, target: Any) -> None:
        self.registered = spec.check()  # devices with the key at the tracker now
        self.spec = spec
        self.kind = target.kind.name
        self.session: Any = None
        remote = self._device()
        if not remote.exist:
            raise OpBenchError(f"the device with key '{spec.key}' has no {self.kind} device")
        self.device_name = f"{remote.device_name or self.kind} (rpc key {spec.key})"
        # what tuning reads from the device (MetaSchedule's GPU rules), kept for when no session is open
        self.remote = types.SimpleNamespace(
            **{a: getattr(remote, a) for a in ("max_threads_per_block", "max_shared_memory_per_block",
                                               "warp_size")}) if self.kind == "cuda" else None

    def _device(self) -> Any:
        if self.session is None:
            self.session = self.spec.session()
        return self.session.cuda(0) if self.kind == "cuda" else self.session.cpu(0)

    def release(self) -> None:
        """Close the session (the device is free for others, e.g. the tuner's runner)."""
        self.session = None
        gc.collect()

    def place(self, built: Any) -> Any:
        device = self._device()
        return RemoteModule(built, self.session, device)

    def device(self, target: Any) -> dict[str, Any]:
        from ..runtime.target import canonical_target

        return {"target": canonical_target(target), "device_name": self.device_name, "rpc_key": self.spec.key}

    def tags(self) -> dict[str, Any]:
        return {"device_name": self.device_name, "hostname": f"rpc:{self.spec.key}@{self.spec.address}"}

    def time_model(self, built: Any, inputs: Sequence[Any], config: TimingConfig) -> Timing:
        """The Relax VM over RPC: inputs set once, then ``invoke_stateful`` is timed (a remote
        call cannot bring back a tuple of outputs)."""
        vm = built.vm()
        vm.set_input("main", *inputs)
        return time_evaluator(vm, "invoke_stateful", built.device, ["main"], config)


def server_args(tracker: str, key: str, host: str = "127.0.0.1", gpu: bool = True,
                port: int | None = None) -> list[str]:
    """The arguments of ``python -m`` that start one ``tvm.exec.rpc_server`` registered with ``tracker``.

    ``port``: the one port it listens on; None lets it take the first free one of 9090-9999 (servers
    started at the same moment on one host can then race for the same port: give each its own).

    A GPU's server runs with ``--no-fork``: by default the server forks a child for each session, and a
    child forked from a process that has used CUDA cannot use it (``cudaErrorInitializationError`` at its
    first allocation, ``CUDA_ERROR_NOT_INITIALIZED`` reading the device's name; seen on H100s)."""
    first, end = (9090, 9999) if port is None else (port, port + 1)
    return ["tvm.exec.rpc_server", "--tracker", tracker, "--key", key, "--host", host, "--port", str(first),
            "--port-end", str(end), *(["--no-fork"] if gpu else [])]


def free_ports(host: str, count: int) -> list[int]:
    """``count`` distinct ports free on ``host`` now: each bound to port 0 at the same time, so the system
    gives different ones, then released for the processes that will listen on them."""
    import socket

    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in socks]


class LocalFarm:
    """A TVM RPC tracker and one ``tvm.exec.rpc_server`` per device, all on this machine: one host's GPUs
    (or CPU workers) shared by a tuning run through the tracker, exactly as remote devices are.

    ``devices``: for each server, the ``CUDA_VISIBLE_DEVICES`` it runs with (a GPU index or UUID), or
    None to leave the environment as it is (a CPU server). Used as a context manager: the processes
    start, the servers register under ``key`` (waited for, up to ``timeout`` seconds), and everything
    stops on exit. Each process's output goes to ``log_dir``; :meth:`sessions` counts the sessions each
    server served.

    Examples
    --------
    >>> with LocalFarm("h200", ["0", "1"], "farm-logs") as farm:  # doctest: +SKIP
    ...     spec = RPCSpec.parse(farm.address, "h200")  # the workers default to the 2 servers
    """

    def __init__(self, key: str, devices: Sequence[str | None], log_dir: str | os.PathLike[str],
                 host: str = "127.0.0.1", timeout: float = 60.0) -> None:
        if not devices:
            raise OpBenchError("a local RPC farm needs at least one device")
        self.key, self.devices, self.host, self.timeout = key, list(devices), host, timeout
        self.log_dir = Path(log_dir)
        self.port = 0
        self._procs: list[subprocess.Popen[bytes]] = []
        self.server_logs: list[Path] = []

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def _start(self, args: list[str], log: Path, env: dict[str, str]) -> None:
        with open(log, "wb") as out:
            self._procs.append(subprocess.Popen([sys.executable, "-m", *args], stdout=out, stderr=subprocess.STDOUT,
                                                env=env, start_new_session=True))

    def __enter__(self) -> LocalFarm:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.port, *server_ports = free_ports(self.host, 1 + len(self.devices))
        try:
            self._start(["tvm.exec.rpc_tracker", "--host", self.host, "--port", str(self.port), "--port-end",
                         str(self.port + 1)], self.log_dir / "tracker.log", dict(os.environ))
            for i, (device, port) in enumerate(zip(self.devices, server_ports, strict=True)):
                env = dict(os.environ) if device is None else {**os.environ, "CUDA_VISIBLE_DEVICES": str(device)}
                log = self.log_dir / f"server{i}.log"
                self.server_logs.append(log)
                self._start(server_args(self.address, self.key, self.host, gpu=device is not None,
                                        port=port), log, env)
            self._wait()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _wait(self) -> None:
        spec = RPCSpec(self.host, self.port, self.key, timeout_s=5.0)
        deadline = time.monotonic() + self.timeout
        found = 0
        while time.monotonic() < deadline:
            if any(proc.poll() is not None for proc in self._procs):
                break
            with contextlib.suppress(OpBenchError):
                found = spec.check()
                if found >= len(self.devices):
                    return
            time.sleep(0.5)
        raise OpBenchError(f"local RPC farm: {found} of {len(self.devices)} servers registered with key "
                           f"'{self.key}' at {self.address} (logs in {self.log_dir})")

    def sessions(self) -> list[int]:
        """How many sessions each server has served so far (its "connected from" log lines)."""
        return [log.read_text(errors="replace").count("connected from") if log.exists() else 0
                for log in self.server_logs]

    def __exit__(self, *exc: Any) -> None:
        for proc in reversed(self._procs):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in self._procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self._procs.clear()


__all__ = ["LocalFarm", "RPCProfiler", "RPCSpec", "RemoteModule", "free_ports", "server_args", "tracker_address",
           "valid_key"]
