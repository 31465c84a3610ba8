"""Casting a Relax module to float16/bfloat16: every float32 value cast, convolutions and matmuls
accumulating in float32, integer tensors untouched, operators TVM cannot run in bfloat16 kept in float32."""

from __future__ import annotations

import numpy as np
import pytest

from opbench.ir.precision import cast_module

tvm = pytest.importorskip("tvm")
relax = tvm.relax


def _module(norm: bool = False):
    """x (float32) -> conv2d (+ constant bias) -> relu -> [layer norm] ; ids (int64) -> + 1"""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 3, 8, 8), "float32"))
    ids = relax.Var("ids", relax.TensorType((1, 4), "int64"))
    rng = np.random.default_rng(0)
    with bb.function("main", [x, ids]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, relax.const(rng.standard_normal((4, 3, 3, 3)).astype("float32")),
                                           padding=(1, 1), out_dtype="float32"))
            y = bb.emit(relax.op.add(y, relax.const(np.ones((1, 4, 1, 1), "float32"))))
            y = bb.emit(relax.op.nn.relu(y))
            if norm:
                y = bb.emit(relax.op.nn.layer_norm(y, relax.const(np.ones((8,), "float32")),
                                                   relax.const(np.zeros((8,), "float32")), axes=[-1]))
            z = bb.emit(relax.op.add(ids, relax.const(1, "int64")))
            out = bb.emit_output(relax.Tuple([y, z]))
        bb.emit_func_output(out)
    return bb.get()


def _run(mod, *args):
    exe = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(exe, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a) for a in args])
    return [o.numpy() for o in out]


def test_float32_is_left_as_it_is():
    mod = _module()
    assert cast_module(mod, "float32") is mod


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_every_float_is_cast_and_convolutions_accumulate_in_float32(dtype):
    from opbench.models import numpy_dtype

    cast = cast_module(_module(), dtype)
    text = cast["main"].script()
    params = cast["main"].params
    assert str(params[0].ty.dtype) == dtype and str(params[1].ty.dtype) == "int64"
    # float32 survives only as the convolution's accumulator, cast to dtype right after
    assert text.count('out_dtype="float32"') == 1 and f'R.astype(lv, dtype="{dtype}")' in text
    assert all("R.nn.conv2d" in line for line in text.splitlines() if "float32" in line)
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype("float32")
    ids = np.arange(4, dtype="int64").reshape(1, 4)
    want = _run(_module(), x, ids)
    got = _run(cast, x.astype(numpy_dtype(dtype)), ids)
    assert got[0].dtype == numpy_dtype(dtype) and got[1].dtype == np.int64
    np.testing.assert_array_equal(got[1], want[1])
    tol = 1e-2 if dtype == "float16" else 5e-2
    np.testing.assert_allclose(got[0].astype("float32"), want[0], rtol=tol, atol=tol * np.abs(want[0]).max())


def test_layer_norm_stays_float32_in_bfloat16_only():
    bf16 = cast_module(_module(norm=True), "bfloat16")["main"].script()
    line = next(x for x in bf16.splitlines() if "layer_norm" in x)
    assert 'dtype="float32"' in line and "metadata" in line  # float32 gamma and beta, float32 result
    assert bf16.count('R.astype(') == 3  # the conv's rounding, into the norm, out of it
    fp16 = cast_module(_module(norm=True), "float16")["main"].script()
    assert 'dtype="float16"' in next(x for x in fp16.splitlines() if "layer_norm" in x)
    x = np.random.default_rng(2).standard_normal((1, 3, 8, 8)).astype("float32")
    ids = np.zeros((1, 4), "int64")
    from opbench.models import numpy_dtype

    out = _run(cast_module(_module(norm=True), "bfloat16"), x.astype(numpy_dtype("bfloat16")), ids)[0]
    want = _run(_module(norm=True), x, ids)[0]
    np.testing.assert_allclose(out.astype("float32"), want, atol=0.1)
