"""The command line of dataset v2: honest keys, refused files, interrupts, exit codes, JSON output, help."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import FAST, ROOT, SCRIPT, SMALL, count_rows, run, tiny_onnx_bytes


def _query(path: Path, sql: str) -> list[tuple]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return conn.execute(sql).fetchall()


def _collect(path: Path, *args: str) -> subprocess.CompletedProcess:
    proc = run("--dataset", str(path), *FAST, *args)
    assert proc.returncode == 0, proc.stderr
    return proc


@pytest.mark.slow
def test_graph_options_are_part_of_the_key(tmp_path):
    """Re-running with another option measures a new workload instead of "skipped N"."""
    path = tmp_path / "d.sqlite"
    _collect(path, "--modelsource", "local", "--modelname", "squeezenet_v1.1", "--image-size", "32")
    again = _collect(path, "--modelsource", "local", "--modelname", "squeezenet_v1.1", "--image-size", "48")
    assert "skipped 0" in again.stdout
    sizes = _query(path, "SELECT DISTINCT json_extract(workload, '$.options.image_size') FROM operators ORDER BY 1")
    assert sizes == [(32,), (48,)]
    assert _query(path, "SELECT COUNT(*) FROM models") == [(2,)]


@pytest.mark.slow
def test_seqlen_is_part_of_the_key(tmp_path):
    pytest.importorskip("transformers")
    path = tmp_path / "d.sqlite"
    _collect(path, "--modelsource", "transformers", "--modelname", "bert-small", "--seqlen", "8")
    again = _collect(path, "--modelsource", "transformers", "--modelname", "bert-small", "--seqlen", "16")
    assert "skipped 0" in again.stdout
    assert len(_query(path, "SELECT DISTINCT workload_id FROM operators")) == 2


@pytest.mark.slow
def test_two_onnx_files_named_alike(tmp_path):
    path = tmp_path / "d.sqlite"
    files = []
    for i in (1, 2):
        folder = tmp_path / f"d{i}"
        folder.mkdir()
        (folder / "model.onnx").write_bytes(tiny_onnx_bytes(seed=i))
        files.append(folder / "model.onnx")
    _collect(path, "--modelsource", "remoteonnx", "--modelname", str(files[0]))
    again = _collect(path, "--modelsource", "remoteonnx", "--modelname", str(files[1]))
    assert "skipped 0" in again.stdout
    rows = _query(path, "SELECT DISTINCT model, json_extract(workload, '$.options.sha256') FROM operators")
    assert len(rows) == 2 and {r[0] for r in rows} == {"model.onnx"}


@pytest.mark.slow
def test_full_target_is_part_of_the_key(tmp_path):
    path = tmp_path / "d.sqlite"
    _collect(path, "--modelsource", "simple", "--modelname", SMALL)
    again = _collect(path, "--modelsource", "simple", "--modelname", SMALL,
                     "--target", '{"kind":"llvm","mcpu":"x86-64"}')
    assert "skipped 0" in again.stdout
    targets = [json.loads(t)["mcpu"] for (t,) in _query(path, "SELECT DISTINCT target FROM operators")]
    assert len(targets) == 2 and "x86-64" in targets
    assert len(_query(path, "SELECT DISTINCT device_id FROM operators")) == 2


@pytest.mark.slow
def test_plain_rerun_leaves_the_models_row_alone(tmp_path):
    path = tmp_path / "d.sqlite"
    _collect(path, "--modelsource", "simple", "--modelname", SMALL)
    before = _query(path, "SELECT run_id, vm_latency_median_s FROM models")
    again = _collect(path, "--modelsource", "simple", "--modelname", SMALL)
    assert "measured 0, skipped 7" in again.stdout and "(from run 1)" in again.stdout
    assert _query(path, "SELECT run_id, vm_latency_median_s FROM models") == before
    forced = _collect(path, "--modelsource", "simple", "--modelname", SMALL, "--force")
    assert "measured 7" in forced.stdout
    assert _query(path, "SELECT run_id FROM models") == [(3,)]


def _sqlite_unrelated(path: Path) -> None:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE customers (id INTEGER)")
        conn.commit()


@pytest.mark.parametrize("command", ["collect", "export"])
def test_unrelated_sqlite_file_refused_untouched(command, tmp_path):
    path = tmp_path / "other.sqlite"
    _sqlite_unrelated(path)
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    if command == "collect":
        proc = run("--modelsource", "simple", "--modelname", "matmul:n=8", "--dataset", str(path), *FAST)
    else:
        proc = run("export", "--dataset", str(path), "--out", str(tmp_path / "x.csv"), script=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    errs = [x for x in proc.stderr.splitlines() if "error:" in x]
    assert len(errs) == 1 and "not an OpBench dataset" in errs[0]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.sqlite"]


@pytest.mark.slow
def test_locked_dataset_one_line(tmp_path):
    path = tmp_path / "d.sqlite"
    _collect(path, "--modelsource", "simple", "--modelname", "matmul:n=8")
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        env = {**os.environ, "PYTHONPATH": str(ROOT / "python"), "OPBENCH_DB_TIMEOUT": "0.5"}
        proc = subprocess.run([sys.executable, str(SCRIPT), "--modelsource", "simple", "--modelname", "matmul:n=16",
                               "--dataset", str(path), *FAST], capture_output=True, text=True, env=env, cwd=ROOT,
                              timeout=300)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "is locked by another process" in proc.stderr
    assert count_rows(path) == 1


def _wait_for(proc: subprocess.Popen, text: str, timeout: float = 120) -> str:
    seen = ""
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen += line
        if text in line:
            return seen
    raise AssertionError(f"never saw {text!r}: {seen}")


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
@pytest.mark.slow
def test_interrupt_during_lowering(signum, code, tmp_path):
    """Ctrl-C inside TVM's lowering stops the run (never finishes with another graph) and marks it."""
    path = tmp_path / "d.sqlite"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python"), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--modelsource", "simple", "--modelname",
                             "branchy:branches=40,depth=16,channels=4,size=6", "--dataset", str(path), *FAST[:-1]],
                            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for(proc, "extracting operators")
    time.sleep(0.8)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    assert "interrupted" in err and "Traceback" not in err
    assert count_rows(path) == 0
    assert _query(path, "SELECT status FROM runs") == [("interrupted",)]


