"""``opbench sample`` end to end on the CPU: rows per task, two workers, the MetaSchedule export, the audit,
resuming after SIGKILL without a lost or duplicated row, the spec, and bad input refused before any work."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("tvm")
ROOT = Path(__file__).resolve().parents[2]
MODEL = "matmul:n=32"


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
    return subprocess.run([sys.executable, "-m", "opbench", "sample", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _trials(path: Path) -> list[dict]:
    with sqlite3.connect(path) as conn:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute("SELECT * FROM trials ORDER BY id")]


@pytest.fixture(scope="module")
def sampled(tmp_path_factory):
    """One run: simple matmul on llvm, 3 candidates each, two CPU measuring workers, an audit of
    every candidate, exported as a MetaSchedule database."""
    import opbench  # the public names: opbench.sample(opbench.SampleJob(...))

    work = tmp_path_factory.mktemp("sample")
    job = opbench.SampleJob(models=(MODEL,), source="simple", per_task=3, builders=1, devices=(0, 1), audit=1.0,
                            dataset=str(work / "ds.sqlite"), export_database=str(work / "db"))
    return job, opbench.sample(job, command="test")


@pytest.mark.slow
def test_rows_per_task_with_status_knobs_and_timings(sampled):
    job, result = sampled
    rows = _trials(Path(job.dataset))
    assert result.stored == len(rows) == 3 * len(result.tasks) and result.stats.records == len(rows)
    for task in result.tasks:
        mine = [r for r in rows if r["workload_id"] == task.key]
        assert sorted(r["trial"] for r in mine) == [0, 1, 2]  # indices are the sampler's, one row each
        assert {r["source"] for r in mine} == {"task"} and {r["config"] for r in mine} == {"sample:s0"}
    ok = [r for r in rows if r["build_status"] == "ok"]
    assert ok and all(len(json.loads(r["run_secs"])) == r["repeats"] >= 5 for r in ok)
    assert all(r["spread"] >= 0 and r["number"] >= 1 and json.loads(r["knobs"]) for r in ok)
    assert all(len(json.loads(r["audit_secs"])) >= 5 for r in ok)  # --audit 1: each measured twice
    assert result.stats.to_json()["audit"]["n"] == len(ok)
    with sqlite3.connect(job.dataset) as conn:
        uses = [json.loads(u) for (u,) in conn.execute("SELECT uses FROM tasks")]
        sampling = [json.loads(u) for (u,) in conn.execute("SELECT sampling FROM tasks")]
    assert len(uses) == len(result.tasks) and all(u[0]["model"] == "matmul" for u in uses)
    assert all(s["seed=0"]["kept"] == 3 and s["seed=0"]["attempts"] >= 3 for s in sampling)


def test_two_cpu_workers_split_the_measurements(sampled):
    _job, result = sampled
    busy = result.stats.device_busy_s
    assert set(busy) == {"cpu0", "cpu1"} and all(v > 0 for v in busy.values())


def test_a_failed_build_is_stored_when_named_devices_measure(tmp_path):
    """A candidate that fails to build reaches no device: with ``devices`` named (``--devices 0``, one
    measuring process per GPU) its row is stored, with no device's UUID, and the job goes on."""
    from opbench.pipeline.sample import SampleJob, sample

    # a build is killed 1 ms after it starts once its builder is up (the first after a restart may finish)
    job = SampleJob(models=("matmul:n=512",), source="simple", per_task=3, builders=1, devices=(0,), tasks_limit=1,
                    build_timeout_s=1e-3, dataset=str(tmp_path / "ds.sqlite"))
    result = sample(job, command="test")
    rows = _trials(tmp_path / "ds.sqlite")
    assert len(rows) == result.stored == 3 and result.stats.build_timeouts >= 1
    failed = [r for r in rows if r["build_status"] == "build_timeout"]
    assert len(failed) == result.stats.build_timeouts and all(r["gpu_uuid"] is None for r in failed)


def test_the_export_loads_in_metaschedule_and_equals_the_rows(sampled):
    from tvm.s_tir.meta_schedule.database import JSONDatabase

    from opbench.runtime.startup import import_tensor_intrinsics
    from opbench.tune.knobs import dumps

    job, result = sampled
    import_tensor_intrinsics()
    records = JSONDatabase(work_dir=job.export_database, allow_missing=False).get_all_tuning_records()
    ok = [r for r in _trials(Path(job.dataset)) if r["build_status"] == "ok"]
    assert result.exported["records"] == len(records) == len(ok)
    assert sorted(dumps(r.trace) for r in records) == sorted(json.dumps(json.loads(r["trace"]),
                                                                        separators=(",", ":")) for r in ok)
    assert sorted(float(s) for r in records for s in r.run_secs) == \
        sorted(s for r in ok for s in json.loads(r["run_secs"]))
    from opbench.pipeline.sample import export_database

    again = export_database(job.dataset, job.export_database)  # records already there are not added twice
    assert again == {"folder": job.export_database, "records": 0, "already_there": len(ok)}


