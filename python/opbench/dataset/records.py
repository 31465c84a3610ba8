"""Sampled tensor-program records in compact files: the form in which a records dataset is shipped.

A SQLite dataset keeps every sampled candidate as a full row of ``trials``: its whole trace (3-4 KB of
JSON, nearly all of it the instructions of its sketch, the same for every candidate of the sketch)
and the environment columns repeated on every row. A *records folder* keeps the same information in
a fraction of the space:

``tasks.parquet``
    The ``tasks`` table as it is (each task's module once, the models that use it, what sampling cost).
``sketches.parquet``
    One row per distinct instruction list: ``sketch_id`` (a digest of the instructions), ``insts`` (the
    trace's instructions as JSON, without the sampling decisions).
``records-NNNNN.parquet``
    One row per candidate: every column of ``trials`` except ``trace`` (kept as ``sketch_id`` plus the
    candidate's ``decisions``) and ``knobs`` (decoded from the trace again on load); each file at most
    ``max_file_bytes`` (8 MiB by default). ``latency_median_s`` and ``spread`` are functions of
    ``run_secs`` (its median, and its (max - min) / median) for every sampled candidate: a file leaves them
    out when every one of its rows equals what :func:`derived` computes, and they are computed again on
    load; a file with a row that differs keeps both columns as measured.
``manifest.json``
    The format, the counts, and each file's rows and SHA-256 (a file that does not match is refused).

Parquet with zstd compression: columns that repeat (environment, task keys, status) cost next to nothing,
and floating-point columns are written byte-stream-split (the bytes of each position together), which zstd
compresses better; both lossless. :func:`pack` writes a folder from a dataset (the whole folder again,
each file through a partial file renamed when whole), :func:`read` gives a table back as a DataFrame with
each ``trace`` rebuilt, and :func:`unpack` puts the rows into a SQLite dataset (rows it already holds are
kept), so that sampling resumes from a shipped folder. Only Parquet and JSON are read: no data file
executes code.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
from pathlib import Path
from typing import Any

from ..errors import OpBenchError
from ..utils import file_sha256, read_json
from .schema import TABLES, TASK_COLUMNS, TRIAL_COLUMNS
from .store import Dataset, now

#: how ``opbench sample`` may time a candidate (the first is TVM's ``time_evaluator``, the default)
TIMERS = ("evaluator", "graph")
#: what ``opbench sample --timer`` accepts: a timer of :data:`TIMERS`, or ``auto`` (the job picks one)
TIMER_CHOICES = ("auto", *TIMERS)


def sample_config(seed: int, timer: str = TIMERS[0]) -> str:
    """The ``config`` of the rows ``opbench sample`` measures: ``sample:s<seed>``, and ``:<timer>`` when
    another timer than the default timed them (so that the same candidates can be stored both ways)."""
    return f"sample:s{seed}" + ("" if timer == TIMERS[0] else f":{timer}")


def timer_of(config: str | None) -> str:
    """The timer that measured a row of ``config`` (:func:`sample_config`; the default for any other row)."""
    parts = str(config or "").split(":")
    return parts[2] if len(parts) > 2 and parts[0] == "sample" else TIMERS[0]


#: the format :func:`pack` writes (2: derived columns left out where they can be computed again) and those
#: :func:`manifest` reads
FORMAT = "opbench-records/2"
FORMATS = ("opbench-records/1", FORMAT)
MANIFEST = "manifest.json"
MAX_FILE_BYTES = 8 * 1024 * 1024
#: a Parquet data page (zstd compresses each page alone: large pages let it find the repeats across rows)
PAGE_BYTES = 64 * 1024 * 1024
#: the trials columns a record file leaves out (rebuilt on load) and those it stores as lists of floats
DROPPED = ("trace", "knobs")
FLOAT_LISTS = ("run_secs", "audit_secs")
#: the columns a records file may leave out because :func:`derived` computes them from ``run_secs``
DERIVED = ("latency_median_s", "spread")
RECORD_COLUMNS = [c for c, _ in TRIAL_COLUMNS if c not in DROPPED] + ["sketch_id", "decisions"]


def _arrow() -> tuple[Any, Any]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise OpBenchError("records folders need pyarrow: pip install pyarrow") from None
    return pa, pq


def split_trace(trace_json: str) -> tuple[str, str, str]:
    """A trace's JSON as ``(sketch_id, insts, decisions)``: the instructions (shared by every candidate of
    a sketch) and the candidate's own sampling decisions, both as JSON text."""
    insts, decisions = json.loads(trace_json)
    insts_text = json.dumps(insts, separators=(",", ":"))
    return hashlib.sha256(insts_text.encode()).hexdigest()[:16], insts_text, json.dumps(decisions,
                                                                                        separators=(",", ":"))


def join_trace(insts: str, decisions: str) -> str:
    """The trace's JSON again from :func:`split_trace`'s parts."""
    return f"[{insts},{decisions}]"


