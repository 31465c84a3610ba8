"""The predictor file and what every predictor shares.

A predictor is saved as one zip file: ``meta.json`` (what it predicts, the device and target kind
it was trained for, its feature names, the held-out metrics) and its XGBoost models. Loading checks
that the file is a predictor, of the expected kind (``latency``, ``corun``, ``trials``), for the
device in use.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import OpBenchError

FORMAT = "opbench-predictor"
VERSION = 1
WHATS = ("latency", "corun", "trials")


class Predictor:
    """Base class: ``meta`` (JSON-able facts) and named XGBoost boosters or opaque blobs.

    Subclasses set :attr:`what` and implement their ``fit``/``predict``.
    """

    what = ""
    blob_names: tuple[str, ...] = ()  # the data files (besides boosters) a predictor of this kind holds

    def __init__(self, meta: dict[str, Any] | None = None) -> None:
        self.meta: dict[str, Any] = dict(meta or {})
        self.boosters: dict[str, Any] = {}
        self.blobs: dict[str, bytes] = {}
        self._one_thread: set[int] = set()

    @property
    def device_name(self) -> str:
        """The device the training rows were measured on."""
        return str(self.meta.get("device_name", ""))

    def check_device(self, device_name: str | None, target_kind: str | None = None) -> None:
        """Refuse to predict for another device or target kind (one line naming both)."""
        kind = self.meta.get("target_kind")
        if target_kind and kind and target_kind != kind:
            raise OpBenchError(f"the {self.what} predictor was trained for target '{kind}' "
                               f"({self.device_name}), not '{target_kind}'")
        if device_name and self.device_name and device_name != self.device_name:
            raise OpBenchError(f"the {self.what} predictor was trained on '{self.device_name}', "
                               f"not on this device '{device_name}' (train one on this device's rows)")

    def save(self, path: str | Path) -> Path:
        """Write the predictor to ``path`` (a zip file)."""
        path = Path(path)
        if path.parent and not path.parent.exists():
            raise OpBenchError(f"cannot write the predictor to '{path}': folder '{path.parent}' does not exist")
        meta = {"format": FORMAT, "version": VERSION, "what": self.what, **self.meta,
                "boosters": sorted(self.boosters), "blobs": sorted(self.blobs)}
        with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            zf.writestr("meta.json", json.dumps(meta, indent=1, default=_json_default))
            for name, booster in self.boosters.items():
                zf.writestr(f"{name}.ubj", bytes(booster.save_raw(raw_format="ubj")))
            for name, blob in self.blobs.items():
                zf.writestr(name, blob)
        return path

    @classmethod
    def _from_zip(cls, meta: dict[str, Any], zf: zipfile.ZipFile, path: Path) -> Predictor:
        import xgboost as xgb

        obj = cls(meta)
        foreign = [n for n in meta.get("blobs", []) if n not in cls.blob_names]
        if foreign:
            raise OpBenchError(f"predictor file '{path}' holds '{foreign[0]}', which OpBench does not load (accepted: "
                               f"{', '.join(cls.blob_names) or 'none'} for a {cls.what} predictor; a file in an older "
                               f"format may carry code): retrain it with 'opbench train --what {cls.what}'")
        for name in meta.get("boosters", []):
            booster = xgb.Booster()
            booster.load_model(bytearray(_member(zf, f"{name}.ubj", path)))
            obj.boosters[name] = booster
        for name in meta.get("blobs", []):
            obj.blobs[name] = _member(zf, name, path)
        try:
            obj.validate()
        except OpBenchError as err:
            raise OpBenchError(f"predictor file '{path}': {err}") from None
        return obj

    def validate(self) -> None:
        """Raise a one-line :class:`OpBenchError` if the loaded data do not make a working predictor."""

    def booster_predict(self, name: str, x: np.ndarray, margin: np.ndarray | None = None) -> np.ndarray:
        """Raw predictions of booster ``name`` for the rows of ``x`` (plus ``margin``, for a booster
        trained on one)."""
        if len(x) == 0:
            return np.zeros(0)
        # in-place and on one thread: the schedulers ask one small batch at a time, where a DMatrix
        # and a thread pool per call cost more than the trees
        booster = self.boosters[name]
        if id(booster) not in self._one_thread:  # set once: a parameter change reconfigures the booster
            booster.set_param({"nthread": 1})
            self._one_thread.add(id(booster))
        return booster.inplace_predict(np.asarray(x, dtype="float32"), missing=np.nan, base_margin=margin)


def _json_default(value: Any) -> Any:
    if isinstance(value, np.integer | np.floating):
        return value.item()
    return str(value)


def _existing(path: str | Path) -> Path:
    path = Path(path)
    if not path.is_file():
        raise OpBenchError(f"predictor file '{path}' not found (make one with 'opbench train ... --out FILE')")
    return path


def _not_a_predictor(path: Path) -> OpBenchError:
    return OpBenchError(f"'{path}' is not an OpBench predictor file (made by 'opbench train')")


def predictor_kind(path: str | Path) -> str:
    """What the predictor file at ``path`` predicts (``latency``, ``corun``, ``trials``), read from its
    metadata only; a one-line error for a missing file or one that is not a predictor."""
    path = _existing(path)
    try:
        with zipfile.ZipFile(path) as zf:
            meta = _meta(zf, path)
        if meta.get("format") == FORMAT and meta.get("what") in WHATS:
            return str(meta["what"])
    except (zipfile.BadZipFile, KeyError, ValueError, OSError):
        pass
    raise _not_a_predictor(path)


#: the largest member of a predictor file OpBench unpacks (its metadata, each booster, its training data)
MEMBER_LIMIT = 256 << 20


def _member(zf: zipfile.ZipFile, name: str, path: Path, limit: int = MEMBER_LIMIT) -> bytes:
    """One member of a predictor file, refused before it is unpacked when it would be larger than ``limit``."""
    size = zf.getinfo(name).file_size
    if size > limit:
        raise OpBenchError(f"predictor file '{path}': '{name}' unpacks to {size / 2**20:.0f} MiB, more than the "
                           f"{limit / 2**20:.0f} MiB OpBench unpacks")
    return zf.read(name)


def _meta(zf: zipfile.ZipFile, path: Path) -> dict[str, Any]:
    """A predictor file's ``meta.json``: a JSON object of at most 16 MiB, with lists where lists belong."""
    from ..utils import parse_json

    meta = parse_json(_member(zf, "meta.json", path, 16 << 20), f"predictor file '{path}': meta.json")
    for key in ("boosters", "blobs", "groups"):
        if key in meta and not (isinstance(meta[key], list) and all(isinstance(v, str | int) for v in meta[key])):
            raise OpBenchError(f"predictor file '{path}': meta.json's '{key}' is not a list of names")
    return meta


