"""Inter-operator schedules: the ``Schedule`` data model and one file per scheduling policy.

Schedulers are plug-ins: :func:`get_scheduler` takes a name (``sequential``, ``greedy``,
``nimble``, ``opara``, ``ios``) or a :class:`Scheduler` object.
"""

from __future__ import annotations

from typing import Any

from ..ir.dag import transitive_reduction
from .base import SCHEDULER_KINDS, Schedule, Scheduler, WithCost, cross_stream_events
from .cost import SchedulingCost
from .greedy import Greedy
from .ios import IOS
from .nimble import Nimble
from .opara import Opara
from .order import critical_first
from .partition import SmPartitioner, critical_ops
from .sequential import Sequential

SCHEDULERS: dict[str, type[Scheduler]] = {
    cls.name: cls for cls in (Sequential, Greedy, Nimble, Opara, IOS)
}
for _cls in SCHEDULERS.values():
    SCHEDULER_KINDS.register(_cls.name, _cls)


def get_scheduler(scheduler: str | Scheduler, **options: Any) -> Scheduler:
    """A scheduler by name (with constructor options, :meth:`Scheduler.create`) or the object itself."""
    if isinstance(scheduler, Scheduler):
        return scheduler
    return Scheduler.create(scheduler, **options)


__all__ = ["IOS", "SCHEDULERS", "SchedulingCost", "Greedy", "Nimble", "Opara", "Schedule", "Scheduler",
           "Sequential", "SmPartitioner", "WithCost", "critical_first", "critical_ops", "cross_stream_events",
           "get_scheduler", "transitive_reduction"]
