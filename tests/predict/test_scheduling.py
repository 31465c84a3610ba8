"""Schedulers on predicted costs: the cost model, the wrapper, and `compare --cost predicted`."""

from __future__ import annotations

import json

import numpy as np
import pytest

from opbench.models import load_workload
from opbench.predict.scheduling import PredictedCost, predicted_schedulers
from opbench.schedule import IOS, SchedulingCost, get_scheduler

from ..helpers import run


class FakeLatency:
    """Every operator takes 10 us, except convolutions: 100 us."""

    def predict(self, ops):
        return np.array([100e-6 if op["kind"] == "conv2d" else 10e-6 for op in ops])


class FakeCorun:
    """Groups run together in their longest member's time."""

    def __init__(self):
        self.calls = 0

    def concurrent(self, members, solo, sms=None):
        self.calls += 1
        return max(solo)


def _graph():
    from opbench.ir import extract_operators
    from opbench.runtime import resolve_target

    workload = load_workload("simple", "branchy:branches=3,depth=2,channels=8,size=8")
    return extract_operators(workload.mod, resolve_target("llvm"))[1]


def test_predicted_cost_uses_the_predictors():
    graph = _graph()
    corun = FakeCorun()
    cost = PredictedCost(graph, FakeLatency(), corun)
    convs = [n.index for n in graph if n.kind == "conv2d"]
    assert cost.latency(convs[0]) == pytest.approx(100e-6)
    branch_a, branch_b = [convs[1]], [convs[3]]
    assert cost.stage_latency([branch_a, branch_b]) == pytest.approx(100e-6 + cost.fork_s)
    assert corun.calls == 1
    cost.stage_latency([branch_a, branch_b])
    assert corun.calls == 1  # memoised
    alone = PredictedCost(graph, FakeLatency())
    assert alone.stage_latency([branch_a, branch_b]) == SchedulingCost.stage_latency(alone, [branch_a, branch_b])


def test_predicted_schedulers_make_valid_named_schedules():
    graph = _graph()
    ios, greedy = predicted_schedulers([IOS(time_limit_s=5), "greedy"], FakeLatency(), FakeCorun())
    for scheduler, name in ((ios, "ios-predicted"), (greedy, "greedy-predicted")):
        plan = scheduler.schedule(graph, cost=None).validate(graph)
        assert plan.name == name and sorted(plan.order) == list(range(len(graph)))
    assert ios.schedule(graph).num_streams == 3  # three equal branches run side by side
    assert get_scheduler(greedy) is greedy


@pytest.mark.slow
def test_compare_with_predicted_costs(tmp_path):
    from opbench.predict import train

    data = tmp_path / "llvm.sqlite"
    for model in ("branchy:branches=3,depth=2,channels=8,size=8", "branchy:branches=2,depth=3,channels=12,size=8",
                  "ios_block:channels=8,size=8"):
        out = run("collect", "--modelsource", "simple", "--modelname", model, "--target", "llvm",
                  "--dataset", str(data), "-q", "--repeat", "2", "--no-check", script=False)
        assert out.returncode == 0, out.stderr
    train(data, "latency", "by_model", tmp_path / "lat.opm", folds=2)
    table = tmp_path / "cmp.json"
    out = run("compare", "--modelsource", "simple", "--modelname", "branchy:branches=2,depth=2,channels=8,size=8",
              "--target", "llvm", "--schedulers", "sequential,greedy,ios", "--cost", "measured,predicted",
              "--predictor", str(tmp_path / "lat.opm"), "--compare-repeat", "2", "--compare-number", "2",
              "--json", str(table), script=False)
    assert out.returncode == 0, out.stderr
    names = [r["schedule"] for r in json.loads(table.read_text())["schedules"]]
    assert names == ["sequential", "greedy", "ios", "greedy-predicted", "ios-predicted"]
    out = run("compare", "--modelsource", "simple", "--modelname", "branchy", "--target", "llvm",
              "--cost", "predicted", script=False)
    assert out.returncode == 2 and "--cost predicted needs --predictor FILE" in out.stderr
    out = run("compare", "--modelsource", "simple", "--modelname", "branchy", "--target", "llvm",
              "--cost", "guessed", script=False)
    assert out.returncode == 2 and "unknown --cost 'guessed' (accepted: measured, predicted" in out.stderr
