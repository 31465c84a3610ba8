"""The predictors' metrics and splits on hand-computed examples."""

from __future__ import annotations

import numpy as np
import pytest

from opbench import OpBenchError
from opbench.predict import metrics
from opbench.predict.splits import folds


def test_metrics_hand_computed():
    measured = [1.0, 2.0, 4.0, 8.0]
    predicted = [1.09, 1.5, 4.0, 9.0]
    # |0.09|/1 + |0.5|/2 + 0 + 1/8 = 0.09 + 0.25 + 0 + 0.125 = 0.465, / 4
    assert metrics.mape(measured, predicted) == pytest.approx(0.465 / 4)
    assert metrics.within(measured, predicted) == pytest.approx(0.5)  # 1.09 and 4.0
    assert metrics.rmse(measured, predicted) == pytest.approx(np.sqrt((0.0081 + 0.25 + 0 + 1) / 4))
    y, p = np.array(measured), np.array(predicted)
    assert metrics.r2(measured, predicted) == pytest.approx(1 - ((p - y) ** 2).sum() / ((y - y.mean()) ** 2).sum())
    assert metrics.r2([2.0, 2.0], [1.0, 3.0]) is None


def test_pairwise_counts_pairs_inside_groups_only():
    # group a: (1, 2, 3) predicted (1, 3, 2): pairs 1<2 ok, 1<3 ok, 2<3 wrong -> 2/3
    # group b: (5, 6) predicted (6, 5): wrong -> 0/1; pairs across groups are not counted
    value = metrics.pairwise([1, 2, 3, 5, 6], [1, 3, 2, 6, 5], ["a", "a", "a", "b", "b"])
    assert value == pytest.approx(2 / 4)
    assert metrics.pairwise([1, 1], [1, 2], ["a", "a"]) is None  # ties in the measurement are skipped
    # tie: pairs measured within that fraction of the larger are left out too (here 1.0 vs 1.005)
    assert metrics.pair_counts([1.0, 1.005, 2.0], [2, 1, 3], ["a"] * 3) == (2, 3)
    assert metrics.pair_counts([1.0, 1.005, 2.0], [2, 1, 3], ["a"] * 3, tie=0.01) == (2, 2)


def test_top_k_is_tensets_score():
    latency = [1.0, 2.0, 4.0, 10.0, 20.0]
    score = [0.1, 0.9, 0.5, 1.0, 0.2]  # task a: best predicted is 2.0 (best is 1.0); task b: 10.0 (best)
    groups = ["a", "a", "a", "b", "b"]
    assert metrics.top_k(latency, score, groups, 1) == pytest.approx((1.0 + 10.0) / (2.0 + 10.0))
    assert metrics.top_k(latency, score, groups, 3) == pytest.approx(1.0)
    weighted = metrics.top_k(latency, score, groups, 1, {"a": 3.0, "b": 1.0})
    assert weighted == pytest.approx((3 * 1.0 + 10.0) / (3 * 2.0 + 10.0))


@pytest.mark.parametrize("split", ["by_model", "by_task"])
def test_group_splits_never_share_a_group(split):
    groups = [f"g{i % 7}" for i in range(60)]
    seen_test = []
    for train, test in folds(groups, split, k=5, seed=1):
        assert not {groups[i] for i in train} & {groups[i] for i in test}
        seen_test += list(test)
    assert sorted(seen_test) == list(range(60))  # every item is tested exactly once


def test_within_task_split_keeps_every_group_in_training():
    groups = [f"t{i % 4}" for i in range(40)]
    for train, test in folds(groups, "within_task", k=5):
        assert {groups[i] for i in train} == {groups[i] for i in test} == {"t0", "t1", "t2", "t3"}


def test_splits_refuse_too_few_groups():
    with pytest.raises(OpBenchError, match="too few models for a by_model split: 1 .needed: at least 2"):
        folds(["m"] * 10, "by_model")
    with pytest.raises(OpBenchError, match="unknown --split 'random'"):
        folds(["m"] * 10, "random")


def test_by_model_holds_out_every_batch_and_dtype_of_a_model_and_by_dtype_a_precision():
    from opbench.predict.latency import group_of
    from opbench.predict.splits import group_label

    rows = [{"source": "local", "model": m, "dtype": d, "batch_size": b, "workload_id": f"{m}{d}{b}"}
            for m in ("a", "b", "c") for d in ("float16", "bfloat16") for b in (1, 8)]
    rows.append({"source": "local", "model": "a", "batch_size": 1, "workload_id": "a-old"})  # a row before dtypes
    by_model = group_of(rows, "by_model")
    assert set(by_model) == {"local:a", "local:b", "local:c"}
    for train, test in folds(by_model, "by_model", k=3):
        held = {rows[i]["model"] for i in test}
        assert len(held) == 1 and not held & {rows[i]["model"] for i in train}
    by_dtype = [group_label(r, "by_dtype") for r in rows]
    assert by_dtype[-1] == "float32"
    out = folds(by_dtype, "by_dtype", k=10)
    assert len(out) == 3 and sorted(len({by_dtype[i] for i in test}) for _, test in out) == [1, 1, 1]
    with pytest.raises(OpBenchError, match="too few dtypes for a by_dtype split: 1"):
        folds(["float16"] * 4, "by_dtype")
