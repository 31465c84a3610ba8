"""The dataset: a versioned SQLite record store with typed export (CSV, Parquet) and loading."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

from ..errors import OpBenchError
from .frames import json_value, row_dtype
from .schema import ALL_TABLES, SCHEMA_VERSION, TABLES, columns_of
from .store import Dataset, inspect_file, model_key, now

#: the dataset a job writes when none is named and ``$OPBENCH_DATASET`` is unset
DEFAULT_PATH = os.path.join("data", "opbench.sqlite")


def default_path() -> str:
    """``$OPBENCH_DATASET``, else :data:`DEFAULT_PATH`."""
    return os.environ.get("OPBENCH_DATASET") or DEFAULT_PATH


FORMATS = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}


def load(path: str | Path, table: str = "operators") -> Any:
    """One table of a dataset as a typed pandas DataFrame (read only; see :mod:`opbench.dataset.frames`).
    ``path`` may also be a records folder (:mod:`opbench.dataset.records`: tables ``trials`` and ``tasks``).

    Examples
    --------
    >>> ops = opbench.load("data/opbench.sqlite")                  # doctest: +SKIP
    >>> ops.groupby("kind")["latency_median_s"].sum()               # doctest: +SKIP
    >>> trials = opbench.load("data/dataset", "trials")            # doctest: +SKIP
    """
    if Path(path).is_dir():
        from . import records

        return records.read(path, table)
    with Dataset(path, readonly=True) as ds:
        return ds.frame(table)


def export_format(out: str | Path, fmt: str | None) -> str:
    """The export format: ``fmt`` if given, else from ``out``'s suffix; a suffix that names the other format
    (``--format csv --out x.parquet``) is refused, so that no file holds what its name does not say."""
    by_suffix = FORMATS.get(Path(out).suffix.lower())
    if fmt is not None and by_suffix is not None and fmt in ("csv", "parquet") and fmt != by_suffix:
        raise OpBenchError(f"--format {fmt} but '{out}' names a {by_suffix} file (accepted: a suffix that matches "
                           f"the format, e.g. '{Path(out).with_suffix('.' + fmt).name}', or no --format)")
    if fmt is None:
        fmt = by_suffix
        if fmt is None:
            raise OpBenchError(f"cannot tell the format of '{out}' from its suffix "
                               f"(accepted: {', '.join(FORMATS)}, or --format csv|parquet)")
    if fmt not in ("csv", "parquet"):
        raise OpBenchError(f"unknown export format '{fmt}' (accepted: csv, parquet)")
    return fmt


def export_targets(out: str | Path, tables: list[str]) -> list[Path]:
    """Where each table goes: ``out`` for one table, else ``out`` with a ``-<table>`` suffix each."""
    target = Path(out)
    if len(tables) == 1:
        return [target]
    return [target.with_name(f"{target.stem}-{t}{target.suffix}") for t in tables]


def check_tables(tables: list[str]) -> list[str]:
    """Table names checked (``all`` = every table)."""
    if tables == ["all"] or not tables:
        return list(ALL_TABLES)
    bad = [t for t in tables if t not in ALL_TABLES]
    if bad:
        raise OpBenchError(f"unknown table '{bad[0]}' (accepted: {', '.join(ALL_TABLES)}, all)")
    return tables


def export(path: str | Path, fmt: str | None, out: str | Path, tables: list[str] | tuple[str, ...] = ("all",)
           ) -> list[Path]:
    """Write tables of a dataset as CSV or Parquet, read only (the dataset's bytes are unchanged).

    With one table the file is ``out``; with several, ``out`` gets a ``-<table>`` suffix each.
    """
    from .frames import csv_frame, write_parquet

    fmt = export_format(out, fmt)
    tables = check_tables(list(tables))
    written = []
    with Dataset(path, readonly=True) as ds:
        for table, target in zip(tables, export_targets(out, tables), strict=True):
            frame = ds.frame(table)
            partial = target.with_name(f".{target.name}.partial")  # renamed once whole: no file is left cut short
            try:
                if fmt == "csv":
                    csv_frame(frame).to_csv(partial, index=False)
                else:
                    write_parquet(frame, columns_of(table), partial)
                os.replace(partial, target)
            except OSError as err:
                partial.unlink(missing_ok=True)
                raise OpBenchError(f"cannot write {str(target)!r}: {err.strerror or err}"
                                   f"{' (is the disk full?)' if err.errno == errno.ENOSPC else ''}; "
                                   f"{len(written)} of {len(tables)} tables were written") from None
            written.append(target)
    return written


__all__ = ["ALL_TABLES", "DEFAULT_PATH", "SCHEMA_VERSION", "TABLES", "Dataset", "check_tables", "default_path",
           "export", "export_format", "export_targets", "inspect_file", "json_value", "load", "model_key", "now",
           "row_dtype"]
