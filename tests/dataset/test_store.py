"""The SQLite store: schema v2, honest keys, safe opening, migration from v1, typed export and loading."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sqlite3
import threading
from pathlib import Path

import pandas as pd
import pytest

from opbench import OpBenchError
from opbench.dataset import SCHEMA_VERSION, Dataset, export, load, model_key
from opbench.dataset.migrate import _V1

KEY = model_key("w" * 16, "d" * 16, source="simple", model="m", batch_size=1, target='{"kind":"llvm"}')


def _row(i: int, status: str = "ok", key: dict | None = None) -> dict:
    return {**(key or KEY), "op_index": i, "func": f"f{i}", "kind": "conv2d",
            "ops": ["nn.conv2d"], "attrs": {"strides": [1, 1]}, "flops": 10.0 * i,
            "input_shapes": [[1, 3, 8, 8], [4, 3, 3, 3]], "preds": list(range(i)),
            "latency_median_s": 1e-3 * (i + 1), "status": status, "measured_at": "2026-11-22T06:00:00+00:00"}


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


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
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        assert meta["schema_version"] == str(SCHEMA_VERSION) == "8" and meta["created_by"].startswith("opbench ")
        assert conn.execute("SELECT status FROM runs").fetchone()[0] == "ok"
    with Dataset(path) as ds:
        rows = ds.rows("operators", {"workload_id": KEY["workload_id"]})
    assert [r["op_index"] for r in rows] == [0, 1, 2]
    assert rows[1]["ops"] == '["nn.conv2d"]' and rows[2]["flops"] == 20.0


def test_has_and_replace_by_every_key_column(tmp_path):
    with Dataset(tmp_path / "d.sqlite") as ds:
        key = {**KEY, "op_index": 0}
        assert not ds.has("operators", key)
        ds.put("operators", _row(0, status="failed"))
        assert not ds.has("operators", key)  # failed rows are measured again
        ds.put("operators", _row(0))
        assert ds.has("operators", key)
        assert ds.count("operators") == 1  # replaced, not duplicated
        for column, other in [("workload_id", "x" * 16), ("device_id", "y" * 16), ("config", "db:abc"),
                              ("l2_flush", 1)]:
            assert not ds.has("operators", {**key, column: other})
            ds.put("operators", _row(0, key={**KEY, column: other}))
        assert ds.count("operators") == 5  # four variants beside the first row


def test_unknown_or_missing_key_column_rejected(tmp_path):
    with Dataset(tmp_path / "d.sqlite") as ds:
        with pytest.raises(KeyError, match="nonsense"):
            ds.put("operators", {**_row(0), "nonsense": 1})
        with pytest.raises(KeyError, match="device_id"):
            ds.put("operators", {k: v for k, v in _row(0).items() if k != "device_id"})


def _v1_file(path: Path) -> None:
    """A dataset as version 1 wrote it, with one row in each table."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
        conn.execute("CREATE TABLE runs (run_id INTEGER PRIMARY KEY AUTOINCREMENT, started_at TEXT, "
                     "finished_at TEXT, status TEXT, command TEXT, env TEXT)")
        for table in ("operators", "models", "corun"):
            cols = ", ".join(c for c in _V1[table] if c != "id")
            conn.execute(f"CREATE TABLE {table} (id INTEGER PRIMARY KEY AUTOINCREMENT, {cols})")
        conn.execute("INSERT INTO meta VALUES ('schema_version', '1')")
        conn.execute("INSERT INTO runs (started_at, status, command, env) VALUES ('2026-11-21T00:00:00+00:00', "
                     "'ok', 'opbench collect', '{}')")
        v1key = ("simple", "branchy:branches=2", 1, "llvm", "default")
        conn.execute("INSERT INTO operators (run_id, source, model, batch_size, target, config, op_index, kind, "
                     "latency_median_s, l2_flush, cpu_model, status, ops) VALUES (1, ?, ?, ?, ?, ?, 0, 'conv2d', "
                     "0.5, 0, 'Some CPU', 'ok', '[\"nn.conv2d\"]')", v1key)
        conn.execute("INSERT INTO models (run_id, source, model, batch_size, target, config, num_ops, "
                     "vm_latency_median_s, cpu_model, status) VALUES (1, ?, ?, ?, ?, ?, 1, 0.7, 'Some CPU', 'ok')",
                     v1key)
        conn.commit()


