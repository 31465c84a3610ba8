"""Kernel resources read from the binary the build compiled, not from a second compilation."""

from __future__ import annotations

import collections

import pytest

pytest.importorskip("tvm")


@pytest.fixture
def compiler(monkeypatch):
    """A fake CUDA compiler registered as TVM's callback (restored after the test), and the sources it got."""
    import tvm.support.nvcc  # noqa: F401  (TVM's own callback, to restore)
    import tvm_ffi

    from opbench.runtime import resources

    original = tvm_ffi.get_global_func("tvm_callback_cuda_compile")
    seen: list[str] = []

    def fake(code: str) -> bytes:
        seen.append(str(code))
        return b"\x7fELF cubin of " + str(code).encode()

    tvm_ffi.register_global_func("tvm_callback_cuda_compile", fake, override=True)
    monkeypatch.setattr(resources, "_INSTALLED", [])
    monkeypatch.setattr(resources, "_BINARIES", collections.OrderedDict())
    try:
        yield seen
    finally:
        tvm_ffi.register_global_func("tvm_callback_cuda_compile", original, override=True)


def test_resources_load_the_binary_the_build_compiled(compiler, monkeypatch):
    import tvm_ffi

    from opbench.runtime import resources

    resources.remember_cuda_binaries()
    resources.remember_cuda_binaries()  # once: a second call does not wrap the wrapper
    source = "extern \"C\" __global__ void k() {}"
    binary = tvm_ffi.get_global_func("tvm_callback_cuda_compile")(source)  # as TVM's CUDA codegen calls it
    assert bytes(binary) == b"\x7fELF cubin of " + source.encode() and compiler == [source]

    loaded: list[bytes] = []

    class Driver:  # no GPU here: what would be loaded is recorded
        def load(self, image: bytes) -> str:
            loaded.append(image)
            return "module"

    monkeypatch.setattr(resources, "CudaDriver", Driver)
    monkeypatch.setattr("tvm.support.nvcc.compile_cuda", lambda *a, **k: pytest.fail("compiled a second time"))
    assert resources.kernel_resources(source, "sm_90", {}, [], 132, 2048) == {}
    assert loaded == [bytes(binary)]

    monkeypatch.setattr("tvm.support.nvcc.compile_cuda", lambda *a, **k: b"compiled here")
    resources.kernel_resources("a source no build of this process compiled", "sm_90", {}, [], 132, 2048)
    assert loaded[-1] == b"compiled here"


def test_a_cuda_build_keeps_its_binaries(compiler):
    import tvm_ffi

    from opbench.models import load_workload
    from opbench.pipeline.compile import compile_workload
    from opbench.runtime import resolve_target, resources

    target = resolve_target({"kind": "cuda", "arch": "sm_90"}, local_device=False)
    compile_workload(load_workload("simple", "matmul:n=32"), target, None, None)
    assert resources._INSTALLED and tvm_ffi.get_global_func("tvm_callback_cuda_compile").same_as(
        resources._INSTALLED[0])
    for source in compiler:  # what the build compiled (nothing where TVM compiles no CUDA: no GPU here)
        assert resources.compiled_binary(source) == b"\x7fELF cubin of " + source.encode()
