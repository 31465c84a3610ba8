"""The operator costs both the compare job and the compile step use: every operator's time alone, and the
schedulers' cost model over those times (a module of its own, so that neither job imports the other)."""

from __future__ import annotations

from collections.abc import Sequence

from ..profile.schedule import alone_times
from ..runtime.backend import KernelBackend
from ..schedule import SchedulingCost


def scheduling_cost(backend: KernelBackend, latencies: Sequence[float] | None) -> SchedulingCost:
    """The schedulers' cost for ``backend``: ``latencies``, its kernel resources, its device's figures
    (on the CPU: every operator fills one core, every extra thread costs 0.1 ms)."""
    if not backend.is_cuda:  # threads on cores: an untuned kernel fills one core; a thread costs ~0.1 ms
        import os

        cores = max(1, os.cpu_count() or 1)
        return SchedulingCost(backend.graph, latencies, backend.resources, demand=1.0 / cores, fork_s=1e-4)
    from ..profile.cuda import device_figures

    return SchedulingCost.for_device(backend.graph, latencies, backend.resources, device_figures())


def operator_latencies(backend: KernelBackend, repeat: int = 10, number: int = 20) -> list[float]:
    """Seconds per operator, each run alone (median; its own CUDA Graph on the GPU)."""
    return alone_times(backend, repeat, number)


__all__ = ["operator_latencies", "scheduling_cost"]
