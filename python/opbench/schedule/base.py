"""The ``Schedule`` data model and the scheduler plug-in base class.

A schedule is plain data: for each operator a stream and a position in one global launch order
(topological), plus the cross-stream edges that need an event (record after the producer, wait
before the consumer). IOS-style stages (stage -> groups -> operators) are optional metadata, and so is an SM partition:
disjoint groups of SMs (``sm_groups``, sizes) and, for each stream, the group it is confined to
(``sm_group_of``; ``None``: the whole GPU). Streams may share a group.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Literal

from ..errors import OpBenchError
from ..ir.dag import DAG, edges_of, transitive_reduction
from ..registry import Registry


@dataclasses.dataclass
class Schedule:
    """Streams, launch order and events for every operator of a graph."""

    name: str
    stream_of: list[int]
    order: list[int]
    events: list[tuple[int, int]]
    stages: list[list[list[int]]] | None = None
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)
    sm_groups: list[int] | None = None
    sm_group_of: list[int | None] | None = None

    @property
    def partitioned(self) -> bool:
        """True when some stream is confined to a group of SMs."""
        return bool(self.sm_groups) and any(g is not None for g in self.sm_group_of or [])

    def sms_of(self, stream: int) -> int | None:
        """The SMs stream ``stream`` may use (None: the whole GPU)."""
        if not self.partitioned or stream >= len(self.sm_group_of or []):
            return None
        group = self.sm_group_of[stream]
        return None if group is None else self.sm_groups[group]

    def partition_label(self) -> str:
        """The partition in one line: ``streams=SMs`` per group (``-`` for none), e.g. ``0=88; 1-3,5=32``."""
        if not self.partitioned:
            return "-"
        used = sorted(set(self.stream_of))
        parts = []
        for g, n in enumerate(self.sm_groups):
            streams = [s for s in used if s < len(self.sm_group_of) and self.sm_group_of[s] == g]
            if streams:
                parts.append((streams[0], f"{_ranges(streams)}={n}"))
        return "; ".join(text for _, text in sorted(parts)) or "-"

    def with_partition(self, groups: list[int], group_of: list[int | None], name: str | None = None) -> Schedule:
        """A copy of this schedule whose streams are confined as ``groups``/``group_of`` say."""
        copy = dataclasses.replace(self, name=name or self.name, meta=dict(self.meta), sm_groups=list(groups),
                                   sm_group_of=list(group_of))
        return copy

    def check_sm(self, sm_count: int, granularity: int, device: str = "this GPU") -> Schedule:
        """Refuse a partition the device cannot make (more SMs than it has, sizes it cannot split)."""
        if self.partitioned:
            check_sm_sizes(self.sm_groups, sm_count, granularity, f"schedule '{self.name}'", device)
        return self

    @property
    def num_streams(self) -> int:
        return len(set(self.stream_of))

    @property
    def num_events(self) -> int:
        return len(self.events)

    def stream_ops(self) -> list[list[int]]:
        """Operators of each stream in launch order."""
        streams: list[list[int]] = [[] for _ in range(max(self.stream_of, default=-1) + 1)]
        for op in self.order:
            streams[self.stream_of[op]].append(op)
        return streams

    def to_dict(self) -> dict[str, Any]:
        data = {"name": self.name, "stream_of": self.stream_of, "order": self.order,
                "events": [list(e) for e in self.events], "stages": self.stages, "meta": self.meta}
        if self.partitioned:
            data["sm_partition"] = {"groups": list(self.sm_groups), "streams": list(self.sm_group_of)}
        return data

    @classmethod
    def from_dict(cls, data: Any) -> Schedule:
        """A schedule from plain data, checked strictly: every number an integer (no strings, floats or
        booleans coerced), streams and operators within range, no operator twice."""
        if not isinstance(data, dict):
            raise OpBenchError(f"bad schedule data: a JSON object expected, got {type(data).__name__}")
        missing = [k for k in ("name", "stream_of", "order", "events") if k not in data]
        if missing:
            raise OpBenchError(f"bad schedule data: missing {', '.join(missing)} "
                               "(expected name, stream_of, order, events)")
        if not isinstance(data["name"], str):
            raise OpBenchError("bad schedule data: 'name' must be a string")
        stream_of = _int_list(data["stream_of"], "stream_of")
        n = len(stream_of)
        for op, s in enumerate(stream_of):
            if not 0 <= s < max(n, 1):
                raise OpBenchError(f"bad schedule data: operator {op} is on stream {s}, outside 0..{max(n - 1, 0)}")
        order = _int_list(data["order"], "order")
        seen: set[int] = set()
        for op in order:
            if not 0 <= op < n:
                raise OpBenchError(f"bad schedule data: order names operator {op}, outside 0..{n - 1}")
            if op in seen:
                raise OpBenchError(f"bad schedule data: operator {op} appears twice in 'order'")
            seen.add(op)
        events = data["events"]
        if not isinstance(events, list) or not all(isinstance(e, list) and len(e) == 2 for e in events):
            raise OpBenchError("bad schedule data: 'events' must be a list of [producer, consumer] pairs")
        pairs = [tuple(_int_list(e, "events")) for e in events]
        stages = data.get("stages")
        if stages is not None:
            if not (isinstance(stages, list) and all(isinstance(st, list) and all(isinstance(g, list) for g in st)
                                                     for st in stages)):
                raise OpBenchError("bad schedule data: 'stages' must be a list of stages, each a list of groups "
                                   "of operator indices")
            stages = [[_int_list(g, "stages") for g in st] for st in stages]
        meta = data.get("meta") or {}
        if not isinstance(meta, dict):
            raise OpBenchError("bad schedule data: 'meta' must be an object")
        groups, group_of = _sm_partition(data.get("sm_partition"), max(stream_of, default=0) + 1)
        return cls(name=data["name"], stream_of=stream_of, order=order, events=pairs, stages=stages, meta=dict(meta),
                   sm_groups=groups, sm_group_of=group_of)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, path: str | Path) -> Schedule:
        """Read a schedule file; anything malformed is a one-line :class:`OpBenchError`."""
        try:
            raw = Path(path).read_bytes()
        except OSError as err:
            raise OpBenchError(f"cannot read schedule '{path}': {err.strerror}") from None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise OpBenchError(f"schedule '{path}' is not UTF-8 text") from None
        try:
            data = json.loads(text, parse_constant=_no_constant)
        except json.JSONDecodeError as err:
            raise OpBenchError(f"schedule '{path}' is not valid JSON: {err}") from None
        except ValueError as err:
            raise OpBenchError(f"schedule '{path}': {err}") from None
        except RecursionError:
            raise OpBenchError(f"schedule '{path}' is nested too deeply") from None
        try:
            return cls.from_dict(data)
        except OpBenchError as err:
            raise OpBenchError(f"schedule '{path}': {err}") from None

    def validate(self, graph: DAG) -> Schedule:
        """Check that every dependency is ordered; raise naming the first offending edge."""
        n = len(graph)
        if len(self.stream_of) != n or sorted(self.order) != list(range(n)):
            raise OpBenchError(f"schedule '{self.name}' covers {len(self.stream_of)} operators with an order of "
                               f"{len(self.order)}; the graph has {n}")
        if any(s < 0 for s in self.stream_of):
            raise OpBenchError(f"schedule '{self.name}' has a negative stream number")
        if self.partitioned:
            _sm_partition({"groups": self.sm_groups, "streams": self.sm_group_of}, max(self.stream_of, default=0) + 1,
                          f"schedule '{self.name}'")
        pos = {op: i for i, op in enumerate(self.order)}
        for u, v in self.events:
            if not (0 <= u < n and 0 <= v < n) or pos[u] >= pos[v]:
                raise OpBenchError(f"schedule '{self.name}': event {u}->{v} waits before it is recorded")
        # happens-before: program order on each stream, plus events
        before: list[list[int]] = [[] for _ in range(n)]
        for ops in self.stream_ops():
            for a, b in zip(ops, ops[1:], strict=False):
                before[b].append(a)
        for u, v in self.events:
            before[v].append(u)
        hb = [0] * n
        for v in self.order:
            bits = 0
            for u in before[v]:
                bits |= (1 << u) | hb[u]
            hb[v] = bits
        for u, v in edges_of(graph):
            if pos[u] >= pos[v]:
                raise OpBenchError(f"schedule '{self.name}': edge {u}->{v} is launched in the wrong order")
            if not (hb[v] >> u) & 1:
                raise OpBenchError(f"schedule '{self.name}': edge {u}->{v} crosses from stream "
                                   f"{self.stream_of[u]} to {self.stream_of[v]} without an event")
        return self

    def describe(self) -> str:
        """Stage by stage (IOS style) when stages are known, else stream by stream."""
        lines = [f"schedule {self.name}: {self.num_streams} streams, {self.num_events} events"]
        if self.partitioned:
            lines[0] += f", SMs by stream: {self.partition_label()}"
        if self.stages:
            for i, stage in enumerate(self.stages):
                groups = " | ".join(" -> ".join(str(op) for op in g) for g in stage)
                lines.append(f"  stage {i}: {groups}")
        else:
            for s, ops in enumerate(self.stream_ops()):
                if ops:
                    lines.append(f"  stream {s}: {' '.join(str(op) for op in ops)}")
        return "\n".join(lines)


def _ranges(numbers: list[int]) -> str:
    """Sorted integers with runs of three or more shortened: ``[0, 2, 3, 4, 7, 8]`` -> ``0,2-4,7,8``."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ",".join(str(a) if a == b else f"{a},{b}" if b == a + 1 else f"{a}-{b}" for a, b in runs)


