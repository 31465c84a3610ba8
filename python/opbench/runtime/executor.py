"""The parallel graph executor: run any valid schedule on CUDA streams, captured in a CUDA Graph.

Capture follows docs/architecture.md ("Parallel execution"), through :mod:`.graphs`: every buffer
exists before capture (static inputs and outputs); the capture stream forks onto the worker
streams; operators are launched in the schedule's global order, each on its stream, waiting on the
events of its cross-stream producers; the workers join back into the capture stream. Replays then
copy new inputs into the static inputs. On the CPU (llvm) each stream is a thread and events are
``threading.Event``. Timing a run lives in :mod:`opbench.profile.schedule`.

A schedule with an SM partition (``Schedule.sm_groups``) launches each confined stream's operators
on a green-context stream of its group (:mod:`.green`); one refused by the GPU (more SMs than it has,
sizes it cannot split) is an error, and where green contexts are missing (no ``cuda-bindings``, an
older driver, the CPU) the schedule runs unpartitioned after one INFO line.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from ..schedule import Schedule
from . import green
from .backend import KernelBackend
from .graphs import CapturedGraph, capture_graph, fork_join

#: ``around(op, stream)``: a context an operator's launch runs in (``stream``: a CUDA stream, or the number of
#: the stream whose thread runs it on the CPU)
Around = Callable[[int, Any], AbstractContextManager[Any]]


class ParallelExecutor:
    """Runs one schedule of one backend; :meth:`capture` once, then :meth:`run` or :meth:`replay`."""

    def __init__(self, backend: KernelBackend, schedule: Schedule, priorities: dict[int, int] | None = None) -> None:
        """``priorities``: CUDA stream priority by stream number (lower is more urgent; default 0)."""
        self.backend = backend
        self.priorities = priorities or {}
        self.schedule = schedule.validate(backend.graph)
        self.cuda_graph: CapturedGraph | None = None
        self._captured: tuple[CapturedGraph, list[Any]] | None = None  # a capture of :meth:`capture`, its outputs
        self._streams: list[Any] = []
        self._waits: dict[int, list[int]] = defaultdict(list)
        for u, v in schedule.events:
            self._waits[v].append(u)
        self._records = {u for u, _ in schedule.events}
        self._partitions: green.SmPartitions | None = None
        if self.schedule.partitioned and backend.is_cuda and green.available():
            shape = green.layout()
            import torch

            self.schedule.check_sm(shape["partitionable"], shape["granularity"],
                                   f"{torch.cuda.get_device_name()} ({shape['sm_count']} SMs)")
            self._partitions = green.partitions(self.schedule.sm_groups)
        elif self.schedule.partitioned and not backend.is_cuda:
            green.say_off("SM partitions are off on the CPU: its streams are threads")

    # GPU -------------------------------------------------------------------------------------
    def launch_all(self, origin: Any, around: Around | None = None) -> None:
        """Launch the schedule from stream ``origin``: forked onto the worker streams, in the global
        order, each operator waiting on the events of its cross-stream producers, joined back.
        ``around(op, stream)``: a context each operator's launch runs in (a trace's timing marks, NVTX)."""
        import torch

        if not self._streams:
            used = max(self.schedule.stream_of, default=0) + 1
            self._streams = [self._stream(i) for i in range(used)]
        used_streams = [self._streams[s] for s in sorted(set(self.schedule.stream_of))]

        def body() -> None:
            done: dict[int, Any] = {}
            for op in self.schedule.order:
                stream = self._streams[self.schedule.stream_of[op]]
                for u in self._waits[op]:
                    stream.wait_event(done[u])
                with self.backend.on_stream(stream), around(op, stream) if around else nullcontext():
                    self.backend.launch(op)
                if op in self._records:
                    event = torch.cuda.Event()
                    event.record(stream)
                    done[op] = event

        fork_join(origin, used_streams, body)

    def _stream(self, index: int) -> Any:
        """Stream ``index``: its SM group's green stream when the schedule confines it, else a new stream."""
        import torch

        priority = self.priorities.get(index, 0)
        group = self.schedule.sm_group_of[index] if self._partitions is not None else None
        if group is None:
            return torch.cuda.Stream(priority=priority)
        rank = sum(1 for s in range(index) if self.schedule.sm_group_of[s] == group)
        return self._partitions.stream(group, rank, priority)

    def capture(self, keep: bool = False) -> ParallelExecutor:
        """Warm up once on the streams, then capture the whole schedule in a CUDA Graph, which later runs
        replay (a capture binds the operators' outputs to its own memory; ``keep``: as in
        :func:`~opbench.runtime.graphs.capture_graph`, for :meth:`CapturedGraph.dump`). The capture's outputs
        are kept with it, so that :meth:`run` returns this capture's even after another executor of the same
        backend captured the schedule again (its launches leave the backend's values in their own memory)."""
        self.cuda_graph = capture_graph(self.launch_all, keep=keep)
        self._captured = (self.cuda_graph, list(self.backend.outputs()))
        return self

    def replay(self) -> None:
        self.cuda_graph.replay()

    # CPU -------------------------------------------------------------------------------------
    def _run_threads(self, around: Around | None = None) -> None:
        """Each stream's operators on a thread of its own (``around``: as in :meth:`launch_all`, with the
        stream's number)."""
        done = {op: threading.Event() for op in self._records}
        errors: list[BaseException] = []

        def worker(ops: list[int]) -> None:
            try:
                for op in ops:
                    for u in self._waits[op]:
                        done[u].wait()
                    with around(op, self.schedule.stream_of[op]) if around else nullcontext():
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

    def run(self, inputs: Sequence[Any] | None = None, around: Around | None = None) -> list[Any]:
        """Run once (replaying the CUDA Graph on the GPU) and return the outputs (``around``: on the CPU,
        a context each operator runs in, as in :meth:`launch_all`)."""
        if inputs is not None:
            self.backend.set_inputs(inputs)
        if self.backend.is_cuda:
            if self.cuda_graph is None:
                self.capture()
            self.cuda_graph.replay()
            if self._captured is not None and self._captured[0] is self.cuda_graph:
                return list(self._captured[1])
        elif len(set(self.schedule.stream_of)) == 1:
            for op in self.schedule.order:
                with around(op, self.schedule.stream_of[op]) if around else nullcontext():
                    self.backend.launch(op)
        else:
            self._run_threads(around)
        return self.backend.outputs()