def test_v1_is_backed_up_and_migrated(tmp_path, caplog):
    path = tmp_path / "old.sqlite"
    _v1_file(path)
    before = sha(path)
    with caplog.at_level("WARNING", logger="opbench"), Dataset(path) as ds:
        assert ds.schema_version() == 8
        (op,) = ds.rows("operators")
        (model,) = ds.rows("models")
    backup = tmp_path / "old.sqlite.v1-backup"
    assert sha(backup) == before  # the backup is the original, byte for byte
    assert [r.message for r in caplog.records if "migrated" in r.message] == [
        f"migrated dataset {path} from schema version 1 to 8; the original is kept as {backup}"]
    assert op["model"] == "branchy:branches=2" and op["latency_median_s"] == 0.5 and op["run_id"] == 1
    assert op["workload_id"] and op["device_id"] and op["device_name"] == "Some CPU"
    assert '"schema": 1' in op["workload"] and model["workload_id"] == op["workload_id"]
    assert op["dtype"] == model["dtype"] == "float32"  # version 1 measured float32 only
    with contextlib.closing(sqlite3.connect(path)) as conn:
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    assert meta == {"schema_version": "8", "migrated_from": "1"}
    # a v2 key can never be one of these: migrated workloads are marked
    with Dataset(path) as ds:
        assert not ds.has("operators", {**KEY, "op_index": 0})


def test_readonly_open_of_v1_migrates_in_memory_only(tmp_path):
    path = tmp_path / "old.sqlite"
    _v1_file(path)
    before = sha(path)
    frame = load(path, "operators")
    assert len(frame) == 1 and frame["latency_median_s"].iloc[0] == 0.5
    export(path, None, tmp_path / "x.csv", ["operators"])
    assert sha(path) == before and not (tmp_path / "old.sqlite.v1-backup").exists()


def _unrelated(path: Path) -> None:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE customers (id INTEGER, name TEXT)")
        conn.commit()


def _newer(path: Path) -> None:
    Dataset(path).close()
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
        conn.commit()
        conn.execute("PRAGMA journal_mode=DELETE")


def _foreign_column(path: Path) -> None:
    Dataset(path).close()
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("ALTER TABLE operators ADD COLUMN secret TEXT")
        conn.execute("PRAGMA journal_mode=DELETE")
        conn.commit()


def _foreign_table(path: Path) -> None:
    Dataset(path).close()
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE extra (x INTEGER)")
        conn.execute("PRAGMA journal_mode=DELETE")
        conn.commit()


def _junk(path: Path) -> None:
    path.write_bytes(b"x" * 4096)


@pytest.mark.parametrize("make, message", [
    (_junk, "not an OpBench dataset (not an SQLite file)"),
    (_unrelated, "SQLite file but not an OpBench dataset (tables: customers"),
    (_newer, "schema version 99, newer than this OpBench reads (8)"),
    (_foreign_column, "table 'operators' has foreign columns secret"),
    (_foreign_table, "foreign tables: extra"),
])
@pytest.mark.parametrize("readonly", [False, True])
def test_refused_files_are_left_untouched(make, message, readonly, tmp_path):
    path = tmp_path / "d.sqlite"
    make(path)
    names = sorted(p.name for p in tmp_path.iterdir())
    before = sha(path)
    with pytest.raises(OpBenchError, match=message.replace("(", r"\(").replace(")", r"\)")) as info:
        Dataset(path, readonly=readonly)
    assert "\n" not in str(info.value)
    assert sha(path) == before and sorted(p.name for p in tmp_path.iterdir()) == names


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes read-only files")
def test_read_only_file(tmp_path):
    path = tmp_path / "d.sqlite"
    Dataset(path).close()
    path.chmod(0o444)
    with pytest.raises(OpBenchError, match="is read-only"):
        Dataset(path)
    assert len(load(path, "runs")) == 0  # reading still works


def test_read_only_file_even_as_root(tmp_path, monkeypatch):
    path = tmp_path / "d.sqlite"
    Dataset(path).close()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == path and mode == os.W_OK
                        else real(p, mode))
    with pytest.raises(OpBenchError, match=f"dataset '{path}' is read-only"):
        Dataset(path)


