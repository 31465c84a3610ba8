"""Measurement over TVM RPC on loopback: a tracker and a server on this machine stand in for a farm of
devices. Collection and tuning measure there; a wrong address or key fails fast, in one line."""

from __future__ import annotations

import json
import socket
import sqlite3
import time
from contextlib import closing

import pytest

from helpers import FAST, run
from opbench import OpBenchError

pytest.importorskip("tornado")  # TVM's RPC tracker needs it

MODEL = ["--modelsource", "simple", "--modelname", "matmul:n=32"]


@pytest.fixture(scope="module")
def tracker():
    from tvm.s_tir.meta_schedule.testing.local_rpc import LocalRPC

    with LocalRPC(tracker_key="loopback", silent=True) as rpc:
        yield f"127.0.0.1:{rpc.tracker_port}"


def _free_port() -> int:
    with closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_spec_parsing():
    from opbench.profile.rpc import RPCSpec

    spec = RPCSpec.parse(" tracker.lan:9190 ", "h100", 4)
    assert (spec.host, spec.port, spec.key, spec.workers) == ("tracker.lan", 9190, "h100", 4)
    assert RPCSpec.parse("[::1]:9190", "k").host == "::1"
    for bad in ("9190", "host:", ":9190", "host:port", "host:0", "a b:9190"):
        with pytest.raises(OpBenchError, match="bad --rpc-tracker"):
            RPCSpec.parse(bad, "k")
    with pytest.raises(OpBenchError, match="needs --rpc-key"):
        RPCSpec.parse("h:1", "with space")


def test_unreachable_tracker_is_one_line_within_the_timeout(tmp_path, monkeypatch):
    monkeypatch.setenv("OPBENCH_RPC_TIMEOUT", "2")
    start = time.perf_counter()
    proc = run(*MODEL, "--dataset", str(tmp_path / "d.sqlite"), "--rpc-tracker", f"127.0.0.1:{_free_port()}",
               "--rpc-key", "k", *FAST)
    assert time.perf_counter() - start < 120  # gave up, well before any test timeout (start-up included)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "unreachable: no answer within 2 s" in proc.stderr
    assert not (tmp_path / "d.sqlite").exists()  # refused before any work


@pytest.mark.slow
def test_unknown_key_names_the_keys_there(tracker, tmp_path):
    proc = run(*MODEL, "--dataset", str(tmp_path / "d.sqlite"), "--rpc-tracker", tracker, "--rpc-key", "a100",
               *FAST)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"no device registered with key 'a100' at RPC tracker {tracker} (keys there: loopback)" in proc.stderr


@pytest.mark.slow
def test_collect_over_rpc_writes_rows_of_the_remote_device(tracker, tmp_path):
    path = tmp_path / "d.sqlite"
    remote = run(*MODEL, "--dataset", str(path), "--rpc-tracker", tracker, "--rpc-key", "loopback", *FAST,
                 "--json", str(tmp_path / "r.json"))
    assert remote.returncode == 0, remote.stderr
    local = run(*MODEL, "--dataset", str(path), *FAST, "--json", str(tmp_path / "l.json"))
    assert local.returncode == 0, local.stderr
    r, lo = (json.loads((tmp_path / f).read_text()) for f in ("r.json", "l.json"))
    assert r["measured"] == lo["measured"] == 1 and r["replay_rel_error"] == 0.0
    assert r["vm_latency_ms"] > 0 and r["sum_op_latency_ms"] > 0
    assert r["device_id"] != lo["device_id"] and r["workload_id"] == lo["workload_id"]  # never mixed up
    with closing(sqlite3.connect(path)) as conn:
        rows = conn.execute("SELECT device_name, hostname, latency_median_s FROM operators "
                            "ORDER BY id").fetchall()
    assert len(rows) == 2 and rows[0][0].endswith("(rpc key loopback)") and rows[0][1] == f"rpc:loopback@{tracker}"
    assert rows[0][2] > 0 and "rpc key" not in rows[1][0]


