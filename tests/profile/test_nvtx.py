"""Each operator a collection times on a GPU is inside its own NVTX range (for Nsight Compute's filter);
checked on the CPU with the timing itself replaced."""

from __future__ import annotations

import types

import pytest


def test_an_operator_is_timed_inside_its_nvtx_range(monkeypatch):
    torch = pytest.importorskip("torch")
    from opbench.profile.cuda import CudaProfiler, operator_range

    events = []
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda name: events.append(("push", name)))
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: events.append(("pop", None)))
    profiler = CudaProfiler.__new__(CudaProfiler)  # no GPU here: the timing is replaced below

    def time_launch(launch, config):
        events.append(("timed", None))
        launch()
        return "timing"

    monkeypatch.setattr(profiler, "time_launch", time_launch)
    node = types.SimpleNamespace(kind="conv2d", func="fused_conv2d_add_relu")
    calls = []
    kernels = types.SimpleNamespace(graph={3: node}, call=lambda *a: calls.append(a))
    assert profiler.time(kernels, 3, ["a"], ["o"], None) == "timing"
    assert events == [("push", "opbench #3 conv2d fused_conv2d_add_relu"), ("timed", None), ("pop", None)]
    assert calls == [(3, ["a"], ["o"])]
    assert len(operator_range(7, "matmul", "x" * 500)) == 120

    def failing(launch, config):
        raise RuntimeError("kernel failed")

    monkeypatch.setattr(profiler, "time_launch", failing)
    events.clear()
    with pytest.raises(RuntimeError):
        profiler.time(kernels, 3, ["a"], ["o"], None)
    assert [e for e, _ in events] == ["push", "pop"]  # the range is closed also when the timing fails