def derived(run_secs: list[float] | None) -> dict[str, float | None]:
    """``latency_median_s`` and ``spread`` of a candidate's samples, as ``opbench sample`` computes them:
    the median, and (max - min) / median (None for a zero median); both None without samples."""
    if not run_secs:
        return {"latency_median_s": None, "spread": None}
    median = statistics.median(run_secs)
    return {"latency_median_s": median, "spread": (max(run_secs) - min(run_secs)) / median if median > 0 else None}


def _derivable(rows: list[dict[str, Any]]) -> bool:
    """True when every row's :data:`DERIVED` columns equal what :func:`derived` computes from its samples
    (``run_secs`` as a list)."""
    return all(all(row.get(name) == value for name, value in derived(row.get("run_secs")).items()) for row in rows)


def _schema(columns: list[tuple[str, str]]) -> Any:
    pa, _ = _arrow()
    types = {"TEXT": pa.string(), "INTEGER": pa.int64(), "REAL": pa.float64(), "JSON": pa.string(),
             "TIME": pa.string()}
    return pa.schema([(name, pa.list_(pa.float64()) if name in FLOAT_LISTS else types[kind])
                      for name, kind in columns])


def _record_types() -> list[tuple[str, str]]:
    kinds = dict(TRIAL_COLUMNS)
    return [(c, kinds.get(c, "TEXT")) for c in RECORD_COLUMNS]


def _write(rows: list[dict[str, Any]], columns: list[tuple[str, str]], path: Path) -> None:
    """Rows (SQLite values) to one Parquet file through a partial file renamed when whole."""
    pa, pq = _arrow()
    schema = _schema(columns)
    data = {}
    for name, _ in columns:
        values = [r.get(name) for r in rows]
        if name in FLOAT_LISTS:
            values = [None if v is None else (json.loads(v) if isinstance(v, str) else list(v)) for v in values]
        data[name] = pa.array(values, type=schema.field(name).type)
    partial = path.with_name(f".{path.name}.partial")
    floats = [f"{name}.list.element" if name in FLOAT_LISTS else name for name, kind in columns
              if kind == "REAL" or name in FLOAT_LISTS]
    try:  # no dictionaries: zstd alone stores the repeating columns as small, the unique ones smaller
        pq.write_table(pa.Table.from_pydict(data, schema=schema), partial, compression="zstd",
                       compression_level=9, use_dictionary=False, use_byte_stream_split=floats or False,
                       data_page_size=PAGE_BYTES)
        os.replace(partial, path)
    except OSError as err:
        partial.unlink(missing_ok=True)
        raise OpBenchError(f"cannot write {str(path)!r}: {err.strerror or err}") from None


def pack(dataset_path: str | Path, folder: str | Path, max_file_bytes: int = MAX_FILE_BYTES) -> dict[str, Any]:
    """Write the sampled records (``tuner = 'sample'``) and tasks of a dataset to a records folder (module
    docstring); the dataset is read only. Returns the manifest."""
    out = Path(folder)
    if out.exists() and not out.is_dir():
        raise OpBenchError(f"{str(out)!r} is a file, not a folder (accepted: a new folder or a records folder)")
    if out.is_dir() and any(out.iterdir()) and not (out / MANIFEST).is_file():
        raise OpBenchError(f"{str(out)!r} holds other files and no {MANIFEST} (accepted: a new or empty folder, "
                           "or a records folder written before)")
    with Dataset(dataset_path, readonly=True) as dataset:
        tasks = dataset.rows("tasks")
        trials = dataset.rows("trials", {"tuner": "sample"})
    sketches: dict[str, dict[str, Any]] = {}
    records = []
    for row in sorted(trials, key=lambda r: (r["workload_id"], r["seed"] or 0, r["trial"])):
        record = {k: v for k, v in row.items() if k not in DROPPED}
        for name in FLOAT_LISTS:  # parsed once, for the check of the derived columns and the writer
            if isinstance(record.get(name), str):
                record[name] = json.loads(record[name])
        sketch_id, insts, record["decisions"] = split_trace(row["trace"])
        sketches.setdefault(sketch_id, {"sketch_id": sketch_id, "workload_id": row["workload_id"], "insts": insts})
        record["sketch_id"] = sketch_id
        records.append(record)
    out.mkdir(parents=True, exist_ok=True)
    files = []
    _write(tasks, [(c, k) for c, k in TASK_COLUMNS], out / "tasks.parquet")
    _write(list(sketches.values()), [("sketch_id", "TEXT"), ("workload_id", "TEXT"), ("insts", "JSON")],
           out / "sketches.parquet")
    files += [("tasks.parquet", len(tasks)), ("sketches.parquet", len(sketches))]
    per_file = max(1, len(records))
    start = 0
    while start < len(records):
        name = f"records-{len(files) - 2:05d}.parquet"
        chunk = records[start:start + per_file]
        keep = not _derivable(chunk)
        _write(chunk, [(c, k) for c, k in _record_types() if keep or c not in DERIVED], out / name)
        size = (out / name).stat().st_size
        if size > max_file_bytes and len(chunk) > 1:  # too big: fewer rows per file, from this chunk on
            per_file = max(1, int(len(chunk) * max_file_bytes / size * 0.9))
            continue
        files.append((name, len(chunk)))
        start += len(chunk)
    kept = {name for name, _ in files}
    for stale in out.glob("records-*.parquet"):
        if stale.name not in kept:
            stale.unlink()
    manifest = {"format": FORMAT, "written_at": now(), "tasks": len(tasks), "sketches": len(sketches),
                "records": len(records), "files": [{"name": n, "rows": r, "bytes": (out / n).stat().st_size,
                                                    "sha256": file_sha256(out / n)} for n, r in files]}
    partial = out / f".{MANIFEST}.partial"
    partial.write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(partial, out / MANIFEST)
    return manifest


