"""Typed tables: the dataset as pandas DataFrames and Parquet files with a fixed schema.

Column types follow :mod:`opbench.dataset.schema`: INTEGER columns are nullable integers, REAL
floats, TIME UTC timestamps; JSON columns holding lists (shapes, dtypes, predecessors, grid,
per-operator times) are decoded into lists, while JSON columns holding free-form mappings
(``attrs``, ``workload``, ``provenance``, ``features``, ``env``,
``knobs``, ``trace``) stay JSON text (``json.loads`` them):
their keys differ from row to row, so no fixed struct type fits them. :func:`load` and the Parquet
export give the same types.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import OpBenchError

# JSON columns decoded into lists, with their Arrow element type
LIST_COLUMNS = {
    "ops": "str", "input_dtypes": "str", "output_dtypes": "str", "kinds": "str",
    "input_shapes": "int2", "output_shapes": "int2",
    "preds": "int", "grid": "int", "block": "int", "op_indices": "int",
    "solo_s": "float", "slowdowns": "float", "run_secs": "float",
}


def json_value(value: Any) -> Any:
    """A JSON column's value decoded: text is parsed, missing (None, NaN) is None, decoded values pass."""
    if value is None or (isinstance(value, float) and value != value):
        return None
    return json.loads(value) if isinstance(value, str) else value


def row_dtype(row: dict[str, Any]) -> str:
    """A row's precision: its ``dtype`` column, float32 for rows written before that column existed."""
    return row.get("dtype") or "float32"


def typed_frame(raw: Any, columns: list[tuple[str, str]]) -> Any:
    """Give a raw SQL frame its logical types (see the module docstring)."""
    import pandas as pd

    frame = raw.copy()
    for name, kind in columns:
        if name not in frame:
            continue
        col = frame[name]
        if kind == "INTEGER":
            frame[name] = pd.to_numeric(col, errors="coerce").astype("Int64")
        elif kind == "REAL":
            frame[name] = pd.to_numeric(col, errors="coerce").astype("float64")
        elif kind == "TIME":
            frame[name] = pd.to_datetime(col, utc=True, errors="coerce", format="ISO8601").astype("datetime64[ms, UTC]")
        elif kind == "JSON" and name in LIST_COLUMNS:
            frame[name] = col.map(json_value).astype(object)
        else:
            frame[name] = col.astype(object).where(col.notna(), None)
    return frame


def arrow_schema(columns: list[tuple[str, str]]) -> Any:
    """The fixed Parquet (Arrow) schema of a table."""
    import pyarrow as pa

    elems = {"str": pa.list_(pa.string()), "int": pa.list_(pa.int64()), "float": pa.list_(pa.float64()),
             "int2": pa.list_(pa.list_(pa.int64()))}
    scalar = {"TEXT": pa.string(), "INTEGER": pa.int64(), "REAL": pa.float64(), "JSON": pa.string(),
              "TIME": pa.timestamp("ms", tz="UTC")}
    return pa.schema([(name, elems[LIST_COLUMNS[name]] if kind == "JSON" and name in LIST_COLUMNS
                       else scalar[kind]) for name, kind in columns])


def write_parquet(frame: Any, columns: list[tuple[str, str]], out: Path) -> None:
    """Write a typed frame with the table's fixed schema."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise OpBenchError("parquet export needs pyarrow: pip install pyarrow") from None
    import pandas as pd

    schema = arrow_schema(columns)
    data = {}
    for field in schema:
        values = [None if v is None or v is pd.NA or v is pd.NaT or (isinstance(v, float) and v != v) else v
                  for v in frame[field.name].tolist()]
        data[field.name] = pa.array(values, type=field.type)
    pq.write_table(pa.Table.from_pydict(data, schema=schema), out)


def csv_frame(frame: Any) -> Any:
    """A typed frame for CSV: list columns written back as JSON text."""
    out = frame.copy()
    for name in LIST_COLUMNS:
        if name in out:
            out[name] = out[name].map(lambda v: None if v is None else json.dumps(v))
    return out
