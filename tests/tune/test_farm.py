"""The sampling farm's measurers: arguments a kernel can run on."""

from __future__ import annotations

import pytest

pytest.importorskip("tvm")


def _embedding(rows: int, dim: int, count: int, dtype: str = "float32"):
    """An embedding lookup (``take``): the kind of task whose integer argument holds indices."""
    from tvm import te

    table = te.placeholder((rows, dim), dtype, name="table")
    ids = te.placeholder((count,), "int32", name="ids")
    out = te.compute((count, dim), lambda i, j: table[ids[i], j], name="out")
    return te.create_prim_func([table, ids, out])


def test_integer_arguments_are_indices_valid_for_every_axis():
    from opbench.tune.farm import index_values

    info = [["TENSOR", "float16", [30522, 768]], ["TENSOR", "int32", [128]], ["TENSOR", "float16", [128, 768]],
            ["TENSOR", "int64", [2, 3]]]
    values = index_values(info)
    assert values[0] is None and values[2] is None
    assert values[1].dtype.name == "int32" and values[1].shape == (128,)
    assert values[3].dtype.name == "int64" and values[3].shape == (2, 3)
    assert 0 <= values[1].min() and values[1].max() < 2  # the smallest extent of any axis is 2
    assert values[3].max() < 2
    assert len(set(index_values(info[:3])[1].tolist())) > 1  # random, not a constant


def _measure_embedding(folder: str) -> dict:
    import tvm

    from opbench.pipeline.sample import _args_info
    from opbench.tune.farm import Timing, measure_artifact

    mod = tvm.IRModule({"main": _embedding(1 << 20, 64, 256)})
    path = f"{folder}/take.so"
    tvm.compile(mod, target="llvm").export_library(path)
    return measure_artifact(path, _args_info(mod), Timing(repeat=2, min_repeat_ms=0.1), "llvm")


def test_an_embedding_lookup_is_measured_on_its_own_table(tmp_path):
    """Random bits as indices read far outside the table (a segfault here, on a GPU an illegal address that
    ends the measuring process): the farm's measurer gives the kernel indices inside it. Measured in a child
    process, as the farm does, so that a crash fails this test and not the session."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        result = pool.submit(_measure_embedding, str(tmp_path)).result(timeout=300)
    assert "error" not in result, result.get("error")
    assert len(result["run_secs"]) == result["repeats"] >= 2 and min(result["run_secs"]) > 0


@pytest.mark.parametrize("kernel_s, launch_s", [(5e-6, 8e-6), (2e-6, 20e-6), (40e-6, 8e-6), (3e-3, 8e-6)])
def test_a_sample_lasts_what_was_asked_for_although_one_call_overstates_a_short_kernel(kernel_s, launch_s):
    """One call alone costs its launch too; in a sample of many the launches hide behind the kernels. The
    calls per sample are chosen so that a sample of the steady kernel lasts ``min_repeat_ms``."""
    from opbench.tune.farm import Timing, calls_per_sample

    asked = []

    def per_call(number: int) -> float:
        asked.append(number)
        return kernel_s + launch_s / number  # seconds per call in a sample of ``number`` calls

    timing = Timing(min_repeat_ms=2.0)
    number, seconds = calls_per_sample(per_call, timing)
    assert number * kernel_s >= 2e-3 * 0.95 or number == 1
    assert number * kernel_s < 2e-3 * 1.5 + kernel_s  # not much longer than asked
    assert seconds == pytest.approx(kernel_s + launch_s / asked[-1]) and len(asked) <= 4
    assert calls_per_sample(per_call, Timing(min_repeat_ms=2.0, flush_l2=True))[0] == 1  # a flush before each call
