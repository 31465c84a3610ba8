"""Does launching the critical path first bring a fused schedule closer to its critical path?

``capturer(kernels="fused")`` stays 19-36 % above the critical path of its regions (googlenet, inception_v3,
nasnet, batch 1), and the path's regions run 1.3-1.4 times slower beside the other branches than alone
(``scripts/exp_gap.py --backend fused``). The schedulers launch level by level (greedy) or by their own rules
(Opara's Alg. 2), so at a fork a short branch's kernels may take the SMs before the long way's.
:func:`opbench.schedule.order.critical_first` keeps each schedule's streams and launches, of the ready operators,
the one with the longest way to the end first. For each model, this script builds the fused regions
(``FusedBackend``, the regions the capturer compiles), times each operator alone, makes the schedules of
sequential, greedy (2, 3, 4 streams), Nimble and Opara with those times, and each one's critical-first variant;
checks every variant's outputs against the sequential run, and times all of them in alternating rounds (CUDA
Graph replays, medians) beside the critical path run alone as a chain. Writes ``OUT/exp_launch_order.json``
after every model.

    PYTHONUNBUFFERED=1 PYTHONPATH=python python3 scripts/exp_launch_order.py --out out --models googlenet,inception_v3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from _cli import ROOT, checked_models, experiment_doc, measure_each, model_device_args, timing_args
from bench_fused import relative_err

sys.path.insert(0, str(ROOT / "python"))


def fused_regions(name: str, args: Any) -> tuple[Any, list[float], Any, dict, dict]:
    """``name``'s fused regions (``FusedBackend``, as the capturer compiles them), each region's time alone, the
    scheduling cost over those times, the critical path (``pipeline.compare.critical_path``) and the row that
    starts the model's result (build seconds, regions, the chain's time)."""
    import torch

    from opbench.models import get_source
    from opbench.pipeline.compare import critical_path
    from opbench.pipeline.costs import operator_latencies, scheduling_cost
    from opbench.runtime.fused import FusedBackend

    torch.manual_seed(0)
    model, x = get_source("local").torch_model(name, args.batch, dtype=args.dtype)
    model, x = model.to(args.device).eval(), x.to(args.device)
    clock = time.perf_counter()
    backend = FusedBackend(model, [x])
    row: dict[str, Any] = {"model": name, "batch": args.batch, "dtype": args.dtype,
                           "build_s": time.perf_counter() - clock, "regions": len(backend.regions)}
    alone = operator_latencies(backend, args.repeat, args.number)
    cost = scheduling_cost(backend, alone)
    bound = critical_path(backend, args.repeat, args.number, alone)
    row |= {"chain_ms": bound["chain_ms"], "path_ms": bound["path_ms"], "sum_alone_ms": bound["sum_ms"],
            "path_regions": len(bound["ops"])}
    return backend, alone, cost, bound, row


def measure(name: str, args: Any) -> dict:
    """The schedules of ``name``'s fused regions in their own and in critical-first order, timed side by side."""
    from opbench.profile.timer import cuda_event_samples
    from opbench.runtime.executor import ParallelExecutor
    from opbench.schedule import Greedy, Nimble, Opara, Sequential, critical_first

    backend, _, cost, bound, row = fused_regions(name, args)
    runs: dict[str, Any] = {}
    reference = None
    for scheduler in (Sequential(), Greedy(2), Greedy(3), Greedy(4), Nimble(), Opara()):
        plan = scheduler.schedule(backend.graph, cost)
        label = scheduler.name + (f"-{scheduler.max_streams}" if isinstance(scheduler, Greedy) else "")
        for variant, schedule in ((label, plan), (f"{label}, critical first",
                                                  critical_first(plan, backend.graph, cost.latency))):
            if variant == "sequential, critical first":
                continue  # one stream: the order is the only change, and nothing runs side by side
            executor = ParallelExecutor(backend, schedule)
            out = executor.run()
            out = out[0] if isinstance(out, list | tuple) else out
            reference = out.detach().clone() if reference is None else reference
            runs[variant] = {"executor": executor, "err": relative_err(out, reference), "streams":
                             schedule.num_streams, "events": schedule.num_events, "samples": []}
    for _ in range(args.rounds):  # alternating: every variant once a round
        for run in runs.values():
            replay = run["executor"].cuda_graph.replay if args.device == "cuda" else run["executor"].run
            if args.device == "cuda":
                run["samples"].append(statistics.median(cuda_event_samples(replay, args.repeat, args.number)) * 1e3)
            else:
                clock = time.perf_counter()
                replay()
                run["samples"].append((time.perf_counter() - clock) * 1e3)
    row["variants"] = {label: {"ms": statistics.median(run["samples"]), "err": run["err"],
                               "streams": run["streams"], "events": run["events"]} for label, run in runs.items()}
    own = {k: v["ms"] for k, v in row["variants"].items() if "critical first" not in k and k != "sequential"}
    first = {k: v["ms"] for k, v in row["variants"].items() if "critical first" in k}
    row["best_own"], row["best_critical_first"] = min(own, key=own.get), min(first, key=first.get)
    row["best_own_ms"], row["best_critical_first_ms"] = own[row["best_own"]], first[row["best_critical_first"]]
    row["gap_own"] = row["best_own_ms"] / row["chain_ms"] - 1
    row["gap_critical_first"] = row["best_critical_first_ms"] / row["chain_ms"] - 1
    for label, v in row["variants"].items():
        print(f"{name}: {label:<28} {v['ms']:.4f} ms  err {v['err']:.1e}", flush=True)
    print(f"{name}: chain {row['chain_ms']:.4f} ms; best own {row['best_own']} {row['best_own_ms']:.4f} "
          f"({row['gap_own']:+.1%}), best critical first {row['best_critical_first']} "
          f"{row['best_critical_first_ms']:.4f} ({row['gap_critical_first']:+.1%})", flush=True)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    model_device_args(parser, "googlenet,inception_v3,nasnet")
    timing_args(parser)
    args = parser.parse_args()
    models = checked_models(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    measure_each(models, experiment_doc("exp_launch_order.py", args.device), out / "exp_launch_order.json",
                 lambda name: measure(name, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
