"""Cost model used by schedulers: operator latency, GPU demand, resource key, stage latency.

Latencies come from measurement where given (seconds per operator), else from a roofline estimate.
An operator's demand is the fraction of the GPU it fills: its thread blocks over what all SMs hold
at its occupancy (from kernel resources), else its output elements over the GPU's thread slots.
A stage of concurrent groups lasts at least its longest group and at least the demand-weighted sum
of its operators (the GPU cannot run more than full), plus a small fork/join cost per extra group.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


class CostModel:
    """Scheduling costs of the operators of one graph."""

    def __init__(self, graph: Any, latencies: Sequence[float] | None = None,
                 resources: dict[int, dict[str, Any]] | None = None, sm_count: int = 132,
                 threads_per_sm: int = 2048, peak_flops: float = 50e12, bandwidth: float = 3.5e12,
                 launch_s: float = 2e-6, fork_s: float = 1.5e-6, ridge: float | None = None) -> None:
        self.graph = graph
        self.latencies = list(latencies) if latencies is not None else None
        self.resources = resources or {}
        self.sm_count, self.threads_per_sm = sm_count, threads_per_sm
        self.peak_flops, self.bandwidth = peak_flops, bandwidth
        self.launch_s, self.fork_s = launch_s, fork_s
        self.ridge = ridge if ridge is not None else peak_flops / bandwidth

    def _node(self, i: int) -> Any:
        return self.graph[i]

    def latency(self, i: int) -> float:
        if self.latencies is not None:
            return self.latencies[i]
        node = self._node(i)
        return max(node.flops / self.peak_flops, node.bytes / self.bandwidth) + self.launch_s

    def demand(self, i: int) -> float:
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
        node = self._node(i)
        return node.bytes > 0 and node.flops / node.bytes > self.ridge

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
        longest = max(sum(self.latency(i) for i in g) for g in groups)
        packed = sum(self.latency(i) * self.demand(i) for g in groups for i in g)
        return max(longest, packed) + self.fork_s * (len(groups) - 1)
