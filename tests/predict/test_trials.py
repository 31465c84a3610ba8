"""The trials predictor on real (tiny) tuning runs, and as the pretrained cost model of a tuning run."""

from __future__ import annotations

import dataclasses
import tempfile

import pytest

from opbench import OpBenchError
from opbench.dataset import Dataset
from opbench.models import load_workload
from opbench.pipeline.train import TrainJob, train
from opbench.predict import load_predictor

pytest.importorskip("xgboost")
pytest.importorskip("cloudpickle")


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """Two one-task models tuned with 12 trials each on llvm."""
    from opbench.pipeline.tune import TuneSpec, tune_workload
    from opbench.runtime import resolve_target

    tmp = tmp_path_factory.mktemp("trials")
    target = resolve_target("llvm")
    with Dataset(tmp / "d.sqlite") as ds:
        for n in (32, 48):
            tune_workload(load_workload("simple", f"matmul:n={n}"), target, ds, TuneSpec(tmp / "db", "xgb", 12))
    return tmp


@pytest.mark.slow
def test_trials_predictor_ranks_held_out_tasks(tuned, tmp_path):
    result = train(TrainJob(str(tuned / "d.sqlite"), "trials", "by_task", str(tmp_path / "trials.opm"), folds=2))
    assert result["n_test"] >= 20 and {h["model"] for h in result["held_out"]} == {"matmul"}
    m = result["metrics"]
    assert m["mape"] is None and m["within_10pct"] is None  # ranking only
    assert 0.0 <= m["pairwise"] <= 1.0 and 0.0 < m["top1"] <= m["top5"] <= 1.0
    model = load_predictor(tmp_path / "trials.opm", "trials")
    assert model.meta["tasks"] == 2 and model.cost_model().data_size == result["n_test"]


@pytest.mark.slow
def test_pretrained_cost_model_in_a_short_tuning_run(tuned, tmp_path):
    from opbench.pipeline.tune import TuneSpec, load_pretrained, tune_workload
    from opbench.runtime import resolve_target

    train(TrainJob(str(tuned / "d.sqlite"), "trials", "by_task", str(tmp_path / "trials.opm"), folds=2))
    tuner = load_pretrained("xgb", str(tmp_path / "trials.opm"), "llvm")
    assert tuner.name == "xgb-pretrained" and tuner.trials_per_iter == 16
    loaded = tuner.cost_model()
    assert loaded.data_size == 0 and loaded.booster is not None  # predicts from the first round
    made = []  # the cost model the tuning run uses: MetaSchedule must call its own update, not XGBModel's

    def cost_model():
        made.append(tuner.cost_model())
        return made[-1]

    with Dataset(tmp_path / "new.sqlite") as ds:
        run = tune_workload(load_workload("simple", "matmul:n=40"), resolve_target("llvm"), ds,
                            TuneSpec(tmp_path / "db", dataclasses.replace(tuner, cost_model=cost_model), 6))
        rows = ds.rows("trials")
    assert run.tuner == "xgb-pretrained" and len(rows) == 6 and {r["tuner"] for r in rows} == {"xgb-pretrained"}
    assert any(r["build_status"] == "ok" for r in rows)
    assert len(made) == 1 and made[0].data_size == 6 and len(made[0].task_boosters) == 1  # learned the task
    with pytest.raises(OpBenchError, match="--pretrained works with --tuner xgb"):
        load_pretrained("random", str(tmp_path / "trials.opm"))
    with pytest.raises(OpBenchError, match="trained for target 'llvm'"):
        load_pretrained("xgb", str(tmp_path / "trials.opm"), "cuda")


