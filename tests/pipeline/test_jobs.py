"""The jobs of ``opbench.pipeline`` called as a script calls them, on ``simple`` models on the CPU:
compile (with and without a tuning database), collect, compare, tune and measure."""

from __future__ import annotations

import numpy as np
import pytest

from opbench import OpBenchError
from opbench.dataset import Dataset
from opbench.models import load_workload
from opbench.pipeline import CollectOptions, collect, compile_workload
from opbench.pipeline.compare import CompareOptions, compare
from opbench.profile import TimingConfig
from opbench.runtime import flatten_outputs, relative_error, resolve_target

BRANCHY = "branchy:branches=2,depth=2,channels=4,size=6"
FAST = TimingConfig(repeat=2, min_repeat_ms=1)


@pytest.fixture(scope="module")
def tuned_database(tmp_path_factory):
    """A tuning database (4 random trials) of matmul:n=32, and the workload."""
    pytest.importorskip("xgboost")
    from opbench.pipeline.tune import TuneSpec, tune_workload

    tmp = tmp_path_factory.mktemp("db")
    workload = load_workload("simple", "matmul:n=32", 1)
    with Dataset(tmp / "d.sqlite") as ds:
        tune_workload(workload, resolve_target("llvm"), ds, TuneSpec(tmp / "db", "random", 4))
    return workload, tmp / "db"


@pytest.mark.slow
def test_compile_workload_default_and_tuned(tuned_database, llvm_target):
    workload, database = tuned_database
    default = compile_workload(workload, llvm_target)
    tuned = compile_workload(workload, llvm_target, database)
    assert default.config == "default" and default.applied is None
    assert tuned.config.startswith("db:") and set(tuned.applied.tasks) == {"matmul"}
    assert [n.func for n in tuned.graph] == [n.func for n in default.graph]
    outputs = []
    for compiled in (default, tuned):
        kernels = compiled.kernels
        inputs = kernels.to_device(workload.example_inputs())
        replay, _ = kernels.replay(inputs)
        assert relative_error(replay, flatten_outputs(compiled.built.vm()["main"](*inputs))) < 1e-5
        outputs.append(replay[0].numpy())
    np.testing.assert_allclose(outputs[1], outputs[0], rtol=1e-5, atol=1e-5)
    excluded = compile_workload(workload, llvm_target, database, exclude={"matmul"})
    assert excluded.config == "default"


def test_collect_writes_typed_results_and_skips_on_rerun(tmp_path, llvm_target):
    workload = load_workload("simple", BRANCHY, 1)
    with Dataset(tmp_path / "d.sqlite") as ds:
        first = collect(workload, llvm_target, ds, CollectOptions(timing=FAST, progress=False))
        again = collect(workload, llvm_target, ds, CollectOptions(timing=FAST, progress=False))
        rows = ds.rows("operators")
    assert first.measured == len(first.graph) == len(rows) and first.failed == 0 and first.skipped == 0
    assert again.measured == 0 and again.skipped == len(first.graph) and not again.model_row_written
    assert first.kernels is not None and first.inputs is not None and set(first.values) == set(range(len(rows)))
    assert first.key["config"] == "default" and first.corun == {}
    assert {r["workload_id"] for r in rows} == {workload.workload_id}
    assert first.model_row["replay_rel_error"] < 1e-5


def test_collect_with_a_database_files_rows_under_its_config(tmp_path, tuned_database, llvm_target):
    workload, database = tuned_database
    with Dataset(tmp_path / "d.sqlite") as ds:
        result = collect(workload, llvm_target, ds, CollectOptions(timing=FAST, progress=False, database=database))
    assert result.key["config"].startswith("db:") and result.rows[0]["config"] == result.key["config"]


def test_compare_job_on_the_cpu(llvm_target):
    compiled = compile_workload(load_workload("simple", BRANCHY, 1), llvm_target)
    result = compare(compiled.backend(), CompareOptions(schedulers="sequential,greedy,opara,opara+critical-first",
                                                        repeat=2, number=2, stages=True))
    assert [r["schedule"] for r in result.rows] == ["sequential", "greedy", "opara", "opara+critical-first"]
    assert sum(r["kept"] for r in result.rows) == 1 and result.kept_baseline is None
    assert all(r["sched_error"] == 0.0 for r in result.rows)
    table = result.table()
    assert {"schedules", "critical_path", "operator_times", "stages"} <= set(table)
    assert len(table["operator_times"]) == len(compiled.graph) and "sequential" in table["stages"]
    assert table["critical_path"]["ops"] == result.bound["ops"] and result.bound["chain_ms"] > 0


@pytest.mark.parametrize(("options", "message"), [
    (CompareOptions(schedulers="sequential,bogus"), "unknown scheduler 'bogus'"),
    (CompareOptions(schedulers="sequential,bogus+critical-first"), "unknown scheduler 'bogus'"),
    (CompareOptions(ios_cost="guess"), "unknown --ios-cost 'guess'"),
    (CompareOptions(cost="predicted"), "--cost predicted needs --predictor"),
    (CompareOptions(schedulers="nimble", cost="predicted", predictor="p.opm"), "applies to the ios and greedy"),
])
def test_compare_options_are_checked_before_any_work(options, message):
    with pytest.raises(OpBenchError, match=message):
        options.scheduler_names()


def test_tune_and_measure(tmp_path, llvm_target):
    pytest.importorskip("xgboost")
    from opbench.pipeline.tune import TuneSpec, tune_and_measure

    workload = load_workload("simple", "matmul:n=32", 1)
    with Dataset(tmp_path / "d.sqlite") as ds:
        result = tune_and_measure(workload, llvm_target, ds, CollectOptions(timing=FAST, progress=False),
                                  TuneSpec(tmp_path / "db", "random", 4))
        configs = {r["config"] for r in ds.rows("operators")}
    assert result.default.key["config"] == "default" and result.run.measured == 4
    [task] = result.tasks
    assert task.task == "matmul" and task.trials == 4 and task.default_s > 0
    summary = result.summary()
    assert summary["trials"] == 4 and summary["tasks"][0]["kept"] == task.kept
    if task.kept:  # the tuned kernel was faster: its rows are filed under the database's config
        assert result.tuned.key["config"].startswith("db:") and configs == {"default", result.tuned.key["config"]}
        assert task.speedup > 1
    else:
        assert result.tuned.key["config"] == "default" or task.tuned_s >= task.default_s
