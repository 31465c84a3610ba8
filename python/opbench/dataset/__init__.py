"""The dataset: a versioned SQLite record store with CSV/Parquet export."""

from .schema import SCHEMA_VERSION, TABLES
from .store import Dataset, export, model_key, now

__all__ = ["SCHEMA_VERSION", "TABLES", "Dataset", "export", "model_key", "now"]