def test_lock_held_longer_than_the_timeout(tmp_path, monkeypatch):
    path = tmp_path / "d.sqlite"
    with Dataset(path) as ds:
        ds.put("operators", _row(0))
    monkeypatch.setenv("OPBENCH_DB_TIMEOUT", "0.2")
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(OpBenchError, match=r"is locked by another process \(waited 0.2 s") as info:
            with Dataset(path) as ds:
                ds.put("operators", _row(1))
        assert "\n" not in str(info.value)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    with Dataset(path) as ds:
        assert ds.count("operators") == 1  # the finished row is kept


def test_disk_full_is_one_line_and_keeps_rows(tmp_path):
    path = tmp_path / "d.sqlite"
    with Dataset(path) as ds:
        ds.put("operators", _row(0))
        pages = ds.conn.execute("PRAGMA page_count").fetchone()[0]
        ds.conn.execute(f"PRAGMA max_page_count = {pages}")
        with pytest.raises(OpBenchError, match=f"disk full writing dataset '{path}'; rows written so far are kept"):
            for i in range(1, 200):
                ds.put("operators", {**_row(i), "error": "x" * 4000})
    with Dataset(path) as ds:
        assert ds.count("operators") >= 1


def test_concurrent_creation(tmp_path):
    path = tmp_path / "d.sqlite"
    errors = []

    def open_it():
        try:
            Dataset(path).close()
        except Exception as err:  # noqa: BLE001
            errors.append(err)

    threads = [threading.Thread(target=open_it) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def _populated(path: Path) -> None:
    with Dataset(path) as ds:
        run = ds.start_run("opbench test", {"cpu_model": "x"})
        for i in range(4):
            ds.put("operators", {**_row(i), "run_id": run})
        ds.finish_run(run, "ok")


def test_export_is_read_only_and_typed(tmp_path):
    path = tmp_path / "d.sqlite"
    _populated(path)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    before = sha(path)
    (csv,) = export(path, None, tmp_path / "ops.csv", ["operators"])
    frame = pd.read_csv(csv)
    assert len(frame) == 4 and list(frame["op_index"]) == [0, 1, 2, 3]
    assert frame["preds"].iloc[2] == "[0, 1]"  # lists as JSON in CSV
    files = export(path, "csv", tmp_path / "all.csv")
    tables = ("runs", "operators", "models", "corun", "trials", "tasks")
    assert [f.name for f in files] == [f"all-{t}.csv" for t in tables]
    assert sha(path) == before
    pytest.importorskip("pyarrow")
    (pq,) = export(path, None, tmp_path / "ops.parquet", ["operators"])
    loaded = load(path, "operators")
    from_parquet = pd.read_parquet(pq)
    assert from_parquet["input_shapes"].iloc[0].tolist()[0].tolist() == [1, 3, 8, 8]
    assert loaded["input_shapes"].iloc[0] == [[1, 3, 8, 8], [4, 3, 3, 3]]
    assert loaded["preds"].iloc[3] == [0, 1, 2] and list(from_parquet["preds"].iloc[3]) == [0, 1, 2]
    assert str(loaded["measured_at"].dtype) == str(from_parquet["measured_at"].dtype) == "datetime64[ms, UTC]"
    assert frame["ops"].iloc[0] == '["nn.conv2d"]'
    assert str(loaded["op_index"].dtype) == "Int64" and loaded["flops"].dtype == "float64"
    assert loaded["attrs"].iloc[0] == '{"strides": [1, 1]}'  # free-form mappings stay JSON text
    runs = load(path, "runs")
    assert runs["status"].tolist() == ["ok"] and str(runs["started_at"].dtype) == "datetime64[ms, UTC]"
    assert sha(path) == before


def test_export_errors(tmp_path):
    with pytest.raises(OpBenchError, match="unknown export format 'xlsx'"):
        export(tmp_path / "d.sqlite", "xlsx", tmp_path / "o")
    with pytest.raises(OpBenchError, match="cannot tell the format of"):
        export(tmp_path / "d.sqlite", None, tmp_path / "o.xls")
    with pytest.raises(OpBenchError, match="dataset not found"):
        export(tmp_path / "none.sqlite", "csv", tmp_path / "o.csv")
    assert not (tmp_path / "none.sqlite").exists()
    Dataset(tmp_path / "d.sqlite").close()
    with pytest.raises(OpBenchError, match="unknown table 'ops'"):
        export(tmp_path / "d.sqlite", "csv", tmp_path / "o.csv", ["ops"])


def _old_dataset(path, version):
    """An empty dataset as version 2 to 7 wrote it (no trials table in 2, no SM-partition co-run columns
    and no dtype column before 4, no percentile columns before 5, no gpu_uuid before 6, no tasks table and
    no sampler columns of trials before 7, no energy columns before 8)."""
    from opbench.dataset.schema import ENERGY_COLUMNS, PERCENTILE_COLUMNS, SAMPLE_COLUMNS, create_statements

    with contextlib.closing(sqlite3.connect(path)) as conn:
        for stmt in create_statements():
            if (version >= 3 or "CREATE TABLE trials" not in stmt) and (version >= 7 or "CREATE TABLE tasks"
                                                                            not in stmt):
                conn.execute(stmt)
        for table, columns in ENERGY_COLUMNS.items():
            for column, _ in columns:
                conn.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
        for column, _ in SAMPLE_COLUMNS if 3 <= version < 7 else ():
            conn.execute(f"ALTER TABLE trials DROP COLUMN {column}")
        for table in ("operators", "models", "corun", "trials") if version < 6 else ():
            if version >= 3 or table != "trials":
                conn.execute(f"ALTER TABLE {table} DROP COLUMN gpu_uuid")
        for table, columns in PERCENTILE_COLUMNS.items() if version < 5 else ():
            for column, _ in columns:
                conn.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
        for column in ("partitioned_s", "partition_sms") if version < 4 else ():
            conn.execute(f"ALTER TABLE corun DROP COLUMN {column}")
        for table in ("operators", "models", "corun", "trials") if version < 4 else ():
            if version >= 3 or table != "trials":
                conn.execute(f"ALTER TABLE {table} DROP COLUMN dtype")
        conn.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(version),))
        conn.commit()


