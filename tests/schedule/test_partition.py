"""SM partitions: the Schedule's partition (JSON, validation, device checks), the simulation and the policy."""

from __future__ import annotations

import json

import pytest

from opbench import OpBenchError
from opbench.schedule import Greedy, Opara, Schedule, SchedulingCost, SmPartitioner, critical_ops
from opbench.schedule.partition import _split_budget

from .test_schedulers import FORK3, dag

# an inception-like block: 0 -> {1 -> 2 (the long branch), 3, 4} -> 5
BLOCK = dag(6, [(0, 1), (1, 2), (0, 3), (0, 4), (2, 5), (3, 5), (4, 5)])
TIMES = [1e-4, 4e-4, 4e-4, 1e-4, 2e-4, 1e-4]


def _cost(demand: float = 0.9, times=TIMES, graph=BLOCK) -> SchedulingCost:
    return SchedulingCost(graph, times, demand=demand, sm_count=132)


def _partitioned() -> Schedule:
    plan = Opara(reorder=False).schedule(BLOCK)
    streams = max(plan.stream_of) + 1
    return plan.with_partition([32, 96], [1] + [0] * (streams - 1), "opara+sm")


def test_partition_round_trips_through_json(tmp_path):
    plan = _partitioned()
    path = tmp_path / "s.json"
    plan.save(path)
    data = json.loads(path.read_text())
    assert data["sm_partition"] == {"groups": [32, 96], "streams": plan.sm_group_of}
    back = Schedule.load(path).validate(BLOCK)
    assert back.sm_groups == [32, 96] and back.sm_group_of == plan.sm_group_of and back.partitioned
    assert back.sms_of(0) == 96 and back.sms_of(1) == 32
    assert max(plan.stream_of) == 2 and back.partition_label() == "0=96; 1,2=32"
    wide = Schedule("w", [0, 1, 2, 3, 4, 5], list(range(6)), [], sm_groups=[8, 16], sm_group_of=[None, 0, 0, 0, 1, 0])
    assert wide.partition_label() == "1-3,5=8; 4=16"
    plain = Opara(reorder=False).schedule(BLOCK)  # no partition: no key, the whole GPU everywhere
    assert "sm_partition" not in plain.to_dict() and plain.sms_of(0) is None and plain.partition_label() == "-"


@pytest.mark.parametrize("value, message", [
    ([32], "must be an object with 'groups'"),
    ({"groups": [32]}, "must be an object with 'groups'"),
    ({"groups": [], "streams": [None, None, None]}, "must list positive SM counts"),
    ({"groups": [0], "streams": [0, None, None]}, "must list positive SM counts"),
    ({"groups": [32.0], "streams": [0, None, None]}, "holds 32.0, not an integer"),
    ({"groups": [32], "streams": [0, None]}, "'streams' has 2 entries; the schedule has 3 streams"),
    ({"groups": [32], "streams": [0, "a", None]}, "must list a group index or null"),
    ({"groups": [32], "streams": [0, 1, None]}, "stream 1 is in group 1, outside 0..0"),
])
def test_a_bad_partition_is_one_line(value, message):
    data = Opara(reorder=False).schedule(FORK3).to_dict()
    assert max(data["stream_of"]) + 1 == 3
    data["sm_partition"] = value
    with pytest.raises(OpBenchError, match=message) as err:
        Schedule.from_dict(data)
    assert "\n" not in str(err.value)


def test_a_partition_the_gpu_cannot_make_is_refused():
    plan = _partitioned()
    assert plan.check_sm(132, 8) is plan
    too_many = r"^schedule 'opara\+sm': 128 SMs \(32\+96\) asked for; GPU X can partition 104$"
    with pytest.raises(OpBenchError, match=too_many):
        plan.check_sm(104, 8, "GPU X")
    odd = plan.with_partition([20, 96], plan.sm_group_of)
    with pytest.raises(OpBenchError, match="group of 20 SMs asked for; this GPU makes groups of whole multiples of 8"):
        odd.check_sm(132, 8)
    assert odd.check_sm(132, 4) is odd  # a device with a finer granule takes it


def test_the_simulation_confines_a_stream_to_its_share():
    chain = dag(2, [(0, 1)])
    one = Schedule("one", [0, 1], [0, 1], [(0, 1)])
    cost = SchedulingCost(chain, [1e-3, 1e-3], demand=1.0, sm_count=128)
    assert cost.predict(one) == pytest.approx(2e-3 + cost.fork_s)
    half = one.with_partition([64], [None, 0])  # operator 1 on half the SMs: twice as long
    assert cost.predict(half) == pytest.approx(3e-3 + cost.fork_s)
    # two full-GPU operators side by side share the GPU and both end at 2 ms; with one confined to 32
    # SMs of 128, the other runs at 1 / 1.25 of its speed and ends first, at 1.25 ms (the confined
    # one then runs on alone, at a quarter of its speed: the model never makes a partition look free)
    pair = dag(2, [])
    both = Schedule("both", [0, 1], [0, 1], [])
    cost = SchedulingCost(pair, [1e-3, 1e-3], demand=1.0, sm_count=128)
    timeline: list = []
    assert cost.predict(both, timeline) == pytest.approx(2e-3 + cost.fork_s)
    assert {op: end for op, _, _, end in timeline} == pytest.approx({0: 2e-3, 1: 2e-3})
    confined = both.with_partition([32], [None, 0])
    timeline = []
    assert cost.predict(confined, timeline) == pytest.approx(1.25e-3 + 3e-3 + cost.fork_s)
    assert {op: end for op, _, _, end in timeline} == pytest.approx({0: 1.25e-3, 1: 4.25e-3})
    # an operator that fills only 20 % of the GPU is not slowed by a 32-SM (25 %) partition
    small = SchedulingCost(pair, [1e-3, 1e-3], demand=0.2, sm_count=128)
    assert small.predict(confined) == pytest.approx(small.predict(both))


