"""Experiment: where does a parallel schedule's time go beyond the critical path?

For each model and precision (``default``: PyTorch's own settings, TF32 in cuDNN convolutions;
``fp32``: TF32 off), on the ATen operators of ``torch.export`` (with ``--backend tvm``, on
TVM's default kernels; with ``--backend fused``, on the regions ``capturer(kernels="fused")`` compiles
with Inductor, its operators being those regions), in ``--dtype`` (the model and its input cast to it; TVM's
kernels in float32 only):

1. every operator timed alone; the critical path (the longest chain by those times) timed alone;
2. the schedules of greedy (2, 3, 4 and 8 streams), nimble, opara and ios, side by side;
3. for the fastest of them, three more runs of the same schedule (same streams, same events):
   only the chain's operators launched (what its stream placement and cross-stream waits add
   to the chain), only the other operators launched (how long the rest takes without the
   chain), and every operator with a timing event on each side (each kernel's time inside the
   parallel run: how much concurrent kernels slow the chain's, and how long the chain idles
   waiting on other branches);
4. IOS's merge (``all`` sibling convolutions, or those ``ios``'s dynamic programme picks), the
   best schedule of each and its critical path.

Writes OUT/exp_gap.json (``--name``; after every model) and prints one line per measurement.

    PYTHONUNBUFFERED=1 PYTHONPATH=python python3 scripts/exp_gap.py --out out
    PYTHONUNBUFFERED=1 PYTHONPATH=python python3 scripts/exp_gap.py --out out --backend tvm --models googlenet
    PYTHONUNBUFFERED=1 PYTHONPATH=python python3 scripts/exp_gap.py --out out --backend fused --precisions default
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from opbench.models.base import DTYPES


class Partial:
    """A backend that launches only the operators in ``keep`` (the others keep their last outputs)
    and records a timing event on each side of the operators in ``timed``."""

    def __init__(self, backend: Any, keep: set[int], timed: set[int] | None = None) -> None:
        self.inner, self.keep, self.timed = backend, keep, timed or set()
        self.events: dict[int, tuple[Any, Any]] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def launch(self, op: int) -> None:
        import torch

        if op not in self.keep:
            return
        if op not in self.timed:
            self.inner.launch(op)
            return
        stream = torch.cuda.current_stream()
        start, end = (torch.cuda.Event(enable_timing=True, external=True) for _ in range(2))
        start.record(stream)
        self.inner.launch(op)
        end.record(stream)
        self.events[op] = (start, end)


def replay_ms(executor: Any, repeat: int, number: int) -> float:
    from opbench.profile.timer import cuda_event_samples

    return statistics.median(cuda_event_samples(executor.cuda_graph.replay, repeat, number)) * 1e3


def inside_times(backend: Any, plan: Any, replays: int) -> tuple[dict[int, float], dict[int, float], float]:
    """Each operator's duration and start (ms after the first start) inside the parallel run
    (medians over replays), and the instrumented run's median span."""
    import torch

    from opbench.runtime.executor import ParallelExecutor

    class Stamped(ParallelExecutor):
        """Records one timing event on the capture stream before the fork: every start is taken from it."""

        def launch_all(self, origin: Any) -> None:
            self.origin_event = torch.cuda.Event(enable_timing=True, external=True)
            self.origin_event.record(origin)
            super().launch_all(origin)

    every = set(range(len(backend.graph)))
    probe = Partial(backend, every, every)
    executor = Stamped(probe, plan)
    executor.run()
    durations: dict[int, list[float]] = {op: [] for op in every}
    starts: dict[int, list[float]] = {op: [] for op in every}
    spans = []
    for _ in range(replays):
        executor.cuda_graph.replay()
        torch.cuda.synchronize()
        base = executor.origin_event
        offsets = {op: base.elapsed_time(s) for op, (s, _) in probe.events.items()}
        zero = min(offsets.values())
        for op, (s, e) in probe.events.items():
            durations[op].append(s.elapsed_time(e))
            starts[op].append(offsets[op] - zero)
        spans.append(max(offsets[op] - zero + durations[op][-1] for op in every))
    med = statistics.median
    return ({op: med(v) for op, v in durations.items()}, {op: med(v) for op, v in starts.items()}, med(spans))