def test_tuning_over_rpc_measures_every_candidate_remotely(tracker, tmp_path, monkeypatch):
    """... and the compiled model sent to the device leaves no local copy behind (each was tens of MB)."""
    import tempfile

    from opbench.dataset import Dataset
    from opbench.models import load_workload
    from opbench.pipeline import collect
    from opbench.pipeline.tune import TuneSpec, tune_workload
    from opbench.profile.rpc import RPCProfiler, RPCSpec
    from opbench.runtime import resolve_target
    from opbench.tune.database import applied_database

    pytest.importorskip("xgboost")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # where this process's temporary folders go
    target = resolve_target("llvm")
    workload = load_workload("simple", "matmul:n=32", 1)
    profiler = RPCProfiler(RPCSpec.parse(tracker, "loopback"), target)
    with Dataset(tmp_path / "d.sqlite") as ds:
        profiler.release()  # the one loopback device must be free for the runner
        tuned = tune_workload(workload, target, ds, TuneSpec(tmp_path / "db", "random", 2), profiler=profiler)
        rows = ds.rows("trials")
        assert applied_database(tmp_path / "db", tuned.extracted, target) is not None
        from opbench.pipeline import CollectOptions

        result = collect(workload, target, ds, CollectOptions(database=tmp_path / "db", progress=False),
                         profiler=profiler)
    assert [r["build_status"] for r in rows] == ["ok", "ok"]
    assert all(len(json.loads(r["run_secs"])) >= 3 and r["device_name"].endswith("(rpc key loopback)")
               for r in rows)
    assert result.measured == 1 and result.rows[0]["config"].startswith("db:")
    assert result.model_row["replay_rel_error"] == 0.0
    assert not list(scratch.glob("opbench-rpc-*"))  # the model's files were uploaded, then removed here


def test_rpc_timeout_setting_is_checked(monkeypatch):
    from opbench.profile.rpc import RPCSpec

    monkeypatch.setenv("OPBENCH_RPC_TIMEOUT", "soon")
    with pytest.raises(OpBenchError, match="bad \\$OPBENCH_RPC_TIMEOUT 'soon'"):
        RPCSpec.parse("h:1", "k")
    monkeypatch.setenv("OPBENCH_RPC_TIMEOUT", "2.5")
    assert RPCSpec.parse("h:1", "k").timeout_s == 2.5


@pytest.mark.slow
def test_tuning_spreads_over_two_loopback_servers(tmp_path):
    """One tracker, two rpc_servers with the same key (as one per GPU of a host): with --rpc-workers left
    at its default, the tuner measures candidates on both, every trial is kept once, and each runner worker
    measures its candidates in one session."""
    from opbench.profile.rpc import LocalFarm

    pytest.importorskip("xgboost")
    path = tmp_path / "d.sqlite"
    with LocalFarm("two", [None, None], tmp_path / "farm") as farm:
        proc = run(*MODEL, "--dataset", str(path), "--rpc-tracker", farm.address, "--rpc-key", "two", "--iftune",
                   "true", "--tuner", "random", "--trials", "8", *FAST, "--json", str(tmp_path / "t.json"))
        sessions = farm.sessions()
    assert proc.returncode == 0, proc.stderr
    assert len(sessions) == 2 and all(n >= 1 for n in sessions), sessions  # both servers measured
    # each runner worker keeps its session: fewer sessions than the 8 candidates, where one per candidate
    # costs a GPU server (which must not fork) a new interpreter and CUDA context each
    assert sum(sessions) < 8, sessions
    tuning = json.loads((tmp_path / "t.json").read_text())["tuning"]
    assert tuning["trials"] == 8 and tuning["trials_per_s"] > 0
    with closing(sqlite3.connect(path)) as conn:
        trials = conn.execute("SELECT trial, build_status, device_name FROM trials ORDER BY trial").fetchall()
    assert [t[0] for t in trials] == list(range(8)) and all(t[1] == "ok" for t in trials)
    assert all(t[2].endswith("(rpc key two)") for t in trials)


def test_a_farm_whose_servers_do_not_register_is_one_line(tmp_path, monkeypatch):
    from opbench.profile.rpc import LocalFarm

    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "nowhere"))  # the servers cannot import TVM: none registers
    monkeypatch.setattr("sys.executable", "/bin/false")
    with pytest.raises(OpBenchError, match=r"local RPC farm: 0 of 2 servers registered with key 'k'"):
        with LocalFarm("k", [None, None], tmp_path / "farm", timeout=5):
            pass