def test_critical_ops_follow_the_longest_chain():
    assert critical_ops(BLOCK, TIMES.__getitem__) == [0, 1, 2, 5]
    assert critical_ops(dag(0, []), lambda op: 0.0) == []


def test_budget_split_in_whole_granules():
    assert _split_budget(32, [8.0, 8.0], 8) == [16, 16]
    assert _split_budget(32, [30.0, 10.0], 8) == [24, 8]
    assert _split_budget(32, [100.0, 1.0, 1.0], 8) == [16, 8, 8]  # at least one granule each
    assert _split_budget(16, [1.0, 1.0, 1.0], 8) is None  # fewer granules than streams


def test_the_policy_keeps_the_critical_stream_on_most_sms():
    plan = Opara(reorder=False).schedule(BLOCK)
    cost = _cost()
    main, side = SmPartitioner(132, 8).roles(plan, cost)
    assert main == [plan.stream_of[1]] and plan.stream_of[1] == plan.stream_of[2]
    assert sorted(side) == sorted(set(plan.stream_of) - set(main)) and len(side) == 2
    variants = SmPartitioner(132, 8).variants(plan, cost)
    names = [p.name for p, _ in variants]
    assert len(names) == len(set(names)) == 9  # 3 budgets x 3 layouts (16, 32 and 64 SMs)
    predicted = [t for _, t in variants]
    assert predicted == sorted(predicted)
    for p, _ in variants:
        p.validate(BLOCK).check_sm(132, 8)
        layout, budget = p.meta["sm_layout"], p.meta["sm_budget"]
        assert budget in (16, 32, 64) and p.name == f"opara+sm-{layout}{budget}"
        assert all(p.sms_of(s) is not None and p.sms_of(s) <= budget for s in side)
        if layout == "split":  # the critical stream gets the SMs the branches do not
            assert p.sms_of(main[0]) == (132 - budget) // 8 * 8
        else:
            assert p.sms_of(main[0]) is None
        if layout == "each":
            assert sum(p.sm_groups) == budget and len(p.sm_groups) == 2
    # demand decides: branches filling 5 % of the GPU (7 SMs) lose nothing on 16 SMs; ones filling 90 % do
    heavy = {p.name: t for p, t in variants}
    light_cost = _cost(demand=0.05)
    light = {p.name: t for p, t in SmPartitioner(132, 8).variants(plan, light_cost)}
    assert light["opara+sm-shared16"] == pytest.approx(light_cost.predict(plan))
    assert heavy["opara+sm-shared16"] > cost.predict(plan)
    assert heavy["opara+sm-split16"] > heavy["opara+sm-shared16"]  # the critical path loses SMs when split


def test_no_partition_without_side_streams():
    chain = dag(3, [(0, 1), (1, 2)])
    plan = Greedy().schedule(chain)
    assert SmPartitioner(132, 8).variants(plan, SchedulingCost(chain, [1e-4] * 3)) == []


def test_budgets_below_one_granule_are_skipped():
    plan = Opara(reorder=False).schedule(BLOCK)
    variants = SmPartitioner(40, 8, budgets=(0.1, 0.25)).variants(plan, _cost())
    assert {p.meta["sm_budget"] for p, _ in variants} == {8}  # 4 SMs is below a granule; 10 rounds to 8
    assert {p.meta["sm_layout"] for p, _ in variants} == {"shared", "split"}  # 8 SMs hold no granule per branch


def test_candidates_take_the_best_of_each_budget():
    plan = Opara(reorder=False).schedule(BLOCK)
    part = SmPartitioner(132, 8)
    candidates = part.candidates(plan, _cost())
    best = {}
    for p, _ in part.variants(plan, _cost()):
        best.setdefault(p.meta["sm_budget"], p.name)
    assert sorted(p.name for p, _ in candidates) == sorted(best.values()) and len(candidates) == 3
    assert [p.name for p, _ in part.candidates(plan, _cost(), top=1)] == [candidates[0][0].name]


def test_the_roofline_uses_tensor_cores_for_half_precision():
    from opbench.ir.graph import OpGraph, OpNode

    def node(i, dtype):
        return OpNode(index=i, func=f"f{i}", task=f"t{i}", kind="matmul", ops=[], attrs={}, args=[], input_shapes=[],
                      input_dtypes=[dtype], output_shapes=[(1,)], output_dtypes=[dtype], flops=1e12, bytes=1)

    graph = OpGraph([node(0, "float32"), node(1, "float16"), node(2, "bfloat16")], [], [], [])
    cost = SchedulingCost(graph, launch_s=0.0)  # an H100's figures: 67 TFLOP/s fp32, 989 on tensor cores
    assert cost.latency(0) == pytest.approx(1e12 / 67e12)
    assert cost.latency(1) == pytest.approx(1e12 / 989e12) == pytest.approx(cost.latency(2))
    other = SchedulingCost(graph, launch_s=0.0, peak_flops=20e12)  # a device without known tensor cores
    assert other.latency(1) == pytest.approx(other.latency(0)) == pytest.approx(1e12 / 20e12)
