"""Model sources: each turns a model name into a :class:`Workload` (Relax IRModule + inputs).

Sources are plug-ins registered by name (``local``, ``simple``, ``remoteonnx``, ``transformers``);
:func:`load_workload` accepts a source name or a :class:`ModelSource` object.
"""

from __future__ import annotations

from typing import Any

from ..errors import OpBenchError
from ..registry import Registry, constant
from .base import DTYPES, InputSpec, ModelSource, Workload, check_batch_size, check_dtype, numpy_dtype

#: the model sources by name (:meth:`ModelSource.create`); the built-in ones register on first use
SOURCE_KINDS: Registry[ModelSource] = Registry("model source", load=lambda: _register_builtin(), sort=True)


def register_source(source: ModelSource) -> ModelSource:
    """Register a model source under its name and aliases."""
    SOURCE_KINDS.register(source.name, constant(source), aliases=tuple(source.aliases))
    return source


def get_source(source: str | ModelSource) -> ModelSource:
    """A source by name or alias (:meth:`ModelSource.create`), or a :class:`ModelSource` passed through."""
    if isinstance(source, ModelSource):
        return source
    return SOURCE_KINDS.create(str(source))


def list_sources() -> dict[str, list[str]]:
    """Every source with its model names, in the order they were registered."""
    return {kind: SOURCE_KINDS.create(kind).models() for kind in SOURCE_KINDS.kinds(registered=True)}


def load_workload(
    source: str | ModelSource, name: str, batch_size: Any = 1, dtype: str = "float32", **options: Any
) -> Workload:
    """Load ``name`` from ``source`` at ``batch_size`` in precision ``dtype`` (:data:`DTYPES`); options go
    to the source's ``load``."""
    src = get_source(source)
    check_name(src, name)
    batch = check_batch_size(batch_size)
    dtype = check_dtype(dtype)
    if dtype not in src.dtypes:
        raise OpBenchError(f"source '{src.name}' keeps each model's own dtypes; --dtype {dtype} does not apply "
                           f"(accepted for it: {', '.join(src.dtypes)}; export the model in {dtype} instead)")
    check_fits(src, name, batch, **options)
    workload = src.load(name, batch, **options) if dtype == "float32" else src.load(name, batch, dtype=dtype,
                                                                                     **options)
    workload.dtype = dtype
    return workload


def check_name(source: str | ModelSource, name: str) -> None:
    """Refuse a model name before any work: empty, with a control character, or one the source does not
    know (:meth:`ModelSource.check_name`)."""
    src = get_source(source)
    if not name:
        raise OpBenchError(f"no model name given for source '{src.name}'")
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise OpBenchError(f"model name {name!r} contains a control character (accepted: printable text)")
    src.check_name(name)


def check_fits(source: str | ModelSource, name: str, batch_size: int, **options: Any) -> None:
    """Refuse ``name`` at ``batch_size`` when the source's memory estimate exceeds the memory available
    (one line; nothing is allocated)."""
    src = get_source(source)
    batch = check_batch_size(batch_size)
    need = src.estimate_bytes(name, batch, **options)
    if need:
        import psutil

        have = psutil.virtual_memory().available
        if need > have:
            raise OpBenchError(
                f"{src.name} model '{name}' at batch size {batch} needs about {need / 2**30:.1f} GiB of memory, "
                f"more than the {have / 2**30:.1f} GiB available (lower --batchsize, --image-size or the model's size)")


def _register_builtin() -> None:
    """The built-in sources (once, at the first look-up: :data:`SOURCE_KINDS`'s loader)."""
    from .hf import TransformersSource
    from .local import LocalSource
    from .remoteonnx import OnnxSource
    from .simple import SimpleSource

    for src in (LocalSource(), SimpleSource(), OnnxSource(), TransformersSource()):
        register_source(src)


__all__ = [
    "DTYPES",
    "InputSpec",
    "ModelSource",
    "Workload",
    "check_dtype",
    "check_fits",
    "check_name",
    "get_source",
    "list_sources",
    "load_workload",
    "numpy_dtype",
    "register_source",
]
