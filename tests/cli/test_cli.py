"""The command line, run as a user would: the OpBench-compatible script in a subprocess."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from conftest import has_gpu
from helpers import FAST, ROOT, SCRIPT, SMALL, count_rows, run, tiny_onnx_bytes
from opbench.cli.format import format_table
from opbench.utils import parse_bool


@pytest.fixture(scope="module")
def populated(tmp_path_factory):
    path = tmp_path_factory.mktemp("ds") / "d.sqlite"
    proc = run("--modelsource", "simple", "--modelname", SMALL, "--target", "llvm",
               "--dataset", str(path), *FAST)
    assert proc.returncode == 0, proc.stderr
    return path, proc


@pytest.mark.slow
def test_collect_writes_one_row_per_operator(populated):
    path, proc = populated
    assert count_rows(path) == 1 + 2 * 2 + 2
    assert count_rows(path, "models") == 1
    assert "7 operators" in proc.stdout and "measured 7, skipped 0" in proc.stdout
    # closed at once: a connection left to the garbage collector checkpoints the WAL into the file
    # later, while another test checks that the file is untouched
    with contextlib.closing(sqlite3.connect(path)) as conn:
        row = conn.execute("SELECT kind, latency_median_s, flops, cpu_model, tvm_version, status "
                           "FROM operators WHERE op_index=0").fetchone()
        vm, err = conn.execute("SELECT vm_latency_median_s, replay_rel_error FROM models").fetchone()
    assert row[0] == "conv2d" and row[1] > 0 and row[2] > 0 and row[3] and row[4] and row[5] == "ok"
    assert vm > 0 and err < 1e-5


@pytest.mark.slow
def test_rerun_skips_and_force_remeasures(populated, tmp_path):
    path, _ = populated
    again = run("--modelsource", "simple", "--modelname", SMALL, "--dataset", str(path), *FAST)
    assert again.returncode == 0 and "measured 0, skipped 7" in again.stdout
    forced = run("--modelsource", "simple", "--modelname", SMALL, "--dataset", str(path),
                 "--force", *FAST)
    assert forced.returncode == 0 and "measured 7, skipped 0" in forced.stdout
    assert count_rows(path) == 7


def test_table_and_summary_printed(tmp_path):
    proc = run("--modelsource", "simple", "--modelname", "matmul:n=64", "--dataset",
               str(tmp_path / "d.sqlite"), "--repeat", "2", "--min-repeat-ms", "1",
               "--json", str(tmp_path / "s.json"))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:3] == ["#", "operator", "kind"]
    assert lines[2].split()[1:5] == ["matmul", "matmul", "1x64x64", "64x64"]
    assert "1 operators, 1 unique tasks" in lines[-1] and "Relax VM" in lines[-1]
    import json

    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["operators"] == 1 and summary["measured"] == 1


BAD_INPUTS = [
    (["--modelsource", "nowhere", "--modelname", "x"],
     "unknown --modelsource 'nowhere' (accepted: local, simple, remoteonnx, transformers)"),
    (["--modelsource", "local", "--modelname", "resnet-99"], "unknown model 'resnet-99'"),
    (["--modelsource", "simple", "--modelname", "matmul", "--batchsize", "0"], "bad batch size '0'"),
    (["--modelsource", "simple", "--modelname", "matmul", "--batchsize", "two"], "bad batch size 'two'"),
    (["--modelsource", "simple", "--modelname", "matmul", "--target", "metal"], "unknown target 'metal'"),
    (["--modelsource", "remoteonnx", "--modelname", "/nonexistent/m.onnx"], "ONNX file not found"),
    (["--modelsource", "remoteonnx", "--modelname", "http://127.0.0.1:9/m.onnx"], "download failed"),
    (["--modelsource", "simple", "--modelname", "matmul", "--rpc-tracker", "nohost", "--rpc-key", "k"],
     "bad --rpc-tracker 'nohost' (accepted: HOST:PORT"),
    (["--modelsource", "simple", "--modelname", "matmul", "--rpc-tracker", "h:99999", "--rpc-key", "k"],
     "bad --rpc-tracker 'h:99999'"),
    (["--modelsource", "simple", "--modelname", "matmul", "--rpc-tracker", "127.0.0.1:9190"],
     "--rpc-tracker needs --rpc-key KEY"),
    (["--modelsource", "simple", "--modelname", "matmul", "--rpc-key", "k"], "--rpc-key needs --rpc-tracker"),
    (["--modelsource", "simple", "--modelname", "matmul", "--rpc-tracker", "h:9190", "--rpc-key", "k",
      "--corun"], "--corun runs on this machine's GPU, not over --rpc-tracker"),
    (["--modelsource", "simple", "--modelname", "matmul", "--rpc-tracker", "h:9190", "--rpc-key", "k",
      "--rpc-workers", "0"], "'0' is not a positive integer"),
    (["--modelsource", "simple", "--modelname", "matmul", "--iftune", "true", "--tune-time", "0"],
     "'0' is not a finite number > 0"),
    (["--modelsource", "simple", "--modelname", "matmul", "--iftune", "true", "--trials", "0"],
     "'0' is not a positive integer"),
    (["--modelsource", "simple", "--modelname", "matmul", "--database", "/nonexistent/db"],
     "tuning database not found: '/nonexistent/db'"),
    (["--modelsource", "simple", "--modelname", "matmul", "--iftune", "true", "--database", "/etc/hostname"],
     "--database '/etc/hostname' is not a folder"),
    (["--modelsource", "simple", "--modelname", "matmul", "--ifcompare", "yes", "--schedulers", "magic"],
     "unknown scheduler 'magic'"),
    (["--modelsource", "simple", "--modelname", "matmul", "--iftune", "maybe"], "'maybe' is not a boolean"),
    (["--modelsource", "simple", "--modelname", "matmul", "--tuner", "magic"],
     "unknown --tuner 'magic' (accepted: xgb,"),
    (["--modelsource", "simple", "--modelname", "matmul", "--trials", "-3"], "'-3' is not a positive integer"),
    (["--modelsource", "simple", "--modelname", "matmul", "--min-repeat-ms", "nan"], "'nan' is not a finite number"),
    (["--modelsource", "simple", "--modelname", "matmul", "--min-repeat-ms", "inf"], "'inf' is not a finite number"),
    (["--modelsource", "simple", "--modelname", "matmul", "--min-repeat-ms", "-1"], "'-1' is not a finite number"),
    (["--modelsource", "simple", "--modelname", "matmul", "--seed", "-1"], "'-1' is not a non-negative integer"),
    (["--modelsource", "simple", "--modelname", "matmul", "--warmup", "-5"], "'-5' is not a non-negative integer"),
    (["--modelsource", "simple", "--modelname", "mat\nmul"], "model name 'mat\\nmul' contains a control"),
    (["--modelsource", "simple", "--modelname", "matmul", "--batchsize", "100000"], "GiB of memory, more than"),
    (["--modelsource", "simple", "--modelname", "matmul:n=1000000"], "GiB of memory, more than"),
    (["--modelsource", "local", "--modelname", "resnet-18", "--image-size", "100000"], "GiB of memory, more than"),
    (["--modelsource", "simple", "--modelname", "matmul:n=x"], "option n=x must be a positive integer"),
    (["--modelsource", "remoteonnx", "--modelname", "http://127.0.0.1:9/m.onnx", "--sha256", "../../x"],
     "bad --sha256 '../../x'"),
    (["--modelsource", "remoteonnx", "--modelname", "http://127.0.0.1:9/a b.onnx"], "spaces or control characters"),
    (["--modelsource", "simple", "--modelname", "matmul", "--target", '{"kind":"llvm"'], "bad target JSON"),
    (["--modelsource", "simple", "--modelname", "matmul", "--json", "/nonexistent/dir/s.json"],
     "--json '/nonexistent/dir/s.json': folder '/nonexistent/dir' does not exist"),
    (["--modelsource", "simple", "--modelname", "matmul", "--json", "/tmp"], "--json '/tmp' is a folder"),
    (["--modelsource", "simple", "--modelname", "matmul", "--save-schedule", "/nonexistent/k.json"],
     "--save-schedule '/nonexistent/k.json'"),
    (["--modelsource", "simple", "--modelname", "matmul", "--max-download-mb", "nan"], "'nan' is not a finite"),
]


@pytest.mark.parametrize("args, message", BAD_INPUTS, ids=[m for _, m in BAD_INPUTS])
def test_bad_input_one_line_exit_2(args, message, populated, tmp_path):
    path, _ = populated
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    proc = run(*args, "--dataset", str(path), "--cache-dir", str(tmp_path))
    assert proc.returncode == 2
    assert len(proc.stderr.splitlines()) == 1, proc.stderr  # one line, nothing else
    err_lines = [x for x in proc.stderr.splitlines() if x.startswith("op_performance_collector.py: error:")]
    assert len(err_lines) == 1 and message in err_lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before  # dataset untouched


def test_invalid_onnx_file(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x01garbage")
    proc = run("--modelsource", "remoteonnx", "--modelname", str(bad), "--dataset", str(tmp_path / "d.sqlite"))
    assert proc.returncode == 2 and "invalid ONNX file" in proc.stderr and "Traceback" not in proc.stderr


def test_onnx_collect(tmp_path):
    path = tmp_path / "tiny.onnx"
    path.write_bytes(tiny_onnx_bytes())
    proc = run("--modelsource", "remoteonnx", "--modelname", str(path), "--batchsize", "2",
               "--dataset", str(tmp_path / "d.sqlite"), *FAST)
    assert proc.returncode == 0, proc.stderr
    assert count_rows(tmp_path / "d.sqlite") >= 1


@pytest.mark.skipif(has_gpu(), reason="this machine has a GPU")
def test_cuda_without_gpu(tmp_path):
    proc = run("--modelsource", "simple", "--modelname", "matmul", "--target", "cuda",
               "--dataset", str(tmp_path / "d.sqlite"))
    assert proc.returncode == 2
    assert "target 'cuda' needs an NVIDIA GPU" in proc.stderr and "Traceback" not in proc.stderr


def test_debug_shows_traceback(tmp_path):
    # an unknown model is refused by the job (an unknown source is an argparse choice: no traceback to show)
    proc = run("--debug", "--modelsource", "local", "--modelname", "resnet-99", "--dataset",
               str(tmp_path / "d.sqlite"), script=False)
    assert proc.returncode == 2 and "Traceback" in proc.stderr


@pytest.mark.slow
def test_ifcompare_prints_the_table(tmp_path):
    sched = tmp_path / "kept.json"
    proc = run("--modelsource", "simple", "--modelname", SMALL, "--dataset", str(tmp_path / "d.sqlite"),
               "--ifcompare", "true", "--compare-repeat", "2", "--compare-number", "2",
               "--save-schedule", str(sched), "--json", str(tmp_path / "s.json"), *FAST)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    head = next(i for i, x in enumerate(lines) if x.startswith("schedule"))
    names = [x.split()[0] for x in lines[head + 2: head + 7]]
    assert names == ["sequential", "greedy", "nimble", "opara", "ios"]
    end = lines[head].index("max err") + len("max err")  # the column's right edge (columns are right-aligned)
    assert all(float(x[end - 10:end]) == 0.0 for x in lines[head + 2: head + 7])
    import json

    from opbench.schedule import Schedule

    kept = Schedule.load(sched)
    assert kept.name in names and len(kept.stream_of) == 7
    summary = json.loads((tmp_path / "s.json").read_text())
    assert [r["schedule"] for r in summary["schedules"]] == names
    bound = summary["critical_path"]
    assert bound["ops"] and 0 < bound["path_ms"] <= bound["sum_ms"]
    assert any(x.startswith(f"critical path: {len(bound['ops'])} operators") for x in lines)
    # the operators' times come from the collection just made, not from a second measurement
    from opbench.dataset import load

    ops = load(tmp_path / "d.sqlite", "operators").sort_values("op_index")
    alone = [t["alone_ms"] for t in summary["operator_times"]]
    assert alone == pytest.approx(list(ops["latency_median_s"] * 1e3))
    assert kept.meta["graph"] and kept.meta["device"] == "cpu"
    # the kept schedule is reused: no search, measured beside sequential
    proc = run("compare", "--modelsource", "simple", "--modelname", SMALL, "--schedule", str(sched),
               "--compare-repeat", "2", "--compare-number", "2", "--json", str(tmp_path / "c.json"), script=False)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads((tmp_path / "c.json").read_text())["schedules"]
    assert [r["schedule"] for r in rows] == ["sequential", kept.name] and rows[1]["scheduling_ms"] == 0.0
    # ... and refused for another graph, in one line
    proc = run("compare", "--modelsource", "simple", "--modelname", "matmul:n=16", "--schedule", str(sched),
               script=False)
    assert proc.returncode == 2 and "was made for another graph" in proc.stderr
    errors = [x for x in proc.stderr.splitlines() if "error" in x]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.slow
def test_compare_command_errors(tmp_path):
    proc = run("compare", "--modelsource", "simple", "--modelname", "matmul", "--backend", "torch", script=False)
    assert proc.returncode == 2 and "--backend torch needs a torch model" in proc.stderr
    proc = run("compare", "--modelsource", "simple", "--modelname", "matmul", "--backend", "jax", script=False)
    assert proc.returncode == 2 and "unknown --backend 'jax' (accepted: tvm, torch, fused)" in proc.stderr
    proc = run("compare", "--modelsource", "simple", "--modelname", "matmul", "--merge", "some", script=False)
    assert proc.returncode == 2 and "unknown --merge 'some' (accepted: none, all, ios)" in proc.stderr
    proc = run("compare", "--modelsource", "simple", "--modelname", "matmul", "--kernels", "bogus", script=False)
    assert proc.returncode == 2 and "unknown --kernels 'bogus' (accepted: aten, fused)" in proc.stderr
    proc = run("compare", "--modelsource", "simple", "--modelname", "matmul", "--kernels", "fused", "--cut", "thin",
               script=False)
    assert proc.returncode == 2 and "unknown --cut 'thin' (accepted: auto, branches, blocks, whole)" in proc.stderr
    proc = run("compare", "--modelsource", "simple", "--modelname", "matmul", "--kernels", "fused", script=False)
    assert proc.returncode == 2 and "use them with --backend torch" in proc.stderr
    proc = run("compare", "--modelsource", "simple", "--modelname", "matmul", "--sm-partition", "on", script=False)
    assert proc.returncode == 2 and "unknown --sm-partition 'on' (accepted: off, auto)" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_false_really_is_false(tmp_path):
    proc = run("--modelsource", "simple", "--modelname", "matmul:n=32", "--iftune", "false",
               "--ifcompare", "0", "--dataset", str(tmp_path / "d.sqlite"), *FAST)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("text, value", [("true", True), ("False", False), ("1", True), ("0", False),
                                         ("yes", True), ("NO", False)])
def test_parse_bool(text, value):
    assert parse_bool(text) is value


@pytest.mark.slow
def test_resume_after_kill(tmp_path):
    path = tmp_path / "d.sqlite"
    model = "branchy:branches=3,depth=2,channels=8,size=8"
    total = 1 + 3 * 2 + 2
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
    slow = ["--repeat", "40", "--min-repeat-ms", "25", "--quiet"]
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--modelsource", "simple", "--modelname",
                             model, "--dataset", str(path), *slow], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None and count_rows(path) < 1:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    kept = count_rows(path)
    assert 1 <= kept < total
    resumed = run("--modelsource", "simple", "--modelname", model, "--dataset", str(path), *FAST)
    assert resumed.returncode == 0, resumed.stderr
    assert f"measured {total - kept}, skipped {kept}" in resumed.stdout
    assert count_rows(path) == total


def test_export_and_models_commands(populated, tmp_path):
    path, _ = populated
    out = tmp_path / "ops.csv"
    proc = run("export", "--dataset", str(path), "--table", "operators", "--out", str(out), script=False)
    assert proc.returncode == 0, proc.stderr
    assert len(out.read_text().strip().splitlines()) == 1 + 7
    bad = run("export", "--dataset", str(path), "--format", "xls", "--out", str(out), script=False)
    assert bad.returncode == 2 and "unknown --format 'xls' (accepted: csv, parquet)" in bad.stderr
    bad = run("export", "--dataset", str(path), "--out", str(tmp_path / "no" / "x.csv"), script=False)
    assert bad.returncode == 2 and "does not exist" in bad.stderr
    models = run("models", script=False)
    assert models.returncode == 0 and "local:" in models.stdout and "resnet-18" in models.stdout


def test_format_table_handles_failed_rows():
    rows = [{"op_index": 0, "func": "f", "kind": "conv2d", "input_shapes": [[1, 2]],
             "output_shapes": [[1, 2]], "flops": 1e6, "bytes": 1e6, "latency_median_s": None,
             "latency_min_s": None, "latency_max_s": None, "gflops": None, "status": "failed"}]
    text = format_table(rows)
    assert "failed" in text and text.splitlines()[2].split()[0] == "0"


@pytest.mark.slow
def test_compare_stages_and_measured_ios(tmp_path):
    import json

    # operators of a few ms each: on two cores the ios programme runs the branches concurrently
    proc = run("compare", "--modelsource", "simple", "--modelname", "ios_block:channels=32,size=24",
               "--schedulers", "sequential,ios", "--ios-cost", "model,measured", "--stages",
               "--compare-repeat", "2", "--compare-number", "2", "--json", str(tmp_path / "c.json"), script=False)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "c.json").read_text())
    assert [r["schedule"] for r in doc["schedules"]] == ["sequential", "ios", "ios-measured"]
    stages = doc["stages"]
    assert set(stages) == {"sequential", "ios", "ios-measured"}
    seq = stages["sequential"]["stages"]
    assert len(seq) == 5 and all(len(s["groups"]) == 1 and s["latency_ms"] > 0 for s in seq)
    ios = stages["ios"]["stages"]
    ops = sorted(op for s in ios for g in s["groups"] for op in g)
    assert ops == list(range(5)) and any(s["strategy"] == "concurrent" for s in ios)
    assert stages["ios"]["total_ms"] == pytest.approx(sum(s["latency_ms"] for s in ios))
    assert "stages of ios" in proc.stdout and "concurrent" in proc.stdout
    proc = run("compare", "--modelsource", "simple", "--modelname", "matmul", "--ios-cost", "guess", script=False)
    assert proc.returncode == 2 and "unknown --ios-cost 'guess'" in proc.stderr
