"""Inter-operator parallelism, end to end: schedule, capture, measure, keep the fastest.

``optimize`` measures every scheduler's schedule side by side with the sequential one and returns
the fastest; a parallel schedule that is not faster than sequential beyond ``tolerance`` is not
kept (users of IOS and Opara report parallel schedules that lose on newer GPUs). ``capturer`` does
this for any torch model and returns a callable that replays the chosen CUDA Graph.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from .runtime.backend import KernelBackend, TorchBackend, TVMBackend
from .runtime.executor import ParallelExecutor, median, time_ops
from .runtime.kernels import relative_error
from .schedule import CostModel, Schedule, get_scheduler

__all__ = ["TVMBackend", "TorchBackend", "capturer", "critical_path", "evaluate", "evaluate_with_bound",
           "operator_latencies", "optimize", "table_rows", "tvm_backend"]

log = logging.getLogger("opbench")
DEFAULT_SCHEDULERS = ("sequential", "greedy", "nimble", "opara", "ios")


def _host(outputs: Sequence[Any]) -> list[np.ndarray]:
    out = []
    for t in outputs:
        if hasattr(t, "detach"):
            out.append(t.detach().float().cpu().numpy())
        elif hasattr(t, "numpy"):
            out.append(t.numpy())
        else:
            out.append(np.asarray(t))
    return out


def table_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The comparison rows without their ``Schedule`` objects (JSON-serialisable)."""
    return [{k: v for k, v in r.items() if k != "plan"} for r in rows]


def evaluate(backend: KernelBackend, schedulers: Sequence[Any] = DEFAULT_SCHEDULERS, cost: CostModel | None = None,
             reference: Sequence[np.ndarray] | None = None, repeat: int = 10, number: int = 20,
             tolerance: float = 0.02) -> tuple[Schedule, list[dict[str, Any]]]:
    """Schedule, capture and time ``backend`` under each scheduler; return the kept schedule and the table.

    The first scheduler must be ``sequential`` (the baseline and the fallback). Without ``cost``,
    the schedulers' cost model uses every operator's measured time (:func:`operator_latencies`) and
    the backend's kernel resources. ``error`` is the
    output's relative error against ``reference`` (default: the sequential outputs); a schedule is
    only kept if its output equals the sequential run of the same kernels (``sched_error`` within
    1e-5): scheduling must not change results, while different kernels (TVM vs cuDNN, TF32) may.
    """
    if cost is None:
        cost = CostModel(backend.graph, operator_latencies(backend, repeat, number), resources=backend.resources)
    rows: list[dict[str, Any]] = []
    sequential_out: list[np.ndarray] | None = None
    for item in schedulers:
        scheduler = get_scheduler(item)
        start = time.perf_counter()
        schedule = scheduler.schedule(backend.graph, cost)
        scheduling_s = time.perf_counter() - start
        executor = ParallelExecutor(backend, schedule)
        outputs = _host(executor.run())
        if sequential_out is None:
            sequential_out = outputs
        if reference is None:
            reference = outputs
        samples = executor.time(repeat, number)
        rows.append({"schedule": scheduler.name, "streams": schedule.num_streams, "events": schedule.num_events,
                     "latency_ms": median(samples) * 1e3, "error": relative_error(outputs, reference),
                     "sched_error": relative_error(outputs, sequential_out),
                     "scheduling_ms": scheduling_s * 1e3, "plan": schedule})
        del executor
    base = rows[0]["latency_ms"]
    for row in rows:
        row["speedup"] = base / row["latency_ms"] if row["latency_ms"] else None
    valid = [r for r in rows if r["sched_error"] <= 1e-5]
    best = min(valid, key=lambda r: r["latency_ms"]) if valid else rows[0]
    if best is not rows[0] and best["latency_ms"] > base * (1 - tolerance):
        log.info("no parallel schedule beats sequential by %.0f%%: keeping sequential", tolerance * 100)
        best = rows[0]
    for row in rows:
        row["kept"] = row is best
    return best["plan"], rows


def operator_latencies(backend: KernelBackend, repeat: int = 10, number: int = 20) -> list[float]:
    """Seconds per operator, each run alone (median; its own CUDA Graph on the GPU)."""
    return [median(time_ops(backend, [op], repeat, number)) for op in range(len(backend.graph))]


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


