"""Sweeps: each point in its own process (a crash costs that point only), resumed from the state file,
the flags of a point's command, the cross product, and a real sweep of two tiny models."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import FAST, run
from opbench import OpBenchError
from opbench.pipeline.sweep import Point, Sweep, cross, format_sweep, strip_flags
from opbench.runtime.device import cpu_child_env, cpu_groups

ROOT = Path(__file__).resolve().parents[2]

WORKER = """
import json, os, signal, sys
point, out, log = sys.argv[1], sys.argv[2], sys.argv[3]
open(log, "a").write(point + "\\n")
if point.startswith("crash"):
    os.kill(os.getpid(), signal.SIGKILL)
if point.startswith("bad"):
    sys.stderr.write("opbench: error: unknown model 'bad'\\n")
    sys.exit(2)
json.dump({"operators": 3, "failed": 0, "sum_op_latency_ms": 1.5, "vm_latency_ms": 1.0}, open(out, "w"))
"""


def _fake(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    ran = tmp_path / "ran.txt"

    def command(base, point, json_path):
        return [sys.executable, str(script), point.model, str(json_path), str(ran)]

    return command, ran


def test_a_crashing_point_costs_only_itself_and_a_rerun_resumes(tmp_path):
    command, ran = _fake(tmp_path)
    points = cross(["a", "crash", "bad", "b"], [1, 8], ["float16"])
    state = tmp_path / "d.sweep-x.json"
    records = Sweep([], points, [None], state, command=command, progress=False).run()
    by = {(r["model"], r["batch"]): r for r in records}
    assert [by[("a", 1)]["exit"], by[("b", 8)]["exit"]] == [0, 0]
    assert by[("crash", 1)]["status"] == "crashed (SIGKILL)" and by[("crash", 1)]["summary"] is None
    assert by[("bad", 8)]["status"].startswith("failed (exit 2): opbench: error: unknown model 'bad'")
    assert by[("a", 1)]["summary"]["operators"] == 3
    assert len(ran.read_text().split()) == 8  # every point ran once, after the crash too
    saved = json.loads(state.read_text())["points"]
    assert sorted(saved) == sorted(p.key for p in points)
    # the same sweep again: the finished points are skipped, the crashed and failed ones run again
    ran.unlink()
    again = Sweep([], points, [None], state, command=command, progress=False).run()
    assert sorted(ran.read_text().split()) == ["bad", "bad", "crash", "crash"]
    assert [r["exit"] for r in again] == [r["exit"] for r in records]
    table = format_sweep(again)
    assert table.count("\n") == len(points) + 1 and "crashed (SIGKILL)" in table


def test_points_spread_over_devices_see_only_their_gpu(tmp_path, monkeypatch):
    script = tmp_path / "env.py"
    script.write_text("import json, os, sys\njson.dump({'gpus': os.environ.get('CUDA_VISIBLE_DEVICES')}, "
                      "open(sys.argv[1], 'w'))\n")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    points = cross(["m"], [1, 2, 3, 4], ["float32"])
    records = Sweep([], points, [0, 1], tmp_path / "s.json", progress=False,
                    command=lambda base, p, out: [sys.executable, str(script), str(out)]).run()
    seen = {(r["device"], r["summary"]["gpus"]) for r in records}
    assert seen <= {(0, "4"), (1, "6")} and {d for d, _ in seen} <= {0, 1}


def test_cross_product_and_point_flags():
    points = cross(["a", "b"], [1, 8], ["float16", "bfloat16"])
    assert len(points) == 8 and points[0] == Point("a", 1, "float16") and points[-1] == Point("b", 8, "bfloat16")
    argv = ["--modelsource", "simple", "--modelname", "a,b", "--batchsize=1,8", "--json", "--repeat", "3",
            "--devices", "0,1", "-q", "--json=x.json", "--dtype", "fp16"]
    assert strip_flags(argv) == ["--modelsource", "simple", "--repeat", "3"]
    assert strip_flags(["--json", "-", "--force"]) == ["--force"]


def test_a_point_receives_its_job_as_a_spec(tmp_path):
    """A point's process gets the sweep's CollectJob narrowed to the point, as a file; the command line keeps
    only the flags that are not the job's."""
    from opbench.cli.collect_job import job_flags
    from opbench.pipeline import CollectJob
    from opbench.pipeline.sweep import POINT_FLAGS, spec_command

    job = CollectJob(models=("a", "b"), source="simple", batch_sizes=(1, 8), dtypes=("float16", "float32"),
                     devices=(0, 1), repeat=3, check=False, tune=True)
    argv = ["--modelsource", "simple", "--modelname", "a,b", "--batchsize", "1,8", "--dtype", "fp16,float32",
            "--devices", "0,1", "--repeat", "3", "--no-check", "--iftune", "true", "--cache-dir", "/c", "-v"]
    passthrough = strip_flags(argv, {**POINT_FLAGS, **job_flags()})
    assert passthrough == ["--cache-dir", "/c", "-v"]
    cmd = spec_command(job, passthrough)([], Point("b", 8, "float32"), tmp_path / "b-8.json")
    assert cmd[cmd.index("--config") + 1] == str(tmp_path / "b-8.job.json") and cmd[-5:-3] == ["/c", "-v"]
    point = CollectJob.load(tmp_path / "b-8.job.json")
    assert point == CollectJob(models=("b",), source="simple", batch_sizes=(8,), dtypes=("float32",), repeat=3,
                               check=False, tune=True)


