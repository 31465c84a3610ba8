"""scripts/bench_predict.py --part pretrained: the arms are checked before any tuning starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("arms", "says"), [
    ("xgb,foo", "--arms xgb,foo: accepted are xgb, xgb-pretrained (comma-separated) or none"),
    ("xgb-pretrained", "--arms xgb-pretrained needs --pretrained"),
])
def test_bad_arms_are_refused_in_one_line_before_any_tuning(tmp_path: Path, arms: str, says: str) -> None:
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_predict.py"), "--part", "pretrained",
                           "--arms", arms, "--out", str(out)], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(ROOT / "python"), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0]
    assert not out.exists() or not any(out.iterdir())  # nothing tuned, no database written
