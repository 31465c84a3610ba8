"""scripts/bench_tuning.py's per-operator table: ATen times paired with the right operators, and the
median share of ATen's speed the tuned kernels reach."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import bench_tuning  # noqa: E402


def _task(func: str, default_s: float, tuned_s: float, kept: bool = True) -> dict:
    return {"func": func, "default_s": default_s, "tuned_s": tuned_s, "kept": kept}


def test_ten_slowest_operators_are_paired_with_aten_and_their_median_share_computed() -> None:
    tasks = [_task("conv_a", 4e-4, 1e-4), _task("conv_b", 2e-4, 4e-5), _task("mm", 1e-4, 5e-5, kept=False)]
    tvm = [{"index": 0, "name": "conv_a", "kind": "conv2d", "output_shape": [1, 8, 4, 4]},
           {"index": 1, "name": "relu", "kind": "elementwise", "output_shape": [1, 8, 4, 4]},
           {"index": 2, "name": "conv_b", "kind": "conv2d", "output_shape": [1, 16, 2, 2]},
           {"index": 3, "name": "mm", "kind": "matmul", "output_shape": [1, 10]}]
    torch = [{"kind": "aten::conv2d", "output_shape": [1, 8, 4, 4], "alone_ms": 0.05},
             {"kind": "aten::relu", "output_shape": [1, 8, 4, 4], "alone_ms": 0.001},
             {"kind": "aten::conv2d", "output_shape": [1, 16, 2, 2], "alone_ms": 0.03},
             {"kind": "aten::linear", "output_shape": [1, 10], "alone_ms": 0.02}]
    rows = bench_tuning.top_operators(tasks, tvm, torch, n=10)
    assert [r["func"] for r in rows] == ["conv_a", "conv_b", "mm"]  # slowest default first; relu has no task
    assert [r["aten_ms"] for r in rows] == [0.05, 0.03, 0.02]
    assert rows[2]["tuned_ms"] == pytest.approx(0.1)  # a tuned kernel not kept: the default one runs
    # ATen / tuned: 0.05/0.1, 0.03/0.04, 0.02/0.1 -> median 0.5
    assert bench_tuning.median_aten_fraction(rows) == pytest.approx(0.5)
    assert "reaches 50% of ATen's speed" in bench_tuning.format_top(rows)
    assert bench_tuning.median_aten_fraction(bench_tuning.top_operators(tasks, tvm, None)) is None