def evaluate_with_bound(backend: KernelBackend, schedulers: Sequence[Any] = DEFAULT_SCHEDULERS,
                        reference: Sequence[np.ndarray] | None = None, repeat: int = 10, number: int = 20,
                        tolerance: float = 0.02) -> tuple[Schedule, list[dict[str, Any]], dict[str, Any]]:
    """:func:`evaluate` and :func:`critical_path` on one measurement of the operators' times.

    Returns the kept schedule, the table, and the critical path that bounds every row.
    """
    latencies = operator_latencies(backend, repeat, number)
    cost = CostModel(backend.graph, latencies, resources=backend.resources)
    kept, rows = evaluate(backend, schedulers, cost, reference, repeat, number, tolerance)
    return kept, rows, critical_path(backend, repeat, number, latencies)


def format_comparison(rows: Sequence[dict[str, Any]]) -> str:
    """The comparison table: schedule, streams, events, latency, speedup, error."""
    head = f"{'schedule':<12}{'streams':>8}{'events':>8}{'median ms':>11}{'speedup':>9}{'max err':>10}{'sched ms':>10}"
    lines = [head, "-" * len(head)]
    for r in rows:
        mark = " *" if r.get("kept") else ""
        lines.append(f"{r['schedule']:<12}{r['streams']:>8}{r['events']:>8}{r['latency_ms']:>11.4f}"
                     f"{r['speedup']:>9.2f}{r['error']:>10.1e}{r['scheduling_ms']:>10.1f}{mark}")
    return "\n".join(lines)


def optimize(model: Any, inputs: Sequence[Any], schedulers: Sequence[Any] = DEFAULT_SCHEDULERS,
             **options: Any) -> Schedule:
    """The fastest measured schedule of a torch model (ATen kernels); ``schedule.meta['table']`` has
    every scheduler's row."""
    backend = TorchBackend(model, inputs)
    schedule, rows = evaluate(backend, schedulers, **options)
    schedule.meta["table"] = table_rows(rows)
    return schedule


class Runner:
    """A model captured with its chosen schedule: ``runner(*inputs)`` replays it.

    Outputs are the graph's static output tensors, overwritten by the next call.
    """

    def __init__(self, backend: KernelBackend, schedule: Schedule, table: list[dict[str, Any]], single: bool):
        self.backend, self.schedule, self.table, self._single = backend, schedule, table, single
        self.executor = ParallelExecutor(backend, schedule)
        self.executor.run()

    def __call__(self, *inputs: Any) -> Any:
        outputs = self.executor.run(inputs)
        return outputs[0] if self._single else tuple(outputs)


def capturer(inputs: Sequence[Any], model: Any, schedulers: Sequence[Any] = DEFAULT_SCHEDULERS,
             **options: Any) -> Any:
    """Opara-style one call: export ``model``, pick the fastest schedule by measurement, capture it.

    A model that cannot be exported is run unscheduled (``model`` itself) with a warning.
    """
    from .errors import OpBenchError

    inputs = list(inputs)
    try:
        backend = TorchBackend(model, inputs)
    except OpBenchError as err:
        log.warning("%s; running the model unscheduled", err)
        return model
    import torch

    with torch.no_grad():
        reference = model(*inputs)
    single = not isinstance(reference, list | tuple)
    schedule, rows = evaluate(backend, schedulers, reference=_host([reference] if single else reference), **options)
    return Runner(backend, schedule, table_rows(rows), single)


def tvm_backend(workload: Any, target: Any, inputs: Sequence[Any] | None = None,
                resources: bool = True, database: Any = None) -> TVMBackend:
    """Extract, compile and wrap a workload's TVM kernels as a backend (tuned ones from ``database``,
    a MetaSchedule database, where it has them)."""
    from .ir import extract_operators
    from .runtime import OperatorKernels, build_module

    lowered, graph = extract_operators(workload.mod, target)
    kernels = OperatorKernels(graph, build_module(lowered, target, database))
    res = None
    if resources and kernels.device.dlpack_device_type() == 2:
        from .profile.cuda import CudaProfiler

        res = CudaProfiler().resources(kernels)
    return TVMBackend(kernels, inputs if inputs is not None else workload.example_inputs(), res)
