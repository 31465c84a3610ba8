"""Precision as part of a workload: float16/bfloat16 sources on llvm (outputs equal the PyTorch model in that
dtype), the fingerprint (float32 keys unchanged, another dtype never shares them), rows carrying the dtype,
batch lists and bad input on the command line."""

from __future__ import annotations

import json
import sqlite3

import numpy as np
import pytest

from helpers import replay_vs_vm, run
from opbench import OpBenchError
from opbench.models import DTYPES, check_dtype, load_workload

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("value, want", [("float16", "float16"), ("fp16", "float16"), ("half", "float16"),
                                         ("BF16", "bfloat16"), ("fp32", "float32"), (" float32 ", "float32")])
def test_dtype_names(value, want):
    assert check_dtype(value) == want


@pytest.mark.parametrize("value", ["int8", "float64", "bogus", ""])
def test_a_bad_dtype_is_one_line(value):
    with pytest.raises(OpBenchError, match=r"unknown dtype .* \(accepted: float32, float16, bfloat16; or fp32, "
                                           r"fp16, bf16\)") as err:
        load_workload("simple", "matmul:n=8", 1, dtype=value)
    assert "\n" not in str(err.value)


def test_the_dtype_keys_the_workload_and_float32_keys_stay():
    ids = {dtype: load_workload("simple", "matmul:n=16", 1, dtype=dtype).workload_id for dtype in DTYPES}
    assert len(set(ids.values())) == 3
    plain = load_workload("simple", "matmul:n=16", 1)
    assert plain.dtype == "float32" and "dtype" not in plain.fingerprint() and plain.workload_id == ids["float32"]
    half = load_workload("simple", "matmul:n=16", 1, dtype="fp16")
    assert half.fingerprint()["dtype"] == "float16" and half.inputs[0].dtype == "float16"


def test_onnx_keeps_its_own_dtypes(tmp_path):
    with pytest.raises(OpBenchError, match="source 'remoteonnx' keeps each model's own dtypes; --dtype float16 does "
                                           "not apply"):
        load_workload("remoteonnx", str(tmp_path / "m.onnx"), 1, dtype="float16")


@pytest.mark.parametrize("dtype, tol", [("float16", 2e-2), ("bfloat16", 8e-2)])
def test_a_local_model_in_half_precision_matches_torch_in_that_precision(llvm_target, dtype, tol):
    w = load_workload("local", "squeezenet_v1.1", 1, dtype=dtype, image_size=32)
    assert w.inputs[0].dtype == dtype and next(w.torch_module.parameters()).dtype == getattr(torch, dtype)
    err, outs, graph = replay_vs_vm(w, llvm_target)
    assert err < 1e-2 and outs[0].dtype.name == dtype
    assert all(n.output_dtypes[0] == dtype for n in graph if n.output_dtypes and n.kind != "transform")
    (x,) = w.torch_inputs()
    assert x.dtype == getattr(torch, dtype)
    with torch.no_grad():
        ref = w.torch_module(x).float().numpy()
    assert np.abs(outs[0].astype("float32") - ref).max() / np.abs(ref).max() < tol


@pytest.mark.slow
def test_collect_half_precision_rows_and_batch_lists(tmp_path):
    path = tmp_path / "d.sqlite"
    proc = run("--modelsource", "simple", "--modelname", "matmul:n=32", "--dtype", "fp16", "--batchsize", "1,2,1",
               "--repeat", "2", "--min-repeat-ms", "1", "--dataset", str(path), "--json", str(tmp_path / "s.json"))
    assert proc.returncode == 0, proc.stderr
    sweep = json.loads((tmp_path / "s.json").read_text())  # a list of sizes is a sweep: one process per size
    assert [(p["batch"], p["dtype"], p["status"]) for p in sweep["points"]] == [(1, "float16", "ok"),
                                                                                  (2, "float16", "ok")]
    summaries = [p["summary"] for p in sweep["points"]]
    assert [(s["batch_size"], s["dtype"]) for s in summaries] == [(1, "float16"), (2, "float16")]
    assert summaries[0]["replay_rel_error"] < 1e-2
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT batch_size, dtype, input_dtypes FROM operators ORDER BY batch_size").fetchall()
        models = conn.execute("SELECT dtype FROM models").fetchall()
    assert rows == [(1, "float16", '["float16", "float16"]'), (2, "float16", '["float16", "float16"]')]
    assert models == [("float16",), ("float16",)]


@pytest.mark.parametrize("args, message", [
    (["--dtype", "int8"], "unknown dtype 'int8'"),
    (["--batchsize", "1,,8"], "bad --batchsize '1,,8': an empty item"),
    (["--batchsize", "1,0"], "bad batch size '0' (accepted: a positive integer)"),
    (["--modelsource", "local", "--modelname", "resnet-50", "--batchsize", "1,100000"],
     "at batch size 100000 needs about"),
])
def test_bad_dtype_and_batch_lists_are_one_line(tmp_path, args, message):
    base = {"--modelsource": "simple", "--modelname": "matmul:n=32"}
    given = dict(zip(args[::2], args[1::2], strict=True))
    argv = [x for k, v in {**base, **given}.items() for x in (k, v)]
    proc = run(*argv, "--dataset", str(tmp_path / "d.sqlite"))
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "d.sqlite").exists()  # nothing measured, nothing allocated


def test_compare_takes_one_batch_size():
    proc = run("compare", "--modelsource", "simple", "--modelname", "matmul:n=32", "--batchsize", "1,8",
               script=False)
    assert proc.returncode == 2 and "--batchsize takes one size here, got '1,8'" in proc.stderr
