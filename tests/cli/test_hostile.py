"""Hostile input and faults, as a new user and an attacker would try them: nothing runs code from a
data file, no trial row is lost, a signal or a full disk ends a tuning run cleanly, bad input is
refused before any work, no secret is stored, and odd but legal input does not crash.

Each class of fault is one table-driven test; the commands run as a user runs them (a process each).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import pickle
import signal
import sqlite3
import subprocess
import sys
import tarfile
import threading
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from ..helpers import ROOT, SCRIPT, run

M = ["--modelsource", "simple", "--modelname", "matmul:n=64", "--repeat", "2", "--min-repeat-ms", "1"]
TWO_TASKS = ["--modelsource", "simple", "--modelname", "matmul_matmul_add:n=64", "--repeat", "2",
             "--min-repeat-ms", "1"]


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


class _Pwn:
    """Pickled, it runs ``touch <path>`` when unpickled."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def _evil_predictor(path: Path, marker: Path, how: str) -> Path:
    """A predictor file that runs code if anything unpickles what it holds."""
    meta = {"format": "opbench-predictor", "version": 1, "what": "trials", "boosters": [], "blobs": []}
    payload = pickle.dumps(np.array([_Pwn(marker)], dtype=object))
    entries: dict[str, bytes] = {}
    if how == "metaschedule-tar":  # MetaSchedule's XGBModel format: a tar whose data.npy is a pickle
        npy = io.BytesIO()
        np.save(npy, np.array([_Pwn(marker)], dtype=object), allow_pickle=True)
        tar = io.BytesIO()
        with tarfile.open(fileobj=tar, mode="w") as tf:
            info = tarfile.TarInfo("data.npy")
            info.size = len(npy.getvalue())
            tf.addfile(info, io.BytesIO(npy.getvalue()))
        meta["blobs"] = ["metaschedule_xgb.tar"]
        entries["metaschedule_xgb.tar"] = tar.getvalue()
    elif how == "object-npz":  # the current format's name, with an object (pickled) array inside
        npz = io.BytesIO()
        np.savez(npz, rows0=np.array([_Pwn(marker)], dtype=object))
        meta.update(blobs=["trials_data.npz"], groups=["0x1"])
        entries["trials_data.npz"] = npz.getvalue()
    else:  # a raw pickle where the booster should be
        meta["boosters"] = ["trials"]
        entries["trials.ubj"] = payload
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("meta.json", json.dumps(meta))
        for name, data in entries.items():
            zf.writestr(name, data)
    return path


@pytest.mark.parametrize("how", ["metaschedule-tar", "object-npz", "pickled-booster"])
def test_a_predictor_file_runs_no_code(tmp_path, how):
    marker = tmp_path / "pwned"
    evil = _evil_predictor(tmp_path / "evil.opm", marker, how)
    out = run(*M, "--iftune", "true", "--trials", "4", "--predictor", str(evil), "--dataset",
              str(tmp_path / "d.sqlite"))
    assert out.returncode == 2 and len(_lines(out.stderr)) == 1, out.stderr
    assert "evil.opm" in out.stderr
    assert not marker.exists()
    assert not (tmp_path / "d.sqlite").exists()  # refused before any work


@pytest.mark.parametrize("loader", ["schedule", "database", "dataset", "predictor"])
def test_every_loader_refuses_a_pickle(tmp_path, loader):
    """A pickle that would run code, given to each loader that reads a user's file: refused in one line."""
    marker = tmp_path / "pwned"
    payload = pickle.dumps(_Pwn(marker))
    if loader == "schedule":
        (tmp_path / "s.json").write_bytes(payload)
        args = ["compare", *M, "--schedule", str(tmp_path / "s.json")]
    elif loader == "database":
        (tmp_path / "db").mkdir()
        (tmp_path / "db" / "database_workload.json").write_bytes(payload)
        (tmp_path / "db" / "database_tuning_record.json").write_bytes(payload)
        args = [*M, "--database", str(tmp_path / "db"), "--dataset", str(tmp_path / "d.sqlite")]
    elif loader == "dataset":
        (tmp_path / "d.sqlite").write_bytes(payload)
        args = ["export", "--dataset", str(tmp_path / "d.sqlite"), "--out", str(tmp_path / "x.csv")]
    else:
        (tmp_path / "p.opm").write_bytes(payload)
        args = ["compare", *M, "--cost", "predicted", "--predictor", str(tmp_path / "p.opm")]
    out = run(*args, script=False)
    assert out.returncode == 2 and len(_lines(out.stderr)) == 1, out.stderr
    assert not marker.exists()


