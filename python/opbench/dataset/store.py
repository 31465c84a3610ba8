"""The record store: one SQLite file, every measurement committed as it is taken."""

from __future__ import annotations

import datetime
import json
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..errors import OpBenchError
from .schema import KEY_COLUMNS, SCHEMA_VERSION, TABLES, create_statements


def now() -> str:
    """The current UTC time, ISO 8601."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def _encode(value: Any) -> Any:
    if isinstance(value, dict | list | tuple):
        return json.dumps(value)
    return value


class Dataset:
    """An OpBench dataset in one SQLite file.

    Rows are written with :meth:`put`, one transaction each, so an interrupted run keeps every
    finished measurement. A row's key (source, model, batch size, target, config, and the
    operator index or group) is unique: :meth:`has` tells whether it was measured, and writing it
    again replaces it (``--force``).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.conn = sqlite3.connect(str(self.path), timeout=30)
            self.conn.execute("PRAGMA journal_mode=WAL")
            with self.conn:
                for stmt in create_statements():
                    self.conn.execute(stmt)
                row = self.conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
                if row is None:
                    self.conn.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
                elif int(row[0]) != SCHEMA_VERSION:
                    raise OpBenchError(f"dataset '{path}' has schema version {row[0]}; this OpBench "
                                       f"reads version {SCHEMA_VERSION}")
        except sqlite3.DatabaseError as err:
            raise OpBenchError(f"cannot open dataset '{path}': {err}") from None

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Dataset:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def start_run(self, command: str, env: dict[str, Any]) -> int:
        """Record a new run and return its id."""
        with self.conn:
            cur = self.conn.execute(
                "INSERT INTO runs (started_at, status, command, env) VALUES (?, 'running', ?, ?)",
                (now(), command, json.dumps(env)),
            )
        return int(cur.lastrowid)

    def finish_run(self, run_id: int, status: str) -> None:
        with self.conn:
            self.conn.execute("UPDATE runs SET finished_at=?, status=? WHERE run_id=?",
                              (now(), status, run_id))

    def put(self, table: str, row: dict[str, Any]) -> None:
        """Insert or replace one row and commit it."""
        columns = [name for name, _ in TABLES[table][0]]
        unknown = set(row) - set(columns) - {"run_id"}
        if unknown:
            raise KeyError(f"unknown columns for {table}: {sorted(unknown)}")
        names = [c for c in ["run_id", *columns] if c in row]
        sql = (f"INSERT OR REPLACE INTO {table} ({', '.join(names)}) "
               f"VALUES ({', '.join('?' for _ in names)})")
        with self.conn:
            self.conn.execute(sql, [_encode(row[c]) for c in names])

    def has(self, table: str, key: dict[str, Any]) -> bool:
        """Whether a row with this key was written with status 'ok'."""
        unique = TABLES[table][1]
        where = " AND ".join(f"{c}=?" for c in unique)
        row = self.conn.execute(f"SELECT status FROM {table} WHERE {where}",
                                [key[c] for c in unique]).fetchone()
        return row is not None and row[0] == "ok"

    def rows(self, table: str, where: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Rows of a table as dicts, optionally filtered by equal columns."""
        where = where or {}
        sql = f"SELECT * FROM {table}"
        if where:
            sql += " WHERE " + " AND ".join(f"{c}=?" for c in where)
        cur = self.conn.execute(sql + " ORDER BY id", list(where.values()))
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]

    def count(self, table: str, where: dict[str, Any] | None = None) -> int:
        return len(self.rows(table, where))

    def frame(self, table: str) -> Any:
        """A table as a pandas DataFrame."""
        import pandas as pd

        return pd.read_sql_query(f"SELECT * FROM {table} ORDER BY id", self.conn)


def model_key(source: str, model: str, batch_size: int, target: str, config: str = "default") -> dict[str, Any]:
    """The key columns shared by every table."""
    return dict(zip(KEY_COLUMNS, (source, model, batch_size, target, config), strict=True))


def export(path: str | Path, fmt: str, out: str | Path, tables: Iterable[str] = ("operators",)) -> list[Path]:
    """Write tables of a dataset as CSV or Parquet.

    With one table the file is ``out``; with several, ``out`` gets a ``-<table>`` suffix each.
    """
    if fmt not in ("csv", "parquet"):
        raise OpBenchError(f"unknown export format '{fmt}' (accepted: csv, parquet)")
    if not Path(path).is_file():
        raise OpBenchError(f"dataset not found: '{path}'")
    tables = list(tables)
    bad = [t for t in tables if t not in TABLES]
    if bad:
        raise OpBenchError(f"unknown table '{bad[0]}' (accepted: {', '.join(TABLES)})")
    written = []
    with Dataset(path) as ds:
        for table in tables:
            frame = ds.frame(table)
            target = Path(out)
            if len(tables) > 1:
                target = target.with_name(f"{target.stem}-{table}{target.suffix}")
            target.parent.mkdir(parents=True, exist_ok=True)
            if fmt == "csv":
                frame.to_csv(target, index=False)
            else:
                try:
                    frame.to_parquet(target, index=False)
                except ImportError:
                    raise OpBenchError("parquet export needs pyarrow: pip install pyarrow") from None
            written.append(target)
    return written