def check_sm_sizes(sizes: list[int], sm_count: int, granularity: int, what: str = "SM partitions",
                   device: str = "this GPU") -> None:
    """Refuse SM group sizes a device cannot make: each a positive multiple of ``granularity``, together
    no more than the ``sm_count`` SMs it can partition."""
    for n in sizes:
        if n <= 0 or n % granularity:
            raise OpBenchError(f"{what}: a group of {n} SMs asked for; {device} makes groups of whole multiples "
                               f"of {granularity} SMs")
    if sum(sizes) > sm_count:
        raise OpBenchError(f"{what}: {sum(sizes)} SMs ({'+'.join(map(str, sizes))}) asked for; {device} can "
                           f"partition {sm_count}")


def _sm_partition(value: Any, streams: int, what: str = "bad schedule data") -> tuple[Any, Any]:
    """``sm_groups`` and ``sm_group_of`` from a schedule's ``sm_partition`` object (None: no partition)."""
    if value is None:
        return None, None
    prefix = f"{what}: 'sm_partition'"
    if not isinstance(value, dict) or set(value) != {"groups", "streams"}:
        raise OpBenchError(f"{prefix} must be an object with 'groups' (SMs of each group) and 'streams' (each "
                           "stream's group, or null for the whole GPU)")
    groups = _int_list(value["groups"], "sm_partition.groups")
    if not groups or any(n <= 0 for n in groups):
        raise OpBenchError(f"{prefix}: 'groups' must list positive SM counts, got {groups}")
    of = value["streams"]
    if not isinstance(of, list) or any(g is not None and type(g) is not int for g in of):
        raise OpBenchError(f"{prefix}: 'streams' must list a group index or null for each stream")
    if len(of) != streams:
        raise OpBenchError(f"{prefix}: 'streams' has {len(of)} entries; the schedule has {streams} streams")
    for s, g in enumerate(of):
        if g is not None and not 0 <= g < len(groups):
            raise OpBenchError(f"{prefix}: stream {s} is in group {g}, outside 0..{len(groups) - 1}")
    return list(groups), list(of)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a schedule can hold")


