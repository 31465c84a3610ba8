"""``--cuda-compiler nvrtc-pch``: the builders' CUDA compile callback pre-includes the headers of TVM's kernels
as one precompiled header; the kernels are the same as plain NVRTC's, and a compile that fails with the
header is done again without it."""

from __future__ import annotations

import pytest

pytest.importorskip("tvm")


def _callback():
    import tvm_ffi

    return tvm_ffi.get_global_func("tvm_callback_cuda_compile")


@pytest.fixture
def restore_callback(tmp_path, monkeypatch):
    import tvm_ffi

    monkeypatch.setenv("OPBENCH_CACHE", str(tmp_path / "cache"))  # the pre-included header is written there
    saved = _callback()
    yield
    tvm_ffi.register_global_func("tvm_callback_cuda_compile", saved, override=True)


def test_the_callback_passes_the_precompiled_header_and_falls_back_without_it(monkeypatch, restore_callback):
    import tvm.support.nvcc as nvcc

    from opbench.tune import measure

    calls = []

    def fake(code, target_format=None, compiler=None, options=None, **_):
        calls.append(options)
        if options and calls.count(options) == 2:
            raise RuntimeError("NVRTC_ERROR_INVALID_OPTION")  # an NVRTC without automatic PCH, say
        return b"cubin"

    monkeypatch.setattr(nvcc, "compile_cuda", fake)
    monkeypatch.setattr(measure, "_PCH", {})
    measure.use_cuda_compiler("nvrtc-pch")
    compile_ = _callback()
    assert bytes(compile_("kernel 1")) == b"cubin" and bytes(compile_("kernel 2")) == b"cubin"
    assert calls[0][0] == "-pch" and calls[0][1].startswith("--pre-include=") and calls[1] == calls[0]
    assert calls[2] is None  # the failed compile is done again, plainly
    assert bytes(compile_("kernel 3")) == b"cubin" and calls[3] is None  # and the process stops using the header
    assert "NVRTC_ERROR_INVALID_OPTION" in measure._PCH["failed"]
    # a kernel that fails both ways is its own build error, and the header stays in use
    def broken(code, target_format=None, compiler=None, options=None, **_):
        raise RuntimeError("error: identifier undefined")

    monkeypatch.setattr(nvcc, "compile_cuda", broken)
    monkeypatch.setattr(measure, "_PCH", {})
    measure.use_cuda_compiler("nvrtc-pch")
    with pytest.raises(Exception, match="identifier undefined"):
        _callback()("bad kernel")
    assert not measure._PCH.get("failed")
    with open(calls[0][1].split("=", 1)[1]) as f:
        assert "#include <cuda_fp16.h>" in f.read()


def test_a_tvm_kernel_compiles_to_the_same_code_with_the_precompiled_header(monkeypatch, restore_callback):
    """A real fp16 kernel of TVM's CUDA codegen (no GPU needed: NVRTC only compiles). Its PTX with the
    pre-included header equals plain NVRTC's but for the header's unused module constants."""
    import tvm
    from tvm import te
    from tvm.s_tir import Schedule
    from tvm.support.nvcc import compile_cuda

    from opbench.tune import measure

    a = te.placeholder((1024,), "float16", name="a")
    b = te.compute((1024,), lambda i: a[i] + tvm.tirx.const(1, "float16"), name="b")
    sch = Schedule(te.create_prim_func([a, b]))
    block, thread = sch.split(sch.get_loops(sch.get_sblock("b"))[0], [8, 128])
    sch.bind(block, "blockIdx.x")
    sch.bind(thread, "threadIdx.x")
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    lib = tvm.tirx.build(sch.mod, target=target)
    source = (lib.imports if hasattr(lib, "imports") else lib.imported_modules)[0].inspect_source()
    try:
        plain = bytes(compile_cuda(source, target_format="ptx", arch="sm_90", compiler="nvrtc")).decode()
    except Exception as err:  # no NVRTC or CUDA headers on this machine
        pytest.skip(f"NVRTC cannot compile here: {str(err).splitlines()[0][:120]}")
    monkeypatch.setattr(measure, "_PCH", {})
    measure.use_cuda_compiler("nvrtc-pch")
    with target:
        cubin = bytes(_callback()(source))
    assert cubin[:4] == b"\x7fELF" and not measure._PCH.get("failed")
    with_header = bytes(compile_cuda(source, target_format="ptx", arch="sm_90", compiler="nvrtc",
                                     options=measure._PCH["options"])).decode()

    def code(ptx):
        return [line for line in ptx.splitlines() if not line.startswith(".global .align")]

    assert code(with_header) == code(plain) and "main_kernel" in plain
