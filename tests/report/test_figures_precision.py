"""The report's figures on rows of several precisions: one series per precision, and the captions'
figures per precision equal the dataset's."""

from __future__ import annotations

import gzip
import sqlite3
import statistics
from pathlib import Path

import pytest

from opbench.report.figures import ReportData, corun_speedups, per_dtype, roofline

HALF = Path(__file__).resolve().parents[2] / "data" / "dataset" / "h100_half.sqlite.gz"


def test_per_dtype_names_each_precision_with_its_count_and_stays_quiet_on_one() -> None:
    rows = [{"dtype": "float16", "v": 1.0}, {"dtype": "float16", "v": 3.0}, {"dtype": "bfloat16", "v": 5.0},
            {"v": 7.0}]  # a row without dtype is float32
    text = per_dtype(rows, lambda g: statistics.median(r["v"] for r in g), ".1f")
    assert text == "bfloat16 5.0 (n=1), float16 2.0 (n=2), float32 7.0 (n=1)"
    assert per_dtype(rows[:2], lambda g: 0.0, ".1f") == ""


@pytest.mark.skipif(not HALF.exists(), reason="the shipped half-precision dataset is not in this checkout")
def test_corun_and_roofline_figures_split_the_half_precision_rows_by_dtype(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    plain = tmp_path / "half.sqlite"
    plain.write_bytes(gzip.decompress(HALF.read_bytes()))
    with sqlite3.connect(plain) as conn:
        medians = {d: statistics.median(v for (v,) in conn.execute(
            "SELECT speedup FROM corun WHERE status='ok' AND speedup IS NOT NULL AND dtype=? "
            "AND workload NOT LIKE 'simple:%'", (d,))) for d in ("bfloat16", "float16")}
    data = ReportData.load(HALF)
    caption = corun_speedups(data, tmp_path / "corun.png")
    for dtype, median in medians.items():
        count = sum(1 for g in data.coruns if g["dtype"] == dtype)
        assert f"{dtype} {median:.2f} (n={count})" in caption
    assert (tmp_path / "corun.png").read_bytes()[:4] == b"\x89PNG"
    caption = roofline(data, tmp_path / "roofline.png")
    drawn = [o for o in data.ops if (o.get("flops") or 0) > 0 and (o.get("bytes") or 0) > 0]
    assert {o["dtype"] for o in drawn} == {"bfloat16", "float16"}
    assert caption.startswith(f"{len(drawn)} operators (bfloat16, float16)")