def test_a_gpu_server_does_not_fork_and_a_cpu_server_may():
    """A server forked per session from a process that has used CUDA cannot use it (seen on H100s): GPU
    servers start with --no-fork."""
    from opbench.profile.rpc import server_args

    gpu = server_args("127.0.0.1:9190", "h100", gpu=True)
    assert gpu[:5] == ["tvm.exec.rpc_server", "--tracker", "127.0.0.1:9190", "--key", "h100"] and "--no-fork" in gpu
    assert "--no-fork" not in server_args("127.0.0.1:9190", "cpu", gpu=False)


def test_each_server_of_a_farm_gets_its_own_port(tmp_path, monkeypatch):
    """Servers started at once on one host once raced for port 9090 ("Address already in use"): the farm
    gives the tracker and every server a distinct free port, and each server listens on its port only."""
    from opbench.profile import rpc

    started: list[list[str]] = []
    monkeypatch.setattr(rpc.LocalFarm, "_start", lambda self, args, log, env: started.append(args))
    monkeypatch.setattr(rpc.LocalFarm, "_wait", lambda self: None)
    with rpc.LocalFarm("k", [None, None, None], tmp_path / "farm") as farm:
        pass
    ports = [int(args[args.index("--port") + 1]) for args in started]
    ends = [int(args[args.index("--port-end") + 1]) for args in started]
    assert len(started) == 4 and ports[0] == farm.port and len(set(ports)) == 4
    assert ends == [p + 1 for p in ports]
    assert all(args[args.index("--tracker") + 1] == farm.address for args in started[1:])
    assert len(set(rpc.free_ports("127.0.0.1", 5))) == 5


class _FakeSession:
    def __init__(self):
        self.files: dict[str, str] = {}
        self.loaded: list[str] = []
        self.ended = False

    def get_function(self, name):
        if self.ended:
            raise ConnectionResetError("the server ended the session")
        return name

    def upload(self, local, name):
        self.files[name] = local

    def load_module(self, name):
        self.loaded.append(name)
        return name

    def remove(self, name):
        self.files.pop(name, None)


class _FakeConfig:
    tracker_host, tracker_port, tracker_key, session_priority, session_timeout_sec = "h", 1, "k", 1, 60

    def __init__(self):
        self.opened: list[tuple[_FakeSession, int]] = []

    def connect_tracker(self):
        config = self

        class Tracker:
            def request(self, key, priority, session_timeout):
                session = _FakeSession()
                config.opened.append((session, session_timeout))
                return session

        return Tracker()


def test_a_runner_worker_keeps_its_session_and_names_each_upload(monkeypatch):
    """Candidates of one runner worker share a session (a server that does not fork pays a new interpreter
    per session); each is uploaded under a name of its own (every artifact has the same file name) and
    removed after; the session is opened anew before the server would end it."""
    from opbench.profile import rpc

    monkeypatch.setattr(rpc, "_kept", {})
    now = [0.0]
    monkeypatch.setattr(rpc.time, "monotonic", lambda: now[0])
    config = _FakeConfig()
    first = rpc.kept_session(config)
    names = []
    for _ in range(3):
        session = rpc.kept_session(config)
        names.append(rpc.kept_upload(session, "/tmp/a/tvm_tmp_mod.tar", "tvm_tmp_mod.tar"))
        rpc.kept_cleanup(session, "tvm_tmp_mod.tar")
    assert session is first and len(config.opened) == 1 and config.opened[0][1] >= 3 * 60
    assert len(set(names)) == 3 and all(n.endswith("tvm_tmp_mod.tar") for n in names)
    assert first.files == {}  # every candidate's file removed, the session kept
    now[0] = config.opened[0][1] - 60  # the next candidate could outlive the session on the server
    second = rpc.kept_session(config)
    assert second is not first and len(config.opened) == 2
    second.ended = True  # ended on the server's side: not handed out again
    assert rpc.kept_session(config) is not second and len(config.opened) == 3


def test_a_session_that_failed_is_not_kept(monkeypatch):
    """A kernel's fault stays with the remote CUDA context: after any failure the worker opens a new session."""
    from opbench.profile import rpc

    monkeypatch.setattr(rpc, "_kept", {})
    config = _FakeConfig()
    session = rpc.kept_session(config)

    def fault(*args):
        raise RuntimeError("CUDA: an illegal memory access was encountered")

    monkeypatch.setattr("tvm.s_tir.meta_schedule.runner.rpc_runner.default_run_evaluator", fault)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        rpc.kept_run_evaluator(session, "mod", None, None, [])
    assert rpc.kept_session(config) is not session and len(config.opened) == 2
