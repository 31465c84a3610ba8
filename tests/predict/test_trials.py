"""The trials predictor on real (tiny) tuning runs, and as the pretrained cost model of a tuning run."""

from __future__ import annotations

import pytest

from opbench import OpBenchError
from opbench.dataset import Dataset
from opbench.models import load_workload
from opbench.pipeline.train import train
from opbench.predict import load_predictor

pytest.importorskip("xgboost")
pytest.importorskip("cloudpickle")


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """Two one-task models tuned with 12 trials each on llvm."""
    from opbench.pipeline.tune import tune_workload
    from opbench.runtime import resolve_target

    tmp = tmp_path_factory.mktemp("trials")
    target = resolve_target("llvm")
    with Dataset(tmp / "d.sqlite") as ds:
        for n in (32, 48):
            tune_workload(load_workload("simple", f"matmul:n={n}"), target, ds, tmp / "db", "xgb", 12)
    return tmp


@pytest.mark.slow
def test_trials_predictor_ranks_held_out_tasks(tuned, tmp_path):
    result = train(tuned / "d.sqlite", "trials", "by_task", tmp_path / "trials.opm", folds=2)
    assert result["n_test"] >= 20 and {h["model"] for h in result["held_out"]} == {"matmul"}
    m = result["metrics"]
    assert m["mape"] is None and m["within_10pct"] is None  # ranking only
    assert 0.0 <= m["pairwise"] <= 1.0 and 0.0 < m["top1"] <= m["top5"] <= 1.0
    model = load_predictor(tmp_path / "trials.opm", "trials")
    assert model.meta["tasks"] == 2 and model.cost_model().data_size == result["n_test"]


@pytest.mark.slow
def test_pretrained_cost_model_in_a_short_tuning_run(tuned, tmp_path):
    from opbench.pipeline.tune import load_pretrained, tune_workload
    from opbench.runtime import resolve_target

    train(tuned / "d.sqlite", "trials", "by_task", tmp_path / "trials.opm", folds=2)
    tuner = load_pretrained("xgb", str(tmp_path / "trials.opm"), "llvm")
    assert tuner.name == "xgb-pretrained"
    loaded = tuner.cost_model()
    before = loaded.data_size
    assert before > 0 and loaded.booster is not None  # predicts from the first round
    with Dataset(tmp_path / "new.sqlite") as ds:
        run = tune_workload(load_workload("simple", "matmul:n=40"), resolve_target("llvm"), ds, tmp_path / "db",
                            tuner, 6)
        rows = ds.rows("trials")
    assert run.tuner == "xgb-pretrained" and len(rows) == 6 and {r["tuner"] for r in rows} == {"xgb-pretrained"}
    assert any(r["build_status"] == "ok" for r in rows)
    with pytest.raises(OpBenchError, match="--pretrained works with --tuner xgb"):
        load_pretrained("random", str(tmp_path / "trials.opm"))
    with pytest.raises(OpBenchError, match="trained for target 'llvm'"):
        load_pretrained("xgb", str(tmp_path / "trials.opm"), "cuda")
