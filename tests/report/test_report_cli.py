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


RECORDS = ROOT / "data" / "dataset"


@pytest.mark.skipif(not (RECORDS / "manifest.json").exists(), reason="the shipped records are not in this checkout")
def test_report_on_the_shipped_records_draws_each_precision_and_the_learning_curve(tmp_path):
    """A records folder gets its own figures: every record counted once by precision, and the learning
    curve of a stored evaluation; without one the report says how to make it; a bad evaluation is one line,
    exit 2, and no report folder."""
    pytest.importorskip("matplotlib")
    import json

    from opbench.dataset import records

    evaluation = {"learning_curve": [{"n_train": 100, "pairwise": 0.6, "top1": 0.3, "top5": 0.8},
                                     {"n_train": 1000, "pairwise": 0.7, "top1": 0.5, "top5": 0.9}],
                  "noise": {"pairwise_ceiling": 0.9}}
    (tmp_path / "eval.json").write_text(json.dumps(evaluation))
    out = run("report", "--dataset", str(RECORDS), "--out", str(tmp_path / "r"), "--evaluation",
              str(tmp_path / "eval.json"), "--json", str(tmp_path / "r.json"), script=False, timeout=300)
    assert out.returncode == 0, out.stderr
    page = (tmp_path / "r" / "index.html").read_text()
    assert len(re.findall("data:image/png;base64,", page)) == 3 and "Not drawn" not in page
    summary = json.loads((tmp_path / "r.json").read_text())
    rows = records.read_rows(RECORDS)
    assert summary["counts"]["records"] == len(rows) == sum(v["records"] for v in summary["by_dtype"].values())
    assert "with 1000 records per fold: pairwise 0.700" in page
    bare = run("report", "--dataset", str(RECORDS), "--out", str(tmp_path / "b"), script=False, timeout=300)
    assert bare.returncode == 0 and "Not drawn: no evaluation of the trials cost model" in \
        (tmp_path / "b" / "index.html").read_text()
    (tmp_path / "list.json").write_text("[1, 2]")
    for args, message in ((["--evaluation", str(tmp_path / "list.json")], "holds a JSON list"),
                          (["--evaluation", str(tmp_path / "none.json")], "cannot read --evaluation")):
        bad = run("report", "--dataset", str(RECORDS), "--out", str(tmp_path / "x"), *args, script=False)
        assert bad.returncode == 2 and message in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "x").exists()