@pytest.mark.slow
def test_a_killed_run_resumes_without_a_lost_or_duplicated_row(tmp_path):
    dataset = tmp_path / "ds.sqlite"
    args = ["--modelsource", "simple", "--modelname", MODEL, "--per-task", "4", "--builders", "1",
            "--dataset", str(dataset)]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
    proc = subprocess.Popen([sys.executable, "-m", "opbench", "sample", *args], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 240
    before: list[dict] = []
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.5)
        if dataset.exists():
            try:
                before = _trials(dataset)
            except sqlite3.Error:
                continue
            if before:
                break
    assert before, "no row was stored before the deadline"
    os.killpg(proc.pid, signal.SIGKILL)  # the parent and its workers, as a machine's crash would
    proc.wait()
    stored = _trials(dataset)
    done = _cli(*args)
    assert done.returncode == 0, done.stderr
    after = _trials(dataset)
    keys = [(r["workload_id"], r["trial"]) for r in after]
    tasks = {r["workload_id"] for r in after}
    assert len(keys) == len(set(keys)) == 4 * len(tasks)  # 4 per task, none twice
    kept = {(r["workload_id"], r["trial"]): r["run_secs"] for r in after}
    assert all(kept[(r["workload_id"], r["trial"])] == r["run_secs"] for r in stored)  # nothing re-measured
    assert "already stored" in done.stdout + done.stderr


def test_a_task_that_ran_out_of_candidates_is_not_sampled_again(sampled, tmp_path):
    """A seed gives a task the same candidates every time: once a run with that seed ran out of distinct ones,
    a resumed run does not spend the attempt budget again; a larger --per-task or another seed does."""
    import shutil

    from opbench.dataset import Dataset
    from opbench.pipeline.sample import sample, sampled_before

    job, result = sampled
    copy = tmp_path / "ds.sqlite"
    shutil.copy(job.dataset, copy)
    with sqlite3.connect(copy) as conn:  # the third candidate of each task never existed
        conn.execute("DELETE FROM trials WHERE trial = 2")
    again = dataclasses.replace(job, dataset=str(copy), export_database=None, audit=0.0, devices=None)
    with Dataset(copy) as dataset:
        keys = [t.key for t in result.tasks]
        assert [sampled_before(dataset, k, again) for k in keys] == [3] * len(keys)  # not noted as run out
        for key in keys:  # as a run asked for 3 and given 2 distinct candidates by seed 0 would have noted it
            (row,) = dataset.rows("tasks", {"workload_id": key})
            spent = json.loads(row["sampling"])
            spent["seed=0"].update(kept=2, exhausted=True)
            dataset.update("tasks", {"sampling": spent}, {"workload_id": key})
        assert [sampled_before(dataset, k, again) for k in keys] == [2] * len(keys)
        assert sampled_before(dataset, keys[0], dataclasses.replace(again, per_task=4)) == 4
        assert sampled_before(dataset, keys[0], dataclasses.replace(again, seed=1)) == 3
    resumed = sample(again, command="test")
    assert resumed.stats.sampled == 0 and resumed.stats.records == 0  # nothing sampled, built or measured
    assert resumed.stored == 2 * len(keys)


def test_the_spec_round_trips_and_names_its_fields(tmp_path):
    from opbench.pipeline.sample import SampleJob
    from opbench.pipeline.spec import SpecError

    job = SampleJob(models=("a", "b"), dtypes=("float16",), devices=(0, 1), per_task=8)
    assert SampleJob.from_json(json.dumps(job.to_json())) == job
    job.save(tmp_path / "job.json")
    assert SampleJob.load(tmp_path / "job.json") == job
    for bad, field in [({"per_task": 0}, "per_task"), ({"audit": 2.0}, "audit"), ({"dtypes": ["int4"]}, "dtypes"),
                       ({"devices": [0, 0]}, "devices"), ({"compiler": "clang"}, "compiler"),
                       ({"timer": "wall"}, "timer"), ({"timer": "graph", "target": "llvm"}, "timer")]:
        with pytest.raises(SpecError) as err:
            SampleJob.from_json({**job.to_json(), **bad}).validate()
        assert err.value.field == field
    graph = SampleJob(target='{"kind": "cuda", "arch": "sm_90"}', timer="graph")
    graph.validate()  # a CUDA job may time CUDA Graph replays
    assert SampleJob.from_json(json.dumps(graph.to_json())) == graph
    # auto (the default): CUDA Graph replays for a cuda target on this host, time_evaluator elsewhere
    cuda = '{"kind": "cuda", "arch": "sm_90"}'
    assert SampleJob().timer == "auto" and SampleJob().timer_used == "evaluator"
    assert SampleJob(target=cuda).timer_used == "graph"
    assert SampleJob(target=cuda, timer="evaluator").timer_used == "evaluator"
    assert SampleJob(target=cuda, rpc_tracker="127.0.0.1:9190", rpc_key="k").timer_used == "evaluator"
    with pytest.raises(SpecError, match="per_task"):
        SampleJob.from_json({"per_task": "many"})
    with pytest.raises(SpecError, match="unknown field"):
        SampleJob.from_json({"per_tsk": 3})