def test_shipped_predictors_hold_data_only():
    for path in sorted((ROOT / "data" / "predictors").glob("*.opm")):
        with zipfile.ZipFile(path) as zf:
            meta = json.loads(zf.read("meta.json"))
            names = set(zf.namelist())
        assert names == {"meta.json", *(f"{b}.ubj" for b in meta["boosters"]), *meta["blobs"]}, path
        assert set(meta["blobs"]) <= {"trials_data.npz"}, path
        assert "/" not in meta["dataset"] and "\\" not in meta["dataset"], path  # no folder of the training machine


def test_trials_predictor_round_trip(tmp_path):
    """The data-only format loads into MetaSchedule's XGBModel with the same data and predictions."""
    from opbench.predict import load_predictor

    shipped = load_predictor(ROOT / "data" / "predictors" / "llvm_trials_resnet-18_squeezenet.opm", "trials")
    model = shipped.cost_model()
    assert model.data_size == shipped.meta["n_rows"] and model.booster is not None
    shipped.save(tmp_path / "again.opm")
    again = load_predictor(tmp_path / "again.opm", "trials").cost_model()
    xs = [f for g in list(model.data.values())[:3] for f in g.features[:10]]
    np.testing.assert_array_equal(model._predict(xs=xs), again._predict(xs=xs))


def _trial_state(dataset: Path, database: Path) -> tuple[int, int, int, list[str]]:
    """(trial rows, distinct trial keys, database records, run statuses)."""
    conn = sqlite3.connect(f"file:{dataset}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT COUNT(*) FROM trials").fetchone()[0]
        keys = conn.execute("SELECT COUNT(DISTINCT workload_id || task || tuner || trial) FROM trials").fetchone()[0]
        runs = [r[0] for r in conn.execute("SELECT status FROM runs ORDER BY run_id")]
    finally:
        conn.close()
    records = database / "database_tuning_record.json"
    lines = records.read_text().splitlines() if records.exists() else []
    for line in lines:
        json.loads(line)  # every record reads
    return rows, keys, len(lines), runs