def test_failed_operators_exit_3(tmp_path, monkeypatch, capsys):
    import importlib

    cli = importlib.import_module("opbench.cli.main")
    base = importlib.import_module("opbench.profile.base")

    real = base.time_evaluator

    def flaky(module, name, *args, **kwargs):
        if name.startswith("concatenate"):
            raise RuntimeError("kernel exploded")
        return real(module, name, *args, **kwargs)

    monkeypatch.setattr(base, "time_evaluator", flaky)
    code = cli.main(["collect", "--modelsource", "simple", "--modelname", SMALL, "--dataset",
                     str(tmp_path / "d.sqlite"), *FAST])
    assert code == 3
    assert "1 failed" in capsys.readouterr().out
    assert _query(tmp_path / "d.sqlite", "SELECT status, error FROM operators WHERE kind='concat'") == [
        ("failed", "RuntimeError: kernel exploded")]
    assert _query(tmp_path / "d.sqlite", "SELECT status FROM runs") == [("partial",)]


def test_json_to_stdout_with_run_and_environment(tmp_path):
    proc = run("--modelsource", "simple", "--modelname", SMALL, "--dataset", str(tmp_path / "d.sqlite"),
               "--repeat", "2", "--min-repeat-ms", "1", "--json", "-")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)  # stdout is pure JSON; the table went to stderr
    assert summary["run_id"] == 1 and summary["schema_version"] == 8
    env = summary["environment"]
    for tag in ("hostname", "cpu_model", "tvm_version", "llvm_version", "python_version", "target",
                "thread_settings"):
        assert env[tag], tag
    assert summary["workload"]["options"] == {"branches": 2, "channels": 4, "depth": 2, "seed": 0, "size": 6}
    assert abs(sum(k["share"] for k in summary["by_kind"]) - 1) < 1e-9
    assert summary["top_operators"][0]["latency_ms"] >= summary["top_operators"][-1]["latency_ms"]
    assert "by kind:" in proc.stderr and "#  operator" in proc.stderr
    phases = summary["phases_s"]  # where the process's time went, phase by phase, in order
    assert list(phases) == ["load", "compile", "check", "measure", "model"]
    assert all(s >= 0 for s in phases.values()) and phases["compile"] >= summary["compile_s"]
    assert phases["measure"] >= summary["measure_s"] and sum(phases.values()) < summary["process_s"]


