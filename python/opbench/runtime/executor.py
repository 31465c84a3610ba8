"""The parallel graph executor: run any valid schedule on CUDA streams, captured in a CUDA Graph.

Capture follows docs/architecture.md ("Parallel execution"): every buffer exists before capture (static inputs and
outputs); the capture stream records a fork event that every worker stream waits on; operators
are launched in the schedule's global order, each on its stream, waiting on the events of its
cross-stream producers; finally the capture stream waits on an event from every worker (join).
Replays then copy new inputs into the static inputs. On the CPU (llvm) each stream is a thread
and events are ``threading.Event``.
"""

from __future__ import annotations

import statistics
import threading
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from ..schedule import Schedule
from .backend import KernelBackend


class ParallelExecutor:
    """Runs one schedule of one backend; :meth:`capture` once, then :meth:`run` or :meth:`replay`."""

    def __init__(self, backend: KernelBackend, schedule: Schedule) -> None:
        self.backend = backend
        self.schedule = schedule.validate(backend.graph)
        self.cuda_graph: Any = None
        self._waits: dict[int, list[int]] = defaultdict(list)
        for u, v in schedule.events:
            self._waits[v].append(u)
        self._records = {u for u, _ in schedule.events}

    # GPU -------------------------------------------------------------------------------------
    def _launch_all(self, streams: list[Any]) -> None:
        import torch

        done: dict[int, Any] = {}
        for op in self.schedule.order:
            stream = streams[self.schedule.stream_of[op]]
            for u in self._waits[op]:
                stream.wait_event(done[u])
            with self.backend.on_stream(stream):
                self.backend.launch(op)
            if op in self._records:
                event = torch.cuda.Event()
                event.record(stream)
                done[op] = event

    def capture(self) -> ParallelExecutor:
        """Warm up once on the streams, then capture the whole schedule in a CUDA Graph."""
        import torch

        used = sorted(set(self.schedule.stream_of))
        streams = [torch.cuda.Stream() for _ in range(max(used, default=0) + 1)]
        origin = torch.cuda.current_stream()
        for s in streams:
            s.wait_stream(origin)
        self._launch_all(streams)  # warm-up: lazy kernel loading, cuDNN heuristics
        for s in streams:
            origin.wait_stream(s)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            capture_stream = torch.cuda.current_stream()
            fork = torch.cuda.Event()
            fork.record(capture_stream)
            for s in used:
                streams[s].wait_event(fork)
            self._launch_all(streams)
            for s in used:
                join = torch.cuda.Event()
                join.record(streams[s])
                capture_stream.wait_event(join)
        torch.cuda.synchronize()
        self.cuda_graph = graph
        return self

    def replay(self) -> None:
        self.cuda_graph.replay()

    # CPU -------------------------------------------------------------------------------------
    def _run_threads(self) -> None:
        done = {op: threading.Event() for op in self._records}
        errors: list[BaseException] = []

        def worker(ops: list[int]) -> None:
            try:
                for op in ops:
                    for u in self._waits[op]:
                        done[u].wait()
                    self.backend.launch(op)
                    if op in done:
                        done[op].set()
            except BaseException as err:  # surface in the caller
                errors.append(err)
                for event in done.values():
                    event.set()

        threads = [threading.Thread(target=worker, args=(ops,)) for ops in self.schedule.stream_ops() if ops]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]

    def run(self, inputs: Sequence[Any] | None = None) -> list[Any]:
        """Run once (replaying the CUDA Graph on the GPU) and return the outputs."""
        if inputs is not None:
            self.backend.set_inputs(inputs)
        if self.backend.is_cuda:
            if self.cuda_graph is None:
                self.capture()
            self.cuda_graph.replay()
        elif len(set(self.schedule.stream_of)) == 1:
            for op in self.schedule.order:
                self.backend.launch(op)
        else:
            self._run_threads()
        return self.backend.outputs()

    def time(self, repeat: int = 10, number: int = 20) -> list[float]:
        """Seconds per run: ``repeat`` samples of ``number`` back-to-back runs (CUDA events on GPU)."""
        from ..profile.timer import cuda_event_samples, wall_samples

        if not self.backend.is_cuda:  # CPU runs are slow: a tenth as many per sample
            return wall_samples(self.run, repeat, max(1, number // 10), warmup=1)
        if self.cuda_graph is None:
            self.capture()
        return cuda_event_samples(self.cuda_graph.replay, repeat, number)


def median(samples: Sequence[float]) -> float:
    return statistics.median(samples)


def time_ops(backend: KernelBackend, ops: Sequence[int], repeat: int = 10, number: int = 20) -> list[float]:
    """Seconds per run of ``ops`` launched one after another on one stream (nothing else).

    On the GPU the launches are captured in their own CUDA Graph and timed with CUDA events; the
    other operators' buffers keep whatever they hold, which does not change a kernel's time.
    """
    from ..profile.timer import cuda_event_samples, wall_samples

    ops = list(ops)

    def launch_all() -> None:
        for op in ops:
            backend.launch(op)

    if not backend.is_cuda:
        return wall_samples(launch_all, repeat, max(1, number // 10))
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with backend.on_stream(stream):  # warm-up outside the capture
        launch_all()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), backend.on_stream(torch.cuda.current_stream()):
        launch_all()
    return cuda_event_samples(graph.replay, repeat, number)
