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
from collections.abc import Sequence
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
        return json.loads(json.dumps(dataclasses.asdict(self), default=_plain))

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
        """A spec from a JSON file (:meth:`save` writes one), or a TOML file (``.toml``: the same fields, a
        nested spec as a table; a field left out keeps its default, TOML having no null)."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise OpBenchError(f"cannot read spec file {str(path)!r}: {getattr(err, 'strerror', None) or err}") \
                from None
        if Path(path).suffix.lower() == ".toml":
            import tomllib

            try:
                return cls.from_json(tomllib.loads(text))
            except tomllib.TOMLDecodeError as err:
                raise SpecError("spec", f"not TOML ({err})") from None
        return cls.from_json(text)

    def save(self, path: str | Path) -> None:
        """Write the spec as JSON."""
        Path(path).write_text(json.dumps(self.to_json(), indent=2) + "\n", encoding="utf-8")

    def validate(self) -> None:
        """Check every field (subclasses); raise :class:`SpecError` naming the first bad one."""


def _plain(value: Any) -> Any:
    """A path as its text; anything else that JSON cannot hold is an error naming its type."""
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"a {type(value).__name__} does not go to JSON (give its name instead)")


def _coerce(name: str, value: Any, hint: Any) -> Any:
    """``value`` as the field's type: lists become tuples; a wrong type is a :class:`SpecError`."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if isinstance(hint, type) and issubclass(hint, Spec):  # a spec inside a spec (SweepJob's job, say)
        if isinstance(value, hint):
            return value
        if not isinstance(value, dict):
            raise SpecError(name, f"a JSON object ({hint.__name__}) is needed, got {type(value).__name__}")
        try:
            return hint.from_json(value)
        except SpecError as err:
            raise SpecError(f"{name}.{err.field}", err.message) from None
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


def check_positive(spec: Spec, names: Sequence[str], least: int = 1) -> None:
    """Each of ``spec``'s fields ``names`` is ``None`` or ``least`` or more."""
    for name in names:
        value = getattr(spec, name)
        if value is not None and value < least:
            raise SpecError(name, f"must be {least} or more, got {value}")


@dataclasses.dataclass(frozen=True)
class ModelSpec(Spec):
    """One model at one batch size and precision, as a job loads it (:meth:`load_workload`; ``load`` reads a spec
    file, as for every spec).

    Attributes
    ----------
    name, source:
        The model and its source (``local``, ``simple``, ``transformers``, ``onnx``, ``remoteonnx``, ...).
    batch_size, dtype:
        The batch size and the precision (``float32``, ``float16``, ``bfloat16``).
    image_size, seqlen, seed, sha256:
        The input size of a vision model (``None``: the model's own), the sequence length of a language
        model, the seed of its weights and inputs, and an ONNX file's expected SHA-256.
    cache_dir, max_download_mb:
        Where downloaded models are kept and the largest download accepted (``None``: the defaults).
    """

    name: str = "resnet-18"
    source: str = "local"
    batch_size: int = 1
    dtype: str = "float32"
    image_size: int | None = None
    seqlen: int = 128
    seed: int = 0
    sha256: str | None = None
    cache_dir: str | None = None
    max_download_mb: float | None = None

    def validate(self) -> None:
        """Check every field without loading anything (see :class:`Spec`)."""
        from ..models import SOURCE_KINDS, check_name

        if self.source not in SOURCE_KINDS:
            raise SpecError("source", f"unknown source {self.source!r} (accepted: {', '.join(SOURCE_KINDS.kinds())})")
        try:
            check_name(self.source, self.name)
        except OpBenchError as err:
            raise SpecError("name", str(err)) from None
        check_points((self.dtype,), (self.batch_size,))
        check_positive(self, ("image_size", "seqlen"))
        check_positive(self, ("seed",), least=0)
        if self.max_download_mb is not None and not self.max_download_mb > 0:
            raise SpecError("max_download_mb", f"must be positive, got {self.max_download_mb}")

    def options(self) -> dict[str, Any]:
        """The source's loading options."""
        return {"image_size": self.image_size, "seqlen": self.seqlen, "seed": self.seed, "sha256": self.sha256,
                "cache_dir": self.cache_dir, "max_download_mb": self.max_download_mb}

    def load_workload(self) -> Any:
        """The :class:`~opbench.models.Workload` (checked first: a bad field raises :class:`SpecError`)."""
        from ..models import load_workload

        self.validate()
        return load_workload(self.source, self.name, self.batch_size, dtype=self.dtype, **self.options())


