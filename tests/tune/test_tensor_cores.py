"""float16 tuning on tensor cores: the design space is built for a CUDA target without a GPU (task
extraction and space export need no device), trials name their tensor-core intrinsics, and a workload
that cannot use them gets the ordinary space with one INFO line."""

from __future__ import annotations

import json
import logging

import pytest

from helpers import run
from opbench.tune import space as spaces

tvm = pytest.importorskip("tvm")

SM90 = '{"kind":"cuda","arch":"sm_90"}'


@pytest.fixture(autouse=True)
def fresh_reasons(monkeypatch):
    monkeypatch.setattr(spaces, "_said", set())


@pytest.mark.slow
def test_configspace_of_a_float16_model_uses_wmma_without_a_gpu(tmp_path):
    out = tmp_path / "space.json"
    proc = run("configspace", "--modelsource", "simple", "--modelname", "ios_block:channels=32,size=14", "--dtype",
               "fp16", "--target", SM90, "--json", str(out), script=False)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["dtype"] == "float16" and data["design_space"] == "cuda-tensorcore"
    conv = next(t for t in data["tasks"] if "conv2d" in t["task"])
    assert conv["task"].startswith("fused_conv2d_cast")  # accumulated in float32, rounded in the same kernel
    plain = run("configspace", "--modelsource", "simple", "--modelname", "ios_block:channels=32,size=14",
                "--target", SM90, "--json", str(tmp_path / "fp32.json"), script=False)
    assert plain.returncode == 0 and json.loads((tmp_path / "fp32.json").read_text())["design_space"] == "default"


def test_a_tensor_core_trial_names_its_intrinsics():
    from tvm.s_tir import meta_schedule as ms

    from opbench.models import load_workload
    from opbench.pipeline.tune import extracted_tasks
    from opbench.runtime import resolve_target
    from opbench.runtime.startup import import_tensor_intrinsics
    from opbench.runtime.target import tuning_target
    from opbench.tune.knobs import decode_knobs

    import_tensor_intrinsics()
    target = resolve_target(SM90, local_device=False)
    (task,) = extracted_tasks(load_workload("simple", "matmul:n=128", 1, dtype="float16"), target)
    context = ms.TuneContext(mod=task.dispatched[0], target=tuning_target(target),
                             space_generator=spaces.design_space("cuda-tensorcore"), task_name=task.task_name)
    sketches = context.generate_design_space()
    intrinsics = [decode_knobs(s.trace).get("tensor_intrin", []) for s in sketches]
    assert intrinsics and all(any(i.startswith("wmma_sync_16x16x16_f16f16f32") for i in x) for x in intrinsics)
    assert all(any(i.startswith("wmma_load_16x16x16_f16_a") for i in x) for x in intrinsics)
    fp32 = extracted_tasks(load_workload("simple", "matmul:n=128", 1), target)[0]
    context = ms.TuneContext(mod=fp32.dispatched[0], target=tuning_target(target),
                             space_generator=spaces.design_space("default"), task_name=fp32.task_name)
    assert all("tensor_intrin" not in decode_knobs(s.trace) for s in context.generate_design_space())


@pytest.mark.parametrize("target, dtype, kind, reason", [
    (SM90, "float16", "cuda-tensorcore", None),
    ('{"kind":"cuda","arch":"sm_90a"}', "float16", "cuda-tensorcore", None),
    ('{"kind":"cuda","arch":"sm_120"}', "float16", "cuda-tensorcore", None),
    (SM90, "float32", "default", None),
    (SM90, "bfloat16", "default", "MetaSchedule has no bfloat16 tensor-core intrinsics (float16 only: WMMA)"),
    ('{"kind":"cuda","arch":"sm_61"}', "float16", "default", "sm_61 has no tensor cores"),
    ('{"kind":"llvm","mcpu":"x86-64"}', "float16", "default", "the llvm target has no tensor cores"),
])
def test_the_space_falls_back_with_one_info_line(caplog, target, dtype, kind, reason):
    from opbench.runtime import resolve_target

    resolved = resolve_target(target, local_device=False)
    with caplog.at_level(logging.INFO, logger="opbench"):
        assert spaces.space_kind(resolved, dtype) == kind
        assert spaces.space_kind(resolved, dtype) == kind
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ([] if reason is None else [f"tuning {dtype} with the ordinary design space: {reason}"])


@pytest.mark.parametrize("accumulate", ["float16", "float32"])
def test_tensor_core_candidates_build_for_sm90(accumulate):
    """Every sampled WMMA candidate of a float16 matmul builds, with float32 accumulation too (TVM's
    storage rewrite breaks that one; ``build_context`` turns it off for WMMA modules only)."""
    from tvm import te
    from tvm.s_tir import meta_schedule as ms

    from opbench.runtime.build import uses_wmma
    from opbench.runtime.startup import import_tensor_intrinsics
    from opbench.tune.measure import build_candidate

    import_tensor_intrinsics()
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90", "max_threads_per_block": 1024,
                                "max_shared_memory_per_block": 49152, "thread_warp_size": 32})
    a = te.placeholder((256, 256), "float16", name="A")
    b = te.placeholder((256, 256), "float16", name="B")
    k = te.reduce_axis((0, 256), "k")
    c = te.compute((256, 256), lambda i, j: te.sum(a[i, k].astype(accumulate) * b[k, j].astype(accumulate), axis=k))
    d = te.compute((256, 256), lambda i, j: c[i, j].astype("float16"))
    mod = tvm.IRModule({"main": te.create_prim_func([a, b, d])})
    assert not uses_wmma(mod)
    ctx = ms.TuneContext(mod=mod, target=target, space_generator=spaces.design_space("cuda-tensorcore"),
                         search_strategy="replay-trace", task_name="mm", num_threads=1)
    ctx.pre_tuning(max_trials=4, num_trials_per_iter=4, design_spaces=ctx.generate_design_space(), database=None,
                   cost_model=None)
    candidates = ctx.search_strategy.generate_measure_candidates()
    assert candidates and all(uses_wmma(c.sch.mod) for c in candidates)
    for cand in candidates:
        assert "wmma" in build_candidate(cand.sch.mod, target).imports[0].inspect_source("cuda")
