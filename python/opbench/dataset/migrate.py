"""Schema migrations: each older version's columns, and how its rows become current rows.

Version 2 → 3 adds the ``trials`` table; 3 → 4 adds two ``corun`` columns (``partitioned_s``,
``partition_sms``: the group run with each operator on its own SM partition) and a ``dtype`` column to
every measurement table (``float32`` for every earlier row: no earlier version measured another); 4 → 5
adds the timing percentiles (NULL in earlier rows: their samples were not kept); 5 → 6 adds ``gpu_uuid``
to every measurement table (NULL in earlier rows: which of several same GPUs measured them was not kept);
6 → 7 adds the ``tasks`` table and the sampler's columns of ``trials`` (NULL in tuning rows); 7 → 8 the
energy columns of operators, models and co-runs (NULL in earlier rows: energy was not read).

Version 1 keyed rows by ``source, model, batch_size, target, config``: the model name as typed,
the target's kind only. Its rows cannot be given honest version-2 keys (the options that made the
workload and the full target were not recorded), so migrated rows get keys of their own, marked
``{"schema": 1}`` in ``workload``: they never collide with rows measured by version 2.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator

from ..utils import digest
from .schema import (
    _SQL_TYPES,
    ENERGY_COLUMNS,
    GPU_UUID_COLUMN,
    MEASUREMENT_TABLES,
    PERCENTILE_COLUMNS,
    SAMPLE_COLUMNS,
    SCHEMA_VERSION,
    TABLES,
    columns_of,
    create_statements,
    create_table,
)

_V1_ENV = ["device", "cpu_model", "cpu_cores", "gpu_name", "gpu_sm_count", "gpu_memory_mb", "gpu_driver",
           "cuda_runtime", "gpu_clock_start_mhz", "gpu_clock_end_mhz", "tvm_version", "opbench_version",
           "measured_at"]
_V1_KEY = ["source", "model", "batch_size", "target", "config"]
_V1 = {
    "meta": ["key", "value"],
    "runs": ["run_id", "started_at", "finished_at", "status", "command", "env"],
    "operators": ["id", "run_id", *_V1_KEY, "op_index", "func", "task", "task_uses", "kind", "ops", "attrs",
                  "input_shapes", "input_dtypes", "output_shapes", "output_dtypes", "preds", "flops", "bytes",
                  "arithmetic_intensity", "latency_median_s", "latency_mean_s", "latency_std_s",
                  "latency_min_s", "latency_max_s", "repeats", "number", "l2_flush", "gflops", "gbytes_per_s",
                  "num_kernels", "grid", "block", "registers", "static_smem", "dynamic_smem", "threads",
                  "occupancy", "sms_used", "status", "error", *_V1_ENV],
    "models": ["id", "run_id", *_V1_KEY, "num_ops", "unique_tasks", "sum_op_latency_s", "vm_latency_median_s",
               "vm_latency_std_s", "replay_rel_error", "compile_s", "measure_s", "provenance", "status", "error",
               *_V1_ENV],
    "corun": ["id", "run_id", *_V1_KEY, "group_key", "group_size", "op_indices", "kinds", "features",
              "sequential_s", "concurrent_s", "speedup", "solo_s", "slowdowns", "repeats", "l2_flush", "status",
              "error", *_V1_ENV],
}
_V8 = {t: [c for c, _ in columns_of(t)] for t in ["meta", "runs", *TABLES]}
_NEW_IN_V8 = {t: [c for c, _ in cols] for t, cols in ENERGY_COLUMNS.items()}
_V7 = {t: [c for c in cols if c not in _NEW_IN_V8.get(t, [])] for t, cols in _V8.items()}
_NEW_IN_V7 = {"trials": [c for c, _ in SAMPLE_COLUMNS]}
_V6 = {t: [c for c in cols if c not in _NEW_IN_V7.get(t, [])] for t, cols in _V7.items() if t != "tasks"}
_NEW_IN_V6 = {t: [GPU_UUID_COLUMN[0]] for t in MEASUREMENT_TABLES}
_V5 = {t: [c for c in cols if c not in _NEW_IN_V6.get(t, [])] for t, cols in _V6.items()}
_NEW_IN_V5 = {t: [c for c, _ in cols] for t, cols in PERCENTILE_COLUMNS.items()}
_V4 = {t: [c for c in cols if c not in _NEW_IN_V5.get(t, [])] for t, cols in _V5.items()}
_CORUN_V4 = ["partitioned_s", "partition_sms"]
_NEW_IN_V4 = {t: (_CORUN_V4 if t == "corun" else []) + ["dtype"] for t in MEASUREMENT_TABLES}
_V3 = {t: [c for c in cols if c not in _NEW_IN_V4.get(t, [])] for t, cols in _V4.items()}
_V2 = {t: cols for t, cols in _V3.items() if t != "trials"}

# columns each version appends to the one before (ALTER TABLE ... ADD COLUMN)
_ADDED = [(4, _NEW_IN_V4), (5, _NEW_IN_V5), (6, _NEW_IN_V6), (7, _NEW_IN_V7), (8, _NEW_IN_V8)]

# schema version -> {table: columns}
KNOWN = {1: _V1, 2: _V2, 3: _V3, 4: _V4, 5: _V5, 6: _V6, 7: _V7, 8: _V8}


def _v1_keys(row: dict) -> dict:
    workload = {"source": row["source"], "model": row["model"], "batch_size": row["batch_size"], "schema": 1}
    device_name = row.get("gpu_name") or row.get("cpu_model")
    device = {"target": row["target"], "device_name": device_name, "schema": 1}
    return {"workload_id": digest(workload), "device_id": digest(device), "workload": json.dumps(workload),
            "device_name": device_name, "l2_flush": int(row.get("l2_flush") or 0)}


@contextlib.contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """One explicit transaction, DDL included (Python's sqlite3 commits DDL on its own otherwise)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.rollback()
        raise
    conn.commit()


def migrate(conn: sqlite3.Connection, version: int) -> None:
    """Migrate an open dataset from ``version`` to the current one, in one transaction."""
    if not 1 <= version < SCHEMA_VERSION:
        raise ValueError(f"no migration from schema version {version}")
    with transaction(conn):
        if version == 1:
            _from_v1(conn)
        else:
            if version == 2:
                conn.execute(create_table("trials"))
            if version < 7:
                conn.execute(create_table("tasks"))  # version 7: new to every earlier version
            for since, new in _ADDED:
                if since <= version:
                    continue  # the dataset has these columns already
                for table, columns in new.items():
                    if version == 2 and table == "trials":
                        continue  # made just now, with every column
                    kinds = dict(TABLES[table][0])
                    for column in columns:
                        conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {_SQL_TYPES[kinds[column]]}")
            conn.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION),))
            conn.execute("INSERT OR REPLACE INTO meta VALUES ('migrated_from', ?)", (str(version),))
        for table in MEASUREMENT_TABLES:  # every earlier version measured float32 only
            conn.execute(f"UPDATE {table} SET dtype='float32' WHERE dtype IS NULL")