def test_v2_gains_the_trials_table(tmp_path):
    path = tmp_path / "v2.sqlite"
    _old_dataset(path, 2)
    with Dataset(path) as ds:
        ds.put("operators", _row(0))
        assert ds.schema_version() == 8 and ds.count("trials") == 0
    assert (tmp_path / "v2.sqlite.v2-backup").is_file()


def test_v3_gains_the_partition_columns_of_corun_and_a_dtype(tmp_path):
    path = tmp_path / "v3.sqlite"
    _old_dataset(path, 3)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("INSERT INTO corun (workload_id, device_id, config, l2_flush, group_key, speedup) "
                     "VALUES ('w', 'd', 'default', 0, 'g', 1.5)")
        conn.commit()
    with Dataset(path, readonly=True) as ds:  # read only: migrated in memory, the file stays version 3
        assert ds.schema_version() == 8
    with Dataset(path) as ds:
        assert ds.schema_version() == 8
    with contextlib.closing(sqlite3.connect(path)) as conn:
        cols = [r[1] for r in conn.execute("PRAGMA table_info(corun)")]
        row = conn.execute("SELECT speedup, partitioned_s, partition_sms, dtype FROM corun").fetchone()
        meta = dict(conn.execute("SELECT key, value FROM meta WHERE key != 'created_by'").fetchall())
    assert cols[-10:-7] == ["partitioned_s", "partition_sms", "dtype"] and row == (1.5, None, None, "float32")
    assert cols[-7:-3] == ["concurrent_p10_s", "concurrent_p90_s", "concurrent_p99_s", "gpu_uuid"]
    assert cols[-3:] == ["concurrent_energy_j", "concurrent_power_w", "concurrent_energy_window_s"]
    assert meta == {"schema_version": "8", "migrated_from": "3"}
    assert (tmp_path / "v3.sqlite.v3-backup").is_file()


def _migrated_row(tmp_path, version: int, insert: str):
    """A dataset as ``version`` wrote it holding one row (``insert``), opened (so migrated): its path and
    that row as it reads now."""
    path = tmp_path / f"v{version}.sqlite"
    _old_dataset(path, version)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute(insert)
        conn.commit()
    with Dataset(path) as ds:
        assert ds.schema_version() == 8
        (row,) = ds.rows(insert.split()[2])
    return path, row


