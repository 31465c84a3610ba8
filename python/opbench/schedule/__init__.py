"""Inter-operator schedules: the ``Schedule`` data model and one file per scheduling policy.

Schedulers are plug-ins: :func:`get_scheduler` takes a name (``sequential``, ``greedy``,
``nimble``, ``opara``, ``ios``, any of them followed by ``+critical-first`` for its streams in critical-first
launch order: :mod:`opbench.schedule.order`) or a :class:`Scheduler` object.
"""

from __future__ import annotations

from typing import Any

from ..errors import OpBenchError
from ..ir.dag import transitive_reduction
from .base import SCHEDULER_KINDS, Schedule, Scheduler, WithCost, cross_stream_events
from .cost import SchedulingCost
from .greedy import Greedy
from .ios import IOS
from .nimble import Nimble
from .opara import Opara
from .order import SUFFIX, CriticalFirst, critical_first
from .partition import SmPartitioner, critical_ops
from .sequential import Sequential

SCHEDULERS: dict[str, type[Scheduler]] = {
    cls.name: cls for cls in (Sequential, Greedy, Nimble, Opara, IOS)
}
for _cls in SCHEDULERS.values():
    SCHEDULER_KINDS.register(_cls.name, _cls)


def get_scheduler(scheduler: str | Scheduler, **options: Any) -> Scheduler:
    """A scheduler by name (with constructor options, :meth:`Scheduler.create`; ``NAME+critical-first``: that
    scheduler in :class:`CriticalFirst`) or the object itself."""
    if isinstance(scheduler, Scheduler):
        return scheduler
    if isinstance(scheduler, str) and not known_scheduler(scheduler):
        raise OpBenchError(f"unknown scheduler '{scheduler.removesuffix(SUFFIX)}' (accepted: {accepted_schedulers()})")
    if isinstance(scheduler, str) and scheduler.endswith(SUFFIX):
        return CriticalFirst(get_scheduler(scheduler[:-len(SUFFIX)], **options))
    return Scheduler.create(scheduler, **options)


def known_scheduler(name: str) -> bool:
    """Whether :func:`get_scheduler` takes ``name`` (without making it): a kind of the scheduler registry, with or
    without :data:`~opbench.schedule.order.SUFFIX`."""
    return name.removesuffix(SUFFIX) in SCHEDULER_KINDS


def accepted_schedulers() -> str:
    """The scheduler names :func:`get_scheduler` takes, for errors."""
    return f"{', '.join(SCHEDULER_KINDS.kinds())}; any of them followed by {SUFFIX}"


__all__ = ["IOS", "SCHEDULERS", "CriticalFirst", "SchedulingCost", "Greedy", "Nimble", "Opara",
           "Schedule", "Scheduler", "Sequential", "SmPartitioner", "WithCost", "critical_first", "critical_ops",
           "accepted_schedulers", "cross_stream_events", "get_scheduler", "known_scheduler",
           "transitive_reduction"]
