"""Tuning on MetaSchedule (llvm, tiny tasks): every tuner writes trial rows with decoded knobs, the best
record is applied and computes what the untuned kernel computes, runs resume, failures are recorded."""

from __future__ import annotations

import contextlib
import json
import sqlite3

import numpy as np
import pytest

from opbench import OpBenchError
from opbench.dataset import Dataset
from opbench.models import load_workload
from opbench.tune import TUNERS, get_tuner

pytest.importorskip("xgboost")
pytest.importorskip("cloudpickle")

MODEL = "matmul:n=32"


def _tune(tmp_path, tuner="xgb", trials=4, model=MODEL, **kwargs):
    from opbench.pipeline.tune import TuneSpec, tune_workload
    from opbench.runtime import resolve_target

    target = resolve_target("llvm")
    workload = load_workload("simple", model, 1)
    limits = {k: kwargs.pop(k) for k in ("tasks_limit", "time_limit_s") if k in kwargs}
    with Dataset(tmp_path / "d.sqlite") as ds:
        run = tune_workload(workload, target, ds, TuneSpec(tmp_path / "db", tuner, trials, **limits), **kwargs)
        rows = ds.rows("trials")
    return workload, target, run, rows


def _outputs(workload, target, database=None):
    from opbench.ir import extract_operators
    from opbench.runtime import OperatorKernels, build_module

    lowered, graph = extract_operators(workload.mod, target)
    kernels = OperatorKernels(graph, build_module(lowered, target, database))
    outs, _ = kernels.replay(kernels.to_device(workload.example_inputs()))
    return [o.numpy() for o in outs]


@pytest.mark.parametrize("name", sorted(TUNERS))
def test_every_tuner_records_trials_and_applies_the_best(name, tmp_path):
    from opbench.tune.database import applied_database

    workload, target, run, rows = _tune(tmp_path, name, trials=4)
    assert run.tuner == name and len(run.tasks) == 1 and run.tasks[0].trials == len(rows) == 4
    assert [r["trial"] for r in rows] == [0, 1, 2, 3] and {r["tuner"] for r in rows} == {name}
    ok = [r for r in rows if r["build_status"] == "ok"]
    assert ok, [r["error"] for r in rows]
    for r in ok:
        knobs = json.loads(r["knobs"])
        assert any(k.startswith("tile.matmul") for k in knobs), knobs
        assert len(json.loads(r["run_secs"])) >= 3 and r["latency_median_s"] > 0
        assert json.loads(r["trace"])[0][0][0] in ("GetSBlock", "GetBlock")
    best = [r["best_so_far_s"] for r in rows if r["best_so_far_s"] is not None]
    assert best == sorted(best, reverse=True)  # best so far never gets worse
    assert rows[0]["workload_id"] == workload.workload_id and rows[0]["task"] == "matmul"
    applied = applied_database(tmp_path / "db", run.extracted, target)
    assert applied is not None and applied.config.startswith("db:") and set(applied.tasks) == {"matmul"}
    np.testing.assert_allclose(_outputs(workload, target, applied.database)[0], _outputs(workload, target)[0],
                               rtol=1e-5, atol=1e-5)


def test_xgb_rank_trains_with_its_ranking_loss_while_tuning(tmp_path, monkeypatch):
    """MetaSchedule calls the cost model's own update and _train during tuning (not XGBModel's)."""
    from opbench.tune.models import RankXGBModel

    trained = []
    original = RankXGBModel._cls._train  # noqa: SLF001

    def spy(self, xs, ys):
        trained.append(type(self).__name__)
        return original(self, xs, ys)

    monkeypatch.setattr(RankXGBModel._cls, "_train", spy)  # noqa: SLF001
    _tune(tmp_path, "xgb-rank", trials=4)
    assert trained and set(trained) == {"RankXGBModel"}  # its own _train, with the ranking loss


@pytest.mark.slow
def test_resume_continues_towards_trials(tmp_path):
    _, _, first, _ = _tune(tmp_path, "random", trials=2)
    _, _, second, rows = _tune(tmp_path, "random", trials=5)
    assert first.tasks[0].trials == 2 and second.tasks[0].before == 2 and second.tasks[0].trials == 3
    assert [r["trial"] for r in rows] == [0, 1, 2, 3, 4]
    _, _, third, rows = _tune(tmp_path, "random", trials=5)
    assert third.tasks[0].trials == 0 and len(rows) == 5  # nothing left to do
    records = (tmp_path / "db" / "database_tuning_record.json").read_text().splitlines()
    assert len(records) == 5  # the database TVM reads holds every trial


