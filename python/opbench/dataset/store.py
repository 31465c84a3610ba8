"""The record store: one SQLite file, every measurement committed as it is taken.

Opening checks before it writes: a file that is not an OpBench dataset (not SQLite, unrelated
tables, foreign columns, a newer schema) is refused with a one-line :class:`OpBenchError` and its
bytes are left as they were. A version-1 dataset is backed up and migrated to version 2 on open
(read-only opens migrate a copy in memory). SQLite errors (read-only file, lock timeout, full disk)
become one-line errors naming the file; rows already committed stay.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import shutil
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import OpBenchError
from . import migrate
from .schema import ALL_TABLES, KEY_COLUMNS, SCHEMA_VERSION, TABLES, columns_of, create_statements

log = logging.getLogger(__name__)
DEFAULT_TIMEOUT_S = 30.0
RESERVE_BYTES = 256 * 1024  # room for a run's final status on a disk that fills up (Dataset.start_run)


def now() -> str:
    """The current UTC time, ISO 8601."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def _encode(value: Any) -> Any:
    if isinstance(value, dict | list | tuple):
        return json.dumps(value)
    return value


def lock_timeout() -> float:
    """Seconds to wait for another process's lock: ``$OPBENCH_DB_TIMEOUT`` or 30."""
    text = os.environ.get("OPBENCH_DB_TIMEOUT")
    if text is None:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise OpBenchError(f"bad $OPBENCH_DB_TIMEOUT {text!r} (accepted: seconds, a number >= 0)")
    return value


def db_error(path: Path, err: Exception, timeout: float = DEFAULT_TIMEOUT_S) -> OpBenchError:
    """A one-line error for a SQLite failure on the dataset ``path``."""
    text = str(err).lower()
    if "locked" in text or "busy" in text:
        return OpBenchError(f"dataset '{path}' is locked by another process (waited {timeout:g} s; "
                            "set $OPBENCH_DB_TIMEOUT to wait longer); rows written so far are kept")
    if "readonly" in text or "read-only" in text:
        return OpBenchError(f"dataset '{path}' is read-only; rows written so far are kept "
                            "(use a writable file or --dataset PATH)")
    if "full" in text:
        return OpBenchError(f"disk full writing dataset '{path}'; rows written so far are kept")
    if "not a database" in text or "malformed" in text:
        return OpBenchError(f"'{path}' is not an OpBench dataset (not a valid SQLite file)")
    return OpBenchError(f"dataset '{path}': {' '.join(str(err).split())}")


def inspect_file(path: Path) -> int | None:
    """The schema version of an existing dataset (None for a missing or empty file), read only.

    Raises a one-line :class:`OpBenchError` for a file that is not an OpBench dataset of a
    version this OpBench reads; the file is not modified.
    """
    if not path.exists() or (path.is_file() and path.stat().st_size == 0):
        return None
    if not path.is_file():
        raise OpBenchError(f"dataset '{path}' is not a file")
    try:
        with open(path, "rb") as handle:
            head = handle.read(16)
    except OSError as err:
        raise OpBenchError(f"cannot read dataset '{path}': {err.strerror}") from None
    if head != b"SQLite format 3\x00":
        raise OpBenchError(f"'{path}' is not an OpBench dataset (not an SQLite file)")
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=lock_timeout())
    except sqlite3.Error as err:
        raise db_error(path, err) from None
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        tables.discard("sqlite_sequence")
        if not tables:
            return None
        if "meta" not in tables:
            raise OpBenchError(f"'{path}' is an SQLite file but not an OpBench dataset "
                               f"(tables: {', '.join(sorted(tables))}; no 'meta' table)")
        row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        try:
            version = int(row[0]) if row else None
        except ValueError:
            version = None
        if version is None:
            raise OpBenchError(f"'{path}' has a 'meta' table without a schema version; not an OpBench dataset")
        if version > SCHEMA_VERSION:
            raise OpBenchError(f"dataset '{path}' has schema version {version}, newer than this OpBench reads "
                               f"({SCHEMA_VERSION}); upgrade OpBench")
        if version not in migrate.KNOWN:
            raise OpBenchError(f"dataset '{path}' has unknown schema version {version} "
                               f"(accepted: {', '.join(map(str, sorted(migrate.KNOWN)))})")
        expected = migrate.KNOWN[version]
        foreign = sorted(tables - set(expected))
        if foreign:
            raise OpBenchError(f"dataset '{path}' has foreign tables: {', '.join(foreign)}")
        for table in sorted(tables):
            have = [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]
            extra = [c for c in have if c not in expected[table]]
            missing = [c for c in expected[table] if c not in have]
            if extra or missing:
                what = f"foreign columns {', '.join(extra)}" if extra else f"missing columns {', '.join(missing)}"
                raise OpBenchError(f"dataset '{path}': table '{table}' has {what} "
                                   f"(schema version {version})")
        return version
    except sqlite3.Error as err:
        raise db_error(path, err) from None
    finally:
        conn.close()


