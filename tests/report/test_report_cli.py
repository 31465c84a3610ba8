"""`opbench report` as a user runs it: the HTML report and its figures, or what is missing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ..helpers import run

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "data" / "dataset" / "h100.sqlite.gz"

pytest.importorskip("xgboost")


@pytest.mark.skipif(not SHIPPED.exists(), reason="the shipped dataset is not in this checkout")
def test_report_on_the_shipped_dataset(tmp_path):
    pytest.importorskip("matplotlib")
    out = run("report", "--dataset", str(SHIPPED), "--out", str(tmp_path / "r"), script=False, timeout=600)
    assert out.returncode == 0, out.stderr
    page = (tmp_path / "r" / "index.html").read_text()
    for name in ("latency_by_kind", "roofline", "corun_speedup", "predicted_vs_measured", "tuning_curves",
                 "timeline"):
        png = tmp_path / "r" / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"href='{name}.png'" in page
    assert len(re.findall("data:image/png;base64,", page)) == 6 and "Not drawn" not in page


def test_report_says_what_is_missing(synthetic, tmp_path):
    pytest.importorskip("matplotlib")
    out = run("report", "--dataset", str(synthetic), "--out", str(tmp_path / "r"), script=False)
    assert out.returncode == 0, out.stderr
    page = (tmp_path / "r" / "index.html").read_text()
    assert "Not drawn: no tuning trials (collect with --iftune true)" in page
    assert (tmp_path / "r" / "roofline.png").exists() and not (tmp_path / "r" / "tuning_curves.png").exists()
