"""The parts OpBench adds to MetaSchedule: grid search over a design space, curve features."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("xgboost")


def _matmul_context(n=64):
    import tvm
    from tvm import te
    from tvm.s_tir import meta_schedule as ms

    from opbench.tune.strategies import GridSearch

    a = te.placeholder((n, n), name="A")
    b = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    mod = tvm.IRModule({"main": te.create_prim_func([a, b, c])})
    target = tvm.target.Target({"kind": "llvm", "num-cores": 2})
    return ms.TuneContext(mod=mod, target=target, space_generator="post-order-apply", search_strategy=GridSearch(),
                          task_name="mm")


def test_nth_tiling_enumerates_every_tiling_once():
    from opbench.tune.space import perfect_tilings
    from opbench.tune.strategies import nth_tiling

    for extent, parts, inner in [(64, 4, 64), (12, 3, 4), (7, 2, 16), (48, 4, 8)]:
        count = perfect_tilings(extent, parts, inner)
        tilings = [tuple(nth_tiling(extent, parts, inner, i)) for i in range(count)]
        assert len(set(tilings)) == count
        assert all(math.prod(t) == extent and len(t) == parts and t[-1] <= inner for t in tilings)
        with pytest.raises(IndexError):
            nth_tiling(extent, parts, inner, count)


def test_grid_walks_decisions_in_order_and_resumes():
    from opbench.tune.strategies import _Grid

    ctx = _matmul_context()
    spaces = ctx.generate_design_space()
    grid = _Grid(spaces[0])
    sizes = [n for _, n, _ in grid.digits]
    assert grid.size == math.prod(sizes) > 1000
    first, second = grid.decisions(0), grid.decisions(1)
    changed = [inst for inst in first if str(first[inst]) != str(second[inst])]
    assert changed == [grid.digits[-1][0]]  # the last decision varies fastest
    assert len({str(sorted(map(str, grid.decisions(i).values()))) for i in range(50)}) == 50

    strategy = ctx.search_strategy
    strategy.pre_tuning(6, 6, spaces, None, None)
    batch = strategy.generate_measure_candidates()
    assert len(batch) == 6
    # sketches interleaved: candidate 0 is sketch 0 at position 0 with exactly those decisions
    def plain(d):
        return [int(x) for x in d] if hasattr(d, "__len__") else int(d)

    trace = batch[0].sch.trace
    decided = [plain(trace.decisions[i]) for i in trace.insts
               if i.kind.name in ("SamplePerfectTile", "SampleCategorical") and i in trace.decisions]
    want = grid.decisions(0)
    assert decided == [plain(want[i]) for i in spaces[0].trace.insts if i in want]
    assert strategy.generate_measure_candidates() is None  # budget spent
    strategy.post_tuning()


def test_curve_features_of_a_matmul():
    from tvm.s_tir import Schedule

    from opbench.tune.models import CURVE_BUFFERS, CURVE_POINTS, _accesses, curve_row

    ctx = _matmul_context(16)
    sch = Schedule(ctx.mod)
    accesses = {name: (loops, used) for name, loops, used in _accesses(sch.mod["main"])}
    assert set(accesses) == {"A", "B", "C"}
    loops, used = accesses["A"]
    assert [e for _, e in loops] == [16, 16, 16]  # i, j, k
    assert {str(v) for v in used} == {"i", "k"}
    row = curve_row(sch.mod["main"]).reshape(CURVE_BUFFERS, CURVE_POINTS, 2)
    lg = math.log2
    # levels: k alone, then k and j, then all three (and the last level repeated); (touched, reuse)
    expected = {
        "C": [(lg(2), lg(17)), (lg(17), lg(17)), (lg(257), lg(17))],  # reused across k
        "A": [(lg(17), lg(2)), (lg(17), lg(17)), (lg(257), lg(17))],  # reused across j
        "B": [(lg(17), lg(2)), (lg(257), lg(2)), (lg(257), lg(17))],  # reused across i only
    }
    for i, name in enumerate(["C", "A", "B"]):  # ties keep the order of first access
        want = expected[name] + [expected[name][-1]] * (CURVE_POINTS - 3)
        np.testing.assert_allclose(row[i], np.array(want), rtol=1e-6, err_msg=name)
    assert not row[3:].any()
