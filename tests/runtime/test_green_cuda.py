"""SM partitions on the GPU (needs cuda-bindings and a driver with green contexts): a partition limits a
kernel inside a captured graph; partitioned schedules of PyTorch's and TVM's kernels equal the model;
capturer with partitions equals the model; a partition larger than the GPU is refused; co-run rows
record the partitioned time."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest

from opbench import OpBenchError
from opbench.runtime import green
from opbench.runtime.executor import ParallelExecutor
from opbench.runtime.graphs import capture_graph, fork_join
from opbench.schedule import get_scheduler

from ..helpers import run

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def needs_green_contexts():
    reason = green.support()
    if reason is not None:
        pytest.skip(f"green contexts unavailable: {reason}")


def _graph_ms(graph) -> float:
    from opbench.profile.timer import cuda_event_samples

    return sorted(cuda_event_samples(graph.replay, 7, 5))[3] * 1e3


def test_a_partition_limits_a_kernel_inside_a_captured_graph():
    """A matmul forked from the capture stream into a green stream of 16 SMs runs several times slower
    than on the whole GPU (the partition holds through capture; a functional check with a wide margin)."""
    shape = green.layout()
    assert shape["sm_count"] >= 32 and shape["granularity"] >= 1
    n = 4096
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.float16) for _ in range(2))
    c = torch.empty(n, n, device="cuda", dtype=torch.float16)

    def on(stream):
        def launch(origin):
            def body():
                with torch.cuda.stream(stream):
                    torch.matmul(a, b, out=c)
            fork_join(origin, [stream], body)
        return launch

    small = 2 * shape["granularity"] if 2 * shape["granularity"] >= 16 else 16
    whole = _graph_ms(capture_graph(on(torch.cuda.Stream())))
    confined = _graph_ms(capture_graph(on(green.partitions([small]).stream(0))))
    torch.testing.assert_close(c, a @ b)
    assert confined > 2.0 * whole, (whole, confined)


def test_partitions_are_disjoint_and_cached():
    shape = green.layout()
    g = shape["granularity"]
    parts = green.partitions([g, 2 * g])
    assert parts.actual == [g, 2 * g] and green.partitions([g, 2 * g]) is parts
    assert parts.stream(0, 0) is parts.stream(0, 0) and parts.stream(0, 1) is not parts.stream(0, 0)
    with pytest.raises(OpBenchError, match=f"can partition {shape['partitionable']}$"):
        green.partitions([shape["partitionable"], g])


class Inception(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Conv2d(16, 32, 1)
        self.b = torch.nn.Sequential(torch.nn.Conv2d(16, 32, 1), torch.nn.ReLU(), torch.nn.Conv2d(32, 32, 3, padding=1))
        self.c = torch.nn.Sequential(torch.nn.Conv2d(16, 8, 1), torch.nn.ReLU(), torch.nn.Conv2d(8, 16, 5, padding=2))
        self.d = torch.nn.Sequential(torch.nn.MaxPool2d(3, 1, 1), torch.nn.Conv2d(16, 16, 1))

    def forward(self, x):
        return torch.relu(torch.cat([self.a(x), self.b(x), self.c(x), self.d(x)], dim=1))


def _partitioned(plan, partitionable, granularity):
    streams = max(plan.stream_of) + 1
    side = granularity * max(1, 32 // granularity)
    return plan.with_partition([side, (partitionable - side) // granularity * granularity],
                               [1] + [0] * (streams - 1), f"{plan.name}+sm")


def test_partitioned_torch_schedule_equals_the_model_and_a_too_large_one_is_refused():
    from opbench.pipeline.compile import torch_backend

    torch.manual_seed(0)
    model = Inception().cuda().eval()
    x = torch.randn(1, 16, 28, 28, device="cuda")
    backend = torch_backend(model, [x], trace="auto")
    shape = green.layout()
    plan = get_scheduler("opara").schedule(backend.graph)
    assert plan.num_streams > 1
    executor = ParallelExecutor(backend, _partitioned(plan, shape["partitionable"], shape["granularity"]))
    with torch.no_grad():
        expected = model(x)
        torch.testing.assert_close(executor.run()[0], expected, rtol=1e-5, atol=1e-5)
        other = torch.randn_like(x)
        torch.testing.assert_close(executor.run([other])[0], model(other), rtol=1e-5, atol=1e-5)
    too_big = plan.with_partition([shape["partitionable"] + shape["granularity"]], [0] * (max(plan.stream_of) + 1))
    with pytest.raises(OpBenchError, match=f"can partition {shape['partitionable']}$"):
        ParallelExecutor(backend, too_big)


def test_partitioned_tvm_schedule_equals_sequential():
    from opbench.models import load_workload
    from opbench.pipeline.compile import tvm_backend
    from opbench.runtime import resolve_target

    w = load_workload("simple", "branchy:branches=4,depth=2,channels=16,size=16", 1)
    backend = tvm_backend(w, resolve_target("cuda"))
    seq = ParallelExecutor(backend, get_scheduler("sequential").schedule(backend.graph)).run()[0].numpy().copy()
    shape = green.layout()
    plan = _partitioned(get_scheduler("opara").schedule(backend.graph), shape["partitionable"], shape["granularity"])
    np.testing.assert_allclose(ParallelExecutor(backend, plan).run()[0].numpy(), seq, rtol=1e-6, atol=1e-6)


def test_capturer_with_partitions_equals_the_model():
    from opbench.parallel import capturer, optimize

    torch.manual_seed(0)
    model = Inception().cuda().eval()
    x = torch.randn(1, 16, 28, 28, device="cuda")
    captured = capturer(x, model, sm_partition="auto", repeat=3, number=5)
    rows = {r["schedule"]: r for r in captured.table}
    partitioned = [r for r in captured.table if r["sm"] != "-"]
    assert partitioned, list(rows)
    assert all(r["sched_error"] <= 1e-5 and r["latency_ms"] > 0 for r in partitioned)
    with torch.no_grad():
        torch.testing.assert_close(captured(x), model(x), rtol=1e-4, atol=1e-4)
    plan = optimize(x, model, sm_partition="auto", repeat=3, number=5)
    again = capturer(x, model, schedule=plan, repeat=3, number=5)  # a saved (maybe partitioned) schedule reused
    with torch.no_grad():
        torch.testing.assert_close(again(x), model(x), rtol=1e-4, atol=1e-4)


def test_corun_rows_record_the_partitioned_time(tmp_path):
    path = tmp_path / "d.sqlite"
    proc = run("collect", "--modelsource", "simple", "--modelname", "branchy:branches=3,depth=1,channels=16,size=16",
               "--target", "cuda", "--corun", "--corun-limit", "2", "--repeat", "3", "--min-repeat-ms", "1",
               "--no-check", "--dataset", str(path), script=False)
    assert proc.returncode == 0, proc.stderr
    with sqlite3.connect(path) as conn:
        query = "SELECT concurrent_s, partitioned_s, partition_sms, group_size, error FROM corun"
        rows = conn.execute(query).fetchall()
    assert rows and all(r[1] is not None and r[1] > 0 for r in rows), rows
    for _, _, sms, size, _ in rows:
        shares = [int(v) for v in sms.strip("[]").split(",")]
        assert len(shares) == size and len(set(shares)) == 1 and sum(shares) <= green.layout()["partitionable"]