@pytest.mark.parametrize("databases", ["one", "two"])
@pytest.mark.slow
def test_concurrent_tuning_runs_lose_no_trial_row(tmp_path, databases):
    """Two tuning runs on one dataset, started a second apart: on one database the second is refused
    in one line before any work; on two databases both finish and every candidate is a row."""
    dataset = tmp_path / "ds.sqlite"
    names = ["db", "db"] if databases == "one" else ["db1", "db2"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
    procs = []
    for name in names:
        cmd = [sys.executable, str(SCRIPT), *M, "--iftune", "true", "--tuner", "random", "--trials", "8",
               "--dataset", str(dataset), "--database", str(tmp_path / name), "-q"]
        procs.append(subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
        time.sleep(1)
    results = [(p.wait(timeout=600), p.stderr.read()) for p in procs]
    if databases == "one":
        assert sorted(r[0] for r in results) == [0, 2], results
        refused = next(err for code, err in results if code == 2)
        assert len(_lines(refused)) == 1 and "in use by another tuning run" in refused
        rows, keys, records, _ = _trial_state(dataset, tmp_path / "db")
        assert rows == keys == records == 8
        assert len((tmp_path / "db" / "database_workload.json").read_text().splitlines()) == 1
    else:
        assert [r[0] for r in results] == [0, 0], results
        rows, keys, records1, _ = _trial_state(dataset, tmp_path / "db1")
        records2 = _trial_state(dataset, tmp_path / "db2")[2]
        assert rows == keys == records1 + records2 == 16


def _signalled(tmp_path: Path, signum: int, when: str) -> tuple[int, list[str], float]:
    """Run a two-task tuning collection, send ``signum`` at moment ``when``; (exit code, stderr lines
    after the signal, seconds to exit). A run that ended before the signal could be sent (the last
    moment is a fraction of a second) is run again, up to three times."""
    for attempt in range(3):
        result = _signal_once(tmp_path / f"try{attempt}", signum, when)
        if result is not None:
            return result
    pytest.fail(f"the run ended before the signal could be sent at '{when}', three times")


def _signal_once(tmp_path: Path, signum: int, when: str) -> tuple[int, list[str], float] | None:
    tmp_path.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python"), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, str(SCRIPT), *TWO_TASKS, "--iftune", "true", "--trials", "16", "--dataset",
           str(tmp_path / "ds.sqlite")]
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    triggers = {"lowering": ("extracting operators", 0.0), "tuning starts": ("LocalRunner", 0.3),
                "inside a task": ("16/16 trials", 0.5)}
    if when == "after it finished":
        for line in proc.stdout:
            if "unique tasks" in line and "Relax VM" in line:  # the summary line: the job has returned
                break
    else:
        text, delay = triggers[when]
        deadline = time.monotonic() + 300
        while not any(text in line for line in lines) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(delay)
    seen = len(lines)
    if proc.poll() is not None:
        return None
    sent = time.monotonic()
    proc.send_signal(signum)
    code = proc.wait(timeout=300)
    took = time.monotonic() - sent
    reader.join(timeout=10)
    return code, [line.rstrip() for line in lines[seen:] if line.strip()], took


@pytest.mark.parametrize(("when", "signum"), [
    ("lowering", signal.SIGINT),
    ("tuning starts", signal.SIGTERM),
    ("inside a task", signal.SIGINT),
    ("inside a task", signal.SIGTERM),
    ("after it finished", signal.SIGINT),
])
@pytest.mark.slow
def test_a_signal_ends_a_tuning_run_cleanly(tmp_path, when, signum):
    code, after, took = _signalled(tmp_path, signum, when)
    assert code == 128 + signum, (code, after)
    assert len(after) == 1 and "interrupted" in after[0], after
    assert took < 60
    ran = max(tmp_path.glob("try*"))
    rows, keys, records, runs = _trial_state(ran / "ds.sqlite", ran / "ds.tuning")
    assert rows == keys >= records  # every database record is a row (a batch cut short is in neither)
    if when == "after it finished":
        assert runs and set(runs) == {"ok"}
    else:
        assert runs[-1] == "interrupted" and "running" not in runs


def _in_namespace(script: str) -> subprocess.CompletedProcess:
    return subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "python")})


def _can_mount() -> bool:
    try:
        return _in_namespace("mount -t tmpfs -o size=64k tmpfs /mnt").returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(not _can_mount(), reason="needs a private mount namespace (unshare -m) for a small file system")
@pytest.mark.parametrize(("where", "size"), [("dataset", "400k"), ("database", "60k")])
@pytest.mark.slow
def test_a_full_disk_during_tuning(tmp_path, where, size):
    """The dataset, or the tuning database, on a file system that fills up during tuning: one line
    naming the file, the run marked failed, every record a row, the database still reads."""
    full = tmp_path / "full"
    full.mkdir()
    dataset = (full if where == "dataset" else tmp_path) / "ds.sqlite"
    database = full / "db" if where == "database" else tmp_path / "db"
    cmd = [sys.executable, str(SCRIPT), *M, "--iftune", "true", "--tuner", "random", "--trials", "32",
           "--dataset", str(dataset), "--database", str(database)]
    script = (f"mount -t tmpfs -o size={size} tmpfs {full} && {' '.join(cmd)}; code=$?; "
              f"cp -a {full} {tmp_path}/kept; exit $code")
    out = _in_namespace(script)
    assert out.returncode == 2, out.stderr
    errors = [line for line in _lines(out.stderr) if not line.startswith("opbench: ")]
    assert len(errors) == 1 and ("dataset" if where == "dataset" else "tuning database file") in errors[0], errors
    assert len(_lines(out.stderr)) < 30  # progress lines and the error; no logging tracebacks
    assert "Logging error" not in out.stderr and "Traceback" not in out.stderr
    kept = tmp_path / "kept"
    rows, keys, records, runs = _trial_state(kept / "ds.sqlite" if where == "dataset" else dataset,
                                             kept / "db" if where == "database" else database)
    assert runs[-1] == "failed" and rows == keys >= records