def _int_list(value: Any, field: str) -> list[int]:
    """``value`` as a list of integers, refusing anything that is not one (``True``, ``1.0``, ``"1"``, 1e400)."""
    if not isinstance(value, list):
        raise OpBenchError(f"bad schedule data: '{field}' must be a list of integers")
    for item in value:
        if type(item) is not int:
            raise OpBenchError(f"bad schedule data: '{field}' holds {json.dumps(item)[:40]}, not an integer")
    return list(value)


def cross_stream_events(graph: DAG, stream_of: list[int], reduced: bool = True) -> list[tuple[int, int]]:
    """Events for every (transitively reduced) edge whose ends are on different streams."""
    edges = transitive_reduction(graph) if reduced else edges_of(graph)
    return sorted((u, v) for u, v in edges if stream_of[u] != stream_of[v])


def from_stages(name: str, graph: DAG, stages: list[list[list[int]]], meta: dict[str, Any] | None = None) -> Schedule:
    """A schedule running each stage's groups on streams 0..g-1, stage after stage."""
    stream_of = [0] * len(graph)
    order: list[int] = []
    for stage in stages:
        for s, group in enumerate(stage):
            for op in group:
                stream_of[op] = s
        order.extend(sorted(op for group in stage for op in group))
    sched = Schedule(name, stream_of, order, cross_stream_events(graph, stream_of), stages, meta or {})
    return sched


