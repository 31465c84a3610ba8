"""The executor on llvm (threads per stream) with both backends, and the capturer."""

from __future__ import annotations

import time

import numpy as np
import pytest

from opbench.models import load_workload
from opbench.parallel import capturer
from opbench.pipeline.compare import DEFAULT_SCHEDULERS, critical_path, evaluate
from opbench.pipeline.compile import tvm_backend
from opbench.runtime.executor import ParallelExecutor
from opbench.schedule import critical_first, get_scheduler


@pytest.fixture(scope="module")
def branchy_backend():
    from opbench.runtime import resolve_target

    w = load_workload("simple", "branchy:branches=4,depth=2,channels=8,size=12", 1)
    return tvm_backend(w, resolve_target("llvm"))


@pytest.mark.parametrize("critical", [False, True])
@pytest.mark.parametrize("name", DEFAULT_SCHEDULERS)
def test_every_schedule_gives_the_same_output(branchy_backend, name, critical):
    seq = [o.numpy().copy() for o in ParallelExecutor(branchy_backend, get_scheduler("sequential").schedule(
        branchy_backend.graph)).run()]
    schedule = get_scheduler(name).schedule(branchy_backend.graph)
    if critical:  # the same streams in critical-first launch order (FLOPs for latencies)
        graph = branchy_backend.graph
        schedule = critical_first(schedule, graph, lambda op: graph[op].flops)
    out = ParallelExecutor(branchy_backend, schedule).run()
    np.testing.assert_array_equal(out[0].numpy(), seq[0])
    if name != "sequential":
        assert schedule.num_streams > 1


def test_evaluate_table_and_fallback(branchy_backend):
    best, rows = evaluate(branchy_backend, repeat=2, number=2)
    assert [r["schedule"] for r in rows] == list(DEFAULT_SCHEDULERS)
    assert all(r["error"] == 0.0 and r["sched_error"] == 0.0 for r in rows) and rows[0]["speedup"] == 1.0
    assert sum(r["kept"] for r in rows) == 1
    # tolerance 100%: nothing can be that much faster, sequential is kept
    best, rows = evaluate(branchy_backend, repeat=2, number=2, tolerance=1.0)
    assert best.name == "sequential" and rows[0]["kept"]


def test_kept_schedule_ignores_kernel_numerics_but_not_wrong_results(branchy_backend):
    seq = ParallelExecutor(branchy_backend, get_scheduler("sequential").schedule(branchy_backend.graph)).run()
    shifted = [seq[0].numpy() + 1.0]  # a reference from other kernels: every schedule differs from it
    best, rows = evaluate(branchy_backend, repeat=2, number=2, reference=shifted)
    assert all(r["error"] > 1e-3 and r["sched_error"] == 0.0 for r in rows)
    assert sum(r["kept"] for r in rows) == 1  # still chosen by latency, not rejected


def test_new_inputs_replayed(branchy_backend):
    ex = ParallelExecutor(branchy_backend, get_scheduler("opara").schedule(branchy_backend.graph))
    x1 = np.random.default_rng(1).standard_normal((1, 3, 12, 12)).astype("float32")
    x2 = np.random.default_rng(2).standard_normal((1, 3, 12, 12)).astype("float32")
    y1 = ex.run([x1])[0].numpy().copy()
    y2 = ex.run([x2])[0].numpy().copy()
    assert not np.allclose(y1, y2)
    np.testing.assert_array_equal(ex.run([x1])[0].numpy(), y1)


