"""The ExtractOperators pass: inside a user pipeline, graph structure, features, tasks."""

from __future__ import annotations

import pytest
import tvm
from tvm import relax

from opbench import OpBenchError
from opbench.ir import ExtractOperators, extract_operators
from opbench.models import load_workload


def test_pass_inside_user_pipeline():
    w = load_workload("simple", "ios_block", 1)
    extract = ExtractOperators()
    seen = {}

    @tvm.transform.module_pass(opt_level=0, name="UserPass")
    def user_pass(mod, _ctx):
        seen["bindings"] = len(mod["main"].body.blocks[0].bindings)
        return mod

    assert isinstance(extract, tvm.transform.Pass)
    lowered = tvm.transform.Sequential([extract, user_pass, relax.transform.DeadCodeElimination()])(w.mod)
    graph = extract.graph
    assert graph is not None and len(graph) == 5
    assert seen["bindings"] == 5
    # every binding of the lowered main is a call_tir
    for binding in lowered["main"].body.blocks[0].bindings:
        assert binding.value.op == tvm.ir.Op.get("relax.call_tir")


def test_ios_block_graph():
    _, graph = extract_operators(load_workload("simple", "ios_block:channels=8,size=10", 1).mod)
    kinds = [n.kind for n in graph]
    assert kinds.count("conv2d") == 4 and kinds[-1] == "concat"
    concat = graph[len(graph) - 1]
    assert len(graph.preds(concat.index)) == 3
    convs = [n for n in graph if n.kind == "conv2d"]
    assert all(n.attrs["padding"] == [1, 1, 1, 1] and n.attrs["groups"] == 1 for n in convs)
    assert all(n.ops == ["nn.conv2d", "nn.relu"] for n in convs)
    # three convs read the input, one reads another conv
    from_input = [n for n in convs if any(a.kind == "input" for a in n.args)]
    assert len(from_input) == 3
    # 3x3 conv 8->8 on 10x10: 2*8*8*9*100 multiply-adds plus relu
    assert convs[0].flops >= 2 * 8 * 8 * 9 * 100
    assert convs[0].bytes == 4 * (8 * 100 + 8 * 8 * 9 + 8 * 100)
    assert concat.output_shapes == [(1, 24, 10, 10)]
    # the four convolutions have identical shapes: one kernel (task) used four times
    tasks = graph.tasks()
    assert sorted(t.count for t in tasks.values()) == [1, 4]
    assert {n.task for n in convs} == {next(t for t in tasks.values() if t.count == 4).task}


def test_matmul_flops_and_edges():
    _, graph = extract_operators(load_workload("simple", "matmul_matmul_add:n=64", 1).mod)
    assert len(graph) == 2
    mm = graph[0]
    assert mm.kind == "matmul" and mm.flops == 2 * 64**3
    assert graph.edges == [(0, 1)]
    assert graph[1].ops == ["matmul", "add"]


def test_branchy_parallel_branches():
    _, graph = extract_operators(
        load_workload("simple", "branchy:branches=4,depth=3,channels=8,size=8", 1).mod)
    assert len(graph) == 1 + 4 * 3 + 2  # stem, chains, concat, 1x1 conv
    stem = graph[0]
    assert len(graph.succs(stem.index)) == 4
    # antichain: the first conv of each branch depends on the stem only
    firsts = graph.succs(stem.index)
    assert all(graph.preds(f) == [stem.index] for f in firsts)


@pytest.mark.slow
def test_torch_model_ops_and_attrs():
    w = load_workload("local", "resnet-18", 1, image_size=32)
    _, graph = extract_operators(w.mod)
    first = graph[0]
    assert first.kind == "conv2d" and first.attrs["strides"] == [2, 2]
    assert first.ops[0] == "nn.conv2d" and "nn.relu" in first.ops  # conv + bn + relu fused
    assert graph[1].kind == "pool"
    assert graph[len(graph) - 1].kind == "matmul"
    assert len(graph.tasks()) < len(graph)


def test_already_lowered_module_is_walked():
    lowered, graph = extract_operators(load_workload("simple", "ios_block", 1).mod)
    again, graph2 = extract_operators(lowered)
    assert len(graph2) == len(graph)
    assert [n.func for n in graph2] == [n.func for n in graph]


def test_module_without_main():
    with pytest.raises(OpBenchError, match="no Relax function to extract"):
        extract_operators(tvm.IRModule())
    mod = load_workload("simple", "ios_block", 1).mod
    with pytest.raises(OpBenchError, match=r"no Relax function 'forward' \(it has: main\)"):
        extract_operators(mod, func_name="forward")


def _nn_export():
    """A two-branch block written with tvm.relax.frontend.nn, exported: its entry is ``forward``."""
    from tvm.relax.frontend import nn

    class Block(nn.Module):
        def __init__(self):
            self.a = nn.Linear(16, 32)
            self.b = nn.Linear(16, 32)

        def forward(self, x: nn.Tensor):
            return nn.op.add(nn.op.relu(self.a(x)), self.b(x))

    mod, params = Block().export_tvm(spec={"forward": {"x": nn.spec.Tensor((4, 16), "float32")}})
    return mod, params


