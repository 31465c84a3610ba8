"""Knob decoding from a real MetaSchedule trace (llvm conv2d, as stored in a JSON database)."""

from __future__ import annotations

import pytest

from opbench.tune.knobs import decode_knobs, knob_vector

TRACE = [[
    ["GetSBlock", [], ["pad_temp", "main"], ["b0"]], ["GetSBlock", [], ["conv2d_nchw", "main"], ["b1"]],
    ["GetSBlock", [], ["root", "main"], ["b2"]],
    ["Annotate", ["b1", "\"SSRSRS\""], ["meta_schedule.tiling_structure"], []],
    ["GetLoops", ["b1"], [], ["l3", "l4"]],
    ["SamplePerfectTile", ["l3"], [4, 64], ["v10", "v11", "v12", "v13"]],
    ["Split", ["l3", "v10", "v11", "v12", "v13"], [1, 0], ["l14", "l15", "l16", "l17"]],
    ["SamplePerfectTile", ["l4"], [2, 64], ["v18", "v19"]],
    ["Annotate", ["b2", 32], ["meta_schedule.parallel"], []],
    ["Annotate", ["b2", 64], ["meta_schedule.vectorize"], []],
    ["SampleCategorical", [], [[0, 16, 64, 512], [0.25, 0.25, 0.25, 0.25]], ["v54"]],
    ["Annotate", ["b2", "v54"], ["meta_schedule.unroll_explicit"], []],
    ["SampleComputeLocation", ["b0"], [], ["l55"]],
    ["Bind", ["l14"], ["threadIdx.x"], []],
    ["CacheRead", ["b1"], [0, "shared"], ["b60"]],
    ["EnterPostproc", [], [], []],
], [[5, [1, 2, 4, 2]], [7, [3, 1]], [10, 2], [12, 7]]]


def test_decode_knobs():
    assert decode_knobs(TRACE) == {
        "tile.conv2d_nchw.l0": [1, 2, 4, 2], "tile.conv2d_nchw.l1": [3, 1], "parallel": 32, "vectorize": 64,
        "unroll_explicit": 64, "compute_at.pad_temp": 7, "bind.threadIdx.x": 1, "cache_read": 1,
    }


def test_knob_vector_fixed_length():
    vec = knob_vector(TRACE, length=10)
    assert len(vec) == 10 and vec[:6] == [0.0, 1.0, 2.0, 1.0, 1.584962500721156, 0.0]
    assert vec[6] == 2.0 and vec[7] == 9.0 and vec[8:] == [0.0, 0.0]


def test_perfect_tilings_counts():
    from opbench.tune.space import perfect_tilings

    assert perfect_tilings(6, 2, 64) == 4  # 1x6 2x3 3x2 6x1
    assert perfect_tilings(8, 2, 2) == 2  # 4x2 8x1
    assert perfect_tilings(32, 4, 64) == 56  # C(5+3, 3)


@pytest.mark.slow
def test_configspace_command_writes_valid_json(tmp_path):
    import json

    from helpers import run

    out = tmp_path / "space.json"
    proc = run("configspace", "--modelsource", "simple", "--modelname", "matmul:n=32", "--json", str(out),
               script=False)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    (task,) = data["tasks"]
    assert task["task"] == "matmul" and task["space_size"] > 1000 and task["sketches"]
    kinds = {s["kind"] for sk in task["sketches"] for s in sk["samples"]}
    assert "SamplePerfectTile" in kinds and "SampleCategorical" in kinds
    tiles = [s for sk in task["sketches"] for s in sk["samples"] if s["kind"] == "SamplePerfectTile"]
    assert {t["extent"] for t in tiles} <= {1, 32}
