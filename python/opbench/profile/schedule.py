"""Timing of scheduled runs: the default timer, chains of operators, every operator in one graph, stages.

On the GPU everything is a CUDA Graph (:func:`opbench.runtime.graphs.capture_graph`) timed with
CUDA events around ``number`` back-to-back replays, ``repeat`` times (the median is what callers
keep). On the CPU the host clock times the same calls.

:func:`operator_times` measures every operator of a backend in ONE capture: the operators run one
after another on one stream with a timing event between each two, and operator ``i``'s time is
the elapsed time between its events less what an empty pair of events takes, the median over
replays (:func:`stage_times` does the same for stages). That is each operator as it runs
in the sequential model (inputs fresh from its producer), for the price of one capture, where
timing operators alone takes one capture each (:func:`alone_times`).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

from ..runtime.backend import KernelBackend
from ..runtime.graphs import capture_graph, fork_join
from .timer import cuda_event_samples, wall_samples


def median(samples: Sequence[float]) -> float:
    return statistics.median(samples)


#: ``timer(label, run)`` -> seconds per call of ``run``, samples (``label`` names the row)
Timer = Callable[[str, Callable[[], Any]], list[float]]


def default_timer(is_cuda: bool, repeat: int, number: int) -> Timer:
    """CUDA events around ``number`` back-to-back calls on the GPU; on the CPU the host clock, a
    tenth as many calls per sample (CPU runs are slow)."""
    if is_cuda:
        return lambda label, run: cuda_event_samples(run, repeat, number)
    return lambda label, run: wall_samples(run, repeat, max(1, number // 10), warmup=1)


def time_ops(backend: KernelBackend, ops: Sequence[int], repeat: int = 10, number: int = 20) -> list[float]:
    """Seconds per run of ``ops`` launched one after another on one stream (nothing else).

    On the GPU the launches are captured in their own CUDA Graph; the other operators' buffers
    keep whatever they hold, which does not change a kernel's time. Operators that launch no
    kernel (views) take no time.
    """
    launch_all = _serially(backend, [list(ops)])
    if not backend.is_cuda:
        return wall_samples(launch_all, repeat, max(1, number // 10))
    return graph_samples(lambda stream: _launch_stage(backend, stream, [], [list(ops)]), repeat, number)


def graph_samples(launch: Callable[[Any], Any], repeat: int, number: int, warmup: int = 3) -> list[float]:
    """Seconds per replay of ``launch`` captured alone in a CUDA Graph: ``repeat`` samples of
    ``number`` replays each; zeros for a capture that recorded no work."""
    graph = capture_graph(launch)
    if graph.empty:
        return [0.0] * repeat
    return cuda_event_samples(graph.replay, repeat, number, warmup=warmup)


def alone_times(backend: KernelBackend, repeat: int = 10, number: int = 20) -> list[float]:
    """Seconds per operator, each run alone (median; its own CUDA Graph on the GPU)."""
    return [median(time_ops(backend, [op], repeat, number)) for op in range(len(backend.graph))]


def operator_times(backend: KernelBackend, repeat: int = 10) -> list[float]:
    """Seconds per operator inside one sequential run, from timing events captured between them
    (:func:`stage_times` with one operator per stage). On the CPU this is :func:`alone_times`."""
    if not backend.is_cuda:
        return alone_times(backend, repeat)
    return stage_times(backend, [[[op]] for op in range(len(backend.graph))], repeat)


def schedule_stages(schedule: Any) -> list[list[list[int]]]:
    """A schedule's stages (IOS style: stage -> groups -> operators); one operator per stage for a
    one-stream schedule and for a schedule without stages (Nimble, Opara)."""
    if schedule.stages and schedule.num_streams > 1:
        return schedule.stages
    return [[[op]] for op in schedule.order]


def _serially(backend: KernelBackend, stage: Sequence[Sequence[int]]) -> Callable[[], None]:
    """A CPU run of a stage: its groups one after another on this thread."""
    def run() -> None:
        for group in stage:
            for op in group:
                backend.launch(op)
    return run


def _launch_stage(backend: KernelBackend, origin: Any, streams: list[Any], stage: Sequence[Sequence[int]]) -> None:
    """One stage from stream ``origin``: a single group on ``origin`` itself, several forked onto one
    stream each and joined back (a barrier)."""
    if len(stage) == 1:
        with backend.on_stream(origin):
            for op in stage[0]:
                backend.launch(op)
        return

    def body() -> None:
        for group, stream in zip(stage, streams, strict=False):
            with backend.on_stream(stream):
                for op in group:
                    backend.launch(op)

    fork_join(origin, streams[:len(stage)], body)


def stage_times(backend: KernelBackend, stages: Sequence[Sequence[Sequence[int]]],
                repeat: int = 10) -> list[float]:
    """Seconds of each stage when the stages run one after another with a barrier between them.

    On the GPU the whole run is one CUDA Graph with a timing event at every stage boundary (on the
    stream all groups join back into); a stage's time is the median over replays of the interval
    between its boundaries, less what a pair of events takes with nothing between them (measured in
    the same graph). On the CPU every stage is timed on the host clock, its groups one after
    another (a stage's own work, without thread overhead).
    """
    if not backend.is_cuda:
        return [median(wall_samples(_serially(backend, stage), repeat, 1, warmup=1)) for stage in stages]
    import torch

    streams = [torch.cuda.Stream() for _ in range(max((len(s) for s in stages), default=1))]
    events: list[Any] = []
    probes = 4  # empty stages first: the interval a pair of events adds with nothing between

    def launch_all(origin: Any) -> None:
        events.clear()
        for stage in [None] * (probes + 1) + list(stages):
            if stage is not None:
                _launch_stage(backend, origin, streams, stage)
            event = torch.cuda.Event(enable_timing=True, external=True)
            event.record(origin)
            events.append(event)

    graph = capture_graph(launch_all)
    graph.replay()
    samples = []
    for _ in range(max(3, repeat)):
        graph.replay()
        torch.cuda.synchronize()
        samples.append([events[i].elapsed_time(events[i + 1]) / 1e3 for i in range(len(events) - 1)])
    columns = [median(column) for column in zip(*samples, strict=True)]
    overhead = median(columns[:probes])
    return [max(0.0, t - overhead) for t in columns[probes:]]


def stage_table(backend: KernelBackend, schedule: Any, repeat: int = 10) -> list[dict[str, Any]]:
    """Each stage of ``schedule`` with its groups, strategy and measured latency (:func:`stage_times`)."""
    stages = schedule_stages(schedule)
    times = stage_times(backend, stages, repeat)
    graph = backend.graph
    def strategy(stage: Sequence[Sequence[int]]) -> str:
        if len(stage) > 1:
            return "concurrent"
        return "merge" if len(stage[0]) == 1 and graph[stage[0][0]].attrs.get("merged") else "sequential"

    return [{"stage": i, "strategy": strategy(stage),
             "groups": [list(g) for g in stage],
             "operators": [[graph[op].kind for op in g] for g in stage], "latency_ms": t * 1e3}
            for i, (stage, t) in enumerate(zip(stages, times, strict=True))]


def measured_stage_cost(backend: KernelBackend, repeat: int = 5, number: int = 10) -> Any:
    """A stage cost for IOS that measures every stage it is asked about (memoised by its groups).

    Each stage is captured alone (its groups forked onto streams on the GPU) and timed; on the CPU
    its operators run one after another on the host clock.
    """
    memo: dict[tuple[tuple[int, ...], ...], float] = {}
    streams: list[Any] = []

    def cost(groups: Sequence[Sequence[int]]) -> float:
        key = tuple(sorted(tuple(g) for g in groups))
        if key in memo:
            return memo[key]
        if not backend.is_cuda:
            memo[key] = median(wall_samples(_serially(backend, key), repeat, 1))
            return memo[key]
        import torch

        while len(streams) < len(key):
            streams.append(torch.cuda.Stream())
        memo[key] = median(graph_samples(lambda origin: _launch_stage(backend, origin, streams, key), repeat, number,
                                         warmup=1))
        return memo[key]

    cost.memo = memo  # type: ignore[attr-defined]
    return cost


def merge_cost(backend: KernelBackend, repeat: int = 5, number: int = 10) -> Callable[[Sequence[int]], float | None]:
    """IOS's merge cost: ``cost(ops)`` is the measured time of operators ``ops`` run as one merged
    operator (memoised), None where they cannot merge (or the backend cannot merge at all).

    The merged operator is built by the backend (``merged_launcher``, e.g. one convolution on the
    siblings' concatenated weights) and timed alone like any operator: its own CUDA Graph on the
    GPU, the host clock on the CPU.
    """
    groups = [set(g) for g in getattr(backend, "merge_groups", list)()]
    memo: dict[tuple[int, ...], float | None] = {}

    def cost(ops: Sequence[int]) -> float | None:
        key = tuple(sorted(ops))
        if key in memo:
            return memo[key]
        if len(key) < 2 or not any(set(key) <= g for g in groups):
            memo[key] = None
            return None
        run = backend.merged_launcher(key)
        if backend.is_cuda:
            memo[key] = median(graph_samples(lambda origin: run(), repeat, number, warmup=1))
        else:
            memo[key] = median(wall_samples(run, repeat, 1, warmup=1))
        return memo[key]

    cost.memo = memo  # type: ignore[attr-defined]
    return cost