def manifest(folder: str | Path) -> dict[str, Any]:
    """A records folder's manifest, checked: its format, and each file present with its SHA-256."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise OpBenchError(f"{str(folder)!r} is not a records folder (no {MANIFEST})")
    meta = read_json(path, what="records manifest")
    if not isinstance(meta, dict) or meta.get("format") not in FORMATS or not isinstance(meta.get("files"), list):
        raise OpBenchError(f"{str(path)!r} is not a records manifest of a format this version reads "
                           f"(accepted: {', '.join(FORMATS)})")
    for entry in meta["files"]:
        name = entry.get("name") if isinstance(entry, dict) else None
        if not isinstance(name, str) or "/" in name or name.startswith("."):
            raise OpBenchError(f"{str(path)!r} names a file it may not: {name!r}")
        file = Path(folder) / name
        if not file.is_file() or file_sha256(file) != entry.get("sha256"):
            raise OpBenchError(f"{str(file)!r} is missing or does not match {MANIFEST} (write the folder again "
                               "with opbench.dataset.records.pack)")
    return meta


def _rows(folder: Path, name: str) -> list[dict[str, Any]]:
    _, pq = _arrow()
    return pq.read_table(folder / name).to_pylist()


def read_rows(folder: str | Path, table: str = "trials") -> list[dict[str, Any]]:
    """The rows of ``table`` (``trials``, ``tasks`` or ``sketches``) of a records folder as SQLite would hold
    them: JSON columns as text, each trial's ``trace`` rebuilt (``knobs`` left empty)."""
    base = Path(folder)
    meta = manifest(base)
    if table in ("tasks", "sketches"):
        return _rows(base, f"{table}.parquet")
    if table != "trials":
        raise OpBenchError(f"a records folder holds tasks, sketches and trials, not {table!r}")
    insts = {s["sketch_id"]: s["insts"] for s in _rows(base, "sketches.parquet")}
    rows = []
    for entry in meta["files"]:
        if not entry["name"].startswith("records-"):
            continue
        for row in _rows(base, entry["name"]):
            row["trace"] = join_trace(insts[row.pop("sketch_id")], row.pop("decisions"))
            if DERIVED[0] not in row:  # a file that left them out: every row's are its samples'
                row.update(derived(row["run_secs"]))
            for name in FLOAT_LISTS:
                if row[name] is not None:
                    row[name] = json.dumps(row[name])
            rows.append(row)
    return rows


def read(folder: str | Path, table: str = "trials") -> Any:
    """One table of a records folder as a typed pandas DataFrame, like :func:`opbench.dataset.load`."""
    import pandas as pd

    from .frames import typed_frame
    from .schema import columns_of

    rows = read_rows(folder, table)
    if table == "sketches":
        return pd.DataFrame(rows)
    columns = [(c, k) for c, k in columns_of(table) if c not in ("id", "run_id")]
    raw = pd.DataFrame(rows, columns=[c for c, _ in columns])
    return typed_frame(raw, columns)


def unpack(folder: str | Path, dataset_path: str | Path) -> dict[str, int]:
    """Put a records folder's tasks and trials into a SQLite dataset as one run; rows the dataset already
    holds (same key) are kept as they are. Returns how many rows of each were added."""
    base = Path(folder)
    tasks, trials = read_rows(base, "tasks"), read_rows(base, "trials")
    with Dataset(dataset_path) as dataset:
        run_id = dataset.start_run(f"unpack {base}", {})
        added = {}
        try:
            for table, rows in (("tasks", tasks), ("trials", trials)):
                columns = {c for c, _ in TABLES[table][0]}
                added[table] = dataset.put_many(table, [{**{k: v for k, v in r.items() if k in columns},
                                                         "run_id": run_id} for r in rows])
        except BaseException:
            dataset.finish_run(run_id, "failed")
            raise
        dataset.finish_run(run_id, "ok")
    return added


__all__ = ["FORMAT", "FORMATS", "MAX_FILE_BYTES", "derived", "join_trace", "manifest", "pack", "read", "read_rows",
           "split_trace", "unpack"]