def test_capturer_torch_model_equals_model():
    torch = pytest.importorskip("torch")

    class TwoBranch(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Conv2d(3, 4, 3, padding=1)
            self.b = torch.nn.Conv2d(3, 4, 1)

        def forward(self, x):
            return torch.relu(self.a(x)) + torch.sigmoid(self.b(x))

    torch.manual_seed(0)
    model = TwoBranch().eval()
    x = torch.randn(1, 3, 8, 8)
    run = capturer([x], model, repeat=2, number=2, mode="exhaustive")
    with torch.no_grad():
        expected = model(x)
        other = torch.randn(1, 3, 8, 8)
        torch.testing.assert_close(run(x), expected, rtol=0, atol=0)
        torch.testing.assert_close(run(other), model(other), rtol=0, atol=0)
    assert [r["schedule"] for r in run.table] == ["model, eager", *DEFAULT_SCHEDULERS]  # no CUDA Graph on a CPU
    assert all(r["measured"] for r in run.table) and run.build_s > 0


def test_capturer_falls_back_for_unexportable_model(caplog):
    torch = pytest.importorskip("torch")

    class DataDependent(torch.nn.Module):
        def forward(self, x):
            if x.sum() > 0:  # data-dependent control flow: torch.export cannot trace it
                return x * 2
            return x - 1

    model = DataDependent()
    with caplog.at_level("WARNING", logger="opbench"):
        run = capturer([torch.ones(3)], model)
    assert run is model
    assert "torch.export failed for DataDependent" in caplog.text and "unscheduled" in caplog.text


class _SleepBackend:
    """A fake CPU backend: operator ``i`` sleeps ``cost[i]`` seconds (known critical path)."""

    is_cuda = False

    def __init__(self, preds: list[list[int]], cost: list[float]) -> None:
        self._preds, self.cost, self.launched = preds, cost, []
        self.graph = self

    def __len__(self) -> int:
        return len(self._preds)

    def preds(self, index: int) -> list[int]:
        return self._preds[index]

    def launch(self, index: int) -> None:
        self.launched.append(index)
        time.sleep(self.cost[index])


def test_critical_path_known_answer():
    # 0 -> {1, 2}; 1 -> 3; 2 -> 4; {3, 4} -> 5: the heavy chain is 0-2-4-5 (1+6+4+1 ms), not 0-1-3-5 (1+2+2+1)
    backend = _SleepBackend([[], [0], [0], [1], [2], [3, 4]], [0.001, 0.002, 0.006, 0.002, 0.004, 0.001])
    result = critical_path(backend, repeat=3, number=10)
    assert result["ops"] == [0, 2, 4, 5]
    # sleeps last at least as long as asked (a busy machine only makes them longer: no upper bound)
    assert result["chain_ms"] >= 12.0 and result["path_ms"] >= 12.0 and result["sum_ms"] >= 16.0
    assert backend.launched[-4:] == [0, 2, 4, 5]  # the chain itself was run and timed


def test_critical_path_of_tvm_kernels_is_a_dependency_chain(branchy_backend):
    result = critical_path(branchy_backend, repeat=2, number=10)
    path, graph = result["ops"], branchy_backend.graph
    assert not graph.preds(path[0]) and not graph.succs(path[-1])
    assert all(a in graph.preds(b) for a, b in zip(path, path[1:], strict=False))
    assert 0 < result["path_ms"] <= result["sum_ms"]


@pytest.mark.skipif((__import__("os").cpu_count() or 1) < 2, reason="needs two cores")
def test_cpu_streams_run_at_once():
    """Two independent kernels of a parallel schedule are in flight at the same time on two threads
    (each waits at a barrier inside its launch: one thread would leave the barrier broken), and the
    kernels release Python's lock; the outputs equal sequential's. How much faster that is depends on
    the machine's load: scripts/bench_cpu_threads.py measures it."""
    import threading

    from opbench.runtime import resolve_target

    w = load_workload("simple", "branchy:branches=2,depth=1,channels=8,size=6", 1)
    backend = tvm_backend(w, resolve_target("llvm"))
    a, b = (n.index for n in backend.graph if backend.graph.preds(n.index) == [0])
    assert all(f.release_gil for f in backend.kernels.funcs.values())
    expected = [o.numpy().copy() for o in ParallelExecutor(backend, get_scheduler("sequential").schedule(
        backend.graph)).run()]
    parallel = ParallelExecutor(backend, get_scheduler("greedy").schedule(backend.graph))
    assert parallel.schedule.stream_of[a] != parallel.schedule.stream_of[b]
    barrier, launch, met = threading.Barrier(2, timeout=60), backend.launch, []

    def meeting_launch(op):
        if op in (a, b):
            met.append(barrier.wait())  # returns only once both branches are inside their launch
        launch(op)

    backend.launch = meeting_launch
    try:
        out = parallel.run()
    finally:
        backend.launch = launch
    assert sorted(met) == [0, 1]
    np.testing.assert_array_equal(out[0].numpy(), expected[0])