@pytest.fixture(scope="module")
def records_slice(tmp_path_factory):
    """A slice of the shipped records (data/dataset): the tasks of five models, a few each, among them
    tasks that two of the models share, as a SQLite dataset (tasks and trials tables)."""
    import json
    from collections import defaultdict
    from pathlib import Path

    from opbench.dataset import records

    folder = Path(__file__).resolve().parents[2] / "data" / "dataset"
    tasks = {t["workload_id"]: t for t in records.read_rows(folder, "tasks")}
    rows = [r for r in records.read_rows(folder) if r["build_status"] == "ok"]
    by_task = defaultdict(list)
    for r in rows:
        by_task[r["workload_id"]].append(r)
    models = ["googlenet", "inception_v3", "resnet-18", "resnet-34", "squeezenet_v1.1"]
    chosen, per_model = [], defaultdict(int)
    for key, trows in sorted(by_task.items()):
        users = sorted({u["model"] for u in json.loads(tasks[key]["uses"])})
        if len(trows) >= 8 and set(users) <= set(models) and all(per_model[m] < 4 for m in users):
            chosen.append(key)
            for m in users:
                per_model[m] += 1
    path = tmp_path_factory.mktemp("records") / "slice.sqlite"
    with Dataset(path) as ds:
        run = ds.start_run("slice", {})
        ds.put_many("tasks", [{**tasks[k], "run_id": run} for k in chosen])
        ds.put_many("trials", [{**r, "run_id": run} for k in chosen for r in by_task[k]])
        ds.finish_run(run, "ok")
    return path, chosen


@pytest.mark.slow
def test_held_out_models_share_no_model_and_no_task_with_training(records_slice, tmp_path, monkeypatch):
    from opbench.pipeline.train import task_modules
    from opbench.predict import trials

    monkeypatch.setenv("OPBENCH_CACHE", str(tmp_path / "cache"))
    path, chosen = records_slice
    tasks, _device = trials.trial_examples(str(path), task_modules)
    assert len(tasks) == len(chosen) and any(len(t["models"]) > 1 for t in tasks.values())  # shared tasks too
    report = trials.evaluate(tasks, "by_model", k=3, seed=0)
    assert report["folds"] >= 2 and report["n_test"] > 0
    for models, task_keys in zip(report["fold_models"], report["fold_tasks"], strict=True):
        assert models["test"] and not set(models["test"]) & set(models["train"])
        assert task_keys["test"] and not set(task_keys["test"]) & set(task_keys["train"])
    shared = {f"{t['workload_id']}/{t['task']}" for t in tasks.values() if len(t["models"]) > 1}
    tested = {k for f in report["fold_tasks"] for k in f["test"]}
    assert report["untested"] == sum(len(t["xs"]) for t in tasks.values()
                                     if f"{t['workload_id']}/{t['task']}" not in tested)
    assert {h["dtype"] for h in report["held_out"]} == set(report["by_dtype"])
    m = report["metrics"]
    assert 0.0 <= m["pairwise"] <= 1.0 and 0.0 < m["top1"] <= m["top5"] <= 1.0
    assert m["candidates"] == report["n_test"] and m["tasks"] == len(tested)
    # a task's features are cached: the second read computes nothing
    monkeypatch.setattr(trials, "trial_features", lambda *a: pytest.fail("features computed again"))
    again, _ = trials.trial_examples(str(path), task_modules)
    assert all((again[k]["xs"][0] == tasks[k]["xs"][0]).all() for k in tasks)
    assert shared <= {f"{t['workload_id']}/{t['task']}" for t in again.values()}


@pytest.mark.slow
def test_features_computed_in_worker_processes_equal_those_computed_here(records_slice, tmp_path, monkeypatch):
    from opbench.pipeline.train import task_modules
    from opbench.predict import trials

    path, chosen = records_slice
    monkeypatch.setenv("OPBENCH_CACHE", str(tmp_path / "here"))
    here, _ = trials.trial_examples(str(path), task_modules, jobs=1)
    monkeypatch.setenv("OPBENCH_CACHE", str(tmp_path / "workers"))
    calls = []
    real = trials.cached_features
    monkeypatch.setattr(trials, "cached_features", lambda *a: calls.append(a) or real(*a))
    workers, _ = trials.trial_examples(str(path), task_modules, jobs=2)
    assert not calls  # every task's features came from the two workers, none from this process
    assert sorted(workers) == sorted(here) and len(here) == len(chosen)
    for key, task in here.items():
        assert task["trace_keys"] == workers[key]["trace_keys"]
        assert all((a == b).all() for a, b in zip(task["xs"], workers[key]["xs"], strict=True))
    # the workers wrote the cache: a later read computes nothing and starts no worker
    monkeypatch.setattr(trials, "trial_features", lambda *a: pytest.fail("features computed again"))
    monkeypatch.setattr(trials, "_task_features_job", lambda *a: pytest.fail("a worker started"))
    again, _ = trials.trial_examples(str(path), task_modules, jobs=2)
    assert sorted(again) == sorted(here)


