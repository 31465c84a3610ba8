"""`opbench train` and `opbench predict` as a user runs them: outputs, JSON, one-line errors."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from ..helpers import run
from .conftest import write_synthetic

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "data" / "dataset" / "h100.sqlite.gz"

pytest.importorskip("xgboost")


@pytest.mark.slow
def test_train_json_has_the_documented_fields(synthetic, tmp_path):
    out = run("train", "--dataset", str(synthetic), "--what", "latency", "--split", "by_model", "--out",
              str(tmp_path / "m.opm"), "--json", str(tmp_path / "m.json"), "--folds", "3", script=False)
    assert out.returncode == 0, out.stderr
    assert "held-out model" in out.stdout and "MAPE" in out.stdout
    data = json.loads((tmp_path / "m.json").read_text())
    assert {"what", "split", "n_train", "n_test", "metrics", "per_kind", "held_out"} <= set(data)
    assert set(data["metrics"]) == {"mape", "within_10pct", "rmse", "r2", "pairwise", "top1", "top5"}
    assert data["metrics"]["top1"] is None and data["per_kind"]["conv2d"]["n"] == data["n_test"]
    per_model = data["per_model"]  # each held-out model's own figures, its rows counted once
    assert set(per_model) == {h["model"] for h in data["held_out"]} and len(per_model) > 1
    assert sum(v["n"] for v in per_model.values()) == data["n_test"]
    assert all(0 <= v["mape"] and 0 <= v["within_10pct"] <= 1 for v in per_model.values())
    assert "by model: " in out.stdout


@pytest.mark.parametrize(("args", "message"), [
    (["--what", "speed"], "unknown --what 'speed' (accepted: latency, corun, trials)"),
    (["--what", "latency", "--split", "random"],
     "unknown --split 'random' (accepted: within_task, by_task, by_model, by_dtype)"),
    (["--what", "trials"], "has no measured trials rows (collect with --iftune true)"),
    (["--what", "latency", "--features", "all"],
     "unknown --features 'all' (accepted: graph, graph+launch, graph+kernel)"),
])
def test_train_bad_input(synthetic, args, message):
    out = run("train", "--dataset", str(synthetic), *args, script=False)
    assert out.returncode == 2 and message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_predict_refuses_another_kind_of_model_file(synthetic, tmp_path):
    out = run("train", "--dataset", str(synthetic), "--what", "corun", "--out", str(tmp_path / "c.opm"),
              "--folds", "2", script=False)
    assert out.returncode == 0, out.stderr
    out = run("predict", "--predictor", str(tmp_path / "c.opm"), "--modelsource", "simple", "--modelname", "branchy",
              "--target", "cuda", script=False)
    assert out.returncode == 2 and "is a corun predictor, not a latency predictor" in out.stderr


def test_compressed_dataset_is_read_only(tmp_path):
    from opbench import OpBenchError
    from opbench.dataset import Dataset

    plain = tmp_path / "d.sqlite"
    write_synthetic(plain, models=2, per_model=3, coruns=0)
    packed = tmp_path / "d.sqlite.gz"
    with open(plain, "rb") as src, gzip.open(packed, "wb") as dst:
        shutil.copyfileobj(src, dst)
    with Dataset(packed, readonly=True) as ds:
        assert ds.count("operators") == 6
    with pytest.raises(OpBenchError, match="is compressed and can only be read"):
        Dataset(packed)


def test_train_refuses_too_few_models_and_writes_nothing(tmp_path):
    """The GPU quick start on a machine whose dataset holds the CPU quick start's two models once wrote a
    predictor with MAPE 5e9 % and used it; now it is refused, naming the minimum."""
    plain = tmp_path / "d.sqlite"
    write_synthetic(plain, models=2, per_model=30, coruns=0)
    out = run("train", "--dataset", str(plain), "--what", "latency", "--out", str(tmp_path / "lat.opm"), script=False)
    errors = [line for line in out.stderr.splitlines() if "error" in line]
    assert out.returncode == 2 and len(errors) == 1
    assert "too little data for a latency predictor: the by_model split finds 2 groups" in errors[0]
    assert not (tmp_path / "lat.opm").exists()


def test_a_prediction_outside_the_training_range_is_marked(synthetic, tmp_path):
    from opbench.models import load_workload
    from opbench.predict import load_predictor, train
    from opbench.predict.latency import predict_workload
    from opbench.runtime import resolve_target

    train(synthetic, "latency", out=tmp_path / "lat.opm", folds=3)
    predictor = load_predictor(tmp_path / "lat.opm", "latency")
    low, high = predictor.meta["latency_range_s"]
    assert 0 < low < high
    rows = predict_workload(load_workload("simple", "branchy"), resolve_target({"kind": "cuda", "arch": "sm_90"},
                                                                                 local_device=False), predictor)
    assert rows and all(r["outside_training_range"] == (not low <= r["predicted_ms"] / 1e3 <= high) for r in rows)
    predictor.meta["latency_range_s"] = [1.0, 2.0]  # seconds: every operator's prediction lies below it
    rows = predict_workload(load_workload("simple", "branchy"), resolve_target({"kind": "cuda", "arch": "sm_90"},
                                                                                 local_device=False), predictor)
    assert all(r["outside_training_range"] for r in rows)
    from opbench.cli.learn import _ms

    assert _ms(2.6e11) == "2.600e+11" and _ms(1.5) == "1.5000" and len(_ms(2.6e11)) <= 12


def test_the_train_job_round_trips_and_names_its_fields(tmp_path):
    from opbench.pipeline.spec import SpecError
    from opbench.pipeline.train import TrainJob

    job = TrainJob(dataset="d.sqlite", what="trials", split="by_task", out="t.opm", exclude=("resnet-50",))
    job.validate()
    assert TrainJob.from_json(job.to_json()) == job
    for bad, field in [({"what": "energy"}, "what"), ({"split": "random"}, "split"), ({"folds": 1}, "folds")]:
        with pytest.raises(SpecError) as err:
            TrainJob.from_json({**job.to_json(), **bad}).validate()
        assert err.value.field == field
