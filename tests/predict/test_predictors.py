"""Latency and co-run predictors recover known relationships; files are checked on load."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest

from opbench import OpBenchError
from opbench.predict import load_predictor, train
from opbench.predict.latency import latency_rows

from .conftest import DEVICE, latency_law, write_synthetic

pytest.importorskip("xgboost")


def test_latency_recovers_the_roofline_on_held_out_models(tmp_path):
    synthetic = tmp_path / "synthetic.sqlite"
    write_synthetic(synthetic, per_model=100, coruns=0)
    result = train(synthetic, "latency", "by_model", tmp_path / "lat.opm", folds=3)
    assert result["n_test"] == 6 * 100 and result["folds"] == 3
    m = result["metrics"]
    assert m["mape"] < 0.05 and m["within_10pct"] > 0.9 and m["r2"] > 0.8, m
    assert {h["model"] for h in result["held_out"]} == {f"model{i}" for i in range(6)}
    # a tree ensemble cannot go above the largest latency it saw: a model whose largest operator is
    # rarer than the others' may come out lower, the rest are close
    errors = sorted(abs(h["error"]) for h in result["held_out"])
    assert errors[-2] < 0.05 and errors[-1] < 0.2, errors
    model = load_predictor(tmp_path / "lat.opm", "latency")
    rows, _ = latency_rows(str(synthetic))
    predicted = model.predict(rows[:20])
    truth = np.array([latency_law(r["flops"], r["bytes"]) for r in rows[:20]])
    assert np.all(np.abs(predicted - truth) / truth < 0.15)
    assert model.device_name == DEVICE and model.meta["target_kind"] == "cuda"


def test_corun_recovers_the_group_law(synthetic, tmp_path):
    result = train(synthetic, "corun", "by_model", tmp_path / "corun.opm", folds=3)
    m = result["metrics"]
    assert m["pairwise"] > 0.85 and m["mape"] < 0.1, m
    model = load_predictor(tmp_path / "corun.opm", "corun")
    ops = [{"kind": "conv2d", "flops": 1e9, "bytes": 1e6, "sms_used": 100}] * 2
    together, slowdowns = model.predict(ops, [20e-6, 10e-6], 100)
    assert together == pytest.approx(25e-6, rel=0.15) and len(slowdowns) == 2
    # the ratio is over max**0.25 * sum**0.75 of the solo times; a file saved before that says nothing and
    # meant the solo sum
    assert model.meta["concurrent_over"] == "max**0.25*sum**0.75"
    del model.meta["concurrent_over"]
    mixed = 20 ** 0.25 * 30 ** 0.75
    assert model.predict(ops, [20e-6, 10e-6], 100)[0] == pytest.approx(together * 30 / mixed)
    assert model.concurrent(ops, [20e-6, 10e-6], 100) == pytest.approx(together * 30 / mixed)


def test_corun_groups_far_above_their_solo_sum_do_not_train(synthetic):
    from opbench.predict.corun import MIN_GROUPS, OUTLIER_RATIO, CorunPredictor, corun_examples

    groups, _ = corun_examples(str(synthetic))
    assert len(groups) >= MIN_GROUPS
    outliers = [{**g, "concurrent_s": 4.0 * sum(g["solo_s"])} for g in groups[:10]]
    clean = CorunPredictor.fit(groups)
    mixed = CorunPredictor.fit(groups + outliers)
    assert clean.meta["left_out_untrainable"] == 0 and mixed.meta["left_out_untrainable"] == 10
    assert mixed.meta["n_rows"] == len(groups)
    got, want = mixed.predict_many(groups[:20]), clean.predict_many(groups[:20])
    assert [t for t, _ in got] == pytest.approx([t for t, _ in want], rel=1e-9)  # the outliers changed nothing
    at = OUTLIER_RATIO * sum(groups[0]["solo_s"])  # at the ratio, its members inside as long: trains
    edge = {**groups[0], "concurrent_s": at, "slowdowns": [at / s for s in groups[0]["solo_s"]]}
    assert CorunPredictor.fit(groups + [edge]).meta["n_rows"] == len(groups) + 1
    few = CorunPredictor.fit(groups[:5] + outliers)  # too few would remain: every group trains
    assert few.meta["left_out_untrainable"] == 0 and few.meta["n_rows"] == 15


def test_corun_groups_slower_than_their_members_inside_do_not_train(synthetic):
    from opbench.predict.corun import INCONSISTENT_RATIO, CorunPredictor, corun_examples, inside_ratio, trains

    groups, _ = corun_examples(str(synthetic))
    g = groups[0]
    longest = max(s * t for s, t in zip(g["slowdowns"], g["solo_s"], strict=True))
    assert inside_ratio(g) == pytest.approx(1.0) and trains(g)
    total = sum(g["solo_s"])  # at its solo sum, but twice as long as its members took inside it
    slower = {**g, "concurrent_s": total, "slowdowns": [total / (2.0 * s) for s in g["solo_s"]]}
    assert inside_ratio(slower) == pytest.approx(2.0) and not trains(slower)
    assert trains({**g, "concurrent_s": INCONSISTENT_RATIO * longest})
    assert trains({**slower, "slowdowns": None})  # members not timed inside: only the solo sum decides
    fitted = CorunPredictor.fit(groups + [slower] * 3)
    assert fitted.meta["left_out_untrainable"] == 3 and fitted.meta["n_rows"] == len(groups)


def test_also_groups_train_other_models_folds_and_are_never_tested(synthetic, monkeypatch):
    from opbench.predict import corun

    groups, _ = corun.corun_examples(str(synthetic))
    also = [{**g, "dtype": "float16", "concurrent_s": 0.9 * g["concurrent_s"]} for g in groups]
    base = corun.evaluate(groups, "by_model", 3)
    seen: list[set[str]] = []
    fit = corun.CorunPredictor.fit.__func__

    def spy(cls, train, seed=0, meta=None):
        seen.append({(g["model"], g["dtype"]) for g in train})
        return fit(cls, train, seed, meta)

    monkeypatch.setattr(corun.CorunPredictor, "fit", classmethod(spy))
    result = corun.evaluate(groups, "by_model", 3, also=also)
    assert result["n_test"] == base["n_test"] == len(groups) and result["n_also"] == len(also)
    assert result["n_train"] > base["n_train"]
    models = {g["model"] for g in groups}
    for trained in seen:  # each fold trains the float16 copies of exactly the models it trains in float32
        assert {m for m, d in trained if d == "float16"} == {m for m, d in trained if d != "float16"} < models
    assert result["metrics_consistent"]["mape"] == pytest.approx(result["metrics"]["mape"])
    assert result["n_inconsistent"] == 0


def test_train_with_also_datasets(synthetic, tmp_path):
    from opbench.pipeline.spec import SpecError
    from opbench.pipeline.train import TrainJob
    from opbench.pipeline.train import train as train_job

    more = tmp_path / "more.sqlite"
    write_synthetic(more, seed=1)
    result = train_job(TrainJob(str(synthetic), "corun", folds=3, also=(str(more),), out=str(tmp_path / "c.opm")))
    from opbench.predict.corun import corun_examples

    assert result["n_also"] == len(corun_examples(str(more))[0]) > 0
    assert result["n_test"] == len(corun_examples(str(synthetic))[0])
    assert load_predictor(tmp_path / "c.opm", "corun").meta["also"] == ["more.sqlite"]
    with pytest.raises(SpecError, match="only for --what corun"):
        TrainJob(str(synthetic), "latency", also=(str(more),)).validate()
    with pytest.raises(OpBenchError, match="not found"):
        train_job(TrainJob(str(synthetic), "corun", also=(str(tmp_path / "missing.sqlite"),)))


def test_bad_inputs_are_one_line_errors(synthetic, tmp_path):
    train(synthetic, "latency", "by_model", tmp_path / "lat.opm", folds=2)
    with pytest.raises(OpBenchError, match="is a latency predictor, not a corun predictor"):
        load_predictor(tmp_path / "lat.opm", "corun")
    (tmp_path / "junk.opm").write_text("not a zip")
    with pytest.raises(OpBenchError, match="is not an OpBench predictor file"):
        load_predictor(tmp_path / "junk.opm")
    with pytest.raises(OpBenchError, match="trained on 'Test GPU', not on this device 'Other GPU'"):
        load_predictor(tmp_path / "lat.opm").check_device("Other GPU", "cuda")
    with pytest.raises(OpBenchError, match="trained for target 'cuda'"):
        load_predictor(tmp_path / "lat.opm").check_device(None, "llvm")
    small = tmp_path / "small.sqlite"
    write_synthetic(small, models=2, per_model=5, coruns=2)
    with pytest.raises(OpBenchError, match=r"too few measured operator rows for training: 10 \(needed: at least 20\)"):
        train(small, "latency", "by_model")
    with pytest.raises(OpBenchError, match=r"too few measured co-run groups for training: 4 \(needed: at least 20"):
        train(small, "corun", "by_model")
    with pytest.raises(OpBenchError, match="unknown --what 'speed'"):
        train(synthetic, "speed")
    two = tmp_path / "two.sqlite"
    write_synthetic(two, models=2)
    write_synthetic(two, models=2, device="Other GPU", seed=1)
    with pytest.raises(OpBenchError, match="several devices .*pick one with --device"):
        train(two, "latency")
    assert train(two, "latency", "by_model", device="Other GPU", folds=2)["device_name"] == "Other GPU"


def test_kernel_features_are_needed_when_trained_with_them(synthetic, tmp_path):
    train(synthetic, "latency", "by_model", tmp_path / "k.opm", folds=2, features="graph+kernel")
    model = load_predictor(tmp_path / "k.opm")
    with pytest.raises(OpBenchError, match="needs kernel resources"):
        model.predict([{"kind": "conv2d", "flops": 1e9, "bytes": 1e6}])
    with zipfile.ZipFile(tmp_path / "k.opm") as zf:
        meta = json.loads(zf.read("meta.json"))
    assert meta["what"] == "latency" and meta["feature_set"] == "graph+kernel" and "log2_blocks" in meta["features"]


def test_rows_without_launch_dimensions_train_on_graph_features(tmp_path):
    data = tmp_path / "cpu.sqlite"
    write_synthetic(data, models=3, per_model=10, coruns=0, launch=False)
    assert train(data, "latency", "by_model", folds=2)["features"] == "graph"
    with pytest.raises(OpBenchError, match="--features graph\\+kernel needs kernel launch dimensions"):
        train(data, "latency", "by_model", folds=2, features="graph+kernel")


def test_excluded_models_are_never_trained_on(synthetic, tmp_path):
    result = train(synthetic, "latency", "by_model", folds=2, exclude=["model0", "model1"])
    assert {h["model"] for h in result["held_out"]} == {f"model{i}" for i in range(2, 6)}


def test_predict_an_unmeasured_model(synthetic, tmp_path):
    from opbench.models import load_workload
    from opbench.predict.latency import predict_workload
    from opbench.runtime import resolve_target

    train(synthetic, "latency", "by_model", tmp_path / "lat.opm", folds=2, features="graph")
    model = load_predictor(tmp_path / "lat.opm")
    workload = load_workload("simple", "branchy:branches=2,depth=1,channels=16,size=14")
    rows = predict_workload(workload, resolve_target("llvm"), model)
    convs = [r for r in rows if r["kind"] == "conv2d"]
    assert len(convs) == 4 and all(r["predicted_ms"] > 0 for r in rows)
    assert [r["op_index"] for r in rows] == list(range(len(rows)))
    # graph+launch on a GPU target: the default schedule's launch dimensions, no GPU and no compile needed
    train(synthetic, "latency", "by_model", tmp_path / "launch.opm", folds=2)
    launch = load_predictor(tmp_path / "launch.opm")
    assert launch.feature_set == "graph+launch"
    cuda = resolve_target({"kind": "cuda", "arch": "sm_90"}, local_device=False)
    rows = predict_workload(workload, cuda, launch)
    assert len(rows) == 5 and all(r["predicted_ms"] > 0 for r in rows)  # stem, 2 branches, concat, 1x1


def test_launch_dims_without_compiling():
    from opbench.ir import extract_operators
    from opbench.models import load_workload
    from opbench.runtime import resolve_target
    from opbench.runtime.build import launch_dims

    workload = load_workload("simple", "branchy:branches=2,depth=1,channels=16,size=14")
    cuda = resolve_target({"kind": "cuda", "arch": "sm_90"}, local_device=False)
    lowered, graph = extract_operators(workload.mod, cuda)
    dims = launch_dims(lowered, cuda)
    assert set(dims) == {n.func for n in graph}
    for d in dims.values():
        assert len(d["grid"]) == len(d["block"]) >= 1 and all(len(g) == 3 for g in d["grid"])
        assert d["threads"] == int(np.prod(d["block"][0])) and 1 <= d["threads"] <= 1024
    llvm = resolve_target("llvm")
    assert launch_dims(extract_operators(workload.mod, llvm)[0], llvm) == {}  # CPU kernels launch nothing


def _conv(c: int, size: int) -> dict:
    flops, nbytes = 2.0 * c * c * 9 * size * size, 4 * (2 * c * size * size + c * c * 9)
    return {"kind": "conv2d", "ops": ["nn.conv2d"], "attrs": {"strides": [1, 1], "groups": 1},
            "input_shapes": [[1, c, size, size], [c, c, 3, 3]], "output_shapes": [[1, c, size, size]],
            "output_dtypes": ["float32"], "flops": flops, "bytes": nbytes, "threads": 256,
            "grid": [[max(1, c * size * size // 256), 1, 1]], "latency_median_s": latency_law(flops, nbytes)}


def test_latency_extrapolates_beyond_the_training_rows():
    """Trees stop at the largest latency they saw; the log-linear baseline under them goes on."""
    from opbench.predict.features import operator_matrix
    from opbench.predict.latency import LatencyPredictor

    rows = [_conv(c, size) for c in (64, 96, 128, 160, 192, 256) for size in (28, 35, 42, 49, 56, 63, 70)]
    model = LatencyPredictor.fit(rows)
    largest = max(r["latency_median_s"] for r in rows)
    big = [_conv(256, 224), _conv(512, 224), _conv(512, 448)]  # 10x to 160x the largest trained
    truth = np.array([r["latency_median_s"] for r in big])
    trees = np.exp(model.booster_predict("latency_trees", operator_matrix(big, "graph+launch")))
    assert np.all(trees <= largest * 1.05)  # the trees alone are clipped at the largest seen
    baseline = np.exp(model.baseline(big))
    assert np.all(np.abs(baseline / truth - 1) < 0.4), baseline / truth  # the trees: 1/10 to 1/160
    predicted = model.predict(big)  # the two boosters' geometric mean: above anything seen
    assert np.all(predicted > 2 * largest) and np.all(predicted < truth), (predicted / largest, predicted / truth)


def test_gemm_dims_of_convolutions_and_matmuls():
    """Rows, columns and reduction of the matrix product, by hand; NaN for other kinds."""
    from opbench.predict.features import gemm_dims, graph_feature_names, graph_features

    # a 3x3 convolution of 128 channels into 32, 28x28 output: k = 128 * 9 multiply-adds per output
    flops = 2.0 * 32 * 28 * 28 * 128 * 9
    assert gemm_dims("conv2d", [1, 32, 28, 28], {}, flops) == (784.0, 32.0, 1152.0)
    assert gemm_dims("conv2d", [1, 28, 28, 32], {"data_layout": "NHWC"}, flops) == (784.0, 32.0, 1152.0)
    assert gemm_dims("matmul", [8, 4096], {}, 2.0 * 8 * 4096 * 25088) == (8.0, 4096.0, 25088.0)
    assert all(np.isnan(gemm_dims("pool", [1, 32, 14, 14], {}, 1e6)))
    op = {"kind": "conv2d", "ops": ["nn.conv2d"], "input_shapes": [[1, 128, 28, 28], [32, 128, 3, 3]],
          "output_shapes": [[1, 32, 28, 28]], "attrs": {"strides": [1, 1]}, "flops": flops, "bytes": 1e6}
    named = dict(zip(graph_feature_names(), graph_features(op), strict=True))
    assert named["log2_gemm_n"] == pytest.approx(np.log2(33.0))
    assert named["log2_gemm_k"] == pytest.approx(np.log2(1153.0))
    assert named["log2_flops_per_out"] == pytest.approx(np.log2(2 * 1152.0 + 1))


def test_precision_is_a_feature_and_tells_float16_from_bfloat16():
    """Both half precisions are two bytes wide; the dtype columns are what tells them apart (dlight puts
    float16 matmuls on tensor cores and bfloat16 ones on CUDA cores)."""
    from opbench.predict.features import DTYPES, graph_feature_names, graph_features

    def named(dtype: str) -> dict:
        row = {**_conv(64, 28), "input_dtypes": [dtype, dtype], "output_dtypes": [dtype]}
        return dict(zip(graph_feature_names(), graph_features(row), strict=True))

    for dtype in DTYPES:
        assert [named(dtype)[f"dtype={d}"] for d in DTYPES] == [float(d == dtype) for d in DTYPES]
    fp16, bf16 = named("float16"), named("bfloat16")
    assert fp16["dtype_bytes"] == bf16["dtype_bytes"] == 2.0
    assert [k for k in fp16 if fp16[k] != bf16[k]] == ["dtype=float16", "dtype=bfloat16"]


def test_rows_timed_unsteadily_do_not_train():
    """A row whose repeats disagree by more than UNSTABLE_SPREAD is left out of training: a wild value
    that would otherwise pull the prediction for its shape does not."""
    from opbench.predict.latency import UNSTABLE_SPREAD, LatencyPredictor, stable

    rows = [{**_conv(c, size), "latency_min_s": None, "latency_max_s": None}
            for c in (64, 96, 128, 160) for size in (28, 35, 42, 49, 56)]
    for r in rows:
        r["latency_min_s"], r["latency_max_s"] = 0.99 * r["latency_median_s"], 1.05 * r["latency_median_s"]
    wild = {**_conv(128, 42)}
    truth = wild["latency_median_s"]
    wild.update(latency_median_s=50 * truth, latency_min_s=10 * truth, latency_max_s=60 * truth)
    assert all(stable(r) for r in rows) and not stable(wild) and stable({"latency_median_s": 1.0})
    assert UNSTABLE_SPREAD == pytest.approx(0.2)
    model = LatencyPredictor.fit([*rows, wild, wild, wild])
    assert model.meta["n_rows"] == len(rows)
    assert model.predict([_conv(128, 42)])[0] == pytest.approx(truth, rel=0.25)
    few = [wild] * 30  # nothing stable enough to train on: every row trains
    assert LatencyPredictor.fit(few).meta["n_rows"] == 30
