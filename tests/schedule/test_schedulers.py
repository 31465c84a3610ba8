"""Schedulers on small DAGs with known optimal answers; the Schedule data model."""

from __future__ import annotations

import pytest

from opbench import OpBenchError
from opbench.ir.graph import ArgRef, OpGraph, OpNode
from opbench.schedule import IOS, Greedy, Nimble, Opara, Schedule, SchedulingCost, Sequential, get_scheduler
from opbench.schedule.nimble import hopcroft_karp
from opbench.schedule.opara import allocate_streams, launch_order


def dag(n: int, edges: list[tuple[int, int]], flops=None, nbytes=None) -> OpGraph:
    nodes = []
    for v in range(n):
        args = [ArgRef("node", u) for u, w in edges if w == v]
        nodes.append(OpNode(index=v, func=f"f{v}", task=f"t{v}", kind="elementwise", ops=[], attrs={}, args=args,
                            input_shapes=[], input_dtypes=[], output_shapes=[(1,)], output_dtypes=["float32"],
                            flops=(flops or [1.0] * n)[v], bytes=(nbytes or [1] * n)[v]))
    return OpGraph(nodes, [], [], [])


DIAMOND = dag(4, [(0, 1), (0, 2), (1, 3), (2, 3)])
FORK3 = dag(5, [(0, 1), (0, 2), (0, 3), (1, 4), (2, 4), (3, 4)])


def test_sequential():
    s = Sequential().schedule(FORK3).validate(FORK3)
    assert s.num_streams == 1 and s.num_events == 0 and s.order == [0, 1, 2, 3, 4]


def test_nimble_minimum_path_cover_and_events():
    s = Nimble().schedule(DIAMOND).validate(DIAMOND)
    assert s.num_streams == 2  # |V| - |M| = 4 - 2
    assert s.num_events == 2  # the two unmatched reduced edges
    # a transitive edge is removed first: 0->1->2 plus 0->2 is one chain, no events
    chain = dag(3, [(0, 1), (1, 2), (0, 2)])
    s = Nimble().schedule(chain).validate(chain)
    assert s.num_streams == 1 and s.events == []
    s = Nimble().schedule(FORK3).validate(FORK3)
    assert s.num_streams == 3 and s.num_events == 4


def test_hopcroft_karp_maximum():
    # left 0..3, right 0..3; a perfect matching exists only by augmenting
    adj = [[0, 1], [0], [1, 2], [2, 3]]
    match = hopcroft_karp(4, adj)
    assert sorted(m for m in match if m != -1) == [0, 1, 2, 3]


def test_opara_alg1_streams():
    assert allocate_streams(FORK3, 32) == [0, 0, 1, 2, 0]
    s = Opara(reorder=False).schedule(FORK3).validate(FORK3)
    assert s.num_streams == 3 and s.num_events == 4
    # capped at 2 streams: op 3 joins the stream whose last operator came earliest
    assert allocate_streams(FORK3, 2) == [0, 0, 1, 0, 0]
    # a finished stream is reused: 0 -> 1 -> 3 and 0 -> 2 -> 3 -> 4, 5 after 3
    g = dag(6, [(0, 1), (0, 2), (1, 3), (2, 3), (3, 4), (3, 5)])
    streams = allocate_streams(g, 32)
    assert streams[5] in (streams[2], streams[1]) and len(set(streams)) == 2


def test_opara_alg2_alternates_queues():
    # four independent operators after a source: 1, 2 compute-bound; 3, 4 memory-bound
    g = dag(5, [(0, 1), (0, 2), (0, 3), (0, 4)], flops=[1, 1000, 900, 1, 2], nbytes=[100, 10, 10, 10, 10])
    cost = SchedulingCost(g, ridge=5.0)
    order = launch_order(g, cost)
    assert order[0] == 0
    kinds = [cost.compute_bound(v) for v in order[1:]]
    assert kinds == [True, False, True, False]
    s = Opara().schedule(g, cost).validate(g)
    assert s.order == order


def test_greedy_wavefronts_capped():
    g = dag(6, [(0, 1), (0, 2), (0, 3), (0, 4), (1, 5), (2, 5), (3, 5), (4, 5)])
    s = Greedy(max_streams=2).schedule(g).validate(g)
    assert [sorted(op for grp in st for op in grp) for st in s.stages] == [[0], [1, 2, 3, 4], [5]]
    assert all(len(st) <= 2 for st in s.stages) and s.num_streams == 2


def _max_group_cost(latency):
    return lambda groups: max(sum(latency[i] for i in g) for g in groups)


def test_ios_dp_optimal_cost():
    # chain 0->1->2 (1 each) beside an independent op 3 (3): one stage of two groups costs 3
    g = dag(4, [(0, 1), (1, 2)])
    lat = [1, 1, 1, 3]
    s = IOS(r=3, s=8).schedule(g, _max_group_cost(lat)).validate(g)
    assert s.meta["predicted_s"] == 3 and len(s.stages) == 1
    # r=1: groups of one operator each; the best is 5 (e.g. {2,3}, {1}, {0})
    s = IOS(r=1, s=8).schedule(g, _max_group_cost(lat)).validate(g)
    assert s.meta["predicted_s"] == 5
    assert all(len(grp) == 1 for st in s.stages for grp in st)
    # s=1: one group per stage, so 3 cannot overlap the chain: 1 + 1 + 1 + 3 at best, or 3+3
    s = IOS(r=3, s=1).schedule(g, _max_group_cost(lat)).validate(g)
    assert s.meta["predicted_s"] == 6


