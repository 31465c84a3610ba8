"""Inter-operator parallelism, end to end: schedule, capture, measure, keep the fastest.

``evaluate`` measures schedulers' schedules side by side with the sequential one (and, for a torch
model, with the model itself captured as it is in one CUDA Graph) and keeps the fastest; a parallel
schedule that is not faster than sequential beyond ``tolerance`` is not kept (users of IOS and Opara
report parallel schedules that lose on newer GPUs), and no schedule is kept that does not beat the
model's own CUDA Graph beyond ``tolerance``. ``capturer`` does this for any torch model and returns a
callable: the captured schedule, or the captured model when nothing beats it.

Two modes: ``"fast"`` (the default of ``capturer`` and ``optimize``) times every operator in one
captured run, predicts each cheap scheduler's schedule with the scheduling cost's simulation and
measures only the best predicted ones beside sequential and the baseline; ``"exhaustive"`` (or an
explicit ``schedulers=[...]``) measures every listed scheduler, IOS included.

A schedule carries the fingerprint of the graph it was made for and the device's name
(``meta["graph"]``, ``meta["device"]``); given back as ``schedule=`` it skips the search, and a
schedule of another graph is refused.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .errors import OpBenchError
from .ir.merge import conv_bindings, merge_sibling_convs, sibling_groups
from .profile.schedule import Timer, alone_times, default_timer, median, merge_cost, operator_times, time_ops
from .runtime.backend import KernelBackend, TorchBackend, TVMBackend
from .runtime.executor import ParallelExecutor
from .runtime.graphs import capture_graph
from .runtime.kernels import relative_error
from .schedule import Schedule, SchedulingCost, get_scheduler

__all__ = ["MERGE_MODES", "CapturedModel", "CapturedSchedule", "TVMBackend", "TorchBackend", "capturer",
           "critical_path", "evaluate", "evaluate_with_bound", "ios_merges", "merge_mode", "operator_latencies",
           "optimize", "table_rows", "torch_backend", "tvm_backend", "tvm_ios_merges"]

log = logging.getLogger("opbench")
DEFAULT_SCHEDULERS = ("sequential", "greedy", "nimble", "opara", "ios")
#: the schedulers of the fast mode: each schedules a 300-operator graph in milliseconds
FAST_SCHEDULERS = ("sequential", "greedy", "nimble", "opara")
MODES = ("fast", "exhaustive")
#: the name of the baseline row: the user's module captured as it is
MODEL_ROW = "model, CUDA Graph"
MODEL_ROW_EAGER = "model, eager"
#: IOS's merge: none, every group of sibling convolutions (all), or the groups IOS's DP merges (ios)
MERGE_MODES = ("none", "all", "ios")


def _host(outputs: Sequence[Any]) -> list[np.ndarray]:
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
    """The comparison rows without their ``Schedule`` objects (JSON-serialisable)."""
    return [{k: v for k, v in r.items() if k != "plan"} for r in rows]


def device_name(backend: KernelBackend) -> str:
    """The device a backend runs on, as schedules record it."""
    if backend.is_cuda:
        import torch

        return torch.cuda.get_device_name(0)
    return "cpu"


class CapturedModel:
    """The user's module run as it is: captured in one CUDA Graph, or eager where capture fails.

    ``captured(*inputs)`` copies ``inputs`` into static inputs, replays, and returns the static
    outputs (overwritten by the next call), like :class:`CapturedSchedule`. On the CPU it calls
    the module.
    """

    def __init__(self, model: Any, inputs: Sequence[Any]) -> None:
        import torch

        self.model = model
        self.static_inputs = [x.detach().clone() for x in inputs]
        self.graph: Any = None
        self.reason = ""
        self.outputs: Any = None
        self.is_cuda = bool(self.static_inputs) and self.static_inputs[0].device.type == "cuda"
        if self.is_cuda:
            def launch(stream: Any) -> Any:
                with torch.no_grad():
                    return model(*self.static_inputs)

            try:
                captured = capture_graph(launch, warmup=3)
                self.graph, self.outputs = captured, captured.result
            except Exception as err:  # data-dependent code, host syncs: run it eagerly
                first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                self.reason = f"cannot be captured in a CUDA Graph ({first})"
                log.info("the model %s; its baseline runs eagerly", self.reason)

    @property
    def label(self) -> str:
        return MODEL_ROW if self.graph is not None else MODEL_ROW_EAGER

    def run_once(self) -> Any:
        """One run on the static inputs (a replay, or an eager call)."""
        if self.graph is not None:
            self.graph.replay()
            return self.outputs
        import torch

        with torch.no_grad():
            return self.model(*self.static_inputs)

    def __call__(self, *inputs: Any) -> Any:
        if self.graph is None:
            import torch

            with torch.no_grad():
                return self.model(*inputs)
        for dst, src in zip(self.static_inputs, inputs, strict=True):
            dst.copy_(src)
        return self.run_once()


def _row(name: str, latency_ms: float | None, error: float | None, sched_error: float | None, scheduling_ms: float,
         predicted_ms: float | None, plan: Schedule | None, streams: int, events: int) -> dict[str, Any]:
    return {"schedule": name, "streams": streams, "events": events, "latency_ms": latency_ms, "error": error,
            "sched_error": sched_error, "scheduling_ms": scheduling_ms, "predicted_ms": predicted_ms,
            "measured": True, "plan": plan}


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
    return (tuple(schedule.stream_of), tuple(schedule.order), tuple(schedule.events))


def evaluate(backend: KernelBackend, schedulers: Sequence[Any] | None = None, cost: SchedulingCost | None = None,
             reference: Sequence[np.ndarray] | None = None, repeat: int = 10, number: int = 20,
             tolerance: float = 0.02, mode: str = "exhaustive", baseline: CapturedModel | None = None,
             schedule: Schedule | None = None, timer: Timer | None = None, measure_top: int = 2,
             phases: dict[str, float] | None = None) -> tuple[Schedule, list[dict[str, Any]]]:
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
        The model captured as it is: measured as its own row, and kept (``row["kept"]``) unless a
        schedule beats it by more than ``tolerance``.
    schedule:
        A schedule made earlier for this graph: no search, it is measured beside sequential.
    timer:
        ``timer(label, run)`` returns seconds per call of ``run`` (default: CUDA events on the GPU).
    phases:
        Filled with the seconds spent timing operators, scheduling and measuring, when given.

    Returns
    -------
    The fastest schedule (sequential unless a parallel one wins by ``tolerance``) and one row per
    variant; ``kept`` marks the overall winner, which is the baseline row when nothing beats it.
    """
    if mode not in MODES:
        raise OpBenchError(f"unknown mode '{mode}' (accepted: {', '.join(MODES)})")
    named = schedulers is not None
    items = list(schedulers) if named else list(DEFAULT_SCHEDULERS if mode == "exhaustive" else FAST_SCHEDULERS)
    timer = timer or default_timer(backend.is_cuda, repeat, number)
    phases = phases if phases is not None else {}
    clock = time.perf_counter()
    if cost is None:
        cost = scheduling_cost(backend, operator_times(backend, repeat))
    phases["operator_times_s"] = time.perf_counter() - clock
    fingerprint, device = backend.graph.fingerprint(), device_name(backend)
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
    if baseline is not None:
        outputs = _host(_leaves(baseline.run_once()))
        reference = reference if reference is not None else outputs
        rows.append(_row(baseline.label, median(timer(baseline.label, baseline.run_once)) * 1e3,
                         relative_error(outputs, reference), None, 0.0, None, None, 1, 0))
    sequential_out: list[np.ndarray] | None = None
    for i, (plan, seconds) in enumerate(scheduled):
        plan.meta.update({"graph": fingerprint, "device": device})
        row = _row(plan.name, None, None, None, seconds * 1e3, predicted[i] * 1e3, plan,  # None: not measured
                   plan.num_streams, plan.num_events)
        if i in measure:
            executor = ParallelExecutor(backend, plan)
            outputs = _host(executor.run())
            sequential_out = sequential_out or outputs
            reference = reference if reference is not None else outputs
            run = executor.cuda_graph.replay if executor.cuda_graph is not None else executor.run
            row.update(latency_ms=median(timer(plan.name, run)) * 1e3, error=relative_error(outputs, reference),
                       sched_error=relative_error(outputs, sequential_out))
            del executor
        else:
            row["measured"] = False
        rows.append(row)
    phases["measuring_s"] = time.perf_counter() - clock
    _decide(rows, tolerance)
    kept = next((r for r in rows if r["kept"] and r["plan"] is not None), None)
    if kept is None:  # the baseline won: the best schedule still goes back (for --save-schedule)
        kept = min((r for r in rows if r["plan"] is not None and r["measured"] and r["sched_error"] <= 1e-5),
                   key=lambda r: r["latency_ms"])
    return kept["plan"], rows


