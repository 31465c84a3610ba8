"""scripts/bench_fused.py --table: the newest row of each model wins, and a row whose first builds were not cold
keeps the cold builds of an earlier row."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import bench_fused  # noqa: E402


def _row(model: str, batch: int, fused_ms: float, cold: tuple[float, float], rebuild_s: float) -> dict:
    ms = {"model graph": 1.0, "torch.compile": 0.5, "torch.compile + combo kernels": 0.6, "capturer fused": fused_ms}
    return {"model": model, "batch": batch, "dtype": "float32", "ms": ms, "fused_critical_path_ms": 0.2,
            "gap_to_critical_path": fused_ms / 0.2 - 1, "fused_vs_compile": 0.5 / fused_ms, "fused_kept": "opara",
            "rebuild": {"build_s": rebuild_s}, "cold": {"fused_cold_s": cold[0], "torch_compile_cold_s": cold[1]}}


def test_a_row_whose_first_builds_were_warm_keeps_the_earlier_cold_builds(tmp_path: Path) -> None:
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"results": [_row("googlenet", 8, 0.41, (14, 24), 5.0),
                                           _row("inception_v3", 8, 1.1, (11, 26), 5.9)]}))
    new = tmp_path / "new.json"
    new.write_text(json.dumps({"warm_first_builds": ["googlenet:8:float32", "nasnet:1:float32"],
                               "calls": [{"results": [_row("googlenet", 8, 0.40, (3, 5), 2.9),
                                                      _row("inception_v3", 8, 1.0, (12, 25), 4.3),
                                                      _row("nasnet", 1, 0.3, (1, 2), 7.0)]}]}))
    rows = {r["model"]: r for r in bench_fused.newest_rows([old, new])}
    assert rows["googlenet"]["ms"]["capturer fused"] == 0.40 and rows["googlenet"]["rebuild"]["build_s"] == 2.9
    assert rows["googlenet"]["cold"]["fused_cold_s"] == 14 and rows["googlenet"]["cold_source"] == "old.json"
    assert rows["inception_v3"]["cold"]["fused_cold_s"] == 12 and rows["inception_v3"]["cold_source"] == "new.json"
    assert rows["nasnet"]["cold"] == {} and rows["nasnet"]["cold_source"] is None  # no earlier row: none
    table = bench_fused.markdown_table(list(rows.values()))
    assert "| 14 / 24 | opara | new.json (cold: old.json) |" in table
    assert "| 12 / 25 | opara | new.json |" in table and "| nan / nan | opara | new.json (cold: none) |" in table
    assert "later builds over 5 s: 1 of 3 (nasnet:1 float32)" in table
    assert "cold builds over 1.2x a cold torch.compile (or not measured): 1 of 3 (nasnet:1 float32)" in table