class Dataset:
    """An OpBench dataset in one SQLite file.

    Rows are written with :meth:`put`, one transaction each, so an interrupted run keeps every
    finished measurement. A row's key (workload, device, configuration and L2 flush, and the
    operator index or group; see :mod:`opbench.dataset.schema`) is unique: :meth:`has` tells
    whether it was measured, and writing it again replaces it (``--force``).

    Parameters
    ----------
    path:
        The SQLite file; created with its folder when missing (not with ``readonly``).
    readonly:
        Open without writing anything: for export and loading. A version-1 file is migrated in
        memory.
    """

    def __init__(self, path: str | Path, readonly: bool = False) -> None:
        self.path = Path(path)
        self.readonly = readonly
        self.timeout = lock_timeout()
        if self.path.suffix == ".gz":
            self._open_compressed()
            return
        version = inspect_file(self.path)
        if readonly:
            if version is None:
                raise OpBenchError(f"dataset not found or empty: '{path}'")
            self.conn = self._connect(f"{self.path.resolve().as_uri()}?mode=ro")
            if version < SCHEMA_VERSION:
                memory = sqlite3.connect(":memory:")
                self.conn.backup(memory)
                self.conn.close()
                self.conn = memory
                migrate.migrate(self.conn, version)
            return
        self._check_writable()
        self.conn = self._connect(str(self.path))
        with self.guard():
            if version is None:
                self._create()
            elif version < SCHEMA_VERSION:
                backup = self._backup(version)
                migrate.migrate(self.conn, version)
                log.warning("migrated dataset %s from schema version %d to %d; the original is kept as %s",
                            self.path, version, SCHEMA_VERSION, backup)

    def _create(self) -> None:
        """Create the schema, unless another connection did first. Connections creating one file at
        once can meet in a lock order SQLite resolves by failing one of them at once ("database is
        locked" without waiting for the busy timeout): that one tries again, up to the timeout."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                self.conn.execute("PRAGMA journal_mode=WAL")
                with migrate.transaction(self.conn):
                    if self.conn.execute("SELECT 1 FROM sqlite_master WHERE name='meta'").fetchone():
                        return  # another process created it first
                    for stmt in create_statements():
                        self.conn.execute(stmt)
                    self.conn.executemany("INSERT INTO meta VALUES (?, ?)", [
                        ("schema_version", str(SCHEMA_VERSION)), ("created_by", _created_by())])
                return
            except sqlite3.OperationalError as err:
                if "locked" not in str(err) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def _open_compressed(self) -> None:
        """A gzip-compressed dataset (as shipped in ``data/``), read into memory; read only."""
        import gzip

        if not self.readonly:
            raise OpBenchError(f"dataset '{self.path}' is compressed and can only be read "
                               f"(write to an uncompressed copy: gunzip -k {self.path})")
        try:
            with gzip.open(self.path, "rb") as handle:
                data = handle.read()
        except FileNotFoundError:
            raise OpBenchError(f"dataset not found: '{self.path}'") from None
        except (OSError, EOFError) as err:
            raise OpBenchError(f"dataset '{self.path}' is not a gzip-compressed SQLite file ({err})") from None
        if data[18:20] == b"\x02\x02":  # a WAL-mode file: read it as a rollback-journal one in memory
            data = data[:18] + b"\x01\x01" + data[20:]
        self.conn = sqlite3.connect(":memory:")
        try:
            self.conn.deserialize(data)
            row = self.conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        except sqlite3.Error:
            raise OpBenchError(f"dataset '{self.path}' is not an OpBench dataset (gzip of a SQLite file)") from None
        version = int(row[0]) if row else 1
        if version < SCHEMA_VERSION:
            migrate.migrate(self.conn, version)

    def _connect(self, where: str) -> sqlite3.Connection:
        try:
            return sqlite3.connect(where, uri=where.startswith("file:"), timeout=self.timeout)
        except sqlite3.Error as err:
            raise db_error(self.path, err, self.timeout) from None

    def _check_writable(self) -> None:
        folder = self.path.parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise OpBenchError(f"cannot create the folder of dataset '{self.path}': {err.strerror}") from None
        if self.path.exists() and not os.access(self.path, os.W_OK):
            raise OpBenchError(f"dataset '{self.path}' is read-only (use a writable file or --dataset PATH)")
        if not os.access(folder, os.W_OK):
            raise OpBenchError(f"dataset '{self.path}': its folder is not writable (SQLite writes a journal "
                               "beside the file)")

    def _backup(self, version: int) -> Path:
        backup = self.path.with_name(f"{self.path.name}.v{version}-backup")
        n = 1
        while backup.exists():
            n += 1
            backup = self.path.with_name(f"{self.path.name}.v{version}-backup{n}")
        wal = self.path.with_name(self.path.name + "-wal")
        if wal.exists() and wal.stat().st_size:  # rows still in the write-ahead log: a consistent copy
            target = sqlite3.connect(str(backup))
            try:
                self.conn.backup(target)
            finally:
                target.close()
            shutil.copymode(self.path, backup)
        else:  # the file is the whole dataset: keep its bytes as they are
            shutil.copy2(self.path, backup)
        return backup

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """Turn SQLite errors into one-line :class:`OpBenchError` naming the file."""
        try:
            yield
        except sqlite3.Error as err:
            raise db_error(self.path, err, self.timeout) from None

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Dataset:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def schema_version(self) -> int:
        with self.guard():
            return int(self.conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0])

    def start_run(self, command: str, env: dict[str, Any]) -> int:
        """Record a new run and return its id.

        A small reserve file beside the dataset (``.<name>.run<id>.reserve``) keeps room for the run's
        final status: on a disk that fills up during the run it is removed to mark the run finished.
        """
        with self.guard(), self.conn:
            cur = self.conn.execute(
                "INSERT INTO runs (started_at, status, command, env) VALUES (?, 'running', ?, ?)",
                (now(), command, json.dumps(env, default=str)),
            )
        run_id = int(cur.lastrowid)
        with contextlib.suppress(OSError):
            with open(self._reserve(run_id), "wb") as handle:
                handle.write(b"\0" * RESERVE_BYTES)
        return run_id

    def _reserve(self, run_id: int) -> Path:
        return self.path.with_name(f".{self.path.name}.run{run_id}.reserve")

    def finish_run(self, run_id: int, status: str) -> None:
        """Mark a run finished; a failure here is logged, never raised over the run's own error. On a
        full disk the run's reserve file makes room for it."""
        reserve = self._reserve(run_id)
        try:
            for attempt in range(2):
                try:
                    with self.guard(), self.conn:
                        self.conn.execute("UPDATE runs SET finished_at=?, status=? WHERE run_id=?",
                                          (now(), status, run_id))
                    return
                except OpBenchError as err:
                    if attempt or "disk full" not in str(err) or not reserve.exists():
                        log.warning("could not mark run %d %s: %s", run_id, status, err)
                        return
                    reserve.unlink(missing_ok=True)
        finally:
            reserve.unlink(missing_ok=True)

    def put(self, table: str, row: dict[str, Any]) -> None:
        """Insert or replace one row and commit it."""
        columns = [name for name, _ in TABLES[table][0]]
        unknown = set(row) - set(columns) - {"run_id"}
        if unknown:
            raise KeyError(f"unknown columns for {table}: {sorted(unknown)}")
        missing = [c for c in TABLES[table][1] if row.get(c) is None]
        if missing:
            raise KeyError(f"row for {table} lacks key columns {missing}")
        names = [c for c in ["run_id", *columns] if c in row]
        sql = (f"INSERT OR REPLACE INTO {table} ({', '.join(names)}) "
               f"VALUES ({', '.join('?' for _ in names)})")
        with self.guard(), self.conn:
            self.conn.execute(sql, [_encode(row[c]) for c in names])

    def put_many(self, table: str, rows: list[dict[str, Any]], replace: bool = False) -> int:
        """Insert rows in one transaction (each row's columns are those of the first row); a row already
        there with the same key is kept, or replaced with ``replace``. Returns how many were written."""
        if not rows:
            return 0
        columns = [name for name, _ in TABLES[table][0]]
        names = [c for c in ["run_id", *columns] if c in rows[0]]
        unknown = set(rows[0]) - set(names)
        missing = [c for c in TABLES[table][1] if c not in names]
        if unknown or missing:
            raise KeyError(f"bad rows for {table}: unknown {sorted(unknown)}, missing key columns {missing}")
        sql = (f"INSERT OR {'REPLACE' if replace else 'IGNORE'} INTO {table} ({', '.join(names)}) "
               f"VALUES ({', '.join('?' for _ in names)})")
        with self.guard(), self.conn:
            before = self.conn.total_changes
            self.conn.executemany(sql, ([_encode(row.get(c)) for c in names] for row in rows))
            return self.conn.total_changes - before

    def append(self, table: str, row: dict[str, Any], counter: str) -> int:
        """Insert ``row`` with its key column ``counter`` set to one more than the largest value among
        the rows that share the rest of its key (0 for the first), in one statement: rows appended by
        several processes at once never take the same number. Returns the number given."""
        unique = TABLES[table][1]
        if counter not in unique:
            raise KeyError(f"{counter} is not a key column of {table}")
        rest = [c for c in unique if c != counter]
        row = {k: v for k, v in row.items() if k != counter}
        missing = [c for c in rest if row.get(c) is None]
        if missing:
            raise KeyError(f"row for {table} lacks key columns {missing}")
        columns = {name for name, _ in TABLES[table][0]} | {"run_id"}
        unknown = set(row) - columns
        if unknown:
            raise KeyError(f"unknown columns for {table}: {sorted(unknown)}")
        names = list(row)
        where = " AND ".join(f"{c}=?" for c in rest)
        sql = (f"INSERT INTO {table} ({', '.join(names)}, {counter}) "
               f"SELECT {', '.join('?' for _ in names)}, COALESCE(MAX({counter}), -1) + 1 FROM {table} WHERE {where}")
        with self.guard(), self.conn:
            cur = self.conn.execute(sql, [_encode(row[c]) for c in names] + [row[c] for c in rest])
            return int(self.conn.execute(f"SELECT {counter} FROM {table} WHERE id=?", (cur.lastrowid,)).fetchone()[0])

    def update(self, table: str, values: dict[str, Any], where: dict[str, Any]) -> int:
        """Set ``values`` in the rows of ``table`` whose columns equal ``where`` (one transaction); the count."""
        columns = {name for name, _ in TABLES[table][0]}
        unknown = (set(values) | set(where)) - columns
        if unknown or not where:
            raise KeyError(f"bad update of {table}: {sorted(unknown) or 'no condition'}")
        sql = (f"UPDATE {table} SET {', '.join(f'{c}=?' for c in values)} "
               f"WHERE {' AND '.join(f'{c}=?' for c in where)}")
        with self.guard(), self.conn:
            cur = self.conn.execute(sql, [_encode(v) for v in values.values()] + list(where.values()))
        return int(cur.rowcount)

    def has(self, table: str, key: dict[str, Any]) -> bool:
        """Whether a row with this key was written with status 'ok'."""
        unique = TABLES[table][1]
        where = " AND ".join(f"{c}=?" for c in unique)
        with self.guard():
            row = self.conn.execute(f"SELECT status FROM {table} WHERE {where}",
                                    [key[c] for c in unique]).fetchone()
        return row is not None and row[0] == "ok"

    def rows(self, table: str, where: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Rows of a table as dicts, optionally filtered by equal columns."""
        where = where or {}
        sql = f"SELECT * FROM {table}"
        if where:
            sql += " WHERE " + " AND ".join(f"{c}=?" for c in where)
        order = "run_id" if table == "runs" else "id"
        with self.guard():
            cur = self.conn.execute(sql + f" ORDER BY {order}", list(where.values()))
            names = [d[0] for d in cur.description]
            return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]

    def count(self, table: str, where: dict[str, Any] | None = None) -> int:
        """Rows of a table, optionally filtered by equal columns (counted by SQLite, not loaded)."""
        where = where or {}
        sql = f"SELECT COUNT(*) FROM {table}"
        if where:
            sql += " WHERE " + " AND ".join(f"{c}=?" for c in where)
        with self.guard():
            return int(self.conn.execute(sql, list(where.values())).fetchone()[0])

    def frame(self, table: str) -> Any:
        """A table as a pandas DataFrame with typed columns (see :func:`opbench.dataset.load`)."""
        from .frames import typed_frame

        if table not in ALL_TABLES:
            raise OpBenchError(f"unknown table '{table}' (accepted: {', '.join(ALL_TABLES)})")
        import pandas as pd

        order = "run_id" if table == "runs" else "id"
        with self.guard():
            raw = pd.read_sql_query(f"SELECT * FROM {table} ORDER BY {order}", self.conn)
        return typed_frame(raw, columns_of(table))


def _created_by() -> str:
    from .._version import __version__

    return f"opbench {__version__}"


def model_key(workload_id: str, device_id: str, config: str = "default", l2_flush: bool | int = False,
              **readable: Any) -> dict[str, Any]:
    """The key columns shared by every measurement table, with any readable columns given."""
    key = dict(zip(KEY_COLUMNS, (workload_id, device_id, config, int(bool(l2_flush))), strict=True))
    return {**key, **readable}