def analyse(name: str, build: Any, precision: str, repeat: int, number: int,
            merges: tuple[str, ...] = ("none", "all", "ios")) -> dict[str, Any]:
    """Steps 1-4 of the module docstring on the backends ``build(merge)`` returns, for each of ``merges``."""
    from opbench.pipeline.compare import critical_path, operator_latencies, scheduling_cost
    from opbench.runtime.executor import ParallelExecutor
    from opbench.schedule import IOS, Greedy, Nimble, Opara, Sequential

    out: dict[str, Any] = {"model": name, "precision": precision}
    variants: dict[str, Any] = {}
    for merge in merges:
        clock = time.perf_counter()
        backend = build(merge)
        build_s = time.perf_counter() - clock
        alone = operator_latencies(backend, repeat, number)
        cost = scheduling_cost(backend, alone)
        bound = critical_path(backend, repeat, number, alone)
        schedulers = [Sequential(), Greedy(2), Greedy(3), Greedy(4), Greedy(8), Nimble(), Opara(),
                      IOS(time_limit_s=30.0)]
        if merge != "none":
            schedulers = [Sequential(), Greedy(4), Nimble(), Opara(), IOS(time_limit_s=30.0)]
        rows = []
        for scheduler in schedulers:
            label = scheduler.name + (f"-{scheduler.max_streams}" if isinstance(scheduler, Greedy) else "")
            clock = time.perf_counter()
            plan = scheduler.schedule(backend.graph, cost)
            sched_ms = (time.perf_counter() - clock) * 1e3
            executor = ParallelExecutor(backend, plan)
            executor.run()
            rows.append({"schedule": label, "streams": plan.num_streams, "events": plan.num_events,
                         "ms": replay_ms(executor, repeat, number), "scheduling_ms": sched_ms, "plan": plan})
            print(name, precision, merge, label, f"{rows[-1]['ms']:.4f} ms", flush=True)
        best = min(rows[1:], key=lambda r: r["ms"])
        variants[merge] = {"operators": len(backend.graph), "merged_groups": getattr(backend, "merged_groups", None),
                           "build_s": build_s, "sequential_ms": rows[0]["ms"], "chain_ms": bound["chain_ms"],
                           "path_ms": bound["path_ms"], "sum_alone_ms": bound["sum_ms"],
                           "best": best["schedule"], "best_ms": best["ms"],
                           "gap_to_chain": best["ms"] / bound["chain_ms"] - 1,
                           "rows": [{k: v for k, v in r.items() if k != "plan"} for r in rows]}
        print(name, precision, merge, f"best {best['schedule']} {best['ms']:.4f} ms, chain {bound['chain_ms']:.4f} ms",
              flush=True)
        if merge != "none":
            continue
        plan, path = best["plan"], set(bound["ops"])
        rest = set(range(len(backend.graph))) - path
        parts = {}
        for label, keep in (("chain_only", path), ("rest_only", rest)):
            executor = ParallelExecutor(Partial(backend, keep), plan)
            executor.run()
            parts[label + "_ms"] = replay_ms(executor, repeat, number)
        durations, starts, span = inside_times(backend, plan, max(20, repeat))
        chain = bound["ops"]
        inside = sum(durations[op] for op in chain)
        chain_span = starts[chain[-1]] + durations[chain[-1]] - starts[chain[0]]
        idle = [starts[b] - (starts[a] + durations[a]) for a, b in zip(chain, chain[1:], strict=False)]
        waits = sorted(((w, b) for w, b in zip(idle, chain[1:], strict=False)), reverse=True)[:8]
        out["decomposition"] = {
            "schedule": best["schedule"], "schedule_ms": best["ms"], "chain_alone_ms": bound["chain_ms"],
            "chain_sum_of_alone_ms": bound["path_ms"], **parts,
            "instrumented_span_ms": span, "chain_inside_sum_ms": inside, "chain_span_inside_ms": chain_span,
            "chain_idle_inside_ms": sum(max(0.0, w) for w in idle),
            "chain_operators": len(chain),
            "chain_slowdown": inside / bound["path_ms"] if bound["path_ms"] else None,
            "all_inside_sum_ms": sum(durations.values()), "all_alone_sum_ms": bound["sum_ms"],
            "longest_chain_waits": [{"before": backend.graph[b].func, "index": b, "wait_ms": w} for w, b in waits],
            "slowest_chain_kernels": sorted(({"index": op, "name": backend.graph[op].func,
                                              "alone_ms": bound["alone_ms"][op], "inside_ms": durations[op]}
                                             for op in chain), key=lambda r: r["alone_ms"] - r["inside_ms"])[:8],
        }
        print(name, precision, json.dumps({k: v for k, v in out["decomposition"].items()
                                           if not isinstance(v, list)}), flush=True)
    out["merge"] = variants
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="out")
    parser.add_argument("--models", default="googlenet,inception_v3")
    parser.add_argument("--precisions", default="default,fp32")
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--number", type=int, default=20)
    parser.add_argument("--backend", default="torch", choices=("torch", "tvm", "fused"),
                        help="torch: ATen kernels (per precision); tvm: TVM's default kernels (fp32); fused: the "
                             "regions capturer(kernels='fused') compiles with Inductor (per precision; merges none "
                             "and all)")
    parser.add_argument("--dtype", default="float32", choices=DTYPES,
                        help="the model's and its input's dtype (torch and fused backends; tvm: float32 only)")
    parser.add_argument("--name", default="exp_gap.json", help="file name of the JSON under --out")
    args = parser.parse_args()
    if args.backend == "tvm" and args.dtype != "float32":
        parser.error(f"--dtype {args.dtype} with --backend tvm (accepted there: float32)")
    import torch

    from opbench.models import get_source, load_workload
    from opbench.pipeline.compile import torch_backend, tvm_backend
    from opbench.runtime import resolve_target
    from opbench.runtime.fused import FusedBackend

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    precisions = args.precisions.split(",") if args.backend != "tvm" else ["fp32"]
    merges = ("none", "all") if args.backend == "fused" else ("none", "all", "ios")
    for precision in precisions:
        torch.backends.cudnn.allow_tf32 = precision == "default"
        torch.backends.cuda.matmul.allow_tf32 = False  # PyTorch's default for matmuls
        for name in args.models.split(","):
            if args.backend == "tvm":
                w = load_workload("local", name, 1)

                def build(merge: str, w: Any = w) -> Any:
                    return tvm_backend(w, resolve_target("cuda"), merge=merge, repeat=args.repeat,
                                       number=args.number)
            else:
                model, x = get_source("local").torch_model(name, 1, dtype=args.dtype)
                model, x = model.cuda().eval(), x.cuda()

                def build(merge: str, model: Any = model, x: Any = x) -> Any:
                    if args.backend == "fused":
                        return FusedBackend(model, [x], merge=merge == "all")
                    return torch_backend(model, [x], merge=merge, trace="export", repeat=args.repeat,
                                         number=args.number)
            with torch.no_grad():
                results.append({**analyse(name, build, precision, args.repeat, args.number, merges),
                                "dtype": args.dtype})
            (out_dir / args.name).write_text(json.dumps({"device": torch.cuda.get_device_name(),
                                                              "torch": torch.__version__, "results": results},
                                                             indent=1))


if __name__ == "__main__":
    main()