def test_pass_on_an_nn_module_export():
    mod, params = _nn_export()
    assert "main" not in [gv.name_hint for gv in mod.get_global_vars()]
    extract = ExtractOperators()
    lowered = extract(mod)
    graph = extract.graph
    assert extract.entry == "forward" and "forward" in [gv.name_hint for gv in lowered.get_global_vars()]
    kinds = sorted(n.kind for n in graph)
    assert len(graph) >= 3 and kinds.count("matmul") + kinds.count("dense") >= 2, kinds
    # the inputs are x and the exported parameters, in the function's order
    assert graph.input_specs[0] == ("x", (4, 16), "float32") and len(graph.input_specs) == 1 + len(params)
    last = graph[len(graph) - 1]
    assert last.output_shapes == [(4, 32)] and len(graph.preds(last.index)) >= 1
    _, named = extract_operators(mod, func_name="forward")
    assert [n.func for n in named] == [n.func for n in graph]


def test_merge_known_answer_on_the_ios_block():
    """IOS's merge on its sample block: the three convolutions of the input become one of 24 output
    channels, sliced; the fourth (on a branch's output) stays; every schedule's output is unchanged."""
    import numpy as np

    from opbench.ir.merge import merge_sibling_convs, sibling_groups
    from opbench.pipeline.compile import tvm_backend, tvm_ios_merges
    from opbench.runtime import resolve_target
    from opbench.runtime.executor import ParallelExecutor
    from opbench.schedule import SCHEDULERS, get_scheduler

    w = load_workload("simple", "ios_block:channels=8,size=10", 1)
    assert [len(g) for g in sibling_groups(w.mod["main"])] == [3]
    merged_mod, count = merge_sibling_convs(w.mod)
    assert count == 1 and merge_sibling_convs(merged_mod)[1] == 0  # nothing left to merge
    target = resolve_target("llvm")
    plain, merged = tvm_backend(w, target), tvm_backend(w, target, merge=True)
    convs = [n for n in merged.graph if "nn.conv2d" in n.ops]
    assert len(merged.graph) == 4 and len(convs) == 2
    assert convs[0].output_shapes == [(1, 24, 10, 10)] and convs[0].input_shapes[1] == (24, 8, 3, 3)
    expected = ParallelExecutor(plain, get_scheduler("sequential").schedule(plain.graph)).run()[0].numpy().copy()
    for name in SCHEDULERS:
        out = ParallelExecutor(merged, get_scheduler(name).schedule(merged.graph)).run()[0].numpy()
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    # IOS's choice: with operators of a second each the merged kernel (timed) wins, of a nanosecond it loses
    assert tvm_ios_merges(w.mod, "main", plain, merged, latencies=[1.0] * len(plain.graph), repeat=3) == [0]
    assert tvm_ios_merges(w.mod, "main", plain, merged, latencies=[1e-9] * len(plain.graph), repeat=3) == []
    assert merge_sibling_convs(w.mod, only=[])[1] == 0
    chosen = tvm_backend(w, target, merge="ios", repeat=3)
    assert len(chosen.graph) in (len(plain.graph), len(merged.graph))
    out = ParallelExecutor(chosen, get_scheduler("ios").schedule(chosen.graph)).run()[0].numpy()
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_a_reshape_view_between_kernels_is_replayed_as_a_view():
    """A reshape that lowering leaves as ``vm.builtin.reshape`` (seen in gpt2 at fp16 on CUDA) is no kernel:
    the consumer reads its producer's output through a view, and the replay equals the model."""
    import numpy as np
    from tvm.script import relax as R

    from opbench.runtime import OperatorKernels, build_module, flatten_outputs, relative_error

    @tvm.script.ir_module
    class Viewed:
        @R.function
        def main(x: R.Tensor((4, 8), "float32"), w: R.Tensor((8, 16), "float32"),
                 v: R.Tensor((8, 4), "float32")) -> R.Tensor((32,), "float32"):
            with R.dataflow():
                a = R.matmul(x, w)
                b = R.call_pure_packed("vm.builtin.reshape", a, R.shape([8, 8]),
                                       ty_args=R.Tensor((8, 8), "float32"))
                c = R.matmul(b, v)
                d = R.call_pure_packed("vm.builtin.reshape", c, R.shape([32]), ty_args=R.Tensor((32,), "float32"))
                R.output(d)
            return d

    target = tvm.target.Target("llvm")
    lowered, graph = extract_operators(Viewed, target)
    assert len(graph) == 2  # the two matmuls; the reshapes are views
    assert graph[1].args[0].kind == "node" and graph[1].args[0].shape == (8, 8)
    assert graph.outputs[0].shape == (32,) and graph.preds(1) == [0]
    built = build_module(lowered, target)
    kernels = OperatorKernels(graph, built)
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(s).astype("float32") for s in ((4, 8), (8, 16), (8, 4))]
    inputs = kernels.to_device(xs)
    outputs, _ = kernels.replay(inputs)
    np.testing.assert_allclose(outputs[0].numpy(), ((xs[0] @ xs[1]).reshape(8, 8) @ xs[2]).reshape(32), rtol=1e-5)
    assert relative_error(outputs, flatten_outputs(built.vm()["main"](*inputs))) < 1e-6
