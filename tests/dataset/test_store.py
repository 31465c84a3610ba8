"""The SQLite store: schema, rows, resume keys, export."""

from __future__ import annotations

import contextlib
import sqlite3

import pandas as pd
import pytest

from opbench import OpBenchError
from opbench.dataset import SCHEMA_VERSION, Dataset, export, model_key


def _row(i: int, status: str = "ok") -> dict:
    return {**model_key("simple", "m", 1, "llvm"), "op_index": i, "func": f"f{i}", "kind": "conv2d",
            "ops": ["nn.conv2d"], "attrs": {"strides": [1, 1]}, "flops": 10.0 * i,
            "latency_median_s": 1e-3 * (i + 1), "status": status}


def test_rows_written_and_read(tmp_path):
    path = tmp_path / "d.sqlite"
    with Dataset(path) as ds:
        run = ds.start_run("opbench test", {"cpu_model": "x"})
        for i in range(3):
            ds.put("operators", {**_row(i), "run_id": run})
        ds.finish_run(run, "ok")
    # a fresh connection (another process) sees every row: each put committed
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert conn.execute("SELECT COUNT(*) FROM operators").fetchone()[0] == 3
        assert conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == str(SCHEMA_VERSION)
        assert conn.execute("SELECT status FROM runs").fetchone()[0] == "ok"
    with Dataset(path) as ds:
        rows = ds.rows("operators", model_key("simple", "m", 1, "llvm"))
    assert [r["op_index"] for r in rows] == [0, 1, 2]
    assert rows[1]["ops"] == '["nn.conv2d"]' and rows[2]["flops"] == 20.0


def test_has_and_replace(tmp_path):
    with Dataset(tmp_path / "d.sqlite") as ds:
        key = {**model_key("simple", "m", 1, "llvm"), "op_index": 0}
        assert not ds.has("operators", key)
        ds.put("operators", _row(0, status="failed"))
        assert not ds.has("operators", key)  # failed rows are measured again
        ds.put("operators", _row(0))
        assert ds.has("operators", key)
        assert ds.count("operators") == 1  # replaced, not duplicated
        assert not ds.has("operators", {**key, "target": "cuda"})


def test_unknown_column_rejected(tmp_path):
    with Dataset(tmp_path / "d.sqlite") as ds, pytest.raises(KeyError, match="nonsense"):
        ds.put("operators", {**_row(0), "nonsense": 1})


def test_schema_version_mismatch(tmp_path):
    path = tmp_path / "d.sqlite"
    Dataset(path).close()
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
        conn.commit()
    with pytest.raises(OpBenchError, match="schema version 99"):
        Dataset(path)


def test_not_a_database(tmp_path):
    path = tmp_path / "junk.sqlite"
    path.write_bytes(b"x" * 4096)
    with pytest.raises(OpBenchError, match="cannot open dataset"):
        Dataset(path)


def test_export_csv_and_parquet(tmp_path):
    path = tmp_path / "d.sqlite"
    with Dataset(path) as ds:
        for i in range(4):
            ds.put("operators", _row(i))
    (csv,) = export(path, "csv", tmp_path / "ops.csv")
    frame = pd.read_csv(csv)
    assert len(frame) == 4 and list(frame["op_index"]) == [0, 1, 2, 3]
    pytest.importorskip("pyarrow")
    (pq,) = export(path, "parquet", tmp_path / "ops.parquet")
    assert pd.read_parquet(pq)["flops"].tolist() == [0.0, 10.0, 20.0, 30.0]
    files = export(path, "csv", tmp_path / "all.csv", ["operators", "models"])
    assert [f.name for f in files] == ["all-operators.csv", "all-models.csv"]


def test_export_errors(tmp_path):
    with pytest.raises(OpBenchError, match="unknown export format 'xlsx'"):
        export(tmp_path / "d.sqlite", "xlsx", tmp_path / "o")
    with pytest.raises(OpBenchError, match="dataset not found"):
        export(tmp_path / "none.sqlite", "csv", tmp_path / "o.csv")
    Dataset(tmp_path / "d.sqlite").close()
    with pytest.raises(OpBenchError, match="unknown table 'ops'"):
        export(tmp_path / "d.sqlite", "csv", tmp_path / "o.csv", ["ops"])