def test_feature_jobs_come_from_the_argument_then_the_environment(monkeypatch):
    from opbench.predict import trials

    monkeypatch.setenv("OPBENCH_FEATURE_JOBS", "3")
    assert trials.feature_jobs(5) == 5 and trials.feature_jobs() == 3
    monkeypatch.delenv("OPBENCH_FEATURE_JOBS")
    assert 1 <= trials.feature_jobs() <= 16 and trials.feature_jobs(0) == 1


def test_ranking_pairs_stay_inside_a_task_and_weigh_how_far_apart_they_are():
    import numpy as np

    from opbench.predict.trials import RANK_PAIRS, task_pairs

    ys = np.array([1.0, 0.5, 1.0, 1.0, 0.25, 0.0])
    i, j, weight = task_pairs([3, 3], ys)
    pairs = {(int(a), int(b)): round(float(w), 3) for a, b, w in zip(i, j, weight, strict=True)}
    # (0, 2) are equally fast: no pair; (3, 4) is 4x apart: weight capped at 1; a failed candidate counts 1
    assert pairs == {(0, 1): 0.693, (1, 2): 0.693, (3, 4): 1.0, (3, 5): 1.0, (4, 5): 1.0}
    big = np.linspace(1.0, 0.1, 3 * RANK_PAIRS)
    i, j, _ = task_pairs([2, len(big)], np.r_[1.0, 0.5, big])
    assert len(i) <= 1 + RANK_PAIRS * len(big) and ((i < 2) == (j < 2)).all()  # sampled, never across tasks
    with pytest.raises(ValueError, match="4 speeds for tasks of 5 candidates"):
        task_pairs([2, 3], ys[:4])


def test_pair_gradients_are_the_pairwise_loss_s_derivatives():
    import numpy as np

    from opbench.predict.trials import pair_gradients

    rng = np.random.default_rng(0)
    score = rng.normal(size=5)
    i, j = np.array([0, 0, 1, 3]), np.array([1, 2, 4, 4])
    sign, weight = np.array([1.0, -1.0, 1.0, -1.0]), np.array([0.5, 1.0, 0.2, 0.9])

    def loss(s):
        return float((weight * np.log1p(np.exp(-sign * (s[i] - s[j])))).sum())

    grad, hess = pair_gradients(score, i, j, sign, weight)
    eps = 1e-6
    numeric = [(loss(score + eps * e) - loss(score - eps * e)) / (2 * eps) for e in np.eye(5)]
    np.testing.assert_allclose(grad, numeric, rtol=1e-5, atol=1e-8)
    curvature = [(loss(score + 1e-4 * e) - 2 * loss(score) + loss(score - 1e-4 * e)) / 1e-8 for e in np.eye(5)]
    np.testing.assert_allclose(hess[:5], np.maximum(curvature, 1e-6), rtol=1e-3, atol=1e-6)


def test_the_ranking_model_learns_each_tasks_own_order():
    """Two tasks ordered by different features (the first by one, faster when larger; the second by
    another, faster when smaller): the model ranks each task's candidates in that task's order, and the
    saved predictor's cost model scores them as the trained one does."""
    import numpy as np

    from opbench.predict.trials import FEATURE_WIDTH, TrialsPredictor, fit_xgb

    rng = np.random.default_rng(0)
    tasks = []
    for t in range(2):
        xs, latency = [], []
        for k in range(12):
            x = rng.uniform(0, 1, (1, FEATURE_WIDTH)).astype("float32")  # features that tell nothing
            x[0, 0], x[0, 1] = (k, t) if t == 0 else (rng.uniform(0, 12), t)
            x[0, 2] = k if t == 1 else rng.uniform(0, 12)
            xs.append(x)
            latency.append(1.0 / (k + 1) if t == 0 else float(k + 1))
        tasks.append({"xs": xs, "latency": np.array(latency), "group_hash": f"task{t}"})
    model = fit_xgb(tasks)
    for t in tasks:
        score = model._predict(xs=t["xs"])  # noqa: SLF001
        assert list(np.argsort(-score)) == list(np.argsort(t["latency"]))  # fastest first, in each task
    loaded = TrialsPredictor.fit(tasks).cost_model()
    assert type(loaded) is type(model) and loaded.data_size == 24
    assert np.allclose(loaded._predict(xs=tasks[0]["xs"]), model._predict(xs=tasks[0]["xs"]))  # noqa: SLF001