def load_predictor(path: str | Path, what: str | None = None) -> Any:
    """Load a predictor file; ``what`` (``latency``, ``corun``, ``trials``) checks its kind."""
    from .corun import CorunPredictor
    from .latency import LatencyPredictor
    from .trials import TrialsPredictor

    path = _existing(path)
    try:
        with zipfile.ZipFile(path) as zf:
            meta = _meta(zf, path)
            if meta.get("format") != FORMAT:
                raise KeyError
            kinds = {"latency": LatencyPredictor, "corun": CorunPredictor, "trials": TrialsPredictor}
            found = meta.get("what")
            if what is not None and found != what:
                raise OpBenchError(f"'{path}' is a {found} predictor, not a {what} predictor "
                                   f"(train one with 'opbench train --what {what}')")
            if found not in kinds:
                raise KeyError
            return kinds[found]._from_zip(meta, zf, path)
    except (zipfile.BadZipFile, KeyError, json.JSONDecodeError, UnicodeDecodeError, ValueError, TypeError,
            AttributeError, OSError):
        raise _not_a_predictor(path) from None


def xgb_regressor(x: np.ndarray, y: np.ndarray, rounds: int = 400, seed: int = 0, margin: np.ndarray | None = None,
                  **params: Any) -> Any:
    """An XGBoost regression booster on ``x``/``y`` (squared error unless ``objective=`` says otherwise; NaN
    marks a missing feature); with ``margin`` the trees fit ``y - margin`` (pass the same margin to
    :meth:`Predictor.booster_predict`)."""
    import xgboost as xgb

    config = {"objective": "reg:squarederror", "eta": 0.08, "max_depth": 6, "subsample": 0.9,
              "colsample_bytree": 0.9, "min_child_weight": 1.0, "seed": seed, "nthread": 0, **params}
    return xgb.train(config, xgb.DMatrix(x, label=y, missing=np.nan, base_margin=margin), num_boost_round=rounds)


_HINTS = {"operators": "run 'opbench collect'", "models": "run 'opbench collect'",
          "corun": "collect with --corun on a GPU", "trials": "collect with --iftune true"}


def target_kind(target: Any) -> str:
    """``cuda`` or ``llvm``: the kind of a row's canonical target."""
    return "cuda" if "cuda" in str(target) else "llvm"


def open_dataset(path: str | Path) -> Any:
    """A dataset opened read only, for several :func:`dataset_rows` calls on one read of the file."""
    from ..dataset import Dataset

    if not Path(path).is_file():
        raise OpBenchError(f"dataset '{path}' not found")
    return Dataset(path, readonly=True)


def dataset_rows(source: Any, table: str, device: str | None = None, required: bool = True
                 ) -> tuple[list[dict[str, Any]], str]:
    """The ``ok`` rows of ``table`` measured on one device (``device``, else the only one there is).

    ``source`` is a dataset path, a records folder (its ``trials``) or a dataset from
    :func:`open_dataset`. With ``required``, a table without such rows is an error naming what to
    collect; else it gives ``[]``.
    """
    from ..dataset import Dataset

    if isinstance(source, Dataset):
        path, rows = source.path, source.rows(table)
    elif Path(source).is_dir():  # a records folder (opbench.dataset.records)
        from ..dataset import records

        path, rows = source, records.read_rows(source, table)
    else:
        path = source
        with open_dataset(source) as ds:
            rows = ds.rows(table)
    if table == "trials":
        rows = [r for r in rows if r.get("build_status") == "ok" and r.get("latency_median_s")]
    else:
        rows = [r for r in rows if r.get("status") == "ok"]
    devices = sorted({r["device_name"] for r in rows if r.get("device_name")})
    if not rows:
        if required:
            raise OpBenchError(f"dataset '{path}' has no measured {table} rows ({_HINTS[table]})")
        return [], device or ""
    if device is not None:
        if device not in devices:
            if not required:
                return [], device
            raise OpBenchError(f"dataset '{path}' has no {table} rows measured on '{device}' "
                               f"(it has: {', '.join(devices) or 'none'})")
        return [r for r in rows if r["device_name"] == device], device
    if len(devices) > 1:
        raise OpBenchError(f"dataset '{path}' holds {table} rows of several devices ({'; '.join(devices)}): "
                           "pick one with --device")
    return rows, devices[0] if devices else ""


__all__ = ["FORMAT", "VERSION", "WHATS", "Predictor", "dataset_rows", "load_predictor", "open_dataset",
           "predictor_kind", "target_kind", "xgb_regressor"]
