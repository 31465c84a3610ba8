"""Every kernel backend is exact: a parallel run of its operators equals the model's own result
(TVM's kernels against the Relax VM, PyTorch's against the eager model), and ``KernelBackend.create``
chooses by name with a one-line error for an unknown one."""

from __future__ import annotations

import numpy as np
import pytest

from opbench import OpBenchError
from opbench.models import load_workload
from opbench.runtime.backend import BACKEND_KINDS, KernelBackend
from opbench.runtime.executor import ParallelExecutor
from opbench.schedule import get_scheduler


def _tvm(llvm_target):
    from opbench.pipeline import compile_workload
    from opbench.runtime import flatten_outputs

    workload = load_workload("simple", "branchy:branches=3,depth=2,channels=4,size=6", 1)
    compiled = compile_workload(workload, llvm_target)
    inputs = workload.example_inputs(3)
    backend = KernelBackend.create("tvm", compiled.kernels, inputs)
    vm = compiled.built.vm()
    reference = [o.numpy() for o in flatten_outputs(vm["main"](*compiled.kernels.to_device(inputs)))]
    return backend, reference


def _zoo(kind: str, name: str, **options):
    """``kind``'s backend over a small zoo model (64 px), and the model's own output."""
    torch = pytest.importorskip("torch")

    workload = load_workload("local", name, 1, image_size=64)
    model = workload.torch_module.eval()
    x = torch.from_numpy(workload.example_inputs(3)[0])
    backend = KernelBackend.create(kind, model, [x], **options)
    with torch.no_grad():
        reference = [model(x).numpy()]
    return backend, reference


def _torch(_llvm_target):
    return _zoo("torch", "googlenet", trace="export")


def _fused(_llvm_target):
    return _zoo("fused", "squeezenet_v1.1")


MAKERS = {"tvm": _tvm, "torch": _torch, "fused": _fused}


def test_every_backend_kind_is_tested():
    assert set(BACKEND_KINDS.kinds()) <= set(MAKERS)


@pytest.mark.parametrize("kind", sorted(MAKERS))
@pytest.mark.slow
def test_a_parallel_run_equals_the_model(kind, llvm_target):
    backend, reference = MAKERS[kind](llvm_target)
    assert backend.name == kind
    for name in ("sequential", "greedy"):
        outputs = ParallelExecutor(backend, get_scheduler(name).schedule(backend.graph)).run()
        host = [o.numpy() if hasattr(o, "numpy") else np.asarray(o) for o in outputs]
        assert len(host) == len(reference)
        for got, want in zip(host, reference, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_unknown_backend_is_one_line():
    with pytest.raises(OpBenchError, match=r"unknown backend 'bogus' \(accepted: tvm, torch, fused\)"):
        KernelBackend.create("bogus")