@pytest.mark.parametrize("args, message", [
    (["--per-task", "0"], "--per-task: must be between 1 and 100000"),
    (["--per-task", "-3"], "--per-task: must be between 1 and 100000"),
    (["--per-task", "1000000"], "--per-task: must be between 1 and 100000"),
    (["--modelname", "resnet-18,nosuch"], "unknown model 'nosuch'"),
    (["--target", "vulkan"], "unknown target"),
    (["--audit", "1.5"], "a fraction between 0 and 1"),
    (["--timer", "graph"], "--timer: graph times CUDA Graph replays"),  # the default target is llvm
    (["--timer", "wall"], "unknown --timer 'wall' (accepted: auto, evaluator, graph)"),
    (["--rpc-tracker", "nohost"], "--rpc-tracker: expected HOST:PORT"),
    (["--rpc-tracker", "127.0.0.1:9190"], "--rpc-key: the key the remote devices registered with"),
    (["--rpc-key", "k"], "--rpc-key: needs rpc_tracker"),
    (["--rpc-tracker", "127.0.0.1:9190", "--rpc-key", "k", "--devices", "0"], "--devices: measuring devices"),
    (["--rpc-tracker", "127.0.0.1:1", "--rpc-key", "k"], "RPC tracker 127.0.0.1:1 unreachable"),
])
def test_bad_input_is_one_line_and_exit_2_before_any_work(tmp_path, args, message):
    dataset = tmp_path / "ds.sqlite"
    done = _cli("--dataset", str(dataset), *args, timeout=120)
    assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not dataset.exists()


