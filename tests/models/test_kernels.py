"""The sampled-operators model (``simple`` ``kernels``) and the device lock that collections share."""

from __future__ import annotations

import threading
import time

from opbench.ir import extract_operators
from opbench.models import load_workload


def test_kernels_are_independent_sampled_operators(llvm_target):
    first = load_workload("simple", "kernels:n=12,sample=3")
    again = load_workload("simple", "kernels:n=12,sample=3")
    other = load_workload("simple", "kernels:n=12,sample=4")
    assert first.workload_id == again.workload_id != other.workload_id
    assert first.options == {"n": 12, "sample": 3, "seed": 0}
    _, graph = extract_operators(first.mod, llvm_target)
    assert len(graph) == 12 and all(not graph.preds(i) for i in range(len(graph)))  # no operator feeds another
    kinds = {n.kind for n in graph}
    assert kinds <= {"conv2d", "pool", "matmul", "elementwise", "concat", "softmax", "reduction"}
    # every operator reads its own inputs, with exactly the sampled shapes
    assert sum(len(n.input_shapes) for n in graph) == len(first.inputs)
    readable = first.readable()
    assert readable["inputs"] == {"count": len(first.inputs), "digest": readable["inputs"]["digest"]}
    assert first.fingerprint()["inputs"] != readable["inputs"]


def test_device_lock_serialises_measurements(tmp_path, monkeypatch):
    from opbench.utils import device_lock

    monkeypatch.setenv("OPBENCH_DEVICE_LOCK", str(tmp_path / "lock"))
    spans = []

    def hold() -> None:
        with device_lock():
            start = time.perf_counter()
            time.sleep(0.2)
            spans.append((start, time.perf_counter()))

    threads = [threading.Thread(target=hold) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    (a0, a1), (b0, b1) = sorted(spans)
    assert b0 >= a1  # the second holder started after the first let go