def _decide(rows: list[dict[str, Any]], tolerance: float) -> None:
    """Mark the kept row and fill ``speedup`` (over sequential) and ``vs_model`` (over the baseline)."""
    base = rows[0] if rows[0]["plan"] is None else None
    schedules = [r for r in rows if r["plan"] is not None]
    sequential = schedules[0]
    valid = [r for r in schedules if r["measured"] and r["sched_error"] <= 1e-5]
    best = min(valid, key=lambda r: r["latency_ms"]) if valid else sequential
    if best is not sequential and best["latency_ms"] > sequential["latency_ms"] * (1 - tolerance):
        log.info("no parallel schedule beats sequential by %.0f%%: keeping sequential", tolerance * 100)
        best = sequential
    if base is not None and not best["latency_ms"] < base["latency_ms"] * (1 - tolerance):
        log.info("no schedule beats the %s by more than %.0f%% (best: %s %.4f ms, model %.4f ms): keeping the "
                 "model as it is", base["schedule"], tolerance * 100, best["schedule"], best["latency_ms"],
                 base["latency_ms"])
        best = base
    for row in rows:
        row["kept"] = row is best
        lat = row["latency_ms"]
        row["speedup"] = sequential["latency_ms"] / lat if row["measured"] and lat else None
        if base is not None:
            row["vs_model"] = base["latency_ms"] / lat if row["measured"] and lat else None


