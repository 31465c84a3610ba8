"""Per-operator replay reproduces the whole-model Relax VM for every local and simple model."""

from __future__ import annotations

import pytest

from helpers import replay_vs_vm
from opbench.models import list_sources, load_workload

LOCAL_SIZES = {"inception_v3": 96}
# a small instance of each parameterised synthetic model (kernels: 24 of its 200 sampled operators)
SIMPLE_NAMES = {"matmul": "matmul:n=256", "matmul_matmul_add": "matmul_matmul_add:n=256", "kernels": "kernels:n=24"}


@pytest.mark.parametrize("name", sorted(list_sources()["simple"]))
@pytest.mark.slow
def test_simple_replay(name, llvm_target):
    model = SIMPLE_NAMES.get(name, name)
    err, outs, graph = replay_vs_vm(load_workload("simple", model, 1), llvm_target)
    assert err < 1e-5
    assert len(graph) >= 1 and outs[0].size > 0


# every zoo model is checked with --zoo; by default three that cover its kinds of graph: a chain,
# branches that join (inception blocks), depthwise convolutions
QUICK = {"resnet-18", "googlenet", "mobilenet"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=[] if n in QUICK else [pytest.mark.zoo])
                                  for n in sorted(list_sources()["local"])])
@pytest.mark.slow
def test_local_replay(name, llvm_target):
    pytest.importorskip("torchvision")
    w = load_workload("local", name, 1, image_size=LOCAL_SIZES.get(name, 64))
    err, outs, graph = replay_vs_vm(w, llvm_target)
    assert err < 1e-5
    assert outs[0].shape == (1, 1000)
    assert len(graph) > 10


def test_relative_error_detects_difference():
    import numpy as np

    from opbench.runtime import relative_error

    a = np.ones((2, 2), "float32")
    assert relative_error([a], [a]) == 0.0
    assert relative_error([a * 1.1], [a]) == pytest.approx(0.1, rel=1e-5)
    assert relative_error([a], [np.ones((4,), "float32")]) == float("inf")