def test_failed_candidates_are_recorded_and_defaults_kept(tmp_path, monkeypatch):
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.builder import BuilderResult, PyBuilder

    import opbench.pipeline.tune as job
    from opbench.tune.database import applied_database

    @derived_object
    class Broken(PyBuilder):
        def build(self, build_inputs):
            return [BuilderResult(None, "RuntimeError: no compiler today") for _ in build_inputs]

    monkeypatch.setattr(job, "_builder", lambda target: Broken())
    workload, target, run, rows = _tune(tmp_path, "random", trials=3)
    assert [r["build_status"] for r in rows] == ["build_error"] * 3
    assert all(r["error"] == "RuntimeError: no compiler today" and r["latency_median_s"] is None for r in rows)
    assert run.tasks[0].valid == 0 and run.tasks[0].best_s is None
    assert applied_database(tmp_path / "db", run.extracted, target) is None  # default kernels stay


def test_heaviest_tasks_first_and_limit(tmp_path):
    _, _, run, rows = _tune(tmp_path, "random", trials=2, model="branchy:branches=2,depth=1,channels=4,size=6",
                            order={"conv2d2": 1.0, "fused_conv2d_relu": 0.5}, tasks_limit=2)
    assert [t.task for t in run.tasks] == ["conv2d2", "fused_conv2d_relu"]
    assert {r["task"] for r in rows} == {"conv2d2", "fused_conv2d_relu"}


def test_time_limit_stops_starting_tasks(tmp_path):
    _, _, run, rows = _tune(tmp_path, "random", trials=2, model="branchy:branches=2,depth=1,channels=4,size=6",
                            order={"conv2d2": 1.0, "fused_conv2d_relu": 0.5}, time_limit_s=0.001)
    assert [t.task for t in run.tasks] == ["conv2d2"]  # the first task took longer than the limit
    assert {r["task"] for r in rows} == {"conv2d2"}


def test_tuner_names():
    assert set(TUNERS) == {"xgb", "xgb-rank", "xgb_knob", "xgb_itervar", "xgb_curve", "ga", "random", "gridsearch"}
    with pytest.raises(OpBenchError, match="unknown tuner 'magic' \\(accepted: xgb, xgb-rank"):
        get_tuner("magic")


def test_database_for_another_target_is_refused(tmp_path):
    from opbench.runtime import resolve_target
    from opbench.tune.database import applied_database

    _, _, run, _ = _tune(tmp_path, "random", trials=2)
    other = resolve_target('{"kind": "llvm", "mcpu": "x86-64"}')
    with pytest.raises(OpBenchError, match="holds records for another target only"):
        applied_database(tmp_path / "db", run.extracted, other)


@pytest.mark.slow
def test_collect_iftune_cli(tmp_path):
    from helpers import run

    proc = run("--modelsource", "simple", "--modelname", MODEL, "--dataset", str(tmp_path / "d.sqlite"),
               "--iftune", "true", "--tuner", "random", "--trials", "3", "--repeat", "2", "--min-repeat-ms", "1",
               "--json", str(tmp_path / "s.json"))
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "s.json").read_text())
    tuning = summary["tuning"]
    assert tuning["tuner"] == "random" and tuning["trials_per_task"] == 3 and tuning["trials"] == 3
    (task,) = tuning["tasks"]
    assert task["task"] == "matmul" and task["default_s"] > 0 and task["tuned_s"] > 0 and task["trials"] == 3
    # one task: kept exactly when its tuned kernel measured faster; a dropped one shows its own (slower) time
    assert task["kept"] == (task["speedup"] > 1)
    assert tuning["model_default_s"] > 0 and tuning["model_tuned_s"] > 0 and tuning["trials_per_s"] > 0
    assert "Relax VM: default kernels" in proc.stdout and "matmul" in proc.stdout
    assert (tmp_path / "d.tuning" / "database_tuning_record.json").is_file()
    with contextlib.closing(sqlite3.connect(tmp_path / "d.sqlite")) as conn:
        configs = dict(conn.execute("SELECT config, COUNT(*) FROM operators GROUP BY config").fetchall())
        assert conn.execute("SELECT COUNT(*) FROM trials").fetchone()[0] == 3
    assert configs.get("default") == 1  # default and tuned rows side by side (tuned unless slower)
    assert summary["config"] in configs