@dataclasses.dataclass(frozen=True)
class MeasureSpec(Spec):
    """Where and how operators are timed.

    Attributes
    ----------
    target:
        ``llvm``, ``cuda`` or a JSON target.
    warmup, repeat, min_repeat_ms, flush_l2:
        Untimed calls, timed samples (the median is reported), the least duration of a sample, and caches
        flushed before each sample.
    corun_k, corun_limit:
        Co-runs on a GPU: the largest group launched together, and how many groups (0: none).
    rpc_tracker, rpc_key, rpc_workers:
        Time on the devices registered with a TVM RPC tracker (``HOST:PORT``) under ``rpc_key``.
    """

    target: str = "llvm"
    warmup: int = 1
    repeat: int = 10
    min_repeat_ms: float = 5.0
    flush_l2: bool = False
    corun_k: int = 4
    corun_limit: int = 0
    rpc_tracker: str | None = None
    rpc_key: str | None = None
    rpc_workers: int | None = None

    def validate(self) -> None:
        """Check every field without touching a device (see :class:`Spec`)."""
        from ..runtime.target import target_config

        try:
            target_config(self.target)
        except OpBenchError as err:
            raise SpecError("target", str(err)) from None
        check_positive(self, ("repeat", "corun_k"))
        check_positive(self, ("warmup", "corun_limit"), least=0)
        if not 0 <= self.min_repeat_ms < float("inf"):
            raise SpecError("min_repeat_ms", f"must be a finite number of 0 or more, got {self.min_repeat_ms}")
        check_rpc(self.rpc_tracker, self.rpc_key, self.rpc_workers)

    def timing(self) -> Any:
        """The :class:`~opbench.profile.TimingConfig` of one kernel."""
        from ..profile import TimingConfig

        return TimingConfig(warmup=self.warmup, repeat=self.repeat, min_repeat_ms=self.min_repeat_ms,
                            flush_l2=self.flush_l2)

    def rpc(self) -> Any:
        """The remote devices (:class:`~opbench.profile.rpc.RPCSpec`), or None."""
        from ..profile.rpc import RPCSpec

        return None if self.rpc_tracker is None else RPCSpec.parse(self.rpc_tracker, self.rpc_key, self.rpc_workers)

    def resolve_target(self) -> Any:
        """The ``tvm.target.Target`` (a CUDA target reads its architecture from this machine's GPU unless the
        devices are remote)."""
        from ..runtime.target import resolve_target

        return resolve_target(self.target, local_device=self.rpc_tracker is None)

    def profiler(self, target: Any = None) -> Any:
        """Where operators are timed: the remote devices, this machine's GPU or its CPU
        (:class:`~opbench.profile.Profiler`)."""
        from ..profile import Profiler
        from ..runtime.target import is_gpu

        rpc = self.rpc()
        target = target if target is not None else self.resolve_target()
        if rpc is not None:
            return Profiler.create("rpc", spec=rpc, target=target)
        if is_gpu(target):
            return Profiler.create("cuda", corun_k=self.corun_k, corun_limit=self.corun_limit)
        return Profiler.create("local")


D = TypeVar("D")


def overridden(options: D, overrides: dict[str, Any], caller: str) -> D:
    """A frozen options dataclass with ``overrides`` (a function's keywords of the same names) replacing its fields;
    an unknown keyword is a ``TypeError`` naming it, as Python's own."""
    fields = [f.name for f in dataclasses.fields(options)]  # type: ignore[arg-type]
    unknown = sorted(set(overrides) - set(fields))
    if unknown:
        raise TypeError(f"{caller}() got an unexpected keyword argument '{unknown[0]}' (accepted: {', '.join(fields)})")
    return dataclasses.replace(options, **overrides) if overrides else options  # type: ignore[type-var]


__all__ = ["MeasureSpec", "ModelSpec", "Spec", "SpecError", "check_devices", "check_points", "check_positive",
           "check_rpc", "overridden"]