def _synthetic_task(rng, name: str, sign: float, n: int = 48) -> dict:
    """A task of ``n`` candidates of two stores each, slower as feature 0 of their stores grows (``sign``
    +1) or shrinks (-1); the other features tell nothing."""
    import numpy as np

    from opbench.predict.trials import FEATURE_WIDTH

    xs = [rng.uniform(0, 1, (2, FEATURE_WIDTH)).astype("float32") for _ in range(n)]
    latency = np.array([np.exp(sign * float(x[:, 0].sum())) for x in xs])
    return {"xs": xs, "latency": latency, "group_hash": name}


def _pairwise(score, latency) -> float:
    import numpy as np

    i, j = np.triu_indices(len(latency), 1)
    return float(np.mean((score[i] > score[j]) == (latency[i] < latency[j])))


def test_a_pretrained_model_learns_a_new_tasks_own_order():
    """A model pretrained on tasks where a larger feature 0 is slower, tuning a task where it is faster:
    the pretrained order is wrong there; after the task's first candidates are measured (``learn``), the
    task's own booster turns the ranking of its other candidates its way, while another task keeps the pretrained
    scores."""
    import numpy as np

    from opbench.predict.trials import XGB_PARAMS, TrialsPredictor, rank_booster

    rng = np.random.default_rng(0)
    old = [_synthetic_task(rng, f"old{t}", +1.0) for t in range(6)]
    base = rank_booster({**XGB_PARAMS, "seed": 0}, [x for t in old for x in t["xs"]],
                        np.concatenate([t["latency"].min() / t["latency"] for t in old]), [48] * 6, 60)
    predictor = TrialsPredictor({})
    predictor.boosters = {"trials": base}
    model = predictor.tuning_model()
    new, other = _synthetic_task(rng, "new", -1.0), _synthetic_task(rng, "other", +1.0)
    before = _pairwise(model.score("new", new["xs"][24:]), new["latency"][24:])
    assert before < 0.3  # the pretrained order, reversed on this task
    other_before = model.score("other", other["xs"])
    model.learn("new", new["xs"][:4], new["latency"][:4])
    assert model.task_trained == {"new": 4}
    model.learn("new", new["xs"][4:24], new["latency"][4:24])
    assert model.task_trained == {"new": 24} and model.data_size == 24
    after = _pairwise(model.score("new", new["xs"][24:]), new["latency"][24:])
    assert after > 0.5 and after > before + 0.3  # the candidates it has not seen: turned the task's way
    np.testing.assert_allclose(model.score("other", other["xs"]), other_before)  # no booster of its own


def test_twins_of_measured_or_better_candidates_rank_last():
    """:func:`demote_twins`: a candidate with the features of a measured one, or of a higher-scored one in the
    same call, ranks below every other candidate; the first of each feature set keeps its score, twins keep
    their own order; a pretrained model's ``predict`` path remembers what ``learn`` measured."""
    import numpy as np

    from opbench.predict.trials import (
        FEATURE_WIDTH,
        XGB_PARAMS,
        TrialsPredictor,
        demote_twins,
        feature_key,
        rank_booster,
    )

    rng = np.random.default_rng(2)
    a, b, c, d = (rng.uniform(0, 1, (2, FEATURE_WIDTH)).astype("float32") for _ in range(4))
    xs = [a, a.copy(), b, c, d, d.copy()]
    scores = np.array([5.0, 6.0, 4.0, 1.0, 3.0, 2.0])
    out = demote_twins(scores, xs, {feature_key(c)})
    # a (6.0, the better of the two a's) and b, d (3.0) keep their scores; the second a, c (measured) and the
    # second d fall below 3.0 and below the lowest score, in their own order
    assert out[1] == 6.0 and out[2] == 4.0 and out[4] == 3.0
    assert max(out[0], out[3], out[5]) < scores.min() and out[0] > out[5] > out[3]
    assert list(np.argsort(-out)[:3]) == [1, 2, 4]  # three distinct feature sets first
    np.testing.assert_array_equal(demote_twins(scores[2:5], xs[2:5], set()), scores[2:5])  # no twin: unchanged
    assert feature_key(a) != feature_key(a[:1]) and len(demote_twins(np.zeros(0), [], set())) == 0

    old = [_synthetic_task(rng, f"old{t}", +1.0) for t in range(3)]
    predictor = TrialsPredictor({})
    predictor.boosters = {"trials": rank_booster({**XGB_PARAMS, "seed": 0}, [x for t in old for x in t["xs"]],
                                                 np.concatenate([t["latency"].min() / t["latency"] for t in old]),
                                                 [48] * 3, 20)}
    model = predictor.tuning_model()
    new = _synthetic_task(rng, "new", +1.0)
    model.learn("new", new["xs"][:2], new["latency"][:2])
    assert model.measured_keys == {"new": {feature_key(x) for x in new["xs"][:2]}}