def test_ios_merge_strategy_known_answers():
    """IOS's merge: FORK3's three middle operators may merge (cost m) or run concurrently (cost
    max of the groups = 2). The DP takes the merge exactly where it is cheaper, and only for a
    stage of operators the merge cost accepts."""
    lat = [1, 2, 2, 2, 1]
    cost = _max_group_cost(lat)

    def merge(m):
        return lambda ops: m if set(ops) <= {1, 2, 3} else None

    s = IOS(merge=merge(1.5)).schedule(FORK3, cost).validate(FORK3)
    assert s.meta["predicted_s"] == 3.5 and s.meta["merged"] == [[1, 2, 3]]
    assert s.meta["strategies"] == ["sequential", "merge", "sequential"]
    assert s.stages[1] == [[1, 2, 3]]  # one group until the backend runs it as one operator
    s = IOS(merge=merge(2.5)).schedule(FORK3, cost).validate(FORK3)
    assert s.meta["predicted_s"] == 4 and s.meta["merged"] == []
    assert s.meta["strategies"] == ["sequential", "concurrent", "sequential"]
    # a merge of two plus the third beside it is never a stage: 1.5 + 2 > 2 concurrent
    s = IOS(merge=lambda ops: 1.0 if set(ops) <= {1, 2} else None).schedule(FORK3, cost)
    assert s.meta["predicted_s"] == 4 and s.meta["merged"] == []
    assert "merged" not in IOS().schedule(FORK3, cost).meta  # without a merge cost: IOS as before


def test_ios_blocks_and_cost_model():
    g = dag(7, [(0, 1), (0, 2), (1, 3), (2, 3), (3, 4), (3, 5), (4, 6), (5, 6)])
    s = IOS().schedule(g, SchedulingCost(g)).validate(g)
    assert sorted(op for st in s.stages for grp in st for op in grp) == list(range(7))


def test_json_round_trip(tmp_path):
    s = IOS().schedule(FORK3)
    path = tmp_path / "s.json"
    s.save(path)
    back = Schedule.load(path).validate(FORK3)
    assert back.to_dict() == s.to_dict()
    assert "stage 0" in back.describe()


def test_validation_names_the_edge(tmp_path):
    s = Opara(reorder=False).schedule(FORK3)
    bad = Schedule("bad", s.stream_of, s.order, [e for e in s.events if e != (0, 2)])
    with pytest.raises(OpBenchError, match=r"edge 0->2 crosses from stream 0 to 1 without an event"):
        bad.validate(FORK3)
    wrong = Schedule("wrong", [0] * 5, [1, 0, 2, 3, 4], [])
    with pytest.raises(OpBenchError, match=r"edge 0->1 is launched in the wrong order"):
        wrong.validate(FORK3)
    with pytest.raises(OpBenchError, match="the graph has 5"):
        Schedule("short", [0, 0], [0, 1], []).validate(FORK3)
    (tmp_path / "x.json").write_text('{"name": "x"}')
    with pytest.raises(OpBenchError, match="bad schedule data"):
        Schedule.load(tmp_path / "x.json")


def test_unknown_scheduler():
    with pytest.raises(OpBenchError, match="unknown scheduler 'fastest'"):
        get_scheduler("fastest")
    obj = Greedy(3)
    assert get_scheduler(obj) is obj


def _half_gpu(n: int) -> dict[int, dict]:
    """Kernel resources that fill half of a 2-SM device each (one block of a full SM's threads)."""
    return {i: {"grid": [1, 1, 1], "threads": 1024, "occupancy": 1.0} for i in range(n)}


def test_predicted_schedule_latency_known_answers():
    # FORK3: 0 -> {1, 2, 3} -> 4, every operator 1 ms alone
    half = SchedulingCost(FORK3, [1e-3] * 5, _half_gpu(5), sm_count=2, threads_per_sm=1024, fork_s=0.0)
    assert half.demand(1) == 0.5
    assert half.predict(Sequential().schedule(FORK3)) == pytest.approx(5e-3)
    # three branches at half the GPU each share it: 1.5 ms for the middle, 3.5 ms in all
    assert half.predict(Greedy().schedule(FORK3)) == pytest.approx(3.5e-3)
    cores = SchedulingCost(FORK3, [1e-3] * 5, demand=0.5, fork_s=0.0)  # two cores, one per kernel
    assert cores.predict(Greedy().schedule(FORK3)) == pytest.approx(3.5e-3)
    full = SchedulingCost(FORK3, [1e-3] * 5, {}, sm_count=1, threads_per_sm=1, fork_s=0.0)
    assert full.demand(1) == 1.0  # a GPU-filling operator gains nothing from a second stream
    assert full.predict(Greedy().schedule(FORK3)) == pytest.approx(5e-3)
    # two streams with two chains: 0->2 and 1->3, no dependency between them, half the GPU each
    chains = dag(4, [(0, 2), (1, 3)])
    cost = SchedulingCost(chains, [1e-3, 2e-3, 1e-3, 2e-3], _half_gpu(4), sm_count=2, threads_per_sm=1024,
                          fork_s=1e-6)
    two = Schedule("two", [0, 1, 0, 1], [0, 1, 2, 3], [])
    assert cost.predict(two) == pytest.approx(4e-3 + 1e-6)


def test_scheduling_cost_takes_the_device_figures():
    cost = SchedulingCost.for_device(FORK3, device={"sm_count": 78, "peak_flops": 1e12, "bandwidth": None,
                                                    "name": "a GPU"})
    assert cost.sm_count == 78 and cost.peak_flops == 1e12 and cost.bandwidth == 3.35e12  # unknown: default
    assert SchedulingCost.for_device(FORK3).sm_count == 132
