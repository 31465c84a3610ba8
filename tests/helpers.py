"""Helpers shared by tests: build and replay a workload, tiny ONNX models."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "python" / "performance_collector" / "op_performance_collector.py"
FAST = ["--repeat", "2", "--min-repeat-ms", "1", "--quiet"]
SMALL = "branchy:branches=2,depth=2,channels=4,size=6"


def run(*args: str, script: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
    cmd = [sys.executable, str(SCRIPT), *args] if script else \
        [sys.executable, "-m", "opbench", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)


def count_rows(path: Path, table: str = "operators") -> int:
    conn = sqlite3.connect(path, timeout=30)
    try:
        return conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
    except sqlite3.OperationalError:
        return 0
    finally:
        conn.close()


def replay_vs_vm(workload: Any, target: Any) -> tuple[float, list[Any], Any]:
    """Replay every operator and compare with the whole-model Relax VM."""
    from opbench.ir import extract_operators
    from opbench.runtime import OperatorKernels, build_module, flatten_outputs, relative_error

    lowered, graph = extract_operators(workload.mod, target)
    built = build_module(lowered, target)
    kernels = OperatorKernels(graph, built)
    inputs = kernels.to_device(workload.example_inputs())
    outputs, _ = kernels.replay(inputs)
    expected = flatten_outputs(built.vm()["main"](*inputs))
    return relative_error(outputs, expected), [o.numpy() for o in outputs], graph


def tiny_onnx_bytes(seed: int = 0) -> bytes:
    """A small ONNX model: conv 3->4 (3x3, pad 1) + relu + add of a constant, symbolic batch."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype("float32"), "w")
    b = numpy_helper.from_array(rng.standard_normal((1, 4, 1, 1)).astype("float32"), "b")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Add", ["r", "b"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 8, 8])],
        initializer=[w, b],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def onnx_reference(data: bytes, x: np.ndarray) -> np.ndarray:
    """Evaluate the tiny ONNX model with onnx's reference evaluator."""
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(data).run(None, {"x": x})[0]
