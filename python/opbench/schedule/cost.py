"""Scheduling cost: operator latency, GPU demand, resource key, stage latency, schedule latency.

This is the schedulers' cost model (not MetaSchedule's, which ranks kernel candidates).
Latencies come from measurement where given (seconds per operator), else from a roofline estimate
with the device's peak rates. The device's figures (SM count, threads per SM, peak FLOP/s and
bandwidth) come from the GPU in use where it is known (:meth:`SchedulingCost.for_device` with
``opbench.profile.cuda.device_figures()``), else from an H100-class default.
An operator's demand is the fraction of the GPU it fills: its thread blocks over what all SMs hold
at its occupancy (from kernel resources), else its output elements over the GPU's thread slots.
A stage of concurrent groups lasts at least its longest group and at least the demand-weighted sum
of its operators (the GPU cannot run more than full), plus a small fork/join cost per extra group.

A whole schedule's latency (:meth:`SchedulingCost.predict`) is a fluid simulation: each stream
runs its operators in order, an operator starts once its stream is free and its cross-stream
producers have finished, and operators running together share the GPU: while their demands add
up to more than one, each progresses at ``1 / sum(demands)`` of its alone speed. A schedule with an
SM partition confines a stream's operators to a share ``c`` of the GPU (its group's SMs over all):
an operator of demand ``d > c`` runs ``d / c`` times slower alone and fills only ``c``; operators of
one group share its SMs, and operators on the whole GPU spread over every SM, partitions included.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

#: device figures assumed when the GPU in use is unknown (an H100 SXM: fp32 without tensor cores, and
#: dense float16/bfloat16 on tensor cores)
DEFAULT_DEVICE = {"sm_count": 132, "threads_per_sm": 2048, "peak_flops": 67e12, "bandwidth": 3.35e12,
                  "peak_flops_half": 989e12}
#: the dtypes that run at ``peak_flops_half``
HALF_DTYPES = ("float16", "bfloat16")


class SchedulingCost:
    """Scheduling costs of the operators of one graph.

    Parameters
    ----------
    graph:
        The operator graph (``OpGraph`` or anything with ``preds``/``succs`` and nodes with
        ``flops``, ``bytes`` and ``output_shapes``).
    latencies:
        Measured seconds per operator; without them, a roofline estimate.
    resources:
        Kernel resources by operator index (grid, threads, occupancy, registers, shared memory).
    sm_count, threads_per_sm, peak_flops, bandwidth, peak_flops_half:
        The device's figures (see :data:`DEFAULT_DEVICE` and :meth:`for_device`); ``peak_flops_half``
        is the float16/bfloat16 peak (tensor cores), used for operators of those dtypes.
    launch_s, fork_s:
        Launch overhead per operator (roofline estimate only) and per extra group of a stage.
    demand:
        Every operator's share of the device, when it is known without kernel resources (a CPU
        running single-threaded kernels: one core of all).
    """

    def __init__(self, graph: Any, latencies: Sequence[float] | None = None,
                 resources: dict[int, dict[str, Any]] | None = None, sm_count: int = 132,
                 threads_per_sm: int = 2048, peak_flops: float = 67e12, bandwidth: float = 3.35e12,
                 launch_s: float = 2e-6, fork_s: float = 1.5e-6, ridge: float | None = None,
                 demand: float | None = None, peak_flops_half: float | None = None) -> None:
        self.graph = graph
        self.latencies = list(latencies) if latencies is not None else None
        self.resources = resources or {}
        self.sm_count, self.threads_per_sm = sm_count, threads_per_sm
        self.peak_flops, self.bandwidth = peak_flops, bandwidth
        self.launch_s, self.fork_s = launch_s, fork_s
        self.ridge = ridge if ridge is not None else peak_flops / bandwidth
        self.fixed_demand = demand
        if peak_flops_half is None:  # the default device's tensor cores, or none known for another device
            peak_flops_half = DEFAULT_DEVICE["peak_flops_half"] if peak_flops == DEFAULT_DEVICE["peak_flops"] \
                else peak_flops
        self.peak_flops_half = peak_flops_half

    @classmethod
    def for_device(cls, graph: Any, latencies: Sequence[float] | None = None,
                   resources: dict[int, dict[str, Any]] | None = None,
                   device: dict[str, Any] | None = None, **options: Any) -> SchedulingCost:
        """A cost with a device's figures (see :meth:`figures`)."""
        return cls(graph, latencies, resources, **{**cls.figures(device), **options})

    @staticmethod
    def figures(device: dict[str, Any] | None) -> dict[str, Any]:
        """The device figures to use: ``device``'s keys of :data:`DEFAULT_DEVICE`, the default for
        missing or unknown ones."""
        return {**DEFAULT_DEVICE, **{k: v for k, v in (device or {}).items() if k in DEFAULT_DEVICE and v}}

    def _node(self, i: int) -> Any:
        return self.graph[i]

    def latency(self, i: int) -> float:
        """Seconds operator ``i`` takes alone."""
        if self.latencies is not None:
            return self.latencies[i]
        node = self._node(i)
        return max(node.flops / self.peak(i), node.bytes / self.bandwidth) + self.launch_s

    def peak(self, i: int) -> float:
        """Peak FLOP/s for operator ``i``'s dtype (its first output's): tensor cores for float16 and
        bfloat16, the FP32 peak otherwise."""
        dtypes = getattr(self._node(i), "output_dtypes", None) or ["float32"]
        return self.peak_flops_half if str(dtypes[0]) in HALF_DTYPES else self.peak_flops

    def demand(self, i: int) -> float:
        """The fraction of the GPU operator ``i`` fills (0..1)."""
        if self.fixed_demand is not None:
            return self.fixed_demand
        res = self.resources.get(i) or {}
        grid, threads, occ = res.get("grid"), res.get("threads"), res.get("occupancy")
        if grid and threads and occ:
            first = grid[0] if isinstance(grid[0], list | tuple) else grid
            blocks = math.prod(first)
            per_sm = max(1.0, occ * self.threads_per_sm / threads)
            return min(1.0, blocks / (per_sm * self.sm_count))
        node = self._node(i)
        elems = sum(math.prod(s) for s in node.output_shapes) if node.output_shapes else 1
        return min(1.0, max(elems, 1) / (self.sm_count * self.threads_per_sm))

    def compute_bound(self, i: int) -> bool:
        """True when operator ``i``'s arithmetic intensity is above the device's ridge point."""
        node = self._node(i)
        ridge = self.ridge * self.peak(i) / self.peak_flops
        return node.bytes > 0 and node.flops / node.bytes > ridge

    def resource_key(self, i: int) -> tuple[float, float, float]:
        """Opara's resource demand: shared memory, threads in flight, registers (smallest first)."""
        res = self.resources.get(i) or {}
        if res.get("threads"):
            grid = res.get("grid") or [[1]]
            first = grid[0] if isinstance(grid[0], list | tuple) else grid
            smem = (res.get("static_smem") or 0) + (res.get("dynamic_smem") or 0)
            threads = res["threads"] * math.prod(first)
            return (smem, threads, (res.get("registers") or 0) * threads)
        return (0.0, self.demand(i), 0.0)

    def stage_latency(self, groups: Sequence[Sequence[int]]) -> float:
        """Seconds a stage of concurrent groups takes (each group one stream, in order)."""
        longest = max(sum(self.latency(i) for i in g) for g in groups)
        packed = sum(self.latency(i) * self.demand(i) for g in groups for i in g)
        return max(longest, packed) + self.fork_s * (len(groups) - 1)

    def predict(self, schedule: Any, timeline: list[tuple[int, int, float, float]] | None = None) -> float:
        """Seconds ``schedule`` takes, by the fluid simulation of the module docstring.

        ``timeline``, when given, receives ``(operator, stream, start, end)`` for every operator.
        """
        started: dict[int, float] = {}
        numbers = [s for s, ops in enumerate(schedule.stream_ops()) if ops]
        streams = [list(schedule.stream_ops()[s]) for s in numbers]
        sms_of = getattr(schedule, "sms_of", None)
        share = [min(1.0, sms / self.sm_count) if sms_of and (sms := sms_of(s)) else 1.0 for s in numbers]
        group = [schedule.sm_group_of[s] if share[i] < 1.0 else None for i, s in enumerate(numbers)]
        waits: dict[int, list[int]] = {}
        for u, v in schedule.events:
            waits.setdefault(v, []).append(u)
        head = [0] * len(streams)
        finished: set[int] = set()
        running: dict[int, float] = {}  # operator -> remaining alone-seconds
        running_on: dict[int, int] = {}
        now = 0.0
        while True:
            for s, ops in enumerate(streams):
                if s in running_on.values() or head[s] >= len(ops):
                    continue
                op = ops[head[s]]
                if all(u in finished for u in waits.get(op, ())):
                    running[op] = self.latency(op)
                    running_on[op] = s
                    started[op] = now
            if not running:
                break
            fill = {op: min(self.demand(op), share[running_on[op]]) for op in running}
            load = sum(fill.values())
            rate = {}
            for op in running:
                s = running_on[op]
                alone = min(1.0, share[s] / max(self.demand(op), 1e-9))
                busy = load
                if group[s] is not None:  # its group's SMs: its own group's work over the group's share
                    mates = sum(fill[o] for o in running if group[running_on[o]] == group[s])
                    busy = max(load, mates / share[s])
                rate[op] = alone / max(1.0, busy)
            first = min(running, key=lambda op: running[op] / rate[op])
            step = running[first] / rate[first]
            now += step
            for op in list(running):
                running[op] -= step * rate[op]
                if op == first or running[op] <= 1e-12:
                    del running[op]
                    stream = running_on.pop(op)
                    head[stream] += 1
                    finished.add(op)
                    if timeline is not None:
                        timeline.append((op, numbers[stream], started[op], now))
        return now + self.fork_s * (len(streams) - 1)