@pytest.mark.slow
def test_a_real_sweep_keeps_the_good_points(tmp_path):
    path = tmp_path / "d.sqlite"
    models = "matmul:n=16,matmul:n=24"
    proc = run("--modelsource", "simple", "--modelname", models, "--batchsize", "1,2", *FAST,
               "--dataset", str(path), "--json", str(tmp_path / "s.json"))
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "s.json").read_text())
    assert [(p["model"], p["batch"], p["status"]) for p in summary["points"]] == [
        ("matmul:n=16", 1, "ok"), ("matmul:n=16", 2, "ok"), ("matmul:n=24", 1, "ok"), ("matmul:n=24", 2, "ok")]
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT model, batch_size, latency_p90_s >= latency_p10_s FROM operators "
                            "ORDER BY batch_size, input_shapes").fetchall()
    assert len(rows) == 4 and all(r[2] == 1 for r in rows)
    specs = sorted(tmp_path.glob("d.sweep-*/*.job.json"))  # each point ran from its own spec
    assert len(specs) == 4 and {json.loads(p.read_text())["repeat"] for p in specs} == {2}
    again = run("--modelsource", "simple", "--modelname", models, "--batchsize", "1,2", *FAST,
                "--dataset", str(path))
    assert again.returncode == 0 and "4 of 4 points finished (4 in an earlier run)" in again.stdout, again.stdout


@pytest.mark.slow
def test_a_cuda_sweep_leaves_the_gpu_to_its_points(tmp_path, monkeypatch):
    """The parent of a sweep on plain ``--target cuda`` reads no GPU (it once refused such a sweep as a
    remote GPU without ``arch``): each point resolves the target itself, here with no GPU to find."""
    from opbench.runtime.target import target_config

    assert target_config("cuda") == {"kind": "cuda"}
    assert target_config('{"kind":"cuda","arch":"sm_90"}') == {"kind": "cuda", "arch": "sm_90"}
    with pytest.raises(OpBenchError, match="unknown target 'gpu'"):
        target_config("gpu")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU for the points, on any machine
    proc = run("--modelsource", "simple", "--modelname", "matmul:n=16", "--batchsize", "1,2", "--target", "cuda",
               "--dataset", str(tmp_path / "d.sqlite"))
    assert proc.returncode == 1 and "remote GPU" not in proc.stderr + proc.stdout, proc.stderr
    assert proc.stderr.count("target 'cuda' needs an NVIDIA GPU") == 2, proc.stderr
    assert "0 of 2 points finished" in proc.stdout


def test_a_sweep_with_an_unknown_model_fails_before_any_point(tmp_path):
    proc = run("--modelsource", "local", "--modelname", "resnet-18,resnet-99", "--dataset", str(tmp_path / "d.sqlite"))
    assert proc.returncode == 2 and "unknown model 'resnet-99'" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "d.sqlite").exists()


def test_cpu_workers_split_the_cores():
    cores = sorted(os.sched_getaffinity(0))
    groups = cpu_groups(2) if len(cores) >= 2 else [cores]
    assert sorted(c for g in groups for c in g) == cores and all(groups)  # disjoint, all cores, none empty
    assert max(map(len, groups)) - min(map(len, groups)) <= 1
    env = cpu_child_env(groups[0])
    assert env["TVM_NUM_THREADS"] == env["OMP_NUM_THREADS"] == str(len(groups[0])) and env["CUDA_VISIBLE_DEVICES"] == ""
    with pytest.raises(OpBenchError, match=rf"--devices: {len(cores) + 1} CPU workers but this process may use "
                                           rf"{len(cores)} cores"):
        cpu_groups(len(cores) + 1)


