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
@pytest.mark.slow
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


@pytest.mark.slow
def test_report_says_what_is_missing(synthetic, tmp_path):
    pytest.importorskip("matplotlib")
    out = run("report", "--dataset", str(synthetic), "--out", str(tmp_path / "r"), script=False)
    assert out.returncode == 0, out.stderr
    page = (tmp_path / "r" / "index.html").read_text()
    assert "Not drawn: no tuning trials (collect with --iftune true)" in page
    assert (tmp_path / "r" / "roofline.png").exists() and not (tmp_path / "r" / "tuning_curves.png").exists()


@pytest.mark.slow
def test_report_counts_agree_and_nothing_is_trained(synthetic, tmp_path, monkeypatch):
    """The counts the report states equal its tables' and its figures' on a fixture dataset; it draws the
    held-out predictions 'opbench train --out' stored, with XGBoost unimportable (nothing is trained)."""
    import json
    import sqlite3
    import sys

    pytest.importorskip("matplotlib")
    predictor = tmp_path / "lat.xgb"
    out = run("train", "--dataset", str(synthetic), "--what", "latency", "--out", str(predictor), "-q",
              script=False)
    assert out.returncode == 0, out.stderr
    stored = json.loads((tmp_path / "lat.xgb.heldout.json").read_text())
    from opbench.report import write_report

    monkeypatch.setitem(sys.modules, "xgboost", None)  # an import of XGBoost now fails
    index = write_report(synthetic, tmp_path / "r", predictor=predictor)
    summary = json.loads((index.parent / "report.json").read_text())
    counts = summary["counts"]
    with sqlite3.connect(synthetic) as conn:
        ops = conn.execute("SELECT COUNT(*) FROM operators WHERE status='ok' AND config='default' "
                           "AND latency_median_s IS NOT NULL").fetchone()[0]
        groups = conn.execute("SELECT COUNT(*) FROM corun WHERE status='ok' AND speedup IS NOT NULL").fetchone()[0]
    assert counts["operators"] == ops == sum(w["operators"] for w in summary["workloads"])
    assert counts["corun_groups"] == groups == sum(w["corun_groups"] for w in summary["workloads"])
    assert counts["workloads"] == len(summary["workloads"]) == 6
    page = index.read_text()
    assert f"{counts['workloads']} workloads of {counts['models']} models, {counts['operators']} measured" in page
    figures = {f["file"]: f for f in summary["figures"]}
    assert figures["predicted_vs_measured.png"]["missing"] is None
    assert figures["corun_speedup.png"]["missing"] is None and figures["roofline.png"]["caption"].startswith(
        f"{counts['operators']} operators")
    assert len(stored["rows"]) == counts["operators"]
    assert "Slowest operators" in page and len(summary["top_operators"]) == 15
    assert figures["timeline.png"]["caption"].startswith("Simulated, not measured")


def test_report_refuses_a_missing_dataset_before_making_its_folder(tmp_path):
    out = run("report", "--dataset", str(tmp_path / "none.sqlite"), "--out", str(tmp_path / "r"), script=False)
    assert out.returncode == 2 and "not found" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()
