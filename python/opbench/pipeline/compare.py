"""The compare job: a model's kernels under each inter-operator schedule, side by side, and the fastest kept.

:func:`evaluate` measures schedulers' schedules side by side with the sequential one (and, for a
torch model, with the model itself captured as it is in one CUDA Graph) and keeps the fastest; a
parallel schedule that is not faster than sequential beyond ``tolerance`` is not kept (users of IOS
and Opara report parallel schedules that lose on newer GPUs), and no schedule is kept that does not
beat the model's own CUDA Graph beyond ``tolerance``. :func:`critical_path` measures the longest
dependency chain, which bounds every schedule. :func:`compare` is the whole job as the command line
runs it: the schedulers named (with IOS's stage costs and predicted costs), the table, the bound and,
on request, every stage's measured latency.

Two modes: ``"fast"`` times every operator in one captured run, predicts each cheap scheduler's
schedule with the scheduling cost's simulation and measures only the best predicted ones beside
sequential and the baseline; ``"exhaustive"`` (or an explicit list of schedulers) measures every
listed scheduler, IOS included.

With ``sm_partition="auto"`` (CUDA, with green contexts), the best measured parallel schedule is
also measured with SM partitions (:class:`opbench.schedule.SmPartitioner`: the critical path's
stream keeps the SMs it needs, the other branches share the rest; the best predicted few are
measured), and a partitioned row is kept like any other. Without green contexts this is one INFO
line and no partitioned row.

A schedule carries the fingerprint of the graph it was made for and the device's name
(``meta["graph"]``, ``meta["device"]``); given back, it skips the search, and a schedule of another
graph is refused.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import OpBenchError
from ..profile.schedule import Timer, default_timer, median, operator_times, time_ops
from ..profile.timer import device_seconds, host_seconds, percentile
from ..runtime.backend import KernelBackend
from ..runtime.executor import ParallelExecutor
from ..runtime.graphs import CapturedModel
from ..runtime.kernels import relative_error
from ..schedule import Schedule, SchedulingCost, get_scheduler
from ..utils import PERCENTILES
from .costs import operator_latencies, scheduling_cost
from .spec import Spec, SpecError, check_positive, overridden

log = logging.getLogger(__name__)

#: ``host(run)``: the host seconds one call of ``run`` takes to return (:func:`call_clocks`)
HostClock = Callable[[Any], float]
#: ``device(run, host_s)``: the GPU seconds a call, the host left out; None where it cannot tell (:func:`call_clocks`)
DeviceClock = Callable[[Any, float | None], float | None]

DEFAULT_SCHEDULERS = ("sequential", "greedy", "nimble", "opara", "ios")
#: the schedulers of the fast mode: each schedules a 300-operator graph in milliseconds
FAST_SCHEDULERS = ("sequential", "greedy", "nimble", "opara")
MODES = ("fast", "exhaustive")
SM_PARTITIONS = ("off", "auto")  # SM partitions of the best parallel schedule: never, or the best few measured
IOS_COSTS = ("model", "measured")  # IOS's stage cost: the scheduling cost's model, or every stage measured
COSTS = ("measured", "predicted")  # operator costs of the ios and greedy schedulers
PREDICTED = ("ios", "greedy")  # the schedulers that take predicted costs


def host_arrays(outputs: Sequence[Any]) -> list[np.ndarray]:
    """The array outputs on the host (other leaves of a nested output, such as None or numbers, are left out)."""
    out = []
    for t in outputs:
        if not hasattr(t, "shape"):
            continue
        if hasattr(t, "detach"):
            out.append(t.detach().float().cpu().numpy())
        elif hasattr(t, "numpy"):
            out.append(t.numpy())
        else:
            out.append(np.asarray(t))
    return out


def _leaves(value: Any) -> list[Any]:
    """The leaves of a nested output (tuples, lists, dicts, named tuples) in PyTorch's pytree order."""
    import torch

    return list(torch.utils._pytree.tree_leaves(value))


def table_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The comparison rows without their ``Schedule`` and baseline objects (JSON-serialisable)."""
    return [{k: v for k, v in r.items() if k not in ("plan", "baseline", "executor")} for r in rows]


def spread_ms(samples: Sequence[float]) -> dict[str, float]:
    """A row's tail and spread in ms: ``p10_ms``, ``p90_ms``, ``p99_ms`` (the median is ``latency_ms``)."""
    return {f"p{q}_ms": percentile(samples, q) * 1e3 for q in PERCENTILES}


def _row(name: str, plan: Schedule | None, **values: Any) -> dict[str, Any]:
    """A comparison row: ``name``'s ``plan`` (None for a baseline), not timed yet, with ``values`` set."""
    row = {"schedule": name, "streams": plan.num_streams if plan is not None else 1,
           "events": plan.num_events if plan is not None else 0, "latency_ms": None, "error": None,
           "sched_error": None, "scheduling_ms": 0.0, "predicted_ms": None, "measured": True, "plan": plan,
           "sm": plan.partition_label() if plan is not None else "-"}
    row.update(values)
    return row


def _scheduled(backend: KernelBackend, items: Sequence[Any], cost: SchedulingCost,
               given: Schedule | None) -> list[tuple[Schedule, float]]:
    """(schedule, scheduling seconds) of each scheduler, sequential first; or sequential and ``given``."""
    if given is not None:
        return [(get_scheduler("sequential").schedule(backend.graph, cost), 0.0), (given, 0.0)]
    out = []
    for item in items:
        scheduler = get_scheduler(item)
        start = time.perf_counter()
        out.append((scheduler.schedule(backend.graph, cost), time.perf_counter() - start))
    if out[0][0].name != "sequential":
        raise OpBenchError(f"the first scheduler must be 'sequential' (got '{out[0][0].name}')")
    return out


def _worth_measuring(scheduled: list[tuple[Schedule, float]], predicted: list[float], top: int) -> set[int]:
    """Indices to measure in the fast mode: sequential and the ``top`` best predicted parallel schedules
    (distinct plans only)."""
    keep, seen = {0}, {_plan_key(scheduled[0][0])}
    for i in sorted(range(1, len(scheduled)), key=lambda i: predicted[i]):
        key = _plan_key(scheduled[i][0])
        if key in seen:
            continue
        seen.add(key)
        keep.add(i)
        if len(keep) > top:
            break
    return keep