@pytest.mark.slow
def test_a_cpu_sweep_over_two_workers(tmp_path):
    """--devices 0,1 with a CPU target: two workers, each pinned to its half of the cores with its thread pools
    sized to it; every point's rows written once."""
    path = tmp_path / "d.sqlite"
    models = "matmul:n=16,matmul:n=24"
    proc = run("--modelsource", "simple", "--modelname", models, "--batchsize", "1,2", "--devices", "0,1", *FAST,
               "--dataset", str(path), "--json", str(tmp_path / "s.json"))
    assert proc.returncode == 0, proc.stderr
    points = json.loads((tmp_path / "s.json").read_text())["points"]
    assert [p["status"] for p in points] == ["ok"] * 4
    used = {p["device"]: tuple(p["cores"]) for p in points}
    if len(os.sched_getaffinity(0)) >= 2:
        assert set(used) == {0, 1} and not set(used[0]) & set(used[1])  # both workers ran, on disjoint cores
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT workload_id, batch_size, thread_settings FROM operators").fetchall()
    assert len(rows) == len({(w, b) for w, b, _ in rows}) == 4  # one operator per point: none lost or duplicated
    sizes = {len(c) for c in used.values()}
    assert {t.split()[0] for _, _, t in rows} <= {f"TVM_NUM_THREADS={n}" for n in sizes}


@pytest.mark.parametrize("content, message", [
    ('{"name": "my-project", "important": [1, 2, 3]}', "is not an OpBench sweep state"),
    ('{"points": {}, "command": ["--modelsource", "local"]}', "is the state of another sweep"),
    ('{"points": {"a|1|float32": {"exit": 0}', "cannot be read as a sweep state"),
    ('[1, 2, 3]', "is not an OpBench sweep state"),
    ('[' * 100000, "cannot be read as a sweep state"),
    ('{"points": [], "command": []}', "is not an OpBench sweep state"),
])
def test_a_file_that_is_not_this_sweeps_state_is_refused_untouched(tmp_path, content, message):
    mine = tmp_path / "mine.json"
    mine.write_text(content)
    before = mine.read_bytes()
    with pytest.raises(OpBenchError, match=message) as err:
        Sweep(["--modelsource", "simple"], cross(["a"], [1], ["float32"]), [None], mine, progress=False)
    assert "\n" not in str(err.value) and mine.read_bytes() == before


def test_the_cli_refuses_a_users_json_as_sweep_state(tmp_path):
    mine = tmp_path / "mine.json"
    mine.write_text('{"name":"my-project","important":[1,2,3]}')
    before = mine.read_bytes()
    proc = subprocess.run([sys.executable, "-m", "opbench", "collect", "--modelsource", "simple", "--modelname",
                           "matmul:n=64", "--batchsize", "1,2", "--dataset", str(tmp_path / "ds.sqlite"),
                           "--sweep-state", str(mine)], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "python")})
    assert proc.returncode == 2 and "is not an OpBench sweep state" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and mine.read_bytes() == before


SLEEPER = """import os, signal, sys, time
signal.signal(signal.SIGINT, lambda *a: sys.exit(130))
signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))
open(sys.argv[2], "a").write(f"{os.getpid()}\\n")
time.sleep(120)
"""

PARENT = """import sys
from pathlib import Path
from opbench import signals
from opbench.pipeline.sweep import Sweep, cross
signals.install()
tmp = Path(sys.argv[1])
command = lambda base, point, out: [sys.executable, str(tmp / "sleeper.py"), point.model, str(tmp / "pids.txt")]
try:
    Sweep([], cross(["a", "b", "c"], [1], ["float32"]), [0, 1], tmp / "state.json", command=command,
          progress=False).run()
except KeyboardInterrupt:
    sys.exit(128 + (signals.received() or 2))
"""


@pytest.mark.parametrize("signum, sleeper", [(signal.SIGINT, SLEEPER), (signal.SIGTERM, SLEEPER),
                                             (signal.SIGTERM, SLEEPER.replace("signal.signal(", "0 and ("))])
def test_an_interrupted_sweep_stops_its_points_and_says_so(tmp_path, signum, sleeper):
    """The sweep hands its signal to its points; a point that exits by it (handled, or its default action: a
    point still starting) is ``interrupted``."""
    (tmp_path / "sleeper.py").write_text(sleeper)
    (tmp_path / "parent.py").write_text(PARENT)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python"), "CUDA_VISIBLE_DEVICES": "0,1"}
    parent = subprocess.Popen([sys.executable, str(tmp_path / "parent.py"), str(tmp_path)], env=env)
    pids = tmp_path / "pids.txt"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not pids.exists() or len(pids.read_text().split()) < 2):
        time.sleep(0.1)
    os.kill(parent.pid, signum)  # to the parent alone, as `kill` does (a terminal's Ctrl-C reaches the group)
    assert parent.wait(timeout=60) == 128 + signum
    for pid in map(int, pids.read_text().split()):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # no point outlives the sweep
    state = json.loads((tmp_path / "state.json").read_text())
    stopped = [r for r in state["points"].values() if r["status"] == "interrupted"]
    assert len(stopped) == 2 and "c|1|float32" not in state["points"], state["points"]  # the third never started