#: the scheduling policies by name (registered by :mod:`opbench.schedule`)
SchedulerKind = Literal["sequential", "greedy", "nimble", "opara", "ios"]
SCHEDULER_KINDS: Registry[Scheduler] = Registry("scheduler")


class Scheduler:
    """Base class of a scheduling policy; subclasses set ``name`` and implement :meth:`schedule`.

    A subclass's module docstring states its algorithm, step by step.
    """

    name = ""

    @staticmethod
    def create(kind: SchedulerKind, **options: Any) -> Scheduler:
        """A scheduler by name (``sequential``, ``greedy``, ``nimble``, ``opara``, ``ios``) with its
        constructor's options."""
        return SCHEDULER_KINDS.create(kind, **options)

    def schedule(self, graph: Any, cost: Any = None) -> Schedule:
        """A valid schedule of ``graph`` (operators in topological order).

        Parameters
        ----------
        graph:
            Anything with ``len``, ``preds`` and ``succs`` (an ``OpGraph``).
        cost:
            A ``SchedulingCost`` (or, for IOS, a stage-cost callable); policies that need none
            ignore it.
        """
        raise NotImplementedError


class WithCost(Scheduler):
    """A scheduler run with its own cost instead of the one it is given: ``make_cost(graph)`` is
    built inside :meth:`schedule`, so the scheduling time includes it (e.g. a predictor's inference).

    Parameters
    ----------
    inner:
        The scheduler (an object or a name understood by :func:`opbench.schedule.get_scheduler`).
    make_cost:
        ``make_cost(graph) -> cost`` for ``inner``.
    name:
        The name of the schedules it makes (default: ``<inner>-custom``).
    """

    def __init__(self, inner: Any, make_cost: Any, name: str | None = None) -> None:
        from . import get_scheduler

        self.inner = get_scheduler(inner)
        self.make_cost = make_cost
        self.name = name or f"{self.inner.name}-custom"

    def schedule(self, graph: Any, cost: Any = None) -> Schedule:
        """``inner``'s schedule of ``graph`` under ``make_cost(graph)`` (``cost`` is ignored)."""
        plan = self.inner.schedule(graph, self.make_cost(graph))
        plan.name = self.name
        return plan
