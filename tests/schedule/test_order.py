"""The critical-first launch order: ranks, the order it gives, and schedules that stay valid."""

from __future__ import annotations

import random

import pytest

from opbench import OpBenchError
from opbench.pipeline.compare import CompareOptions
from opbench.pipeline.spec import SpecError
from opbench.schedule import IOS, CriticalFirst, Greedy, Nimble, Opara, SchedulingCost, Sequential, get_scheduler
from opbench.schedule.order import SUFFIX, critical_first, upward_ranks

from .test_schedulers import FORK3, dag

# 0 -> 1 -> 2 -> 4 is the long way (latencies 1, 5, 5, 1); 0 -> 3 -> 4 a short branch
LONG_AND_SHORT = dag(5, [(0, 1), (1, 2), (0, 3), (2, 4), (3, 4)])
LATENCY = [1.0, 5.0, 5.0, 1.0, 1.0]


def test_upward_ranks_are_the_longest_way_to_an_output():
    assert upward_ranks(LONG_AND_SHORT, LATENCY.__getitem__) == [12.0, 11.0, 6.0, 2.0, 1.0]
    assert upward_ranks(FORK3, [1.0, 2.0, 3.0, 1.0, 1.0].__getitem__) == [5.0, 3.0, 4.0, 2.0, 1.0]


def test_the_long_way_is_launched_first_on_the_schedule_s_own_streams():
    greedy = Greedy(2).schedule(LONG_AND_SHORT)
    assert greedy.order == [0, 1, 3, 2, 4]  # level by level: the short branch before the long way's second step
    cf = critical_first(greedy, LONG_AND_SHORT, LATENCY.__getitem__)
    assert cf.order == [0, 1, 2, 3, 4] and cf.stream_of == greedy.stream_of
    assert cf.name == "greedy" + SUFFIX and cf.stages is None and cf.meta["order"] == "critical-first"
    # at a fork the longer branch goes first; equal ranks keep the schedule's own order
    cf = critical_first(Opara().schedule(FORK3), FORK3, [1.0, 2.0, 3.0, 1.0, 1.0].__getitem__)
    assert cf.order == [0, 2, 1, 3, 4]
    assert critical_first(Greedy(3).schedule(FORK3), FORK3, lambda op: 1.0).order == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("seed", range(5))
def test_every_scheduler_s_schedule_stays_valid_in_critical_first_order(seed):
    rng = random.Random(seed)
    n = 14
    edges = sorted({(u, v) for v in range(1, n) for u in rng.sample(range(v), min(v, rng.randint(1, 3)))})
    graph = dag(n, edges)
    latency = [rng.uniform(1, 10) for _ in range(n)]
    for scheduler in (Sequential(), Greedy(2), Greedy(4), Nimble(), Opara(), IOS(time_limit_s=2.0)):
        schedule = scheduler.schedule(graph)
        cf = critical_first(schedule, graph, latency.__getitem__)  # validate() checks every edge's happens-before
        assert sorted(cf.order) == list(range(n)) and cf.stream_of == schedule.stream_of
        position = {op: i for i, op in enumerate(cf.order)}
        ranks = upward_ranks(graph, latency.__getitem__)
        # whenever an operator is launched, no ready operator of a higher rank waits
        for i, op in enumerate(cf.order):
            done = set(cf.order[:i])
            ready = [o for o in range(n) if o not in done and all(p in done for p in graph.preds(o))]
            assert ranks[op] == max(ranks[o] for o in ready) and position[op] == i


def test_a_scheduler_name_with_the_suffix_gives_that_scheduler_in_critical_first_order():
    scheduler = get_scheduler("greedy+critical-first", max_streams=2)
    assert isinstance(scheduler, CriticalFirst) and scheduler.name == "greedy+critical-first"
    assert scheduler.inner.max_streams == 2
    cost = SchedulingCost(LONG_AND_SHORT, LATENCY)
    plan = scheduler.schedule(LONG_AND_SHORT, cost)  # the cost's latencies rank the operators
    assert plan.name == "greedy+critical-first" and plan.order == [0, 1, 2, 3, 4]
    assert plan.to_dict() == critical_first(Greedy(2).schedule(LONG_AND_SHORT), LONG_AND_SHORT,
                                            LATENCY.__getitem__).to_dict()
    assert scheduler.schedule(LONG_AND_SHORT).order  # without a cost: the cost model's own latencies
    with pytest.raises(OpBenchError, match="unknown scheduler 'fastest'"):
        get_scheduler("fastest+critical-first")
    CompareOptions(schedulers="sequential,opara+critical-first").validate()
    with pytest.raises(SpecError, match=r"'fastest\+critical-first'.*followed by \+critical-first"):
        CompareOptions(schedulers="sequential,fastest+critical-first").validate()
