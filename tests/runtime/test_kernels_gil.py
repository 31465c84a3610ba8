"""CPU kernels release Python's global lock while they run, so the CPU executor's threads overlap."""

from __future__ import annotations

from opbench.ir import extract_operators
from opbench.models import load_workload
from opbench.runtime import OperatorKernels, build_module


def test_cpu_kernels_release_the_gil(llvm_target):
    workload = load_workload("simple", "matmul:n=32", 1)
    lowered, graph = extract_operators(workload.mod, llvm_target)
    kernels = OperatorKernels(graph, build_module(lowered, llvm_target))
    assert kernels.funcs and all(f.release_gil for f in kernels.funcs.values())
