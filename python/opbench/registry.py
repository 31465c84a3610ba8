"""One way to make a plug-in by name: each plug-in base (``Profiler``, ``KernelBackend``, ``Scheduler``,
``ModelSource``, ``Tuner``) has a :class:`Registry`, and ``Base.create(kind, ...)`` makes one, as
MetaSchedule's ``Runner.create`` does. An unknown kind is a one-line :class:`~opbench.errors.OpBenchError`
naming the kinds there are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from .errors import OpBenchError

T = TypeVar("T")


class Registry(Generic[T]):
    """The kinds of one plug-in base, each a factory (a class, or a function returning an instance).

    Parameters
    ----------
    what:
        What a kind is, for errors (``"scheduler"``: "unknown scheduler 'x' (accepted: ...)").
    load:
        Called once before the first look-up: registers kinds that live in modules not imported yet.
    sort:
        List the accepted kinds alphabetically (otherwise in the order they were registered).
    """

    def __init__(self, what: str, load: Callable[[], None] | None = None, sort: bool = False) -> None:
        self.what, self._load, self._sort = what, load, sort
        self._factories: dict[str, Callable[..., T]] = {}
        self._aliases: dict[str, str] = {}

    def register(self, kind: str, factory: Callable[..., T], aliases: tuple[str, ...] = ()) -> None:
        """Make ``kind`` (and each of ``aliases``, accepted but not listed) mean ``factory``; a later
        registration of the same kind replaces it."""
        self._factories[kind] = factory
        self._aliases.update(dict.fromkeys(aliases, kind))

    def _loaded(self) -> dict[str, Callable[..., T]]:
        if self._load is not None:
            load, self._load = self._load, None
            load()
        return self._factories

    def kinds(self, registered: bool = False) -> list[str]:
        """The kinds there are (``registered``: in the order they were registered, even for a sorted registry)."""
        kinds = list(self._loaded())
        return sorted(kinds) if self._sort and not registered else kinds

    def __contains__(self, kind: object) -> bool:
        return kind in self._loaded() or kind in self._aliases

    def __iter__(self) -> Iterator[str]:
        return iter(self.kinds())

    def factory(self, kind: str) -> Callable[..., T]:
        """What makes ``kind``; a one-line error naming the kinds there are for an unknown one."""
        factories = self._loaded()
        try:
            return factories[self._aliases.get(str(kind), str(kind))]
        except KeyError:
            raise OpBenchError(f"unknown {self.what} '{kind}' (accepted: {', '.join(self.kinds())})") from None

    def create(self, kind: str, /, *args: Any, **options: Any) -> T:
        """A ``kind`` made with ``args`` and ``options``."""
        return self.factory(kind)(*args, **options)


def constant(value: T) -> Callable[[], T]:
    """A factory that returns ``value`` itself (for kinds that are instances: a tuner, a model source)."""
    return lambda: value


__all__ = ["Registry", "constant"]