def _plan_key(schedule: Schedule) -> tuple[Any, ...]:
    return (tuple(schedule.stream_of), tuple(schedule.order), tuple(schedule.events),
            tuple(schedule.sm_groups or ()), tuple(schedule.sm_group_of or ()))


@dataclasses.dataclass(frozen=True)
class EvaluateOptions:
    """How :func:`evaluate` measures and chooses (each field is described there)."""

    repeat: int = 10
    number: int = 20
    tolerance: float = 0.02
    mode: str = "exhaustive"
    schedule: Schedule | None = None
    measure_top: int = 2
    sm_partition: str = "off"
    rtol: float | None = None
    captures: int = 1


@dataclasses.dataclass
class Evaluation:
    """What :func:`evaluate` found: the kept schedule (``plan``), one row per variant, and where the time went
    (``phases``: seconds timing the operators, scheduling, measuring). Unpacks as ``plan, rows``. ``executor``:
    the kept schedule's captured :class:`~opbench.runtime.executor.ParallelExecutor`, the very capture its row
    timed (the fastest of ``captures``); None where a baseline was kept."""

    plan: Schedule
    rows: list[dict[str, Any]]
    phases: dict[str, float] = dataclasses.field(default_factory=dict)
    executor: ParallelExecutor | None = None

    def __iter__(self) -> Iterator[Any]:
        return iter((self.plan, self.rows))


def evaluate(backend: KernelBackend, schedulers: Sequence[Any] | None = None, cost: SchedulingCost | None = None,
             reference: Sequence[np.ndarray] | None = None, baseline: Any = None, timer: Timer | None = None,
             options: EvaluateOptions | None = None, **overrides: Any) -> Evaluation:
    """Schedule, capture and time ``backend`` under each scheduler; return the kept schedule and the table.

    Parameters
    ----------
    schedulers:
        Names or :class:`~opbench.schedule.Scheduler` objects, ``sequential`` first (the fallback).
        Default: every scheduler (``"exhaustive"``) or the fast ones (``"fast"``).
    cost:
        The schedulers' cost; default: every operator's measured time (:func:`operator_times`, one
        captured run), the backend's kernel resources and the device's figures.
    reference:
        Outputs to report ``error`` against (default: the sequential outputs). A schedule is only
        kept if its output equals the sequential run of the same kernels (``sched_error`` within
        1e-5): scheduling must not change results, while different kernels (TVM vs cuDNN) may.
    mode:
        ``"exhaustive"`` measures every schedule; ``"fast"`` measures sequential and the
        ``measure_top`` best by predicted latency (unless ``schedulers`` were named).
    baseline:
        The model run as it is, or several ways to (a list): the model captured in its own CUDA Graph
        (:class:`~opbench.runtime.graphs.CapturedModel`, the first, which outputs are compared
        against), ``torch.compile`` and ``torch.compile`` with combo kernels
        (:class:`~opbench.runtime.graphs.CompiledModel`). Each is a row;
        the fastest of them is kept (``row["kept"]``) unless a schedule beats it by more than
        ``tolerance``.
    schedule:
        A schedule made earlier for this graph: no search, it is measured beside sequential.
    timer:
        ``timer(label, run)`` returns seconds per call of ``run`` (default: CUDA events on the GPU). Every
        candidate is timed through the call its user makes (a baseline's ``__call__``, a schedule's
        ``executor.run(inputs)``, the input copy included) in :data:`ROUNDS` interleaved rounds
        (:func:`time_rounds`), ``repeat`` samples in all.
    rtol:
        A candidate whose outputs differ from the reference (the model's own outputs) by more than this
        relative norm (``error``) is not kept, and its row says so (``refused``); None: none is refused.
    sm_partition:
        ``"auto"``: also measure the best parallel schedule with up to ``measure_top + 1`` SM
        partitions (the best predicted of each SM budget; see the module docstring); ``"off"``: none.
    captures:
        On a GPU, the kept schedule is captured this many times in all and the fastest capture is kept
        (:func:`fastest_capture`): two instantiations of one CUDA Graph run their concurrent kernels a few per cent
        apart, steadily. 1: the capture measured beside the others. A one-stream schedule is captured once
        (:func:`captures_of`).

    options, overrides:
        ``repeat``, ``number``, ``tolerance``, ``mode``, ``schedule``, ``measure_top``, ``sm_partition``, ``rtol``
        and ``captures`` as one :class:`EvaluateOptions`; keywords of the same names override its fields.

    Returns
    -------
    An :class:`Evaluation`: the fastest schedule (sequential unless a parallel one wins by ``tolerance``),
    one row per variant (``kept`` marks the overall winner, which is a baseline row when no schedule beats
    them) and the seconds each phase took.
    """
    o = overridden(options or EvaluateOptions(), overrides, "evaluate")
    repeat, number, tolerance, mode, schedule = o.repeat, o.number, o.tolerance, o.mode, o.schedule
    measure_top, sm_partition, rtol = o.measure_top, o.sm_partition, o.rtol
    if mode not in MODES:
        raise OpBenchError(f"unknown mode '{mode}' (accepted: {', '.join(MODES)})")
    check_captures(o.captures)
    check_sm_partition(sm_partition)
    named = schedulers is not None
    items = list(schedulers) if named else list(DEFAULT_SCHEDULERS if mode == "exhaustive" else FAST_SCHEDULERS)
    timer = timer or rounds_timer(backend.is_cuda, repeat, number)
    phases: dict[str, float] = {}
    clock = time.perf_counter()
    if cost is None:
        cost = scheduling_cost(backend, operator_times(backend, repeat))
    phases["operator_times_s"] = time.perf_counter() - clock
    fingerprint, device = backend.graph.fingerprint(), backend.device_name
    if schedule is not None:
        check_schedule(schedule, fingerprint, device)
    clock = time.perf_counter()
    scheduled = _scheduled(backend, items, cost, schedule)
    predicted = [cost.predict(plan) for plan, _ in scheduled]
    phases["scheduling_s"] = time.perf_counter() - clock
    clock = time.perf_counter()
    measure = (set(range(len(scheduled))) if mode == "exhaustive" or named or schedule is not None
               else _worth_measuring(scheduled, predicted, measure_top))
    rows: list[dict[str, Any]] = []
    bases = [] if baseline is None else list(baseline) if isinstance(baseline, list | tuple) else [baseline]
    inputs = _user_inputs(bases)
    timed: list[tuple[dict[str, Any], Any]] = []  # every candidate's row and the call a user makes
    for base in bases:
        outputs = host_arrays(_leaves(base(*inputs) if inputs is not None else base.run_once()))
        reference = reference if reference is not None else outputs
        rows.append(_row(base.label, None, error=relative_error(outputs, reference)))
        rows[-1]["baseline"] = base
        timed.append((rows[-1], (lambda b=base: b(*inputs)) if inputs is not None else base.run_once))
    host_clock, device_clock = call_clocks(backend.is_cuda, number)
    measured = _Measure(backend, timer, reference, inputs, host_clock, device_clock)
    for i, (plan, seconds) in enumerate(scheduled):
        plan.meta.update({"graph": fingerprint, "device": device, "versions": library_versions(),
                          **backend.schedule_meta()})
        row = _row(plan.name, plan, scheduling_ms=seconds * 1e3, predicted_ms=predicted[i] * 1e3)
        if i in measure:
            timed.append((row, measured.prepare(row)))
        else:
            row["measured"] = False
        rows.append(row)
    time_rounds(timed, timer, host=host_clock, device=device_clock)
    _say_host_bound(rows)
    if sm_partition == "auto" and schedule is None:
        rows += _partitioned_rows(backend, rows, cost, measured, measure_top + 1, phases)
    phases["measuring_s"] = time.perf_counter() - clock
    _decide(rows, tolerance, rtol)
    kept = next((r for r in rows if r["kept"] and r["plan"] is not None), None)
    executor = kept.get("executor") if kept is not None else None
    if executor is not None and captures_of(kept["plan"], o.captures) > 1 and backend.is_cuda:
        clock = time.perf_counter()
        executor, timed_captures = fastest_capture(backend, kept["plan"], o.captures, inputs, timer, executor)
        best = next(r for r in timed_captures if r["kept"])
        kept.update({k: v for k, v in best.items() if k.endswith("_ms")}, compared_ms=kept["latency_ms"],
                    captures_ms=[r["latency_ms"] for r in timed_captures], capture=best["capture"],
                    finalists=[r["capture"] for r in timed_captures if r["finalist"]])
        _decide(rows, tolerance, rtol, say=False)  # the kept row is only faster: the same choice, its ratios again
        phases["captures_s"] = time.perf_counter() - clock
    for row in rows:  # only the kept capture stays alive (each holds its own memory)
        row.pop("executor", None)
    if kept is None:  # a baseline won: the best schedule still goes back (for --save-schedule)
        kept = min((r for r in rows if r["plan"] is not None and r["measured"] and r["sched_error"] <= 1e-5),
                   key=lambda r: r["latency_ms"])
    return Evaluation(kept["plan"], rows, phases, executor=executor)


