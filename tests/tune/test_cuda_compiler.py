"""``--cuda-compiler nvrtc-pch``: the builders' CUDA compile callback pre-includes the headers of TVM's kernels
as one precompiled header; the kernels are the same as plain NVRTC's, a compile that fails with the
header is done again without it until the header has worked once, and a source NVRTC must reject fails
before compiling."""

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
        if options:
            raise RuntimeError("NVRTC_ERROR_INVALID_OPTION")  # an NVRTC without automatic PCH, say
        return b"cubin"

    monkeypatch.setattr(nvcc, "compile_cuda", fake)
    monkeypatch.setattr(measure, "_PCH", {})
    measure.use_cuda_compiler("nvrtc-pch")
    compile_ = _callback()
    assert bytes(compile_("kernel 1")) == b"cubin"
    assert calls[0][0] == "-pch" and calls[0][1].startswith("--pre-include=")
    assert calls[1] is None  # the failed compile is done again, plainly
    assert bytes(compile_("kernel 2")) == b"cubin" and calls[2:] == [None]  # and the process stops using the header
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


def test_once_the_header_has_worked_a_failing_kernel_is_compiled_once(monkeypatch, restore_callback):
    import tvm.support.nvcc as nvcc

    from opbench.tune import measure

    calls = []

    def fake(code, target_format=None, compiler=None, options=None, **_):
        calls.append((code, options))
        if code == "bad kernel":
            raise RuntimeError("error: too many arguments in function call")
        return b"cubin"

    monkeypatch.setattr(nvcc, "compile_cuda", fake)
    monkeypatch.setattr(measure, "_PCH", {})
    measure.use_cuda_compiler("nvrtc-pch")
    assert bytes(_callback()("kernel")) == b"cubin"
    with pytest.raises(Exception, match="too many arguments"):
        _callback()("bad kernel")
    assert [c for c, _ in calls] == ["kernel", "bad kernel"] and calls[1][1] == calls[0][1]  # with the header, once
    assert not measure._PCH.get("failed")


#: TVM 0.27's CUDA code for an 8-lane int64 vector (bfloat16 candidates), and the same with 4 lanes
_EIGHT_ARGS = ('extern "C" __global__ void k(long long* a, int n) {\n'
               "  longlong4 v = make_longlong4((n * 2), (n * 2), 2, 2, 2, 2, 2, make_int2(n, 2).x);\n"
               "  a[0] = v.x;\n}\n")
_FOUR_ARGS = _EIGHT_ARGS.replace(", 2, 2, 2, make_int2(n, 2).x)", ")")


def test_a_vector_constructor_with_more_arguments_than_lanes_fails_before_nvrtc(monkeypatch, restore_callback):
    import tvm.support.nvcc as nvcc

    from opbench.tune import measure

    assert measure.known_compile_error(_EIGHT_ARGS) == ("make_longlong4 called with 8 arguments for 4 lanes: "
                                                        "too many arguments")
    assert measure.known_compile_error(_FOUR_ARGS) is None
    assert "too few" in measure.known_compile_error("float4 f = make_float4(1.0f, g(2, 3));")
    calls = []
    monkeypatch.setattr(nvcc, "compile_cuda", lambda code, **_: calls.append(code) or b"cubin")
    monkeypatch.setattr(measure, "_PCH", {})
    measure.use_cuda_compiler("nvrtc-pch")
    with pytest.raises(Exception, match="NVRTC compilation failed .*make_longlong4 called with 8 arguments"):
        _callback()(_EIGHT_ARGS)
    assert calls == []
    assert bytes(_callback()(_FOUR_ARGS)) == b"cubin" and calls == [_FOUR_ARGS]


def test_nvrtc_rejects_what_known_compile_error_finds_and_compiles_the_rest():
    """The shortcut says what the compiler would: NVRTC itself (where it can compile on this machine)."""
    from tvm.support.nvcc import compile_cuda

    try:
        compile_cuda(_FOUR_ARGS, target_format="ptx", arch="sm_90", compiler="nvrtc")
    except Exception as err:  # no NVRTC or CUDA headers on this machine
        pytest.skip(f"NVRTC cannot compile here: {str(err).splitlines()[0][:120]}")
    with pytest.raises(Exception, match="too many arguments in function call"):
        compile_cuda(_EIGHT_ARGS, target_format="ptx", arch="sm_90", compiler="nvrtc")


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