@pytest.mark.slow
def test_collect_with_database_uses_tuned_kernels(tmp_path):
    from helpers import run

    _tune(tmp_path, "random", trials=2)
    proc = run("--modelsource", "simple", "--modelname", MODEL, "--dataset", str(tmp_path / "other.sqlite"),
               "--database", str(tmp_path / "db"), "--repeat", "2", "--min-repeat-ms", "1", "-q")
    assert proc.returncode == 0, proc.stderr
    assert "tuned kernels db:" in proc.stdout
    missing = run("--modelsource", "simple", "--modelname", MODEL, "--dataset", str(tmp_path / "x.sqlite"),
                  "--database", str(tmp_path / "nowhere"), "-q")
    assert missing.returncode == 2 and "tuning database not found" in missing.stderr


@pytest.mark.slow
def test_pool_builder_builds_in_worker_processes(tmp_path, monkeypatch):
    import opbench.pipeline.tune as job
    from opbench.tune.measure import PoolBuilder

    builders = []

    def pool(target):
        builders.append(PoolBuilder(max_workers=2))
        return builders[-1]

    monkeypatch.setattr(job, "_builder", pool)
    workload, target, run, rows = _tune(tmp_path, "random", trials=3)
    assert [r["build_status"] for r in rows] == ["ok"] * 3 and run.tasks[0].valid == 3
    assert builders[0]._pool is None  # the workers are stopped when tuning ends


def test_gzipped_database_is_unpacked_on_first_use(tmp_path):
    import gzip
    import shutil

    from opbench import OpBenchError
    from opbench.tune.database import DATABASE_FILES, open_database

    _tune(tmp_path, "random", trials=3)
    packed = tmp_path / "packed"
    packed.mkdir()
    for name in DATABASE_FILES:
        with open(tmp_path / "db" / name, "rb") as src, gzip.open(packed / f"{name}.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
    db = open_database(packed, create=False)
    assert len(db.get_all_tuning_records()) == 3
    for name in DATABASE_FILES:
        assert (packed / name).read_bytes() == (tmp_path / "db" / name).read_bytes()
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / f"{DATABASE_FILES[0]}.gz").write_bytes(b"not gzip")
    with pytest.raises(OpBenchError, match="cannot unpack tuning database file"):
        open_database(broken, create=False)
    assert not (broken / DATABASE_FILES[0]).exists()


def test_builders_keep_candidates_in_one_folder_removed_at_close(tmp_path, monkeypatch):
    """An interrupted run leaves built but unmeasured candidates: closing the builder removes them, and a
    candidate that does not build leaves no folder at all."""
    import os
    import tempfile

    import tvm
    from tvm import te
    from tvm.s_tir.meta_schedule.builder import BuilderInput

    import opbench.tune.measure as measure

    a = te.placeholder((8,), name="a")
    add = te.create_prim_func([a, te.compute((8,), lambda i: a[i] + 1.0, name="b")])
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # every temporary folder of this test lands here
    real = measure.build_to_file
    monkeypatch.setattr(measure, "build_to_file",
                        lambda mod, target, path, fcompile=None: "broken" if "fail" in str(mod) else
                        real(mod, target, path, fcompile))
    good = tvm.IRModule({"main": add.with_attr("global_symbol", "main")})
    bad = tvm.IRModule({"main": add.with_attr("global_symbol", "fail")})
    builder = measure.InProcessBuilder()
    llvm = tvm.target.Target("llvm")
    results = builder.build([BuilderInput(good, llvm), BuilderInput(bad, llvm)])
    assert results[0].error_msg is None and results[1].error_msg == "broken" and results[1].artifact_path is None
    root = os.path.dirname(os.path.dirname(results[0].artifact_path))
    assert os.path.isfile(results[0].artifact_path) and os.path.basename(root).startswith("opbench-build-")
    assert os.listdir(tmp_path) == [os.path.basename(root)]  # one folder for the builder's candidates
    assert len(os.listdir(root)) == 1  # the failed candidate's folder is gone
    builder.close()  # as the tuning run's end does, measured or not
    assert os.listdir(tmp_path) == []