def check_captures(captures: Any) -> int:
    """``captures`` if it is a whole number of captures, 1 or more; else a one-line error saying what is accepted."""
    if isinstance(captures, bool) or not isinstance(captures, int) or captures < 1:
        raise OpBenchError(f"captures must be a whole number, 1 or more (got {captures!r})")
    return captures


def captures_of(plan: Schedule, captures: int) -> int:
    """How many captures of ``plan`` :func:`fastest_capture` is worth: ``captures`` for a schedule with concurrent
    streams, 1 for one stream. What varies from one instantiation to the next is how its concurrent branches
    run; the captures of a one-stream schedule ran within 0.4 % of each other and keeping the fastest of six
    gained 0.0-0.2 % out of sample (fused regions of resnet-50 and densenet121 at batch 8 on an H200,
    ``docs/parallel.md``), where the extra captures took 0.8-2.8 s of a rebuild."""
    return captures if plan.num_streams > 1 else 1


def fastest_capture(backend: KernelBackend, plan: Schedule, captures: int, inputs: Sequence[Any] | None,
                    timer: Timer, first: ParallelExecutor | None = None, host: HostClock | None = None,
                    device: DeviceClock | None = None) -> tuple[ParallelExecutor, list[dict[str, Any]]]:
    """The fastest of ``captures`` captures of ``plan``, and one timed row per capture.

    Every instantiation of a CUDA Graph runs the same kernels, yet concurrent branches run a few per cent faster
    or slower in one than in another, and steadily so (up to 10 % between captures of one schedule of googlenet's
    fused regions on an H200: ``docs/parallel.md``). ``first`` (a capture already made, e.g. the one a comparison
    timed) counts as one; the others are new :class:`~opbench.runtime.executor.ParallelExecutor` captures, each
    checked to give ``first``'s outputs (one that does not is dropped, with an INFO line). All are timed by
    ``timer`` through the call a user makes (``executor.run(inputs)``, the input copy included; the replay where
    ``inputs`` is None): with more than :data:`FINALISTS` captures, first in one screening round, after which only
    the :data:`FINALISTS` fastest are timed further; those in :data:`ROUNDS` interleaved rounds
    (:func:`time_rounds`, ``host`` and ``device`` as there). Each row has ``capture`` (its index), ``kept`` (the one
    returned), ``finalist`` (timed in full; the others keep their screening's time) and the timing fields of a
    comparison row."""
    check_captures(captures)
    executors = [first if first is not None else ParallelExecutor(backend, plan)]
    expected = host_arrays(executors[0].run(inputs))
    for i in range(1, captures):
        executor = ParallelExecutor(backend, plan)
        error = relative_error(host_arrays(executor.run(inputs)), expected)
        if error > 1e-5:
            log.info("%s: capture %d gives other outputs than the first (error %.1e); not kept", plan.name, i, error)
            continue
        executors.append(executor)
    rows = [{"schedule": f"{plan.name} capture {i}", "capture": i} for i in range(len(executors))]
    timed = [(row, (lambda e=e: e.run(inputs)) if inputs is not None else e.run)
             for row, e in zip(rows, executors, strict=True)]
    finalists = list(range(len(rows)))
    if len(rows) > FINALISTS:  # captures apart by a few per cent, steadily: one round tells the slow ones
        time_rounds(timed, timer, rounds=1)
        finalists = sorted(finalists, key=lambda i: rows[i]["latency_ms"])[:FINALISTS]
    time_rounds([timed[i] for i in finalists], timer, host=host, device=device)
    best = min(finalists, key=lambda i: rows[i]["latency_ms"])
    for i, row in enumerate(rows):
        row.update(kept=i == best, finalist=i in finalists)
    return executors[best], rows