def test_the_search_simulation_finds_more_with_a_model_than_at_random():
    """:func:`simulate_search` on tasks ordered as the pretrained model was taught: its picks reach the task's
    best sooner than random picks; an unknown arm or a pretrained arm without a predictor is refused."""
    import numpy as np

    from opbench.predict.trials import XGB_PARAMS, TrialsPredictor, rank_booster, simulate_search

    rng = np.random.default_rng(1)
    old = [_synthetic_task(rng, f"old{t}", +1.0) for t in range(4)]
    predictor = TrialsPredictor({})
    predictor.boosters = {"trials": rank_booster({**XGB_PARAMS, "seed": 0}, [x for t in old for x in t["xs"]],
                                                 np.concatenate([t["latency"].min() / t["latency"] for t in old]),
                                                 [48] * 4, 60)}
    tasks = [_synthetic_task(rng, f"new{t}", +1.0) for t in range(3)]
    pre = simulate_search(tasks, predictor, "pretrained+task", batch=4, budget=12)
    rand = simulate_search(tasks, None, "random", batch=4, budget=12)
    assert pre["tasks"] == rand["tasks"] == 3 and pre["budget"] == rand["budget"] == 12
    best = pre["best_over_task_best"]
    assert all(a >= b >= 1.0 for a, b in zip(best, best[1:], strict=False))
    assert pre["best_over_task_best"][3] < rand["best_over_task_best"][3]
    with pytest.raises(OpBenchError, match="unknown search arm 'best'"):
        simulate_search(tasks, predictor, "best")
    with pytest.raises(OpBenchError, match="needs a trials predictor"):
        simulate_search(tasks, None, "pretrained")


def test_evaluate_trains_another_model_on_the_same_held_out_folds():
    """``fit=`` replaces the xgboost model: it is trained on each fold's training tasks only, and its scores are
    ranked as the shipped model's are (an oracle that reads the latency from a feature ranks every task right)."""
    import numpy as np

    from opbench.predict import trials

    rng = np.random.default_rng(0)
    tasks = {}
    for m in range(4):
        for t in range(2):
            latency = rng.uniform(1e-5, 1e-3, 6)
            xs = [np.full((2, trials.FEATURE_WIDTH), v, "float32") for v in latency]
            tasks[(f"w{m}{t}", f"t{t}")] = {"xs": xs, "latency": latency, "model": f"m{m}", "models": [f"m{m}"],
                                            "source": "task", "groups": None, "dtype": "float16", "weight": 1.0,
                                            "workload_id": f"w{m}{t}", "task": f"t{t}", "group_hash": f"w{m}{t}"}
    trained = []

    class Oracle:
        def __init__(self, train, seed):
            trained.append({m for task in train for m in task["models"]})

        def _predict(self, xs):
            return -np.array([x[0, 0] for x in xs])

    got = trials.evaluate(tasks, "by_model", k=4, seed=0, fit=Oracle)
    assert got["metrics"]["pairwise"] == 1.0 and got["metrics"]["top1"] == 1.0 and got["n_test"] == 48
    assert len(trained) == len(got["fold_models"]) == 4
    assert all(not (models & set(f["test"])) for models, f in zip(trained, got["fold_models"], strict=True))


