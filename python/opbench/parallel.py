"""The Opara-style facade: one call takes a PyTorch model to its fastest captured form.

:func:`capturer` traces the model's operators (``torch.fx`` where it can, else ``torch.export``),
schedules them on CUDA streams, measures the candidates beside the model's own CUDA Graph
(:func:`opbench.pipeline.compare.evaluate`), and returns the fastest, captured: a
:class:`CapturedSchedule`, or the model captured as it is when no schedule beats it.
:func:`optimize` returns the chosen schedule itself (JSON, reusable with ``schedule=``).

The jobs behind it live in :mod:`opbench.pipeline` (``compile``: the kernel backends and IOS's
merge; ``compare``: measuring schedules and keeping the fastest).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .errors import OpBenchError
from .pipeline.compare import evaluate, host_arrays, table_rows
from .pipeline.compile import torch_backend
from .profile.schedule import Timer
from .runtime.backend import KernelBackend, TorchBackend
from .runtime.executor import ParallelExecutor
from .runtime.graphs import CapturedModel
from .schedule import Schedule

__all__ = ["CapturedSchedule", "capturer", "optimize"]
log = logging.getLogger("opbench")


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
    leaves, structure = torch.utils._pytree.tree_flatten(reference)
    if not any(isinstance(v, torch.Tensor) for v in leaves):
        raise OpBenchError(f"{type(model).__name__} returns no tensor ({type(reference).__name__}): nothing to "
                           "schedule")
    plan, rows = evaluate(backend, schedulers, None, host_arrays(leaves), repeat, number, tolerance,
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
