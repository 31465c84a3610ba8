"""Typed, JSON-serialisable job specs: one frozen dataclass per job, shared by the CLI, the Python API
and config files.

A spec is plain data. :meth:`Spec.to_json` and :meth:`Spec.from_json` round-trip it; :meth:`Spec.validate`
checks every field before any work and raises :class:`SpecError` naming the *field* (the command line
maps fields to its flags in one table, so a Python user reads field names and a shell user flag names).
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from ..errors import OpBenchError

S = TypeVar("S", bound="Spec")


class SpecError(OpBenchError):
    """A field of a spec has a value the job cannot take."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclasses.dataclass(frozen=True)
class Spec:
    """Base of the job specs (see the module docstring)."""

    def to_json(self) -> dict[str, Any]:
        """The spec as JSON-ready data (tuples become lists)."""
        return json.loads(json.dumps(dataclasses.asdict(self)))

    @classmethod
    def from_json(cls: type[S], data: dict[str, Any] | str) -> S:
        """A spec from :meth:`to_json`'s data (or its JSON text); unknown fields and wrong types are a
        :class:`SpecError` naming the field."""
        if isinstance(data, str):
            try:
                data = json.loads(data)
            except json.JSONDecodeError as err:
                raise SpecError("spec", f"not JSON ({err.msg} at line {err.lineno})") from None
        if not isinstance(data, dict):
            raise SpecError("spec", f"a JSON object is needed, got {type(data).__name__}")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise SpecError(unknown[0], f"unknown field of {cls.__name__} (accepted: {', '.join(fields)})")
        hints = typing.get_type_hints(cls)
        values = {name: _coerce(name, value, hints[name]) for name, value in data.items()}
        return cls(**values)

    @classmethod
    def load(cls: type[S], path: str | Path) -> S:
        """A spec from a JSON file (:meth:`save` writes one)."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise OpBenchError(f"cannot read spec file {str(path)!r}: {getattr(err, 'strerror', None) or err}") \
                from None
        return cls.from_json(text)

    def save(self, path: str | Path) -> None:
        """Write the spec as JSON."""
        Path(path).write_text(json.dumps(self.to_json(), indent=2) + "\n", encoding="utf-8")

    def validate(self) -> None:
        """Check every field (subclasses); raise :class:`SpecError` naming the first bad one."""


def _coerce(name: str, value: Any, hint: Any) -> Any:
    """``value`` as the field's type: lists become tuples; a wrong type is a :class:`SpecError`."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(name, value, arg)
            except SpecError as err:
                errors.append(err.message)
        raise SpecError(name, errors[0] if errors else f"cannot be {value!r}")
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise SpecError(name, f"a list is needed, got {type(value).__name__}")
        return tuple(_coerce(name, v, args[0]) for v in value)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint in (int, float, str, bool) and not (isinstance(value, hint) and (hint is bool or not isinstance(value,
                                                                                                          bool))):
        raise SpecError(name, f"{hint.__name__} needed, got {json.dumps(value)[:40]}")
    return value


def check_points(dtypes: tuple[str, ...], batch_sizes: tuple[int, ...]) -> None:
    """The ``dtypes`` and ``batch_sizes`` fields of a job that loads models: each dtype known, each size positive."""
    from ..models import DTYPES, check_dtype

    if not dtypes:
        raise SpecError("dtypes", "at least one dtype is needed")
    for dtype in dtypes:
        try:
            check_dtype(dtype)
        except OpBenchError:
            raise SpecError("dtypes", f"unknown dtype {dtype!r} (accepted: {', '.join(DTYPES)})") from None
    if not batch_sizes or any(b < 1 for b in batch_sizes):
        raise SpecError("batch_sizes", f"positive sizes are needed, got {list(batch_sizes)}")


def check_devices(devices: tuple[int, ...] | None) -> None:
    """A job's ``devices`` field: ``None``, or distinct indices of 0 or more."""
    if devices is not None and (not devices or any(d < 0 for d in devices) or len(set(devices)) != len(devices)):
        raise SpecError("devices", f"distinct indices of 0 or more are needed, got {list(devices)}")


def check_rpc(tracker: str | None, key: str | None, workers: int | None) -> None:
    """A job's ``rpc_tracker``, ``rpc_key`` and ``rpc_workers`` fields: all unset, or a tracker's HOST:PORT with
    the key its devices registered with."""
    if tracker is None:
        for name, value in (("rpc_key", key), ("rpc_workers", workers)):
            if value is not None:
                raise SpecError(name, "needs rpc_tracker (HOST:PORT of TVM's RPC tracker)")
        return
    from ..profile.rpc import tracker_address, valid_key

    if tracker_address(tracker) is None:
        raise SpecError("rpc_tracker", f"expected HOST:PORT, e.g. 127.0.0.1:9190, got {tracker!r}")
    if not valid_key(key):
        raise SpecError("rpc_key", "the key the remote devices registered with is needed (no spaces or ':')")
    if workers is not None and workers < 1:
        raise SpecError("rpc_workers", f"must be 1 or more, got {workers}")


D = TypeVar("D")


def overridden(options: D, overrides: dict[str, Any], caller: str) -> D:
    """A frozen options dataclass with ``overrides`` (a function's keywords of the same names) replacing its fields;
    an unknown keyword is a ``TypeError`` naming it, as Python's own."""
    fields = [f.name for f in dataclasses.fields(options)]  # type: ignore[arg-type]
    unknown = sorted(set(overrides) - set(fields))
    if unknown:
        raise TypeError(f"{caller}() got an unexpected keyword argument '{unknown[0]}' (accepted: {', '.join(fields)})")
    return dataclasses.replace(options, **overrides) if overrides else options  # type: ignore[type-var]


__all__ = ["Spec", "SpecError", "check_devices", "check_points", "check_rpc", "overridden"]