#: the captures :func:`fastest_capture` times in full, the fastest of its screening round
FINALISTS = 2


#: interleaved rounds in which every candidate of a comparison is timed (each round starts with another one)
ROUNDS = 3


def rounds_timer(is_cuda: bool, repeat: int, number: int) -> Timer:
    """The default timer of :func:`time_rounds`: ``repeat`` samples of ``number`` runs in all, spread over its
    :data:`ROUNDS` rounds (at least one a round)."""
    return default_timer(is_cuda, max(1, -(-repeat // ROUNDS)), number)


def _user_inputs(bases: Sequence[Any]) -> list[Any] | None:
    """Inputs as a user passes them (new tensors equal to the model's), for timing each candidate through the
    call its user makes, input copy included; None without a torch baseline (then the replays are timed)."""
    static = getattr(bases[0], "static_inputs", None) if bases else None
    return [x.detach().clone() for x in static] if static else None


def time_rounds(timed: Sequence[tuple[dict[str, Any], Any]], timer: Timer, rounds: int = ROUNDS,
                host: HostClock | None = None, device: DeviceClock | None = None) -> None:
    """Time every ``(row, run)`` with ``timer`` in ``rounds`` interleaved rounds (one ``timer`` call per candidate
    and round, the first candidate of a round rotating), so that a drift of the machine's speed (clocks, a
    neighbour's load) reaches every candidate alike; each row gets the median and spread of all its samples.

    ``host(run)``: the host seconds one call of ``run`` takes to return (:func:`call_clocks`), taken
    after each of the row's timings; the row's ``host_ms`` is the least of them (a busy host only adds).
    ``device(run, host_s)``: the GPU seconds a call, whatever the host's speed (:func:`call_clocks`;
    None where it cannot tell), taken after that; the row's ``device_ms`` is their median."""
    samples: dict[int, list[float]] = {id(row): [] for row, _ in timed}
    hosts: dict[int, list[float]] = {id(row): [] for row, _ in timed}
    devices: dict[int, list[float]] = {id(row): [] for row, _ in timed}
    for r in range(rounds if timed else 0):
        shift = r % len(timed)
        for row, run in [*timed[shift:], *timed[:shift]]:
            samples[id(row)] += list(timer(row["schedule"], run))
            host_s = host(run) if host is not None else None
            if host_s is not None:
                hosts[id(row)].append(host_s)
            device_s = device(run, host_s) if device is not None else None
            if device_s is not None:
                devices[id(row)].append(device_s)
    for row, _ in timed:
        row.update(latency_ms=median(samples[id(row)]) * 1e3, **spread_ms(samples[id(row)]))
        if hosts[id(row)]:
            row["host_ms"] = min(hosts[id(row)]) * 1e3
        if devices[id(row)]:
            row["device_ms"] = median(devices[id(row)]) * 1e3


def call_clocks(is_cuda: bool, number: int) -> tuple[HostClock | None, DeviceClock | None]:
    """For :func:`time_rounds`: ``run``'s host seconds a call (:func:`~opbench.profile.timer.host_seconds`,
    ``number`` calls, the GPU synchronised outside the clock) and its GPU seconds a call with the host's speed
    left out (:func:`~opbench.profile.timer.device_seconds`, ``number`` calls behind a spin kernel). ``(None,
    None)`` on the CPU, where a call's time is all host time and its latency says it already, and on a CUDA
    backend without PyTorch (the spin kernel and the events are PyTorch's)."""
    if not is_cuda:
        return None, None
    try:
        import torch
    except ImportError:
        return None, None
    return (lambda run: host_seconds(run, number, torch.cuda.synchronize),
            lambda run, host_s: device_seconds(run, number, host_s))


#: a row whose call takes at least this share of its latency on the host is said to be host-bound (INFO)
HOST_BOUND_SHARE = 0.5


def _say_host_bound(rows: Sequence[dict[str, Any]]) -> None:
    """One INFO line per measured row whose host time a call is :data:`HOST_BOUND_SHARE` of its latency or more."""
    for row in rows:
        host_ms, latency_ms = row.get("host_ms"), row.get("latency_ms")
        if host_ms is not None and latency_ms and host_ms >= HOST_BOUND_SHARE * latency_ms:
            log.info("%s: a call takes %.3f ms of host time, %.0f %% of its %.3f ms: a busy host slows it",
                     row["schedule"], host_ms, 100 * host_ms / latency_ms, latency_ms)


class _Measure:
    """Prepares and times one schedule's row (outputs checked against the reference and the sequential run,
    the first schedule measured); with ``inputs``, a schedule is timed through the call a user makes
    (``executor.run(inputs)``: the inputs copied in, the graph replayed), as the baselines are."""

    def __init__(self, backend: KernelBackend, timer: Timer, reference: Sequence[np.ndarray] | None,
                 inputs: Sequence[Any] | None = None, host: HostClock | None = None,
                 device: DeviceClock | None = None) -> None:
        self.backend, self.timer, self.reference, self.inputs = backend, timer, reference, inputs
        self.host, self.device = host, device
        self.sequential: list[np.ndarray] | None = None

    def prepare(self, row: dict[str, Any]) -> Any:
        """Capture the row's schedule, check its outputs (``error``, ``sched_error``); the call to time. The
        capture stays with the row (``executor``) until :func:`evaluate` has chosen."""
        executor = ParallelExecutor(self.backend, row["plan"])
        row["executor"] = executor
        outputs = host_arrays(executor.run(self.inputs))
        self.sequential = self.sequential or outputs
        self.reference = self.reference if self.reference is not None else outputs
        row.update(error=relative_error(outputs, self.reference), sched_error=relative_error(outputs, self.sequential))
        if self.inputs is not None:
            return lambda: executor.run(self.inputs)
        return executor.cuda_graph.replay if executor.cuda_graph is not None else executor.run

    def __call__(self, row: dict[str, Any]) -> None:
        time_rounds([(row, self.prepare(row))], self.timer, host=self.host, device=self.device)


def check_sm_partition(value: str) -> str:
    """``value`` if it is one of :data:`SM_PARTITIONS`, else a one-line error naming the choices."""
    if value not in SM_PARTITIONS:
        raise OpBenchError(f"unknown SM partition mode '{value}' (accepted: {', '.join(SM_PARTITIONS)})")
    return value


def _partitioned_rows(backend: KernelBackend, rows: list[dict[str, Any]], cost: SchedulingCost, measure: _Measure,
                      top: int, phases: dict[str, float]) -> list[dict[str, Any]]:
    """The best measured parallel schedule with up to ``top`` SM partitions (one per budget), measured."""
    from ..runtime import green
    from ..schedule import SmPartitioner

    if not backend.is_cuda:
        green.say_off("SM partitions are off on the CPU: its streams are threads")
        return []
    if not green.available():
        return []
    parallel = [r for r in rows if r["plan"] is not None and r["measured"] and r["sched_error"] <= 1e-5
                and r["plan"].num_streams > 1]
    if not parallel:
        log.info("SM partitions: no parallel schedule was measured to partition")
        return []
    base = min(parallel, key=lambda r: r["latency_ms"])
    clock = time.perf_counter()
    shape = green.layout()
    partitioner = SmPartitioner(shape["sm_count"], shape["granularity"], partitionable=shape["partitionable"])
    variants = partitioner.candidates(base["plan"], cost, top)
    phases["partitioning_s"] = time.perf_counter() - clock
    log.info("SM partitions of %s: measuring %d (the best predicted of each SM budget)", base["schedule"],
             len(variants))
    out = []
    for plan, predicted in variants:
        row = _row(plan.name, plan, predicted_ms=predicted * 1e3)
        measure(row)
        out.append(row)
    return out


def _decide(rows: list[dict[str, Any]], tolerance: float, rtol: float | None = None, say: bool = True) -> None:
    """Mark the kept row and fill ``speedup`` (over sequential) and ``vs_model`` (over the first
    baseline, the model's own graph): the fastest baseline is kept unless a schedule beats it by more
    than ``tolerance``. A row whose ``error`` exceeds ``rtol`` is refused (``refused`` says why); the first
    baseline is the reference and never refused.

    Each measured row also gets ``steady_ms`` (:func:`steady_ms`), and ``steady_kept`` marks the row the same
    rule keeps when it compares those instead: what the choice would be on a quiet host, recorded beside the
    choice made. ``say``: log why a baseline or sequential was kept."""
    for i, row in enumerate(rows):
        off = rtol is not None and row["measured"] and (i > 0 or row["plan"] is not None) and \
            row.get("error") is not None and not row["error"] <= rtol
        row["refused"] = f"error {row['error']:.1e} > rtol {rtol:.0e}" if off else None
        row["steady_ms"] = steady_ms(row) if row["measured"] else None
    best = _choice(rows, tolerance, "latency_ms", say=say)
    steady = _choice(rows, tolerance, "steady_ms")
    model = next((r for r in rows if r["plan"] is None and not r["refused"]), None)  # the first baseline not refused
    sequential = next(r for r in rows if r["plan"] is not None)
    for row in rows:
        row["kept"], row["steady_kept"] = row is best, row is steady
        lat = row["latency_ms"]
        row["speedup"] = sequential["latency_ms"] / lat if row["measured"] and lat else None
        if model is not None:
            row["vs_model"] = model["latency_ms"] / lat if row["measured"] and lat else None


def steady_ms(row: dict[str, Any]) -> float | None:
    """A measured row's latency on a quiet host: the larger of its device time and its host time a call
    (``device_ms``, ``host_ms``; calls back to back take about the larger of the two), never above the latency
    measured; the latency where either is missing, or where the larger is under :data:`STEADY_FLOOR` of the
    latency (the two do not account for it: work on another stream than the one the spin held, say)."""
    latency, device, host = row.get("latency_ms"), row.get("device_ms"), row.get("host_ms")
    if latency is None or device is None or host is None or max(device, host) < STEADY_FLOOR * latency:
        return latency
    return min(latency, max(device, host))


#: the least share of a row's measured latency that its device or host time must reach to stand for it
STEADY_FLOOR = 0.5


def _choice(rows: list[dict[str, Any]], tolerance: float, key: str, say: bool = False) -> dict[str, Any]:
    """The row :func:`_decide` keeps when it compares ``key``: the fastest schedule that beats sequential by
    ``tolerance`` (else sequential), unless the fastest baseline is not beaten by ``tolerance``; refused rows and
    schedules whose outputs differ from sequential's are left out. ``say``: log why a baseline or sequential
    was kept."""
    baselines = [r for r in rows if r["plan"] is None and not r["refused"]]
    model = baselines[0] if baselines else None
    base = min(baselines, key=lambda r: r[key]) if baselines else None
    schedules = [r for r in rows if r["plan"] is not None]
    sequential = schedules[0]
    valid = [r for r in schedules if r["measured"] and r["sched_error"] <= 1e-5 and not r["refused"]]
    best = min(valid, key=lambda r: r[key]) if valid else sequential
    if best is not sequential and best[key] > sequential[key] * (1 - tolerance):
        if say:
            log.info("no parallel schedule beats sequential by %.0f%%: keeping sequential", tolerance * 100)
        best = sequential
    if base is not None and not best[key] < base[key] * (1 - tolerance):
        if say:
            keeping = "the model as it is" if base is model else f"the {base['schedule']} module"
            log.info("no schedule beats the %s by more than %.0f%% (best: %s %.4f ms, %s %.4f ms): keeping %s "
                     "(%s)", base["schedule"], tolerance * 100, best["schedule"], best[key], base["schedule"],
                     base[key], keeping, base["schedule"])
        best = base
    return best


def library_versions() -> dict[str, str]:
    """The versions a schedule's kernels depend on: OpBench's, and PyTorch's, TVM's and CUDA's where this
    process has them (a schedule measured under one is not the fastest under another, say)."""
    import sys

    from .._version import __version__

    out = {"opbench": __version__}
    torch = sys.modules.get("torch")
    if torch is not None:
        out.update(torch=str(torch.__version__), cuda=str(torch.version.cuda))
    tvm = sys.modules.get("tvm")
    if tvm is not None and hasattr(tvm, "__version__"):
        out["tvm"] = str(tvm.__version__)
    return out


def check_schedule(schedule: Schedule, fingerprint: str, device: str) -> None:
    """Refuse a schedule made for another graph; warn (one line) when it was made on another device or under
    other library versions."""
    made_for = schedule.meta.get("graph")
    if made_for is None:
        raise OpBenchError(f"schedule '{schedule.name}' carries no graph fingerprint (save it with this version "
                           "of opbench to reuse it)")
    if made_for != fingerprint:
        raise OpBenchError(f"schedule '{schedule.name}' was made for another graph (fingerprint {made_for[:12]}, "
                           f"this model's is {fingerprint[:12]})")
    if schedule.meta.get("device") not in (None, device):
        log.warning("schedule '%s' was made on %s, running on %s: it may not be the fastest here",
                    schedule.name, schedule.meta["device"], device)
    made, now = schedule.meta.get("versions") or {}, library_versions()
    changed = [f"{k} {made[k]} -> {now[k]}" for k in sorted(made) if k in now and made[k] != now[k]]
    if changed:
        log.warning("schedule '%s' was made under other versions (%s): it may not be the fastest here",
                    schedule.name, ", ".join(changed))


def critical_path(backend: KernelBackend, repeat: int = 10, number: int = 20,
                  latencies: Sequence[float] | None = None) -> dict[str, Any]:
    """The longest dependency chain of ``backend``'s kernels and its measured time.

    Every operator is timed alone (or ``latencies`` are taken as those times); the longest path by
    those times is then timed as a chain (its operators alone, one after another, in one CUDA Graph
    on the GPU). Any schedule runs that chain in order, so ``chain_ms`` bounds every schedule's
    latency from below (concurrent kernels only slow each other down) and ``sequential / chain_ms``
    bounds the speedup. The chain can run slower than the sum of its alone-times (``path_ms``): a
    kernel repeated alone finds its weights in L2.

    Returns ``ops`` (the path), ``chain_ms``, ``path_ms``, ``sum_ms`` (all alone-times) and
    ``alone_ms`` (each operator's alone-time, by index).
    """
    graph = backend.graph
    alone = list(latencies) if latencies is not None else operator_latencies(backend, repeat, number)
    finish = [0.0] * len(graph)
    came_from: list[int | None] = [None] * len(graph)
    for op in range(len(graph)):  # operator indices are a topological order
        preds = graph.preds(op)
        if preds:
            came_from[op] = max(preds, key=lambda p: finish[p])
            finish[op] = finish[came_from[op]]
        finish[op] += alone[op]
    last: int | None = max(range(len(graph)), key=lambda op: finish[op])
    path: list[int] = []
    while last is not None:
        path.append(last)
        last = came_from[last]
    path.reverse()
    return {"ops": path, "chain_ms": median(time_ops(backend, path, repeat, number)) * 1e3,
            "path_ms": sum(alone[op] for op in path) * 1e3, "sum_ms": sum(alone) * 1e3,
            "alone_ms": [t * 1e3 for t in alone]}


def evaluate_with_bound(backend: KernelBackend, schedulers: Sequence[Any] | None = DEFAULT_SCHEDULERS,
                        reference: Sequence[np.ndarray] | None = None, repeat: int = 10, number: int = 20,
                        tolerance: float = 0.02, latencies: Sequence[float] | None = None,
                        **options: Any) -> tuple[Schedule, list[dict[str, Any]], dict[str, Any]]:
    """:func:`evaluate` and :func:`critical_path` on one measurement of the operators' alone-times
    (``latencies``, seconds by operator index, when they were measured already).

    Returns the kept schedule, the table, and the critical path that bounds every row (:func:`bounded` returns
    them as one object, with the phases).
    """
    found = bounded(backend, schedulers, reference, options.pop("baseline", None), latencies,
                    EvaluateOptions(repeat, number, tolerance), **options)
    return found.plan, found.rows, found.bound


@dataclasses.dataclass
class Bounded(Evaluation):
    """An :class:`Evaluation` with the critical path that bounds every row (:func:`critical_path`)."""

    bound: dict[str, Any] = dataclasses.field(default_factory=dict)


def bounded(backend: KernelBackend, schedulers: Sequence[Any] | None = DEFAULT_SCHEDULERS,
            reference: Sequence[np.ndarray] | None = None, baseline: Any = None,
            latencies: Sequence[float] | None = None, options: EvaluateOptions | None = None,
            **overrides: Any) -> Bounded:
    """:func:`evaluate` and :func:`critical_path` on one measurement of the operators' alone-times
    (``latencies``, seconds by operator index, when they were measured already); ``baseline``, ``options``
    and ``overrides`` as :func:`evaluate` takes them."""
    o = overridden(options or EvaluateOptions(), overrides, "bounded")
    clock = time.perf_counter()
    if latencies is None:
        latencies = operator_latencies(backend, o.repeat, o.number)
    alone_s = time.perf_counter() - clock
    found = evaluate(backend, schedulers, scheduling_cost(backend, latencies), reference, baseline, options=o)
    found.phases["operator_times_s"] += alone_s
    clock = time.perf_counter()
    bound = critical_path(backend, o.repeat, o.number, latencies)
    found.phases["critical_path_s"] = time.perf_counter() - clock
    return Bounded(found.plan, found.rows, found.phases, found.executor, bound=bound)


def choices(text: str, accepted: Sequence[str], flag: str) -> list[str]:
    """A comma-separated option's values, each one of ``accepted``, once each in the order given."""
    values = list(dict.fromkeys(c.strip() for c in text.split(",") if c.strip()))
    bad = [c for c in values if c not in accepted] or ([] if values else [text])
    if bad:
        raise OpBenchError(f"unknown {flag} '{bad[0]}' (accepted: {', '.join(accepted)}, comma-separated)")
    return values


@dataclasses.dataclass(frozen=True)
class CompareOptions(Spec):
    """What :func:`compare` runs, as plain data (a :class:`~opbench.pipeline.spec.Spec`).

    Attributes
    ----------
    schedulers:
        The schedulers, sequential first (the fallback); a comma-separated text is split.
    cost, ios_cost, predictor, ios_time_limit_s:
        The operator costs of ios and greedy (``measured``, ``predicted``; comma-separated), IOS's stage costs
        (``model``, ``measured``), a latency predictor file (and optionally a co-run one, comma-separated) for
        ``predicted``, and IOS's search limit.
    repeat, number:
        Every candidate is timed as ``repeat`` samples of ``number`` runs.
    schedule:
        A schedule file saved earlier for this graph: measured beside sequential instead of a search.
    stages:
        Also time every stage of sequential and of the staged schedules (IOS's view).
    sm_partition:
        ``auto``: also measure the best parallel schedule with SM partitions (GPU); ``off``.
    """

    schedulers: tuple[str, ...] = DEFAULT_SCHEDULERS
    cost: str = "measured"
    ios_cost: str = "model"
    predictor: str | None = None
    ios_time_limit_s: float = 60.0
    repeat: int = 10
    number: int = 20
    schedule: str | None = None
    stages: bool = False
    sm_partition: str = "off"

    def __post_init__(self) -> None:
        if isinstance(self.schedulers, str):  # "sequential,opara", as the flag takes them
            object.__setattr__(self, "schedulers", tuple(n.strip() for n in self.schedulers.split(",") if n.strip()))

    def validate(self) -> None:
        """Check every field without loading anything (see :class:`~opbench.pipeline.spec.Spec`)."""
        from ..schedule import accepted_schedulers, known_scheduler

        unknown = [s for s in self.schedulers if not known_scheduler(s)]
        if not self.schedulers or unknown:
            raise SpecError("schedulers", f"unknown scheduler {unknown[0] if unknown else ''!r} "
                                          f"(accepted: {accepted_schedulers()})")
        for name, accepted in (("cost", COSTS), ("ios_cost", IOS_COSTS)):
            try:
                choices(getattr(self, name), accepted, name)
            except OpBenchError:
                raise SpecError(name, f"{getattr(self, name)!r}: each of {', '.join(accepted)}, comma-separated, "
                                      "is accepted") from None
        if "predicted" in self.cost and not self.predictor:
            raise SpecError("predictor", "cost 'predicted' needs a latency predictor file (from 'opbench train')")
        check_positive(self, ("repeat", "number"))
        if not 0 < self.ios_time_limit_s < float("inf"):
            raise SpecError("ios_time_limit_s", f"must be a finite positive number, got {self.ios_time_limit_s}")
        if self.sm_partition not in SM_PARTITIONS:
            raise SpecError("sm_partition", f"{self.sm_partition!r} is not one of {', '.join(SM_PARTITIONS)}")

    def load_schedule(self) -> Schedule | None:
        """The saved schedule ``schedule`` names (a file that does not read is a one-line error), or None."""
        return Schedule.load(self.schedule) if self.schedule else None

    def scheduler_names(self) -> list[str]:
        """The schedulers checked (unknown names and inconsistent costs fail before any work), sequential first."""
        names = [get_scheduler(n).name for n in self.schedulers]
        choices(self.ios_cost, IOS_COSTS, "--ios-cost")
        costs = choices(self.cost, COSTS, "--cost")
        if "predicted" in costs and not self.predictor:
            raise OpBenchError("--cost predicted needs --predictor FILE (a latency predictor from 'opbench train')")
        if "predicted" in costs and not any(n in PREDICTED for n in names):
            raise OpBenchError(f"--cost predicted applies to the {' and '.join(PREDICTED)} schedulers; --schedulers "
                               f"names neither")
        return ["sequential"] + [n for n in names if n != "sequential"]


def trace_rows(backend: KernelBackend, rows: list[dict[str, Any]], plan: Schedule, path: str | Path,
               repeat: int = 5, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """Replay sequential and ``plan`` (when it is another schedule) with a timing mark around each operator
    and write them as a Chrome trace to ``path`` (:mod:`opbench.runtime.trace`), each labelled with its
    time measured without the marks in ``rows`` (rows of :func:`evaluate`). Returns the trace."""
    from ..runtime.trace import chrome_trace, trace_schedule, write_trace

    plans = [r["plan"] for r in rows if r["schedule"] == "sequential" and r["plan"] is not None][:1]
    if plan is not None and plan.name != "sequential":
        plans.append(plan)
    traced = [trace_schedule(backend, p, repeat) for p in plans]
    for run, traced_plan in zip(traced, plans, strict=True):
        row = next((r for r in rows if r["plan"] is traced_plan and r["measured"]), None)
        if row is not None and row["latency_ms"]:
            run["unmarked_us"] = row["latency_ms"] * 1e3
    trace = chrome_trace(backend, traced, meta)
    write_trace(path, trace)
    return trace


@dataclasses.dataclass
class CompareResult:
    """What :func:`compare` measured: the kept schedule, every row (the model's own graph first, for
    a torch model), the critical path that bounds them, and the stages when asked for."""

    backend: KernelBackend
    kept: Schedule
    rows: list[dict[str, Any]]
    bound: dict[str, Any]
    stages: dict[str, Any] | None = None
    #: seconds by phase: timing the operators alone, scheduling, measuring, the critical path (and stages)
    phases: dict[str, float] = dataclasses.field(default_factory=dict)
    #: the model compared, when the compare job loaded it (:func:`opbench.pipeline.compare_job.run_compare`)
    workload: Any = None

    @property
    def kept_baseline(self) -> dict[str, Any] | None:
        """The baseline row that is kept (the model's own graph, or torch.compile's) when no schedule
        beats it, else None."""
        return next((r for r in self.rows if r["kept"] and r["plan"] is None), None)

    def trace(self, path: str, repeat: int = 5, nvtx: bool = False, meta: dict[str, Any] | None = None
              ) -> dict[str, Any]:
        """Replay the kept schedule and sequential with a timing mark around each operator and write them as
        a Chrome trace to ``path`` (:mod:`opbench.runtime.trace`); with ``nvtx`` (GPU), also run the kept
        schedule under ``torch.profiler`` with NVTX ranges, its trace written to ``<path>.torch.json``."""
        from ..runtime.trace import nvtx_profile

        trace = trace_rows(self.backend, self.rows, self.kept, path, repeat, meta)
        if nvtx:
            nvtx_profile(self.backend, self.kept, str(path).removesuffix(".json") + ".torch.json")
        return trace

    def table(self) -> dict[str, Any]:
        """The comparison as JSON: schedules, critical path, each operator's time alone (and stages)."""
        times = [{"index": n.index, "name": n.func, "kind": n.kind,
                  "output_shape": list(n.output_shapes[0]) if n.output_shapes else [],
                  "alone_ms": self.bound["alone_ms"][n.index]} for n in self.backend.graph]
        table = {"schedules": table_rows(self.rows),
                 "critical_path": {k: v for k, v in self.bound.items() if k != "alone_ms"}, "operator_times": times}
        if self.stages is not None:
            table["stages"] = self.stages
        return table


def load_predictors(files: str, backend: KernelBackend) -> tuple[Any, Any]:
    """The latency (and co-run) predictor of ``files`` (comma-separated), checked against the device in use."""
    from ..predict import load_predictor
    from ..profile.env import cpu_model

    if backend.name != "tvm":
        raise OpBenchError("--cost predicted costs TVM kernels (the predictors learn from TVM kernel rows); "
                           "use it with --backend tvm")
    names = [f.strip() for f in files.split(",") if f.strip()]
    if not 1 <= len(names) <= 2:
        raise OpBenchError(f"--predictor takes a latency predictor and optionally a co-run predictor, "
                           f"got {len(names)} files")
    latency = load_predictor(names[0], "latency")
    corun = load_predictor(names[1], "corun") if len(names) > 1 else None
    kind = "cuda" if backend.is_cuda else "llvm"
    for p in (latency, corun):
        if p is not None:
            p.check_device(backend.device_name if backend.is_cuda else cpu_model(), kind)
    return latency, corun


def schedulers_for(backend: KernelBackend, options: CompareOptions) -> list[Any]:
    """The schedulers ``options`` name, with ``ios`` once per IOS stage cost (``ios-measured`` times
    its stages) and the ``-predicted`` variants of ios and greedy where costs are predicted."""
    from ..profile.schedule import measured_stage_cost
    from ..schedule import IOS, SUFFIX, CriticalFirst

    names = options.scheduler_names()
    costs = choices(options.cost, COSTS, "--cost")
    out: list[Any] = []
    for name in names:
        if "measured" in costs or name not in PREDICTED:
            if name == "ios" + SUFFIX:
                out.append(CriticalFirst(IOS(time_limit_s=options.ios_time_limit_s)))
            elif name != "ios":
                out.append(name)
            else:
                for cost in choices(options.ios_cost, IOS_COSTS, "--ios-cost"):
                    measured = measured_stage_cost(backend) if cost == "measured" else None
                    out.append(IOS(time_limit_s=options.ios_time_limit_s, stage_cost=measured,
                                   name="ios" if cost == "model" else "ios-measured"))
    if "predicted" in costs:
        from ..predict.scheduling import predicted_schedulers
        from ..profile.cuda import device_figures

        latency, corun = load_predictors(options.predictor or "", backend)
        chosen = [IOS(time_limit_s=options.ios_time_limit_s) if n == "ios" else n for n in names if n in PREDICTED]
        out += predicted_schedulers(chosen, latency, corun, backend.resources,
                                    device_figures() if backend.is_cuda else None)
    return out


def stage_tables(backend: KernelBackend, rows: Sequence[dict[str, Any]], repeat: int) -> dict[str, Any]:
    """IOS's view: every stage of sequential and of each staged schedule, with its measured latency."""
    from ..profile.schedule import stage_table

    found: dict[str, Any] = {}
    for row in rows:
        plan = row.get("plan")
        if plan is None or (plan.name != "sequential" and not plan.stages):
            continue
        stages = stage_table(backend, plan, repeat)
        found[plan.name] = {"total_ms": sum(s["latency_ms"] for s in stages), "stages": stages}
    return found


def compare(backend: KernelBackend, options: CompareOptions | None = None,
            baseline: CapturedModel | Sequence[Any] | None = None,
            latencies: Sequence[float] | None = None) -> CompareResult:
    """Schedules of ``backend``'s kernels side by side (and, for a torch model, the baselines: the
    model's own CUDA Graph, ``torch.compile``'s module), then the critical path that bounds them all.
    ``latencies`` (seconds by operator) are the operators' alone-times when they were just measured."""
    options = options or CompareOptions()
    schedule = options.load_schedule()
    what = f"schedule {schedule.name}" if schedule else f"schedules {','.join(options.schedulers)}"
    log.info("comparing %s on %d operators", what, len(backend.graph))
    found = bounded(backend, schedulers_for(backend, options), None, baseline, latencies,
                    EvaluateOptions(options.repeat, options.number, schedule=schedule,
                                    sm_partition=options.sm_partition))
    clock = time.perf_counter()
    stages = stage_tables(backend, found.rows, options.repeat) if options.stages else None
    if stages is not None:
        found.phases["stages_s"] = time.perf_counter() - clock
    return CompareResult(backend, found.plan, found.rows, found.bound, stages, found.phases)


__all__ = ["COSTS", "DEFAULT_SCHEDULERS", "FAST_SCHEDULERS", "IOS_COSTS", "MODES", "PREDICTED", "SM_PARTITIONS",
           "Bounded", "CompareOptions", "CompareResult", "EvaluateOptions", "Evaluation", "bounded", "check_schedule",
           "check_sm_partition", "choices", "compare", "critical_path", "evaluate", "evaluate_with_bound",
           "host_arrays", "load_predictors", "operator_latencies", "scheduling_cost", "schedulers_for", "stage_tables",
           "table_rows"]
