"""Round 4 of hostile input and faults: export that names what it cannot write and never leaves a file cut
short or of the wrong format. Each case is one row of a table; commands run as a user runs them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ..helpers import ROOT


def _opbench(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "opbench", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT / "python")})


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


@pytest.fixture
def dataset(tmp_path) -> Path:
    """A dataset of 2,000 operator rows (no model is compiled)."""
    from opbench.dataset import Dataset

    path = tmp_path / "ds.sqlite"
    with Dataset(path) as ds:
        with ds.guard(), ds.conn:
            ds.conn.executemany(
                "INSERT INTO operators (workload_id, device_id, config, l2_flush, op_index, func, latency_median_s, "
                "status, error) VALUES ('w', 'd', 'default', 0, ?, ?, 1e-3, 'ok', ?)",
                [(i, f"fused_op_{i}", "x" * 200) for i in range(2000)])
    return path


@pytest.mark.parametrize("args, message", [
    (["--format", "csv", "--out", "x.parquet"], "--format csv but 'x.parquet' names a parquet file"),
    (["--format", "parquet", "--out", "x.csv"], "--format parquet but 'x.csv' names a csv file"),
    (["--format", "xml", "--out", "x.xml"], "unknown --format 'xml' (accepted: csv, parquet)"),
])
def test_export_refuses_a_format_its_file_name_contradicts(tmp_path, dataset, args, message):
    out = _opbench("export", "--dataset", str(dataset), "--table", "operators",
                   *[str(tmp_path / a) if a.startswith("x.") else a for a in args])
    assert out.returncode == 2 and message.replace("'x.", f"'{tmp_path}/x.") in out.stderr
    assert len(_lines(out.stderr)) == 1 and not list(tmp_path.glob("x.*"))


def _can_mount() -> bool:
    try:
        return subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
                              capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(not _can_mount(), reason="needs a private mount namespace (unshare -m) for a small file system")
@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_export_on_a_full_disk_names_the_file_and_leaves_nothing_cut_short(tmp_path, dataset, suffix):
    pytest.importorskip("pyarrow")
    full = tmp_path / "full"
    full.mkdir()
    target = full / f"ops{suffix}"
    cmd = [sys.executable, "-m", "opbench", "export", "--dataset", str(dataset), "--table", "operators",
           "--out", str(target)]
    script = (f"mount -t tmpfs -o size=48k tmpfs {full} && {' '.join(cmd)}; code=$?; ls -a {full}; exit $code")
    out = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=300,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT / "python")})
    errors = [line for line in _lines(out.stderr) if "error" in line]
    assert out.returncode == 2 and len(errors) == 1, out.stderr
    assert str(target) in errors[0] and "is the disk full?" in errors[0]
    listed = set(out.stdout.split())
    assert not listed & {f"ops{suffix}", f".ops{suffix}.partial"}  # neither a truncated file nor a partial one


@pytest.mark.parametrize("args, message", [
    (["collect", "--modelsource", "simple", "--modelname", "matmul:n=64,bogus", "--batchsize", "1,2"],
     "unknown model 'bogus' for source 'simple'"),
    (["collect", "--modelsource", "simple", "--modelname", "matmul:q=64", "--batchsize", "1,2"],
     "unknown option 'q'"),
    (["collect", "--modelsource", "transformers", "--modelname", "bert-small,gpt9", "--batchsize", "1,2"],
     "unknown model 'gpt9' for source 'transformers'"),
    (["collect", "--modelsource", "local", "--modelname", "googlenet,resnet-5", "--dtype", "fp32,fp16"],
     "unknown model 'resnet-5'"),
    (["train", "--what", "latency", "--config", "bogus", "--dataset", "data/dataset/h100.sqlite.gz"],
     "--config 'bogus': no operator rows of NVIDIA H100 80GB HBM3 have it (accepted: "),
])
def test_every_point_and_name_is_checked_before_any_work(tmp_path, args, message):
    if "--dataset" not in args:
        args = [*args, "--dataset", str(tmp_path / "ds.sqlite")]
    out = _opbench(*args)
    assert out.returncode == 2 and message in out.stderr and len(_lines(out.stderr)) == 1, out.stderr
    assert not (tmp_path / "ds.sqlite").exists()


@pytest.mark.parametrize("how", ["link to a secret", "foreign content"])
@pytest.mark.slow
def test_a_tuning_database_never_echoes_a_file_that_is_not_ours(tmp_path, how):
    secret = tmp_path / "secret.txt"
    secret.write_text("password=hunter2\n")
    db = tmp_path / "db"
    db.mkdir()
    (db / "database_workload.json").write_text("")
    records = db / "database_tuning_record.json"
    if how == "link to a secret":
        records.symlink_to(secret)
    else:
        records.write_text("password=hunter2\n")
    out = _opbench("collect", "--modelsource", "simple", "--modelname", "matmul:n=64", "--dataset",
                   str(tmp_path / "ds.sqlite"), "--database", str(db))
    assert out.returncode == 2 and len(_lines(out.stderr)) == 1, out.stderr
    assert "hunter2" not in out.stderr and "database" in out.stderr


def _schedule(path: Path, **extra) -> Path:
    from opbench.schedule import Schedule

    Schedule("opara", [0], [0], [], meta=extra.pop("meta", {}), **extra).save(path)
    return path


@pytest.mark.parametrize("args, message", [
    (["--cut", "whole"], "--cut whole cuts a PyTorch model into Inductor-compiled regions: it applies to"),
    (["--torch-compile"], "--torch-compile adds a torch.compile row to the PyTorch backends"),
    (["--sm-partition", "auto"], "--sm-partition auto confines CUDA streams to groups of SMs"),
    (["--nvtx"], "--nvtx marks operators for Nsight Systems on a GPU"),
    (["--schedule", "PARTITIONED"], "this schedule confines its streams to groups of SMs"),
    (["--backend", "fused", "--cut", "whole", "--schedule", "CUT"], "the schedule was saved with its regions cut"),
    (["--layout", "pytorch"], "--layout pytorch lays out the convolutions of Inductor-compiled regions: it applies"),
    (["--backend", "fused", "--layout", "pytorch", "--schedule", "CUT"],
     "--layout pytorch, but the schedule's regions were compiled in layout 'inductor'"),
    (["--depthwise", "taps"], "--depthwise taps sets how Inductor-compiled regions run depthwise convolutions: it"),
    (["--backend", "fused", "--depthwise", "taps", "--schedule", "CUT"],
     "--depthwise taps, but the schedule's regions ran depthwise convolutions as 'aten'"),
    (["--piece-ops", "40"], "--piece-ops 40 limits the regions Inductor compiles: it applies to --backend torch"),
    (["--backend", "fused", "--piece-ops", "-1"], "--piece-ops -1: the most a region weighs before it is cut"),
])
def test_an_option_that_does_not_apply_is_refused_not_ignored(tmp_path, args, message):
    files = {"PARTITIONED": _schedule(tmp_path / "p.json", sm_groups=[66], sm_group_of=[0]),
             "CUT": _schedule(tmp_path / "c.json", meta={"kernels": "fused", "cut": "branches",
                                                          "regions": [["x"]]})}
    args = [str(files.get(a, a)) for a in args]
    out = _opbench("compare", "--modelsource", "simple", "--modelname", "matmul:n=64", "--target", "llvm", *args)
    assert out.returncode == 2 and message in out.stderr and len(_lines(out.stderr)) == 1, out.stderr
    assert "SMs" not in out.stdout


def test_collect_refuses_an_sm_partition_on_the_cpu(tmp_path):
    out = _opbench("collect", "--modelsource", "simple", "--modelname", "matmul:n=64", "--ifcompare", "true",
                   "--sm-partition", "auto", "--dataset", str(tmp_path / "ds.sqlite"))
    assert out.returncode == 2 and "--sm-partition auto confines CUDA streams" in out.stderr
    assert not (tmp_path / "ds.sqlite").exists()


def _rezip(src: Path, dst: Path, replace: dict[str, bytes]) -> Path:
    import zipfile

    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", compression=zipfile.ZIP_DEFLATED) as zout:
        for item in zin.infolist():
            zout.writestr(item.filename, replace.get(item.filename, zin.read(item.filename)))
        for name, data in replace.items():
            if name not in zin.namelist():
                zout.writestr(name, data)
    return dst


def _narrow_trials(src: Path, dst: Path) -> Path:
    """The shipped trials predictor with its training data cut to 7 features per store."""
    import io
    import zipfile

    import numpy as np

    with zipfile.ZipFile(src) as zf, np.load(io.BytesIO(zf.read("trials_data.npz"))) as arrays:
        data = {k: (arrays[k][:, :7] if k.startswith("features") else arrays[k]) for k in arrays.files}
    buffer = io.BytesIO()
    np.savez(buffer, **data)
    return _rezip(src, dst, {"trials_data.npz": buffer.getvalue()})


TRIALS = ROOT / "data" / "predictors" / "llvm_trials_resnet-18_squeezenet.opm"
PREDICTOR_CASES = {
    "meta.json nested 100,000 deep": (lambda p: _rezip(TRIALS, p, {"meta.json": b"[" * 100_000}), "nested too deeply"),
    "meta.json a list": (lambda p: _rezip(TRIALS, p, {"meta.json": b"[1, 2]"}), "holds a JSON list"),
    "meta.json of 17 MiB": (lambda p: _rezip(TRIALS, p, {"meta.json": b" " * (17 << 20) + b"{}"}),
                            "unpacks to 17 MiB, more than the 16 MiB"),
    "boosters not a list": (lambda p: _rezip(TRIALS, p, {"meta.json": b'{"format": "opbench-predictor", "what": '
                                                                      b'"trials", "boosters": {"a": 1}}'}),
                            "'boosters' is not a list of names"),
    "7 features, not 164": (lambda p: _narrow_trials(TRIALS, p), "164 features per buffer store"),
}


@pytest.mark.parametrize("case", list(PREDICTOR_CASES))
def test_a_hostile_predictor_file_is_one_line(tmp_path, case):
    make, message = PREDICTOR_CASES[case]
    bad = make(tmp_path / "bad.opm")
    out = _opbench("collect", "--modelsource", "simple", "--modelname", "matmul:n=64", "--iftune", "true",
                   "--predictor", str(bad), "--dataset", str(tmp_path / "ds.sqlite"))
    assert out.returncode == 2 and len(_lines(out.stderr)) == 1 and message in out.stderr, out.stderr


TRACE_CASES = {
    "events of the wrong type": ('{"traceEvents": [1, "x", null]}', "event 0 is a int, not an object"),
    "NaN duration": ('{"traceEvents": [{"ts": 0, "dur": NaN}]}', "event 0 has dur NaN"),
    "negative duration": ('{"traceEvents": [{"ts": 0, "dur": -5}]}', "event 0 has dur -5"),
    "infinite time": ('{"traceEvents": [{"ts": Infinity, "dur": 1}]}', "event 0 has ts Infinity"),
    "nested 100,000 deep": ("[" * 100_000, "nested too deeply"),
    "a list": ("[1, 2, 3]", "holds a JSON list"),
    "no events": ('{"other": 1}', "has no list of traceEvents"),
    "too many events": ('{"traceEvents": [' + ",".join(['{"ts": 1, "dur": 1}'] * 200_001) + "]}",
                        "has 200001 events, more than the 200000"),
}


@pytest.mark.parametrize("case", list(TRACE_CASES))
def test_a_hostile_trace_is_one_line_before_any_work(tmp_path, case):
    content, message = TRACE_CASES[case]
    trace = tmp_path / "t.json"
    trace.write_text(content)
    out = _opbench("report", "--dataset", str(ROOT / "data" / "dataset" / "h100.sqlite.gz"), "--trace", str(trace),
                   "--out", str(tmp_path / "report"))
    assert out.returncode == 2 and len(_lines(out.stderr)) == 1 and message in out.stderr, out.stderr
    assert not (tmp_path / "report").exists()


def test_a_huge_trace_is_refused_by_its_size_at_once(tmp_path):
    trace = tmp_path / "t.json"
    with open(trace, "wb") as handle:
        handle.truncate(65 << 20)  # sparse: 65 MiB that read as zeros
    out = _opbench("report", "--dataset", str(ROOT / "data" / "dataset" / "h100.sqlite.gz"), "--trace", str(trace),
                   "--out", str(tmp_path / "report"))
    assert out.returncode == 2 and "65 MiB, more than the 64 MiB OpBench reads" in out.stderr


def test_a_hostile_heldout_file_is_one_line(tmp_path):
    heldout = tmp_path / "x.heldout.json"
    heldout.write_text('{"what": "latency", "rows": [1, 2]}')
    out = _opbench("report", "--dataset", str(ROOT / "data" / "dataset" / "h100.sqlite.gz"), "--predictor",
                   str(heldout), "--out", str(tmp_path / "report"))
    assert out.returncode == 2 and len(_lines(out.stderr)) == 1 and "is not a file of held-out predictions" in \
        out.stderr, out.stderr


@pytest.mark.parametrize("verbose", [False, True])
@pytest.mark.slow
def test_tvms_own_warnings_only_with_v(tmp_path, verbose):
    """gpt2-small printed 9 raw TVM C++ warnings ('Fast mode segfaults ...') at the default verbosity."""
    pytest.importorskip("transformers")
    out = _opbench("collect", "--modelsource", "transformers", "--modelname", "gpt2-small", "--seqlen", "16",
                   "--no-check", "--repeat", "1", "--min-repeat-ms", "0", "--dataset", str(tmp_path / "ds.sqlite"),
                   *(["-v"] if verbose else []), timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    native = [line for line in out.stderr.splitlines() if "] /project/" in line and "Warning:" in line]
    assert bool(native) == verbose


def test_a_signal_in_the_interpreters_last_moments_is_ignored():
    """Python resets its handlers while it shuts down; a Ctrl-C then killed the process with exit -2 and no
    message. The last exit handler now ignores signals: a SIGINT sent from it leaves the exit status as is."""
    code = ("import atexit, os, signal\nfrom opbench import signals\nsignals.install()\n"
            "signals.exiting('interrupted while exiting')\n"
            "atexit.register(lambda: os.kill(os.getpid(), signal.SIGINT))\n")  # runs before the last handler
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "python")})
    assert done.returncode in (0, 130) and (done.returncode == 0 or "interrupted while exiting" in done.stderr)
    code = ("import os, signal\nfrom opbench import signals\nsignals.install()\nsignals._last_moments()\n"
            "os.kill(os.getpid(), signal.SIGINT)\nprint('alive')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "python")})
    assert done.returncode == 0 and done.stdout.strip() == "alive"


def test_an_interrupt_caught_after_it_left_an_exec_of_a_string_still_exits_130(tmp_path):
    """A Ctrl-C that arrived while a library ran ``exec`` on a string (a dataclass being created) is marked
    unhandled by CPython although the command handles it; ``python -m`` then ended with SIGINT (-2), 6 of 155
    starts interrupted while the model loaded. ``run`` clears the mark, so the command's own status stands."""
    (tmp_path / "interrupted_in_exec.py").write_text(
        "import os, signal, sys\n"
        "import opbench.cli.main\n"
        "cli = sys.modules['opbench.cli.main']\n"
        "signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "def main(argv, prog):\n"
        "    try:\n"
        "        exec('import os, signal\\nos.kill(os.getpid(), signal.SIGINT)\\nfor _ in range(1000): pass', {})\n"
        "    except KeyboardInterrupt:\n"
        "        return cli._interrupted(prog)\n"
        "    return 0\n"
        "cli.main = main\n"
        "cli.run([])\n")
    done = subprocess.run([sys.executable, "-m", "interrupted_in_exec"], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": f"{ROOT / 'python'}{os.pathsep}{tmp_path}"})
    assert done.returncode == 130, (done.returncode, done.stderr[-2000:])
    assert done.stderr.strip().endswith("interrupted; every finished measurement is in the dataset"), done.stderr


@pytest.mark.parametrize("entry", ["opbench", "op_performance_collector.py"])
@pytest.mark.parametrize("moment", ["while modules import", "while the model loads"])
def test_a_signal_at_any_moment_of_a_start_is_one_line_and_130(entry, moment, tmp_path):
    """Ctrl-C as the command starts (its modules importing) or while the model loads: exit 130 and the one
    'interrupted' line, never a KeyboardInterrupt traceback or exit -2. The moment "while modules import" is
    found with ``python -X importtime`` (a line per finished import): the signal follows the import of
    ``opbench._startup``, the command's first, while its other modules are still to import."""
    script = ["-m", "opbench", "collect"] if entry == "opbench" else \
        [str(ROOT / "python" / "performance_collector" / "op_performance_collector.py")]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python"), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-X", "importtime", *script, "--modelsource", "local", "--modelname",
                             "resnet-18", "--target", "llvm", "--dataset", str(tmp_path / "d.sqlite")], env=env,
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    marker = "| opbench._startup" if moment == "while modules import" else "loading local model"
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if line.rstrip().endswith(marker) or marker in line and not line.startswith("import time"):
            break
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=120)
    err = "".join(seen) + err
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    mine = [line for line in err.splitlines() if not line.startswith("import time")]
    assert mine[-1].endswith("interrupted; every finished measurement is in the dataset"), mine


def test_depthwise_auto_takes_what_a_saved_schedule_ran():
    """``--depthwise auto`` with a saved fused schedule is not refused: the schedule's own choice is taken, as
    without the option; a fixed mode that differs from the saved one is refused."""
    import argparse

    from opbench.cli.main import _check_applies
    from opbench.errors import OpBenchError
    from opbench.schedule import Schedule

    saved = Schedule("opara", [0], [0], [], meta={"kernels": "fused", "cut": "branches", "regions": [["x"]],
                                                   "depthwise": "taps"})
    args = argparse.Namespace(backend="fused", sm_partition="off", depthwise="auto")
    _check_applies(args, False, saved)
    with pytest.raises(OpBenchError, match="--depthwise aten, but the schedule's regions ran depthwise convolutions"):
        _check_applies(argparse.Namespace(backend="fused", sm_partition="off", depthwise="aten"), False, saved)
