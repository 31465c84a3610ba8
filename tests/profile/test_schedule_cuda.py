"""Timing of scheduled runs on the GPU: operator times from one captured run, stage times with
barriers, measured IOS stages."""

from __future__ import annotations

import pytest

from opbench.profile.schedule import measured_stage_cost, operator_times, stage_times, time_ops
from opbench.runtime.backend import TorchBackend
from opbench.schedule import IOS, get_scheduler

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def backend():
    from opbench.models import load_workload

    w = load_workload("local", "googlenet", 1, image_size=96)
    model = w.torch_module.cuda().eval()
    return TorchBackend(model, [torch.from_numpy(w.example_inputs()[0]).cuda()])


def test_operator_times_add_up_to_the_sequential_run(backend):
    times = operator_times(backend, repeat=5)
    whole = sorted(time_ops(backend, range(len(backend.graph)), repeat=5, number=10))[2]
    assert len(times) == len(backend.graph) and min(times) >= 0.0
    views = [i for i, n in enumerate(backend.graph) if n.kind in ("view", "reshape", "flatten")]
    assert all(times[i] < 2e-6 for i in views)  # a view launches nothing
    assert 0.7 * whole < sum(times) < 1.3 * whole, (sum(times), whole)


def test_stage_times_and_measured_ios(backend):
    graph = backend.graph
    sequential = [[[op]] for op in range(len(graph))]
    per_stage = stage_times(backend, sequential, repeat=5)
    whole = sorted(time_ops(backend, range(len(graph)), repeat=5, number=10))[2]
    assert 0.7 * whole < sum(per_stage) < 1.3 * whole
    cost = measured_stage_cost(backend, repeat=3, number=5)
    ios = IOS(time_limit_s=30, stage_cost=cost, name="ios-measured").schedule(graph)
    assert ios.name == "ios-measured" and ios.meta["stage_evaluations"] >= len(cost.memo) > 10
    ios.validate(graph)
    staged = stage_times(backend, ios.stages, repeat=5)
    # one time per stage of IOS's schedule (whether concurrent stages are faster is a benchmark's question:
    # scripts/bench_parallel.py; the GPU is shared with other tests here)
    assert len(staged) == len(ios.stages) and all(t >= 0 for t in staged) and sum(staged) > 0  # a view: 0
    assert get_scheduler("sequential").schedule(graph).num_streams == 1
