"""The profiler interface: where and how operators and whole models are timed.

One implementation per place of measurement:

* :class:`LocalProfiler` (this module): TVM's ``time_evaluator`` on this machine (CPU targets).
* :class:`~opbench.profile.cuda.CudaProfiler`: CUDA Graphs timed with CUDA events, kernel
  resources, L2 flush, co-runs on several streams (GPU targets on this machine).
* :class:`~opbench.profile.rpc.RPCProfiler`: TVM's RPC tracker and servers (builds stay here,
  kernels and the Relax VM run on a remote device).

The collection job (:mod:`opbench.pipeline.collect`) only talks to this interface.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from ..errors import OpBenchError
from ..registry import Registry
from .timer import Timing, TimingConfig, time_evaluator

#: the kinds :meth:`Profiler.create` makes
ProfilerKind = Literal["local", "cuda", "rpc"]


class Profiler:
    """Times operators and whole models; the base class times locally with ``time_evaluator``.

    Attributes
    ----------
    name:
        Short name, used in messages.
    corun_k, corun_limit:
        Largest co-run group and how many groups to measure (0: no co-runs).
    """

    name = "local"
    corun_k = 0
    corun_limit = 0

    @staticmethod
    def create(kind: ProfilerKind, **options: Any) -> Profiler:
        """A profiler by name, as MetaSchedule's ``Runner.create`` makes a runner: ``local``
        (``time_evaluator`` on this machine), ``cuda`` (CUDA Graphs and events on this machine's GPU;
        ``corun_k``, ``corun_limit``) or ``rpc`` (remote devices; ``spec``, an
        :class:`~opbench.profile.rpc.RPCSpec`, and ``target``)."""
        return PROFILER_KINDS.create(kind, **options)

    def place(self, built: Any) -> Any:
        """The compiled model where it is measured (here: ``built`` itself)."""
        return built

    def release(self) -> None:
        """Called when a collection is done with the device."""

    def device(self, target: Any) -> dict[str, Any] | None:
        """The measuring device's fingerprint when it is not this machine's (see
        :func:`opbench.profile.env.device_fingerprint`), else None."""
        return None

    def tags(self) -> dict[str, Any]:
        """Environment tags at the start of a run (columns of the dataset's environment tags)."""
        return {}

    def run_facts(self) -> dict[str, Any]:
        """Facts of the measuring device kept with the run (the ``runs`` table's ``env``), not in every row:
        on a GPU its peak figures, which the report's roofline draws."""
        return {}

    def end_tags(self) -> dict[str, Any]:
        """Environment tags at the end of a run."""
        return {}

    def resources(self, kernels: Any) -> dict[int, dict[str, Any]]:
        """Kernel resources by operator index (none known here)."""
        return {}

    def time(self, kernels: Any, index: int, args: Sequence[Any], outs: Sequence[Any],
             config: TimingConfig) -> Timing:
        """Time operator ``index`` called with ``args`` and ``outs``."""
        built = kernels.built
        return time_evaluator(built.library, kernels.graph[index].func, built.device, [*args, *outs], config)

    def time_model(self, built: Any, inputs: Sequence[Any], config: TimingConfig) -> Timing:
        """Time the whole model in the Relax VM."""
        return time_evaluator(built.vm(), "main", built.device, inputs, config)

    def corun(self, kernels: Any, group: Sequence[int], inputs: Sequence[Any], values: dict[int, list[Any]],
              config: TimingConfig) -> dict[str, Any]:
        """Measure a co-run group (only the CUDA profiler can)."""
        raise OpBenchError(f"co-runs need the CUDA profiler on this machine, not '{self.name}'")


class LocalProfiler(Profiler):
    """TVM's ``time_evaluator`` on this machine (the default on CPU targets)."""


def _cuda(**options: Any) -> Profiler:
    from .cuda import CudaProfiler

    return CudaProfiler(**options)


def _rpc(**options: Any) -> Profiler:
    from .rpc import RPCProfiler

    return RPCProfiler(**options)


#: the timing back ends by name (:meth:`Profiler.create`)
PROFILER_KINDS: Registry[Profiler] = Registry("profiler")
for _kind, _factory in (("local", LocalProfiler), ("cuda", _cuda), ("rpc", _rpc)):
    PROFILER_KINDS.register(_kind, _factory)

__all__ = ["PROFILER_KINDS", "LocalProfiler", "Profiler"]
