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


__all__ = ["Spec", "SpecError"]