@pytest.mark.slow
def test_metaschedules_mlp_is_compared_on_the_same_split(records_slice, tmp_path, monkeypatch):
    """MetaSchedule's own MLP cost model (its trainer fails on current PyTorch without the scheduler shim)
    is evaluated on the same held-out models as the xgboost model; an unknown model is one line."""
    pytest.importorskip("torch")
    from opbench.pipeline.train import task_modules
    from opbench.predict import trials

    monkeypatch.setenv("OPBENCH_CACHE", str(tmp_path / "cache"))
    tasks, _device = trials.trial_examples(str(records_slice[0]), task_modules)
    xgb = trials.evaluate(tasks, "by_model", k=3, seed=0)
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    mlp = trials.evaluate(tasks, "by_model", k=3, seed=0, loss="mlp")
    assert list(temporary.iterdir()) == []  # MetaSchedule's trainer leaves its best weights' file behind: removed
    assert mlp["fold_tasks"] == xgb["fold_tasks"] and mlp["n_test"] == xgb["n_test"] > 0
    m = mlp["metrics"]
    assert 0.0 <= m["pairwise"] <= 1.0 and 0.0 < m["top1"] <= m["top5"] <= 1.0
    with pytest.raises(OpBenchError, match="unknown trials model 'lstm'"):
        trials.evaluate(tasks, "by_model", k=3, seed=0, loss="lstm")


@pytest.mark.slow
def test_candidates_timed_from_graph_replays_rank_among_themselves(records_slice, tmp_path, monkeypatch):
    """A task's records of ``--timer graph`` (config ``sample:s0:graph``) are a group of their own: no ranking
    pair ever sets a graph-timed latency against a time_evaluator one."""
    import shutil
    import sqlite3

    from opbench.pipeline.train import task_modules
    from opbench.predict import trials

    monkeypatch.setenv("OPBENCH_CACHE", str(tmp_path / "cache"))
    path, chosen = records_slice
    mixed = tmp_path / "mixed.sqlite"
    shutil.copy(path, mixed)
    with sqlite3.connect(mixed) as conn:
        conn.row_factory = sqlite3.Row
        rows = [dict(r) for r in conn.execute("SELECT * FROM trials WHERE workload_id=?", (chosen[0],))]
        for r in rows:  # the same candidates again, timed "another way": a tenth of the time
            r.pop("id")
            r.update(config="sample:s0:graph", latency_median_s=r["latency_median_s"] / 10)
            conn.execute(f"INSERT INTO trials ({', '.join(r)}) VALUES ({', '.join('?' * len(r))})", list(r.values()))
    tasks, _ = trials.trial_examples(str(mixed), task_modules)
    mine = {k: t for k, t in tasks.items() if k[0] == chosen[0]}
    assert len(mine) == 2 and len(tasks) == len(chosen) + 1
    plain, graph = (mine[k] for k in sorted(mine, key=len))
    assert len(graph["latency"]) == len(plain["latency"]) == len(rows)
    assert sorted(graph["latency"] * 10) == pytest.approx(sorted(plain["latency"]))
    # each candidate's key in the per-task caches, in the order of its features
    assert sorted(plain["trace_keys"]) == sorted(graph["trace_keys"]) == sorted(trials.trace_key(r["trace"])
                                                                                for r in rows)


def test_the_compiler_figures_give_the_residency_an_sm_allows(monkeypatch):
    """scripts/exp_trials_resources.py: blocks per SM limited by registers (65,536 in units of 256 per warp), by
    warps (64) and by shared memory (228 KiB, 1 KiB more per block), and the waves of the grid at that
    residency; an unknown candidate's columns are NaN; a task is in a share by a stable hash of its id."""
    from pathlib import Path

    import numpy as np

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "scripts"))
    import exp_trials_resources as exp

    figures = np.array([  # registers, stack frame, static smem, threads, blocks, kernels
        [255, 0, 0, 256, 132, 1],       # 8 warps of 8,192 registers each: one block per SM
        [32, 0, 0, 128, 132 * 16, 1],   # 4 warps of 1,024: 16 blocks, every warp of the SM, one wave
        [32, 0, 100_000, 128, 264, 1],  # 101,024 bytes of shared memory a block: 2 blocks, one wave
    ], dtype="float64")
    resident, share, waves, fill = exp.occupancy(figures).T
    assert resident.tolist() == [1, 16, 2] and share.tolist() == [0.125, 1.0, 0.125]
    assert waves.tolist() == [1.0, 1.0, 1.0] and fill.tolist() == [1.0, 1.0, 1.0]
    columns = exp.resource_columns(np.vstack([figures, np.full(6, np.nan)]))
    assert columns.shape == (4, 10) and np.isnan(columns[3]).all() and columns[0, 0] == np.log2(256)
    assert exp.chosen("7782ad337652c85f", 1.0) and not exp.chosen("7782ad337652c85f", 1e-12)
    assert sum(exp.chosen(f"{i:016x}", 0.25) for i in range(4000)) == pytest.approx(1000, rel=0.1)
