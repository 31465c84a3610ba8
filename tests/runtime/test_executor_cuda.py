"""The executor on the GPU: every schedule captured in a CUDA Graph gives the reference output."""

from __future__ import annotations

import pytest

from opbench.models import load_workload
from opbench.parallel import capturer
from opbench.pipeline.compare import DEFAULT_SCHEDULERS, critical_path, evaluate
from opbench.pipeline.compile import tvm_backend

pytestmark = pytest.mark.gpu


def test_tvm_backend_all_schedules_on_cuda():
    from opbench.runtime import resolve_target

    w = load_workload("local", "googlenet", 1, image_size=64)
    backend = tvm_backend(w, resolve_target("cuda"))
    assert backend.is_cuda and backend.resources  # kernel resources feed Opara's launch order
    kept, rows = evaluate(backend, repeat=3, number=5)
    assert [r["schedule"] for r in rows] == list(DEFAULT_SCHEDULERS)
    assert all(r["error"] < 1e-5 for r in rows)
    assert max(r["streams"] for r in rows) > 1
    bound = critical_path(backend, repeat=3, number=10)
    path = bound["ops"]
    assert all(a in backend.graph.preds(b) for a, b in zip(path, path[1:], strict=False))
    # no schedule beats its own critical path (beyond timing noise)
    assert bound["chain_ms"] <= 1.1 * min(r["latency_ms"] for r in rows)
    assert 0 < bound["path_ms"] < bound["sum_ms"]


def test_capturer_on_cuda_equals_model():
    torch = pytest.importorskip("torch")
    w = load_workload("local", "squeezenet_v1.1", 1, image_size=96)
    model = w.torch_module.cuda()
    x = torch.from_numpy(w.example_inputs()[0]).cuda()
    run = capturer([x], model, repeat=3, number=5)
    with torch.no_grad():
        other = torch.randn_like(x)
        torch.testing.assert_close(run(x), model(x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(run(other), model(other), rtol=1e-5, atol=1e-5)