def _digest(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


def _readonly(folder: Path, cmd: list[str]) -> subprocess.CompletedProcess:
    """Run ``cmd`` with ``folder`` read-only: permissions for a user; a read-only mount for root (who
    writes through permissions)."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT,
                                  env={**os.environ, "PYTHONPATH": str(ROOT / "python")})
        finally:
            folder.chmod(0o755)
    if not _can_mount():
        pytest.skip("root needs a private mount namespace for a read-only folder")
    quoted = " ".join(f"'{c}'" for c in cmd)
    return _in_namespace(f"mount --bind {folder} {folder} && mount -o remount,ro,bind {folder} && {quoted}")


@pytest.mark.parametrize("case", ["readonly database", "corrupt database", "train --out /proc/version",
                                  "export --out folder", "report --out before dataset", "export foreign file"])
def test_bad_input_is_refused_before_any_work(tmp_path, case):
    """One line, exit 2, and the dataset's bytes as they were; nothing measured or created."""
    from ..predict.conftest import write_synthetic

    dataset = tmp_path / "ds.sqlite"
    write_synthetic(dataset, models=2, per_model=3, coruns=0)
    before = _digest(dataset)
    py = [sys.executable, "-m", "opbench"]
    if case == "readonly database":
        (tmp_path / "db").mkdir()
        out = _readonly(tmp_path / "db", [*py, "collect", *M, "--iftune", "true", "--trials", "4", "--dataset",
                                          str(dataset), "--database", str(tmp_path / "db")])
        expected = "is not writable"
    else:
        if case == "corrupt database":
            (tmp_path / "db").mkdir()
            (tmp_path / "db" / "database_workload.json").write_text("{not json\n")
            (tmp_path / "db" / "database_tuning_record.json").write_text("")
            args, expected = ["collect", *M, "--iftune", "true", "--trials", "4", "--dataset", str(dataset),
                              "--database", str(tmp_path / "db")], "cannot read tuning database"
        elif case == "train --out /proc/version":
            args, expected = ["train", "--dataset", str(dataset), "--what", "latency", "--out", "/proc/version"], \
                "is not writable"
        elif case == "export --out folder":
            (tmp_path / "folder").mkdir()
            args, expected = ["export", "--dataset", str(dataset), "--out", str(tmp_path / "folder"), "--format",
                              "csv"], "is a folder"
        elif case == "report --out before dataset":
            args, expected = ["report", "--dataset", str(tmp_path / "missing.sqlite"), "--out",
                              str(tmp_path / "rep")], "not found"
        else:
            foreign = tmp_path / "foreign.sqlite"
            conn = sqlite3.connect(foreign)
            conn.execute("CREATE TABLE x (a)")
            conn.commit()
            conn.close()
            dataset, before = foreign, _digest(foreign)
            args, expected = ["export", "--dataset", str(foreign), "--out", str(tmp_path / "x.csv")], \
                "not an OpBench dataset"
        out = run(*args, script=False, timeout=600)
    assert out.returncode == 2 and len(_lines(out.stderr)) == 1 and expected in out.stderr, out.stderr
    assert _digest(dataset) == before
    assert not (tmp_path / "rep").exists() and not list(tmp_path.glob("folder-*"))
    if dataset.name == "ds.sqlite":
        conn = sqlite3.connect(f"file:{dataset}?mode=ro", uri=True)
        assert conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 0  # nothing was measured
        conn.close()


@contextlib.contextmanager
def _serving(folder: Path):
    """A loopback HTTP server for ``folder`` (its port)."""
    import functools
    import http.server

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_a_url_token_is_never_stored(tmp_path):
    from ..helpers import tiny_onnx_bytes

    (tmp_path / "srv").mkdir()
    (tmp_path / "srv" / "m.onnx").write_bytes(tiny_onnx_bytes())
    with _serving(tmp_path / "srv") as port:
        out = run("--modelsource", "remoteonnx", "--modelname", f"http://127.0.0.1:{port}/m.onnx?token=SECRET42",
                  "--dataset", str(tmp_path / "d.sqlite"), "--cache-dir", str(tmp_path / "cache"), "--repeat", "2",
                  "--min-repeat-ms", "1", "-q")
    assert out.returncode == 0, out.stderr
    conn = sqlite3.connect(tmp_path / "d.sqlite")
    stored = "\n".join(str(v) for table in ("runs", "operators", "models") for row in
                       conn.execute(f"SELECT * FROM {table}") for v in row)
    conn.close()
    assert "m.onnx" in stored and "SECRET42" not in stored
    assert all("SECRET42" not in p.read_text(errors="replace") for p in (tmp_path / "cache").glob("*.json"))


@pytest.mark.parametrize(("content", "args", "expected"), [
    (b"<html><body>not found</body></html>", [], "is not an ONNX model"),
    (b"\0" * (3 << 20), [], "is not an ONNX model"),
    (None, ["--modelname", "http://[::1:bad/x.onnx"], "bad URL"),
    (None, ["--target", '{"kind":"llvm","mcpu":"bogus"}'], "unknown mcpu 'bogus'"),
])
def test_odd_input_is_one_line(tmp_path, content, args, expected):
    """An HTML page or zeros served as .onnx (nothing cached), a malformed IPv6 URL, an unknown CPU."""
    (tmp_path / "srv").mkdir()
    if content is not None:
        (tmp_path / "srv" / "m.onnx").write_bytes(content)
    with _serving(tmp_path / "srv") as port:
        base = ["--modelsource", "remoteonnx", "--modelname", f"http://127.0.0.1:{port}/m.onnx"] if content \
            else [*M]
        if args and args[0] == "--modelname":
            base = ["--modelsource", "remoteonnx"]
        out = run(*base, *args, "--dataset", str(tmp_path / "d.sqlite"), "--cache-dir", str(tmp_path / "cache"))
    assert out.returncode == 2 and len(_lines(out.stderr)) == 1 and expected in out.stderr, out.stderr
    cache = tmp_path / "cache"
    assert not list(cache.glob("*.onnx")) and not (cache / "index.json").exists()


def test_capturer_with_nested_or_no_outputs():
    """A model returning a dict of tensors and a tuple comes back with the same nesting and values;
    one returning None is run unscheduled."""
    import torch

    from opbench import capturer
    from opbench.parallel import CapturedSchedule

    class Nested(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)

        def forward(self, x):
            return {"a": self.a(x).relu(), "b": (self.b(x), self.b(x) * 2)}

    class Nothing(torch.nn.Module):
        def forward(self, x):
            x.add(1)

    x = torch.randn(2, 8)
    nested = Nested().eval()
    captured = capturer(x, nested, repeat=2, number=2, tolerance=-100.0)  # keep a schedule whatever it measures
    assert isinstance(captured, CapturedSchedule)
    out, ref = captured(x), nested(x)
    assert torch.utils._pytree.tree_structure(out) == torch.utils._pytree.tree_structure(ref)
    for a, b in zip(torch.utils._pytree.tree_leaves(out), torch.utils._pytree.tree_leaves(ref), strict=True):
        torch.testing.assert_close(a, b)
    nothing = Nothing()
    assert capturer(x, nothing, repeat=2, number=2) is nothing


def test_report_draws_a_model_name_that_looks_like_tex(tmp_path):
    pytest.importorskip("matplotlib")
    from ..predict.conftest import write_synthetic

    dataset = tmp_path / "d.sqlite"
    write_synthetic(dataset, models=3, per_model=8, coruns=2)
    conn = sqlite3.connect(dataset)
    conn.execute("UPDATE operators SET model='m$\\frac{$x.onnx' WHERE model='model0'")
    conn.commit()
    conn.close()
    out = run("report", "--dataset", str(dataset), "--out", str(tmp_path / "rep"), script=False, timeout=600)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "rep" / "index.html").is_file()
