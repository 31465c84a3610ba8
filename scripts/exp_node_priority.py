"""Do CUDA priorities for the critical path's kernels, honoured inside the CUDA Graph, close the fused gap?

``capturer(kernels="fused")`` stays 19-36 % above the critical path of its regions (googlenet, inception_v3,
nasnet, batch 1): the path's regions run 1.3-1.4 times slower beside the other branches than alone
(``scripts/exp_gap.py --backend fused``). An earlier experiment gave the streams of the path a higher CUDA stream
priority and saw no change (``scripts/exp_priority.py``), but it replayed CUDA Graphs, and a graph runs every kernel
at the priority of the stream it is launched into unless it is instantiated with
``cudaGraphInstantiateFlagUseNodePriority``; the priorities captured from the streams are kept in the kernel nodes
and ignored otherwise. This script builds the fused regions (``FusedBackend``), times each region alone, makes the
schedules of greedy (3 and 4 streams), Nimble and Opara, and runs each in four ways:

- ``own``: the executor as the capturer runs it;
- ``own, node priority``: the same capture instantiated with the flag (a control: no priorities were captured);
- ``urgent``: each region of the urgent set launched on a high-priority twin of its stream (the order on each
  stream is kept by events), replayed as PyTorch instantiates it (the priorities ignored, by CUDA's rule above);
- ``urgent, node priority``: the same capture instantiated with the flag.

The urgent set is the critical path (``path``) or every region whose longest way through it is at least S times
the path's (``near-S``, S = 0.9 by default: ``--near``). Every variant's outputs are checked against the sequential
run; all are timed in alternating rounds (medians of CUDA-event samples) beside the critical path run alone as a
chain. Writes ``OUT/exp_node_priority.json`` after every model. Needs ``cuda-bindings``.

    PYTHONUNBUFFERED=1 PYTHONPATH=python python3 scripts/exp_node_priority.py --out out --models googlenet,nasnet
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

from _cli import ROOT, checked_models, experiment_doc, measure_each, model_device_args, timing_args
from bench_fused import relative_err
from exp_launch_order import fused_regions

sys.path.insert(0, str(ROOT / "python"))

#: cudaGraphInstantiateFlagUseNodePriority
USE_NODE_PRIORITY = 8
#: cudaGraphInstantiateFlagAutoFreeOnLaunch, the flag PyTorch's ``CUDAGraph`` instantiates with
AUTO_FREE_ON_LAUNCH = 1
#: cudaGraphInstantiateFlagDeviceLaunch: an executable graph that lives on the device (uploaded before launch)
DEVICE_LAUNCH = 4
#: the schedules this script compares by default (greedy with 3 and 4 streams); :data:`SCHEDULERS` also takes
#: ``sequential`` (one stream)
PRIORITY_SCHEDULERS = ("greedy-3", "greedy-4", "nimble", "opara")
SCHEDULERS = (*PRIORITY_SCHEDULERS, "sequential")


class NodePriorityGraph:
    """A kept CUDA Graph template instantiated again, by default with ``cudaGraphInstantiateFlagUseNodePriority``
    (``flags``: ``cudaGraphInstantiateWithFlags``'s; PyTorch instantiates with :data:`AUTO_FREE_ON_LAUNCH`).
    ``upload``: upload the executable graph to the device at once (``cudaGraphUpload``), which a graph instantiated
    for device launch (:data:`DEVICE_LAUNCH`) needs before its first launch."""

    def __init__(self, graph: Any, flags: int = USE_NODE_PRIORITY, upload: bool = False) -> None:
        import torch
        from cuda.bindings import runtime

        from opbench.runtime.green import _check

        self.graph = graph  # keeps the template alive
        self.exec = _check(runtime.cudaGraphInstantiateWithFlags(graph.raw_cuda_graph(), flags),
                             "cudaGraphInstantiateWithFlags")
        if upload:
            _check(runtime.cudaGraphUpload(self.exec, torch.cuda.current_stream().cuda_stream), "cudaGraphUpload")
            torch.cuda.synchronize()

    def replay(self) -> None:
        import torch
        from cuda.bindings import runtime

        from opbench.runtime.green import _check

        _check(runtime.cudaGraphLaunch(self.exec, torch.cuda.current_stream().cuda_stream), "cudaGraphLaunch")


def schedule_of(label: str, graph: Any, cost: Any) -> Any:
    """The schedule of one of :data:`SCHEDULERS` for ``graph`` under ``cost``."""
    from opbench.schedule import Greedy, Nimble, Opara, Sequential

    scheduler = Greedy(int(label.split("-")[1])) if label.startswith("greedy-") else {
        "nimble": Nimble, "opara": Opara, "sequential": Sequential}[label]()
    return scheduler.schedule(graph, cost)


def sequential_output(backend: Any, cost: Any) -> Any:
    """The first output of ``backend``'s regions run one after another, a copy (what every variant must equal)."""
    from opbench.runtime.executor import ParallelExecutor
    from opbench.schedule import Sequential

    out = ParallelExecutor(backend, Sequential().schedule(backend.graph, cost)).run()
    return (out[0] if isinstance(out, list | tuple) else out).detach().clone()


def _urgent_executor(backend: Any, plan: Any, urgent: set[int], high: int) -> Any:
    """A :class:`ParallelExecutor` that launches the ``urgent`` operators on a twin of their stream made with
    priority ``high`` (each stream's order kept by an event between its two twins)."""
    import torch

    from opbench.runtime.executor import ParallelExecutor
    from opbench.runtime.graphs import fork_join

    class UrgentExecutor(ParallelExecutor):
        def launch_all(self, origin: Any, around: Any = None) -> None:
            if not self._streams:
                self._streams = {(s, p): torch.cuda.Stream(priority=p)
                                 for s in sorted(set(self.schedule.stream_of)) for p in (0, high)}

            def body() -> None:
                done: dict[int, Any] = {}
                last: dict[int, tuple[Any, Any]] = {}
                for op in self.schedule.order:
                    s = self.schedule.stream_of[op]
                    stream = self._streams[(s, high if op in urgent else 0)]
                    if s in last and last[s][0] is not stream:
                        stream.wait_event(last[s][1])
                    for u in self._waits[op]:
                        stream.wait_event(done[u])
                    with self.backend.on_stream(stream):
                        self.backend.launch(op)
                    event = torch.cuda.Event()
                    event.record(stream)
                    done[op] = event
                    last[s] = (stream, event)

            fork_join(origin, list(self._streams.values()), body)

    return UrgentExecutor(backend, plan)


def through(graph: Any, alone: list[float]) -> list[float]:
    """Each operator's longest way from the start to the end through it, by the ``alone`` times: its longest way
    from the start (itself included) plus its upward rank (``schedule.order.upward_ranks``) less itself."""
    from opbench.schedule.order import upward_ranks

    head = [0.0] * len(graph)
    for op in range(len(graph)):  # indices are a topological order
        head[op] = max((head[p] for p in graph.preds(op)), default=0.0) + alone[op]
    tail = upward_ranks(graph, alone.__getitem__)
    return [head[op] + tail[op] - alone[op] for op in range(len(graph))]


def measure(name: str, args: Any) -> dict:
    """The schedules of ``name``'s fused regions with and without priorities for the urgent regions."""
    import torch

    from opbench.profile.timer import cuda_event_samples
    from opbench.runtime.executor import ParallelExecutor
    from opbench.runtime.graphs import capture_graph
    backend, alone, cost, bound, row = fused_regions(name, args)
    ways = through(backend.graph, alone)
    longest = max(ways)
    sets = {"path": set(bound["ops"])} | {f"near-{share:g}": {op for op, w in enumerate(ways) if w >= share * longest}
                                          for share in args.near}
    low, high = torch.cuda.Stream.priority_range()
    row |= {"urgent_regions": {k: len(v) for k, v in sets.items()}, "priority_range": [low, high]}
    reference = sequential_output(backend, cost)
    runs: dict[str, Any] = {}

    def add(label: str, executor: Any, node_priority: bool) -> None:
        executor.cuda_graph = capture_graph(executor.launch_all, keep=True)
        graph = NodePriorityGraph(executor.cuda_graph.graph) if node_priority else executor.cuda_graph
        graph.replay()
        torch.cuda.synchronize()
        out = executor.backend.outputs()
        out = out[0] if isinstance(out, list | tuple) else out
        runs[label] = {"replay": graph.replay, "err": relative_err(out, reference), "samples": [], "keep": executor}

    for label in args.schedulers:
        plan = schedule_of(label, backend.graph, cost)
        add(label, ParallelExecutor(backend, plan), False)
        add(f"{label}, node priority", ParallelExecutor(backend, plan), True)
        for which, urgent in sets.items():
            add(f"{label}, {which} urgent", _urgent_executor(backend, plan, urgent, high), False)
            add(f"{label}, {which} urgent, node priority", _urgent_executor(backend, plan, urgent, high), True)
    for _ in range(args.rounds):  # alternating: every variant once a round
        for run in runs.values():
            run["samples"].append(statistics.median(cuda_event_samples(run["replay"], args.repeat, args.number)) * 1e3)
    row["variants"] = {label: {"ms": statistics.median(run["samples"]), "err": run["err"]}
                       for label, run in runs.items()}
    for label, v in row["variants"].items():
        print(f"{name}: {label:<40} {v['ms']:.4f} ms ({v['ms'] / row['chain_ms'] - 1:+.1%} over the chain)  "
              f"err {v['err']:.1e}", flush=True)
    plain = {k: v["ms"] for k, v in row["variants"].items() if "," not in k}
    best = {k: v["ms"] for k, v in row["variants"].items() if k.endswith("urgent, node priority")}
    row["best_own"], row["best_urgent"] = min(plain, key=plain.get), min(best, key=best.get)
    row["gap_own"] = plain[row["best_own"]] / row["chain_ms"] - 1
    row["gap_urgent"] = best[row["best_urgent"]] / row["chain_ms"] - 1
    print(f"{name}: chain {row['chain_ms']:.4f} ms; best own {row['best_own']} ({row['gap_own']:+.1%}), best with "
          f"node priorities {row['best_urgent']} ({row['gap_urgent']:+.1%})", flush=True)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    model_device_args(parser, "googlenet,inception_v3,nasnet")
    timing_args(parser)
    parser.add_argument("--near", default="0.9", help="comma-separated shares: a 'near-S' urgent set for each, of the "
                        "regions whose longest way through them is at least S times the critical path's")
    parser.add_argument("--schedulers", default=",".join(PRIORITY_SCHEDULERS),
                        help=f"comma-separated, of: {', '.join(SCHEDULERS)}")
    args = parser.parse_args()
    raw, args.near = args.near, []
    try:
        args.near = [float(v) for v in raw.split(",")]
    except ValueError:
        pass
    if not args.near or not all(0 < v <= 1 for v in args.near):
        parser.error(f"--near {raw!r}: accepted: comma-separated shares above 0 and at most 1, e.g. 0.8,0.9")
    args.schedulers = args.schedulers.split(",")
    unknown = [s for s in args.schedulers if s not in SCHEDULERS]
    if unknown:
        parser.error(f"unknown --schedulers {','.join(unknown)!r} (accepted: {', '.join(SCHEDULERS)})")
    if args.device != "cuda":
        parser.error(f"--device {args.device!r}: CUDA priorities need a GPU (accepted: cuda)")
    models = checked_models(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    measure_each(models, experiment_doc("exp_node_priority.py", args.device), out / "exp_node_priority.json",
                 lambda name: measure(name, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