def _from_v1(conn: sqlite3.Connection) -> None:
    """Version 1 → current: re-key every row (see the module docstring)."""
    old_tables = ("operators", "models", "corun")
    for table in (*old_tables, "meta"):
        conn.execute(f"ALTER TABLE {table} RENAME TO _v1_{table}")
    for stmt in create_statements():
        if not stmt.startswith("CREATE TABLE runs"):
            conn.execute(stmt)
    conn.row_factory = sqlite3.Row
    try:
        meta = {r["key"]: r["value"] for r in conn.execute("SELECT key, value FROM _v1_meta")}
        meta.update(schema_version=str(SCHEMA_VERSION), migrated_from="1")
        conn.executemany("INSERT INTO meta VALUES (?, ?)", sorted(meta.items()))
        for table in old_tables:
            names = ["id", "run_id", *(c for c, _ in TABLES[table][0])]
            for old in conn.execute(f"SELECT * FROM _v1_{table} ORDER BY id").fetchall():
                row = dict(old)
                row.update(_v1_keys(row))
                conn.execute(f"INSERT INTO {table} ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})",
                             [row.get(c) for c in names])
    finally:
        conn.row_factory = None
    for table in (*old_tables, "meta"):
        conn.execute(f"DROP TABLE _v1_{table}")