@pytest.mark.slow
def test_models_and_export_json(tmp_path):
    models = run("models", "--json", script=False)
    assert models.returncode == 0 and "resnet-18" in json.loads(models.stdout)["local"]
    path = tmp_path / "d.sqlite"
    _collect(path, "--modelsource", "simple", "--modelname", "matmul:n=8")
    env_path = {"OPBENCH_DATASET": str(path)}
    proc = subprocess.run([sys.executable, "-m", "opbench", "export", "--out", str(tmp_path / "all.csv"), "--json"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "python"), **env_path})
    assert proc.returncode == 0, proc.stderr
    files = {f["table"]: f["rows"] for f in json.loads(proc.stdout)["files"]}
    assert files == {"runs": 1, "operators": 1, "models": 1, "corun": 0, "trials": 0, "tasks": 0}


def test_version_and_help():
    version = run("--version", script=False)
    assert version.returncode == 0 and version.stdout.startswith("opbench ")
    helptext = run("--help")
    assert helptext.returncode == 0
    assert helptext.stdout.startswith("usage: op_performance_collector.py")
    assert "(default: 10)" in helptext.stdout and "(default: llvm)" in helptext.stdout
    for sub in ("compare", "export", "models"):
        h = run(sub, "--help", script=False)
        assert h.returncode == 0 and "-q, --quiet" in h.stdout and "-v, --verbose" in h.stdout


def test_quiet_prints_only_the_summary(tmp_path):
    proc = run("--modelsource", "simple", "--modelname", "matmul:n=8", "--dataset", str(tmp_path / "d.sqlite"),
               "--repeat", "2", "-q")
    assert proc.returncode == 0
    assert proc.stderr == "" and len(proc.stdout.strip().splitlines()) == 1


def test_bad_schedule_files(tmp_path):
    from opbench import OpBenchError
    from opbench.schedule import Schedule

    good = {"name": "s", "stream_of": [0, 1, 0], "order": [0, 1, 2], "events": [[0, 1], [1, 2]]}
    cases = {
        "Infinity": (b'{"name": "s", "stream_of": [Infinity], "order": [0], "events": []}', "Infinity is not"),
        "1e400": (b'{"name": "s", "stream_of": [1e400], "order": [0], "events": []}', "not an integer"),
        "deep": (b"[" * 100000 + b"]" * 100000, "nested too deeply"),
        "bytes": (b'{"name": "\xff\xfe"}', "not UTF-8"),
        "huge stream": (json.dumps({**good, "stream_of": [0, 10**9, 0]}).encode(), "stream 1000000000, outside"),
        "duplicate": (json.dumps({**good, "order": [0, 1, 1]}).encode(), "operator 1 appears twice"),
        "stages": (json.dumps({**good, "stages": 5}).encode(), "'stages' must be a list"),
        "string int": (json.dumps({**good, "order": ["0", 1, 2]}).encode(), "holds \"0\", not an integer"),
        "bool": (json.dumps({**good, "stream_of": [True, 0, 0]}).encode(), "holds true, not an integer"),
        "float": (json.dumps({**good, "order": [0.0, 1, 2]}).encode(), "holds 0.0, not an integer"),
        "not object": (b"[1, 2]", "a JSON object expected"),
    }
    for name, (data, message) in cases.items():
        path = tmp_path / f"{name}.json"
        path.write_bytes(data)
        with pytest.raises(OpBenchError, match=message) as info:
            Schedule.load(path)
        assert "\n" not in str(info.value), name
    path = tmp_path / "good.json"
    path.write_text(json.dumps(good))
    assert Schedule.load(path).stream_of == [0, 1, 0]


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["collect", "--help"], ["sample", "--help"],
                                  ["compare", "--help"], ["report", "--help"]])
def test_version_and_help_import_neither_tvm_nor_torch(argv):
    """They answer at once: building the parser imports no heavy module (it took 8.6 s when it did)."""
    code = ("import sys\nfrom opbench.cli.main import main\ntry:\n    main(sys.argv[1:])\n"
            "except SystemExit:\n    pass\n"
            "heavy = sorted(m for m in ('tvm', 'torch', 'tvm_ffi') if m in sys.modules)\n"
            "assert not heavy, heavy\n")
    proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "python")})
    assert proc.returncode == 0, proc.stderr[-500:]
