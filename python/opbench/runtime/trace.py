"""Measured timelines of a schedule: every operator's start and end, written as a Chrome trace.

:func:`trace_schedule` replays a schedule with a timing mark around each operator: on the GPU a pair
of CUDA events on the operator's stream, captured with the schedule in its CUDA Graph; on the CPU the
host clock in each stream's thread. The marks perturb what they measure (an event is a small command
on the stream, and it splits kernels that would otherwise launch back to back), so a traced run is
slower than the untraced one (a few microseconds per operator on a GPU: on H100, googlenet's 82 TVM
kernels ran 12-22 % slower, its 197 ATen kernels 2-2.7x); the trace gives both times. Each operator's
start and end are the median over ``repeat`` replays, relative to the replay's start.

:func:`chrome_trace` turns traced runs into the Trace Event Format that ``chrome://tracing``,
Perfetto (ui.perfetto.dev) and ``opbench report --trace`` read: one process per schedule, one
thread (lane) per stream, one complete event per operator with its index, kind, function and shapes.
:func:`nvtx_profile` runs the schedule uncaptured under ``torch.profiler`` with an NVTX range per
operator, so that Nsight Systems (``nsys profile``) shows the project's operator names on the real
streams.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ..schedule import Schedule
from .backend import KernelBackend
from .executor import ParallelExecutor

NOTE = ("measured with a timing mark around each operator (CUDA events on its stream on a GPU, the host clock in "
        "its thread on a CPU); the marks slow the run, by a few microseconds per operator on a GPU, which is "
        "much for a model of short kernels: each schedule's name gives its traced and its unmarked time, and "
        "the order and overlap of operators, not their absolute times, are what a trace shows")


def trace_schedule(backend: KernelBackend, schedule: Schedule, repeat: int = 5) -> dict[str, Any]:
    """Run ``schedule`` ``repeat`` times with a timing mark around each operator.

    Returns ``{"schedule", "streams", "total_us", "spans": [{"op", "stream", "start_us", "dur_us"}]}``
    (medians over the runs, relative to each run's start), spans in launch order.
    """
    executor = ParallelExecutor(backend, schedule)
    runs = _gpu_runs(executor, repeat) if backend.is_cuda else _cpu_runs(executor, repeat)
    spans = []
    for op in schedule.order:
        starts = [r[op][0] for r in runs]
        ends = [r[op][1] for r in runs]
        start = statistics.median(starts)
        spans.append({"op": op, "stream": schedule.stream_of[op], "start_us": start,
                      "dur_us": max(0.0, statistics.median(ends) - start)})
    total = statistics.median(max(end for _, end in r.values()) for r in runs)
    return {"schedule": schedule.name, "streams": len(set(schedule.stream_of)), "total_us": total, "spans": spans}


def _cpu_runs(executor: ParallelExecutor, repeat: int) -> list[dict[int, tuple[float, float]]]:
    marks: dict[int, tuple[int, int]] = {}

    @contextlib.contextmanager
    def mark(op: int, _stream: Any) -> Iterator[None]:
        begin = time.perf_counter_ns()
        yield
        marks[op] = (begin, time.perf_counter_ns())

    executor.run()  # warm-up
    runs = []
    for _ in range(repeat):
        marks.clear()
        origin = time.perf_counter_ns()
        executor.run(around=mark)
        runs.append({op: ((b - origin) / 1e3, (e - origin) / 1e3) for op, (b, e) in marks.items()})
    return runs


def _gpu_runs(executor: ParallelExecutor, repeat: int) -> list[dict[int, tuple[float, float]]]:
    import torch

    from .graphs import capture_graph

    marks: dict[int, tuple[Any, Any]] = {}

    @contextlib.contextmanager
    def mark(op: int, stream: Any) -> Iterator[None]:
        begin, end = (torch.cuda.Event(enable_timing=True, external=True) for _ in range(2))
        begin.record(stream)
        yield
        end.record(stream)
        marks[op] = (begin, end)

    def launch(origin: Any) -> Any:
        marks.clear()
        start = torch.cuda.Event(enable_timing=True, external=True)
        start.record(origin)
        executor.launch_all(origin, around=mark)
        return start

    captured = capture_graph(launch)  # the events of the last launch (the capture) are replayed with the graph
    start = captured.result
    runs = []
    for _ in range(repeat + 1):
        captured.replay()
        torch.cuda.synchronize()
        runs.append({op: (start.elapsed_time(b) * 1e3, start.elapsed_time(e) * 1e3) for op, (b, e) in marks.items()})
    return runs[1:]  # the first replay warms the graph up


def _node_args(node: Any) -> dict[str, Any]:
    def shapes(value: Any) -> str:
        return " ".join("x".join(str(d) for d in s) for s in value or [])

    return {"op_index": node.index, "kind": getattr(node, "kind", "?"), "func": getattr(node, "func", ""),
            "inputs": shapes(getattr(node, "input_shapes", None)),
            "outputs": shapes(getattr(node, "output_shapes", None))}


def traced_label(run: dict[str, Any]) -> str:
    """``"1.292 ms traced, 0.477 ms unmarked"``: a traced run's total and, when known, the same schedule's
    time measured without the marks, so the perturbation can be read off the trace."""
    label = f"{run['total_us'] / 1e3:.3f} ms traced"
    if run.get("unmarked_us"):
        label += f", {run['unmarked_us'] / 1e3:.3f} ms unmarked"
    return label


def chrome_trace(backend: KernelBackend, traced: Sequence[dict[str, Any]], meta: dict[str, Any] | None = None
                 ) -> dict[str, Any]:
    """Traced runs (:func:`trace_schedule`) as one Chrome trace: a process per schedule, a lane per stream."""
    events: list[dict[str, Any]] = []
    lane = "thread" if not backend.is_cuda else "stream"
    for pid, run in enumerate(traced, start=1):
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                       "args": {"name": f"{run['schedule']} ({traced_label(run)})"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
        for stream in sorted({s["stream"] for s in run["spans"]}):
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": stream,
                           "args": {"name": f"{lane} {stream}"}})
        for s in run["spans"]:
            node = backend.graph[s["op"]]
            args = _node_args(node)
            events.append({"ph": "X", "name": f"#{s['op']} {args['kind']}", "cat": args["kind"], "pid": pid,
                           "tid": s["stream"], "ts": round(s["start_us"], 3), "dur": round(s["dur_us"], 3),
                           "args": {**args, "stream": s["stream"]}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"note": NOTE, "backend": backend.name, "device": backend.device_name,
                          "operators": len(backend.graph), **(meta or {}),
                          "schedules": [{k: v for k, v in run.items() if k != "spans"} for run in traced]}}


def write_trace(path: str | Path, trace: dict[str, Any]) -> None:
    """Write a Chrome trace (:func:`chrome_trace`) as JSON."""
    Path(path).write_text(json.dumps(trace) + "\n")


#: the most events a trace may hold for the report (a schedule's trace has a few per operator)
MAX_EVENTS = 200_000


def read_trace(path: str | Path) -> dict[str, Any]:
    """A Chrome trace written by :func:`write_trace`, checked to be one: a JSON object whose ``traceEvents``
    are objects with finite, non-negative times, at most :data:`MAX_EVENTS` of them (a larger trace is
    refused at once, by its size, before it is read)."""
    import math

    from ..errors import OpBenchError
    from ..utils import read_json

    accepted = "accepted: a Chrome trace JSON file written by 'opbench compare --trace'"
    data = read_json(path, f"trace {str(path)!r}")
    events = data.get("traceEvents")
    if not isinstance(events, list):
        raise OpBenchError(f"trace {str(path)!r} has no list of traceEvents ({accepted})")
    if len(events) > MAX_EVENTS:
        raise OpBenchError(f"trace {str(path)!r} has {len(events)} events, more than the {MAX_EVENTS} the report "
                           f"draws ({accepted}, of one model)")
    for i, event in enumerate(events):
        if not isinstance(event, dict):
            raise OpBenchError(f"trace {str(path)!r}: event {i} is a {type(event).__name__}, not an object "
                               f"({accepted})")
        for key in ("ts", "dur"):
            value = event.get(key, 0)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or \
                    value < 0:
                raise OpBenchError(f"trace {str(path)!r}: event {i} has {key} {json.dumps(value)[:20]} (accepted: a "
                                   "finite number of 0 or more microseconds)")
    return data


def nvtx_profile(backend: KernelBackend, schedule: Schedule, path: str | Path | None = None) -> None:
    """Run ``schedule`` once, uncaptured, under ``torch.profiler`` with an NVTX range around each operator
    (``#index kind func``, also a ``record_function`` range) on its stream; with ``path``, the profiler's own
    Chrome trace is exported there.
    Run under ``nsys profile`` to see the ranges on Nsight Systems' timeline."""
    import torch

    @contextlib.contextmanager
    def named(op: int, _stream: Any) -> Iterator[None]:
        node = backend.graph[op]
        name = f"#{op} {getattr(node, 'kind', '?')} {getattr(node, 'func', '')}"[:120]
        torch.cuda.nvtx.range_push(name)  # for Nsight Systems
        try:
            with torch.profiler.record_function(name):  # for torch.profiler's own trace
                yield
        finally:
            torch.cuda.nvtx.range_pop()

    executor = ParallelExecutor(backend, schedule)
    executor.launch_all(torch.cuda.current_stream(), around=named)  # warm-up, outside the profile
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        executor.launch_all(torch.cuda.current_stream(), around=named)
        torch.cuda.synchronize()
    if path is not None:
        prof.export_chrome_trace(str(path))


__all__ = ["NOTE", "chrome_trace", "nvtx_profile", "read_trace", "trace_schedule", "traced_label",
           "write_trace"]