def scheduling_cost(backend: KernelBackend, latencies: Sequence[float] | None) -> SchedulingCost:
    """The schedulers' cost for ``backend``: ``latencies``, its kernel resources, its device's figures
    (on the CPU: every operator fills one core, every extra thread costs 0.1 ms)."""
    if not backend.is_cuda:  # threads on cores: an untuned kernel fills one core; a thread costs ~0.1 ms
        import os

        cores = max(1, os.cpu_count() or 1)
        return SchedulingCost(backend.graph, latencies, backend.resources, demand=1.0 / cores, fork_s=1e-4)
    from .profile.cuda import device_figures

    return SchedulingCost.for_device(backend.graph, latencies, backend.resources, device_figures())


def merge_mode(merge: bool | str | None) -> str:
    """``merge`` as one of :data:`MERGE_MODES` (True is ``all``, False or None ``none``)."""
    if merge is True:
        return "all"
    if merge is False or merge is None:
        return "none"
    if merge in MERGE_MODES:
        return str(merge)
    raise OpBenchError(f"unknown merge '{merge}' (accepted: {', '.join(MERGE_MODES)}, True, False)")


def ios_merges(backend: TorchBackend, latencies: Sequence[float] | None = None, repeat: int = 10,
               number: int = 20, time_limit_s: float = 60.0) -> list[list[str]]:
    """The groups of sibling convolutions that IOS's dynamic programme runs merged, by node name.

    The DP (:class:`opbench.schedule.ios.IOS` with a merge cost) weighs, for every candidate
    stage of two or more sibling convolutions, running them concurrently (the scheduling cost, on
    ``latencies`` or the operators timed alone) against running them as one merged convolution
    (timed alone, :func:`opbench.profile.schedule.merge_cost`), and merges where that is faster.
    """
    if not backend.merge_groups():
        return []
    merged = _ios_merged_stages(backend, merge_cost(backend, max(3, repeat // 2), number), latencies, repeat,
                                number, time_limit_s)
    return [[backend.graph[i].var_name for i in ops] for ops in merged]


def _ios_merged_stages(backend: KernelBackend, merge: Any, latencies: Sequence[float] | None, repeat: int,
                       number: int, time_limit_s: float) -> list[list[int]]:
    """The stages IOS's dynamic programme runs merged on ``backend``'s operators, with merge cost
    ``merge`` and the scheduling cost on ``latencies`` (timed alone when not given)."""
    from .schedule.ios import IOS

    if latencies is None:
        latencies = operator_latencies(backend, repeat, number)
    plan = IOS(time_limit_s=time_limit_s, merge=merge).schedule(backend.graph, scheduling_cost(backend, latencies))
    return plan.meta["merged"]


def torch_backend(model: Any, inputs: Sequence[Any], merge: bool | str | None = "none", trace: str = "auto",
                  repeat: int = 10, number: int = 20, **options: Any) -> TorchBackend:
    """A :class:`TorchBackend` with IOS's merge applied as ``merge`` says (:data:`MERGE_MODES`):
    ``all`` merges every group of sibling convolutions, ``ios`` the groups :func:`ios_merges`
    picks (logged; ``backend.merged_groups`` lists what was merged)."""
    mode = merge_mode(merge)
    backend = TorchBackend(model, inputs, trace=trace, merge=mode == "all", **options)
    if mode == "ios":
        chosen = ios_merges(backend, repeat=repeat, number=number)
        log.info("merge: IOS merges %d of %d group(s) of sibling convolutions: %s", len(chosen),
                 len(backend.merge_groups()), "; ".join("+".join(g) for g in chosen) or "none")
        if chosen:
            backend = TorchBackend(model, inputs, trace=backend.trace, merge=chosen, **options)
    return backend


def check_schedule(schedule: Schedule, fingerprint: str, device: str) -> None:
    """Refuse a schedule made for another graph; warn when it was made on another device."""
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


def operator_latencies(backend: KernelBackend, repeat: int = 10, number: int = 20) -> list[float]:
    """Seconds per operator, each run alone (median; its own CUDA Graph on the GPU)."""
    return alone_times(backend, repeat, number)


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

    Returns the kept schedule, the table, and the critical path that bounds every row.
    """
    if latencies is None:
        latencies = operator_latencies(backend, repeat, number)
    cost = scheduling_cost(backend, latencies)
    kept, rows = evaluate(backend, schedulers, cost, reference, repeat, number, tolerance, **options)
    return kept, rows, critical_path(backend, repeat, number, latencies)


def format_comparison(rows: Sequence[dict[str, Any]]) -> str:
    """The comparison table: schedule, streams, events, latency, speedup, error, scheduling and
    predicted time (``-`` where a row was not measured or does not apply)."""
    head = (f"{'schedule':<18}{'streams':>8}{'events':>8}{'median ms':>11}{'speedup':>9}{'max err':>10}"
            f"{'sched ms':>10}{'pred ms':>10}")
    lines = [head, "-" * len(head)]

    def num(value: Any, fmt: str, width: int) -> str:
        return f"{value:>{width}{fmt}}" if isinstance(value, int | float) and value == value else f"{'-':>{width}}"

    for r in rows:
        mark = " *" if r.get("kept") else ""
        lines.append(f"{r['schedule']:<18}{r['streams']:>8}{r['events']:>8}{num(r['latency_ms'], '.4f', 11)}"
                     f"{num(r.get('speedup'), '.2f', 9)}{num(r['error'], '.1e', 10)}"
                     f"{num(r['scheduling_ms'], '.1f', 10)}{num(r.get('predicted_ms'), '.4f', 10)}{mark}")
    return "\n".join(lines)


def _load_schedule(schedule: Schedule | str | Path | None) -> Schedule | None:
    if schedule is None or isinstance(schedule, Schedule):
        return schedule
    return Schedule.load(schedule)


def _check_order(inputs: Any, model: Any, caller: str) -> list[Any]:
    if callable(inputs) and not callable(model):
        raise OpBenchError(f"{caller} takes (inputs, model): the first argument is a {type(inputs).__name__}, "
                           f"the second a {type(model).__name__}")
    if hasattr(inputs, "shape"):  # one tensor
        return [inputs]
    return list(inputs)


def _select(inputs: Any, model: Any, caller: str, schedulers: Sequence[Any] | None, mode: str,
            schedule: Schedule | str | Path | None, tolerance: float, repeat: int, number: int,
            timer: Timer | None, phases: dict[str, float], merge: bool | str = False) -> tuple[
                TorchBackend, CapturedModel, Schedule, list[dict[str, Any]], Any]:
    inputs = _check_order(inputs, model, caller)
    given = _load_schedule(schedule)
    clock = time.perf_counter()
    # torch.fx where it can, else torch.export
    backend = torch_backend(model, inputs, merge, trace="auto", repeat=repeat, number=number)
    phases["trace_s"] = time.perf_counter() - clock
    import torch

    clock = time.perf_counter()
    baseline = CapturedModel(model, inputs)
    with torch.no_grad():
        reference = model(*inputs)
    phases["model_graph_s"] = time.perf_counter() - clock
    import torch

    leaves, structure = torch.utils._pytree.tree_flatten(reference)
    if not any(isinstance(v, torch.Tensor) for v in leaves):
        raise OpBenchError(f"{type(model).__name__} returns no tensor ({type(reference).__name__}): nothing to "
                           "schedule")
    plan, rows = evaluate(backend, schedulers, None, _host(leaves), repeat, number, tolerance,
                          mode=mode, baseline=baseline, schedule=given, timer=timer, phases=phases)
    return backend, baseline, plan, rows, structure


def optimize(inputs: Any, model: Any, *, schedulers: Sequence[Any] | None = None, mode: str = "fast",
             schedule: Schedule | str | Path | None = None, tolerance: float = 0.02, repeat: int = 7,
             number: int = 10, timer: Timer | None = None, merge: bool | str = False) -> Schedule:
    """The fastest measured schedule of a torch model's ATen kernels (the same search as :func:`capturer`).

    ``schedule.meta["table"]`` has every row, the model's own CUDA Graph included;
    ``schedule.meta["beats_model"]`` says whether the schedule beat it (else :func:`capturer` would
    return the captured model).
    """
    _, _, plan, rows, _ = _select(inputs, model, "optimize", schedulers, mode, schedule, tolerance, repeat,
                                  number, timer, {}, merge)
    plan.meta["table"] = table_rows(rows)
    plan.meta["beats_model"] = any(r["kept"] and r["plan"] is plan for r in rows)
    return plan


class CapturedSchedule:
    """A model captured with its chosen schedule: ``captured(*inputs)`` replays it.

    Outputs are the graph's static output tensors, overwritten by the next call.
    """

    def __init__(self, backend: KernelBackend, schedule: Schedule, table: list[dict[str, Any]], structure: Any):
        self.backend, self.schedule, self.table, self._structure = backend, schedule, table, structure
        self.executor = ParallelExecutor(backend, schedule)
        self.executor.run()

    def __call__(self, *inputs: Any) -> Any:
        import torch

        outputs = self.executor.run(inputs)
        if self._structure.num_leaves == len(outputs):  # the model's own nesting (tuple, dict, ...)
            return torch.utils._pytree.tree_unflatten(list(outputs), self._structure)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)


def capturer(inputs: Any, model: Any, *, schedulers: Sequence[Any] | None = None, mode: str = "fast",
             schedule: Schedule | str | Path | None = None, tolerance: float = 0.02, repeat: int = 7,
             number: int = 10, timer: Timer | None = None, merge: bool | str = False) -> Any:
    """Opara-style one call: export ``model``, pick the fastest variant by measurement, capture it.

    The variants are the model itself captured as it is in one CUDA Graph (the baseline) and the
    schedules of its exported operators (see :func:`evaluate` for ``schedulers``, ``mode``,
    ``schedule``, ``tolerance`` and ``timer``). The result is a :class:`CapturedSchedule` when a
    schedule beats the baseline by more than ``tolerance``, else the :class:`CapturedModel` (with the
    reason logged at INFO). Both take the model's inputs, return static outputs, and carry
    ``table`` (every row), ``build_s`` (seconds this call took), ``phases`` (where they went) and
    ``trace`` (``fx`` or ``export``: how the operators were traced). ``merge`` applies IOS's merge
    first: convolutions that read the same input with the same kernel size, stride, padding and
    dilation run as one convolution whose output is split; ``True`` or ``"all"`` merges every such
    group, ``"ios"`` the groups where IOS's dynamic programme finds merging faster than running
    them concurrently (:func:`ios_merges`).
    Every measured row is ``repeat`` samples of ``number`` runs (the median is compared).

    A model that cannot be exported is run unscheduled (``model`` itself) with a warning.
    """
    start = time.perf_counter()
    phases: dict[str, float] = {}
    try:
        backend, baseline, plan, rows, structure = _select(inputs, model, "capturer", schedulers, mode, schedule,
                                                        tolerance, repeat, number, timer, phases, merge)
    except OpBenchError as err:
        if str(err).startswith("torch.export failed"):
            log.warning("%s (and torch.fx could not trace it either); running the model unscheduled", err)
            return model
        if "returns no tensor" in str(err):
            log.warning("%s; running the model unscheduled", err)
            return model
        raise
    table = table_rows(rows)
    result: Any
    if rows[0]["kept"] and rows[0]["plan"] is None:
        result = baseline
        result.schedule = None
    else:
        result = CapturedSchedule(backend, plan, table, structure)
    result.table = table
    result.trace = backend.trace
    result.phases = phases
    result.build_s = time.perf_counter() - start
    return result


def _build_tvm_backend(mod: Any, target: Any, inputs: Sequence[Any], resources: bool, database: Any) -> TVMBackend:
    from .ir import extract_operators
    from .runtime import OperatorKernels, build_module

    lowered, graph = extract_operators(mod, target)
    kernels = OperatorKernels(graph, build_module(lowered, target, database))
    res = None
    if resources and kernels.device.dlpack_device_type() == 2:
        from .profile.cuda import CudaProfiler

        res = CudaProfiler().resources(kernels)
    return TVMBackend(kernels, inputs, res)


def _conv_operators(bindings: Sequence[Any], graph: Any, check: bool = True) -> list[int]:
    """For each ``conv2d`` binding of ``bindings`` (in program order), the index of the extracted
    operator of ``graph`` that computes it (``check``: its weight's shape agrees)."""
    ops = [n.index for n in graph if "nn.conv2d" in n.ops]
    agree = len(ops) == len(bindings) and (not check or all(
        tuple(b.value.args[1].value.shape) in [tuple(x) for x in graph[op].input_shapes]
        for b, op in zip(bindings, ops, strict=True)))
    if not agree:
        raise OpBenchError("--merge ios: the model's convolutions do not map one to one onto its lowered "
                           "convolution kernels (use --merge all)")
    return ops


def tvm_ios_merges(mod: Any, func_name: str, plain: TVMBackend, merged: TVMBackend,
                   latencies: Sequence[float] | None = None, repeat: int = 10, number: int = 20,
                   time_limit_s: float = 60.0) -> list[int]:
    """The sibling groups (positions in :func:`opbench.ir.merge.sibling_groups`) that IOS's dynamic
    programme merges, for TVM kernels.

    ``plain`` and ``merged`` are ``mod``'s kernels without and with every group merged. Each
    group's merged kernel is timed alone in ``merged``; the DP runs on ``plain``'s operators
    (``latencies``, or timed alone) and may run a stage of exactly one whole group as that kernel.
    """
    func = mod[func_name]
    groups = sibling_groups(func)
    if not groups:
        return []
    convs = conv_bindings(func)
    later = [b for g in groups for b in g[1:]]
    kept = [b for b in convs if not any(b.var.same_as(s.var) for s in later)]  # the merged module's convolutions

    def position(b: Any, among: list[Any]) -> int:
        return next(k for k, c in enumerate(among) if c.var.same_as(b.var))

    plain_ops = _conv_operators(convs, plain.graph)
    merged_ops = _conv_operators(kept, merged.graph, check=False)  # a group's kernel holds all its weights
    members = {tuple(sorted(plain_ops[position(b, convs)] for b in g)): i for i, g in enumerate(groups)}
    kernel = {i: merged_ops[position(g[0], kept)] for i, g in enumerate(groups)}
    timed: dict[int, float] = {}

    def cost(ops: Sequence[int]) -> float | None:
        i = members.get(tuple(sorted(ops)))
        if i is None:
            return None
        if i not in timed:
            timed[i] = median(time_ops(merged, [kernel[i]], max(3, repeat // 2), number))
        return timed[i]

    chosen = _ios_merged_stages(plain, cost, latencies, repeat, number, time_limit_s)
    return sorted(members[tuple(sorted(ops))] for ops in chosen)


def tvm_backend(workload: Any, target: Any, inputs: Sequence[Any] | None = None,
                resources: bool = True, database: Any = None, merge: bool | str = False,
                repeat: int = 10, number: int = 20) -> TVMBackend:
    """Extract, compile and wrap a workload's TVM kernels as a backend (tuned ones from ``database``,
    a MetaSchedule database, where it has them). ``merge`` (:data:`MERGE_MODES`) applies IOS's merge
    to the Relax module first (:mod:`opbench.ir.merge`): ``True`` or ``"all"`` every group of sibling
    convolutions, ``"ios"`` the groups :func:`tvm_ios_merges` picks (two more builds: every group
    merged, to time the merged kernels, then the chosen ones)."""
    from .ir.extract import entry_function

    mode = merge_mode(merge)
    inputs = inputs if inputs is not None else workload.example_inputs()
    mod = workload.mod
    if mode == "none":
        return _build_tvm_backend(mod, target, inputs, resources, database)
    entry = entry_function(mod)
    groups = len(sibling_groups(mod[entry]))
    merged_mod, _ = merge_sibling_convs(mod, entry)
    if mode == "all" or not groups:
        log.info("merge: %d group(s) of sibling convolutions merged", groups)
        return _build_tvm_backend(merged_mod, target, inputs, resources, database)
    plain = _build_tvm_backend(mod, target, inputs, resources, database)
    merged = _build_tvm_backend(merged_mod, target, inputs, resources, database)
    chosen = tvm_ios_merges(mod, entry, plain, merged, repeat=repeat, number=number)
    log.info("merge: IOS merges %d of %d group(s) of sibling convolutions: %s", len(chosen), groups,
             ", ".join(str(i) for i in chosen) or "none")
    if not chosen:
        return plain
    if len(chosen) == groups:
        return merged
    return _build_tvm_backend(merge_sibling_convs(mod, entry, chosen)[0], target, inputs, resources, database)