def test_v4_gains_the_percentile_columns(tmp_path):
    path, row = _migrated_row(tmp_path, 4, "INSERT INTO operators (workload_id, device_id, config, l2_flush, op_index, "
                              "latency_median_s, dtype) VALUES ('w', 'd', 'default', 0, 0, 0.5, 'float16')")
    assert (row["latency_median_s"], row["dtype"], row["latency_p90_s"], row["latency_p99_s"]) == \
        (0.5, "float16", None, None)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        cols = {t: [r[1] for r in conn.execute(f"PRAGMA table_info({t})")] for t in ("operators", "models")}
    assert cols["operators"][-7:-3] == ["latency_p10_s", "latency_p90_s", "latency_p99_s", "gpu_uuid"]
    assert cols["models"][-7:-3] == ["vm_latency_p10_s", "vm_latency_p90_s", "vm_latency_p99_s", "gpu_uuid"]


def test_v5_gains_the_gpu_uuid(tmp_path):
    path, row = _migrated_row(tmp_path, 5, "INSERT INTO models (workload_id, device_id, config, l2_flush, "
                              "vm_latency_p90_s, gpu_name) VALUES ('w', 'd', 'default', 0, 0.5, 'NVIDIA H200')")
    assert (row["vm_latency_p90_s"], row["gpu_name"], row["gpu_uuid"]) == (0.5, "NVIDIA H200", None)
    with Dataset(path) as ds:
        ds.put("models", {"workload_id": "w2", "device_id": "d", "config": "default", "l2_flush": 0,
                          "gpu_uuid": "GPU-1234"})
        uuids = sorted((r["workload_id"], r["gpu_uuid"]) for r in ds.rows("models"))
    assert uuids == [("w", None), ("w2", "GPU-1234")]
    with contextlib.closing(sqlite3.connect(path)) as conn:
        meta = dict(conn.execute("SELECT key, value FROM meta WHERE key != 'created_by'").fetchall())
        last = {t: [r[1] for r in conn.execute(f"PRAGMA table_info({t})")][-4] for t in
                ("operators", "models", "corun")}
    assert meta == {"schema_version": "8", "migrated_from": "5"}
    assert set(last.values()) == {"gpu_uuid"}  # then the energy columns of version 8


def test_v6_gains_the_tasks_table_and_the_sampler_columns(tmp_path):
    from opbench.dataset.schema import SAMPLE_COLUMNS

    path, row = _migrated_row(tmp_path, 6, "INSERT INTO trials (workload_id, device_id, config, l2_flush, task, "
                              "tuner, trial, latency_median_s) VALUES ('w', 'd', 'tuning', 0, 't', 'xgb', 0, 0.5)")
    assert row["latency_median_s"] == 0.5 and all(row[c] is None for c, _ in SAMPLE_COLUMNS)
    with Dataset(path) as ds:
        ds.put("tasks", {"workload_id": "task1", "task": "fused_dense", "uses": [{"model": "m"}]})
        (task,) = ds.rows("tasks")
    assert task["task"] == "fused_dense" and json.loads(task["uses"]) == [{"model": "m"}]


def test_v7_gains_the_energy_columns(tmp_path):
    from opbench.dataset.schema import ENERGY_COLUMNS

    path, row = _migrated_row(tmp_path, 7, "INSERT INTO corun (workload_id, device_id, config, l2_flush, group_key, "
                              "concurrent_s, gpu_uuid) VALUES ('w', 'd', 'default', 0, 'g', 0.5, 'GPU-1')")
    assert (row["concurrent_s"], row["gpu_uuid"]) == (0.5, "GPU-1")
    assert all(row[c] is None for c, _ in ENERGY_COLUMNS["corun"])
    with contextlib.closing(sqlite3.connect(path)) as conn:
        meta = dict(conn.execute("SELECT key, value FROM meta WHERE key != 'created_by'").fetchall())
        cols = {t: [r[1] for r in conn.execute(f"PRAGMA table_info({t})")][-3:] for t in ENERGY_COLUMNS}
    assert meta == {"schema_version": "8", "migrated_from": "7"}
    assert cols == {"operators": ["energy_j", "power_w", "energy_window_s"],
                    "models": ["vm_energy_j", "vm_power_w", "vm_energy_window_s"],
                    "corun": ["concurrent_energy_j", "concurrent_power_w", "concurrent_energy_window_s"]}
    with Dataset(path) as ds:  # the tasks table of version 7 is kept as it was
        assert ds.count("tasks") == 0