def test_an_export_folder_that_is_not_a_database_is_refused_untouched(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    done = _cli("--modelsource", "simple", "--modelname", MODEL, "--dataset", str(tmp_path / "ds.sqlite"),
                "--export-database", str(folder), timeout=120)
    assert done.returncode == 2 and "not a MetaSchedule database" in done.stderr
    assert [p.name for p in folder.iterdir()] == ["notes.txt"] and not (tmp_path / "ds.sqlite").exists()


def test_a_records_folder_holds_the_rows_and_resumes_without_loading_a_model(sampled, tmp_path, monkeypatch):
    from opbench.dataset import records
    from opbench.pipeline.sample import sample

    job, result = sampled
    folder = tmp_path / "records"
    manifest = records.pack(job.dataset, folder, max_file_bytes=1)  # one row per file: the split is exercised
    rows = _trials(Path(job.dataset))
    assert manifest["records"] == len(rows) and manifest["tasks"] == len(result.tasks)
    assert len([f for f in manifest["files"] if f["name"].startswith("records-")]) == len(rows)
    back = {(r["workload_id"], r["trial"]): r for r in records.read_rows(folder)}
    assert len(back) == len(rows)
    for row in rows:  # every column comes back, the trace rebuilt from its sketch and decisions
        got = back[(row["workload_id"], row["trial"])]
        for name, value in row.items():
            if name in ("id", "run_id", "knobs"):
                continue
            if name in ("trace", "run_secs", "audit_secs") and value is not None:
                assert json.loads(got[name]) == json.loads(value), name
            else:
                assert got[name] == value, name
    frame = records.read(folder)
    assert len(frame) == len(rows) and frame["run_secs"].map(len).min() >= 5
    from opbench.dataset import load

    assert load(folder, "trials")["trace"].tolist() == frame["trace"].tolist()  # opbench.load reads a folder too

    fresh = tmp_path / "fresh.sqlite"  # a new machine: the shipped folder only
    assert records.unpack(folder, fresh) == {"tasks": len(result.tasks), "trials": len(rows)}
    assert records.unpack(folder, fresh) == {"tasks": 0, "trials": 0}  # nothing twice

    def no_loading(*_args, **_kwargs):
        raise AssertionError("the model was loaded although its tasks are in the dataset")

    monkeypatch.setattr("opbench.models.load_workload", no_loading)
    again = sample(dataclasses.replace(job, dataset=str(fresh), export_database=None, audit=0.0), command="test")
    assert again.stats.records == 0 and again.stored == len(rows) == len(_trials(fresh))


def test_a_records_folder_that_does_not_match_its_manifest_is_refused(sampled, tmp_path):
    from opbench.dataset import records
    from opbench.errors import OpBenchError

    job, _ = sampled
    folder = tmp_path / "records"
    records.pack(job.dataset, folder)
    (folder / "records-00000.parquet").write_bytes(b"PAR1 not what was written")
    with pytest.raises(OpBenchError, match="does not match manifest.json"):
        records.read_rows(folder)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    with pytest.raises(OpBenchError, match="holds other files"):
        records.pack(job.dataset, mine)
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


@pytest.mark.slow
def test_two_rpc_servers_measure_every_candidate_once(tmp_path):
    """Builds here, measurements on two rpc_servers that registered with one tracker under one key (as one
    server per GPU of each host): both serve, every candidate is one row, the rows name the remote devices."""
    from opbench.pipeline.sample import SampleJob, sample
    from opbench.profile.rpc import LocalFarm

    with LocalFarm("cpus", [None, None], tmp_path / "farm") as farm:
        job = SampleJob(models=(MODEL,), source="simple", per_task=4, builders=1, dataset=str(tmp_path / "ds.sqlite"),
                        rpc_tracker=farm.address, rpc_key="cpus")
        result = sample(job, command="test")
        sessions = farm.sessions()
    rows = _trials(tmp_path / "ds.sqlite")
    assert len(rows) == result.stored == 4 * len(result.tasks)
    assert sorted((r["workload_id"], r["trial"]) for r in rows) == sorted({(r["workload_id"], r["trial"])
                                                                           for r in rows})
    assert sum(r["build_status"] == "ok" for r in rows) >= len(rows) - 1 and result.stats.ok >= 1
    assert all(r["device_name"].endswith("(rpc key cpus)") and r["hostname"].startswith("rpc:cpus@") for r in rows)
    assert len(sessions) == 2 and all(n >= 1 for n in sessions), sessions  # both servers measured
    assert set(result.stats.device_busy_s) == {"rpc0", "rpc1"}


def test_a_task_keeps_the_name_it_was_first_stored_under_when_another_model_calls_it_otherwise(tmp_path):
    """ios_block and branchy share a convolution that each names differently; a job of branchy alone must
    neither rename the stored task (its records, filed under the first name, would no longer match it) nor
    give the task another name for the records it writes (the old code did both)."""
    from opbench.dataset import Dataset
    from opbench.pipeline.sample import SampleJob, _task_row, check_job, extract, sample
    from opbench.runtime.target import resolve_target

    target = '{"kind": "cuda", "arch": "sm_90"}'
    first = SampleJob(models=("ios_block",), source="simple", dtypes=("float16",), target=target,
                      dataset=str(tmp_path / "ds.sqlite"), tasks_only=True)
    sample(first, command="test")
    with Dataset(first.dataset) as ds:
        before = {r["workload_id"]: r["task"] for r in ds.rows("tasks")}
    later = dataclasses.replace(first, models=("branchy",))
    sample(later, command="test")
    with Dataset(first.dataset) as ds:
        after = {r["workload_id"]: (r["task"], [u["task"] for u in json.loads(r["uses"])]) for r in ds.rows("tasks")}
        shared = [k for k in before if len(after[k][1]) == 2]
        assert shared, "ios_block and branchy no longer share a task"
        for key in shared:
            assert after[key][0] == before[key] and after[key][1][0] == before[key] != after[key][1][1]
        tasks = {t.key: t for t in extract(later, check_job(later), resolve_target(target, local_device=False), ds)}
        assert all(tasks[key].name == before[key] for key in shared)
        # a kernel of integers only is the same task at every precision: it keeps its first dtype and space too
        key = shared[0]
        (row,) = ds.rows("tasks", {"workload_id": key})
        other = dataclasses.replace(tasks[key], name="renamed", dtype="bfloat16", space="default")
        again = _task_row(ds, other, resolve_target(target, local_device=False), 1, row["mod"], [])
    assert (again["task"], again["dtype"], again["space"]) == (row["task"], "float16", row["space"])
    assert row["space"] != "default" and len(again["uses"]) == 2


def test_tasks_only_prepares_a_cuda_job_without_a_gpu(tmp_path, monkeypatch):
    """--tasks-only stores the tasks of a CUDA job on a machine without a GPU and samples nothing; the job
    then finds every task in the dataset and loads no model."""
    from opbench.pipeline.sample import SampleJob, check_job, extract, sample
    from opbench.runtime.target import resolve_target

    dataset = tmp_path / "ds.sqlite"
    target = '{"kind": "cuda", "arch": "sm_90"}'
    done = _cli("--modelsource", "simple", "--modelname", "matmul:n=64,branchy", "--dtype", "float16", "--target",
                target, "--tasks-only", "--dataset", str(dataset))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "5 distinct tasks of 2 models" in done.stdout and "nothing sampled" in done.stdout
    with sqlite3.connect(dataset) as conn:
        assert conn.execute("SELECT COUNT(*) FROM tasks").fetchone()[0] == 5
        assert conn.execute("SELECT COUNT(*) FROM trials").fetchone()[0] == 0

    def no_loading(*_args, **_kwargs):
        raise AssertionError("the model was loaded although its tasks are in the dataset")

    monkeypatch.setattr("opbench.models.load_workload", no_loading)
    job = SampleJob(models=("matmul:n=64", "branchy"), source="simple", dtypes=("float16",), target=target,
                    dataset=str(dataset))
    from opbench.dataset import Dataset

    with Dataset(dataset) as ds:
        tasks = extract(job, check_job(job), resolve_target(target, local_device=False), ds)
    assert len(tasks) == 5
    import tvm

    parsed, parse = [], tvm.ir.load_json
    monkeypatch.setattr(tvm.ir, "load_json", lambda text: parsed.append(text) or parse(text))
    one = dataclasses.replace(job, models=("matmul:n=64",))  # a job of one model parses its own tasks only
    with Dataset(dataset) as ds:
        mine = extract(one, check_job(one), resolve_target(target, local_device=False), ds)
    assert 0 < len(mine) < 5 and len(parsed) == len(mine)
    assert all(u["requested"] == "matmul:n=64" for t in mine for u in t.uses)
    monkeypatch.setattr(tvm.ir, "load_json", parse)
    again = sample(dataclasses.replace(job, tasks_only=True), command="test")  # nothing new to extract
    assert len(again.tasks) == 5 and again.stats.records == 0
    with pytest.raises(Exception, match="devices: measures, and tasks_only samples nothing"):
        SampleJob(tasks_only=True, devices=(0,)).validate()


def test_a_task_of_symbolic_shape_is_not_sampled():
    """gpt2's cumulative sum for CUDA is a kernel of symbolic length: no arguments can be made for it."""
    import tvm
    from tvm import te

    from opbench.pipeline.sample import _static

    n = te.var("n")
    a = te.placeholder((n,), "float32", name="a")
    b = te.compute((n,), lambda i: a[i] + 1.0, name="b")
    assert not _static(tvm.IRModule({"main": te.create_prim_func([a, b])}))
    c = te.placeholder((8,), "float32", name="c")
    d = te.compute((8,), lambda i: c[i] + 1.0, name="d")
    assert _static(tvm.IRModule({"main": te.create_prim_func([c, d])}))


def test_the_graph_timer_takes_the_collect_profilers_samples_and_doubles_them_for_fast_kernels(monkeypatch):
    """--timer graph: a candidate is timed by the operator timer of collect (CudaProfiler.time_launch, faked
    here: no GPU), its own launch as the callable; a kernel under 20 us gets twice the samples."""
    from opbench.profile.timer import Timing as Samples
    from opbench.tune import farm

    calls, asked = [], []

    class Profiler:
        def time_launch(self, launch, config):
            launch()
            asked.append((config.repeat, config.min_repeat_ms, config.flush_l2))
            return Samples([seconds] * config.repeat, number=37)

    monkeypatch.setattr(farm, "_GRAPH_PROFILER", [Profiler()])
    timing = farm.Timing(repeat=5, min_repeat_ms=2.0, timer="graph")
    seconds = 1e-3
    assert farm.graph_samples(lambda *a: calls.append(a), ["x", "y"], timing) == ([1e-3] * 5, 37, 5)
    assert calls == [("x", "y")] and asked == [(5, 2.0, False)]
    seconds = 4e-6
    assert farm.graph_samples(lambda *a: calls.append(a), ["x"], timing) == ([4e-6] * 10, 37, 10)
    assert asked[1:] == [(5, 2.0, False), (10, 2.0, False)]
