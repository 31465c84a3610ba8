"""Benchmark: SM partitions (CUDA green contexts) against the contention wall, one process, side by side.

1. ``matmul``: a square fp16 matmul on the whole GPU and on green-context streams of 64, 32 and 16
   SMs, eager and inside a CUDA Graph (forked into the green stream by events from the capture
   stream, the executor's pattern): does a partition hold inside a captured graph?
2. For each model (``--models``: PyTorch's ATen kernels, PyTorch's default precision; ``--tvm``:
   ``name=DATABASE`` for TVM kernels tuned in that database; ``--fused``: regions compiled by
   Inductor, with the torch.compile row): every operator timed alone and the
   critical path (the longest chain, timed alone); sequential, greedy, nimble and opara measured;
   every SM-partitioned variant of the best of them (:class:`opbench.schedule.SmPartitioner`); then
   the model's own CUDA Graph, sequential, the best schedule and every variant measured again in
   ``--rounds`` alternating rounds (medians): best without and with partitions, the critical path,
   the gap to it. Finally ``evaluate(..., sm_partition="auto")``, what ``compare --sm-partition auto``
   and ``capturer(sm_partition="auto")`` run: which row it keeps, with outputs checked.

Writes OUT/bench_partition.json after every model.

    PYTHONPATH=python python3 scripts/bench_partition.py --out out
    PYTHONPATH=python python3 scripts/bench_partition.py --out out --models googlenet \
        --tvm googlenet=data/tuning/googlenet-h100
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any


def replay_ms(run: Any, number: int) -> float:
    from opbench.profile.timer import cuda_event_samples

    return cuda_event_samples(run, 1, number, warmup=2)[0] * 1e3


def side_by_side(runs: dict[str, Any], rounds: int, number: int) -> dict[str, float]:
    """Median ms of each run over ``rounds`` rounds, every run once per round in turn."""
    samples: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(rounds):
        for label, run in runs.items():
            samples[label].append(replay_ms(run, number))
    return {k: statistics.median(v) for k, v in samples.items()}


def matmul_study(n: int, sizes: list[int], number: int) -> dict[str, Any]:
    """Step 1: fp16 matmul time on the whole GPU and on green streams of ``sizes`` SMs."""
    import torch

    from opbench.runtime import green
    from opbench.runtime.graphs import capture_graph, fork_join

    a = torch.randn(n, n, device="cuda", dtype=torch.float16)
    b = torch.randn(n, n, device="cuda", dtype=torch.float16)
    c = torch.empty(n, n, device="cuda", dtype=torch.float16)
    ordinary = torch.cuda.Stream()

    def on(stream: Any) -> Any:
        def launch(origin: Any) -> None:
            fork_join(origin, [stream], lambda: _mm(stream, a, b, c))
        return launch

    rows = []
    for label, stream in [("whole GPU", ordinary)] + [
            (f"{k} SMs", green.partitions([k]).stream(0)) for k in sizes]:
        def eager(stream: Any = stream) -> None:
            on(stream)(torch.cuda.current_stream())

        graph = capture_graph(on(stream))
        times = side_by_side({"eager": eager, "graph": graph.replay}, 5, number)
        rows.append({"stream": label, "eager_ms": times["eager"], "graph_ms": times["graph"]})
        print(f"matmul {n}: {label}: eager {times['eager']:.3f} ms, in a CUDA Graph {times['graph']:.3f} ms",
              flush=True)
    return {"n": n, "dtype": "float16", "rows": rows}


def _mm(stream: Any, a: Any, b: Any, c: Any) -> None:
    import torch

    with torch.cuda.stream(stream):
        torch.matmul(a, b, out=c)


def study(name: str, backend: Any, baselines: list[Any] | None, args: argparse.Namespace) -> dict[str, Any]:
    """Step 2 on one backend."""
    from opbench.pipeline.compare import critical_path, evaluate, host_arrays, operator_latencies, scheduling_cost
    from opbench.runtime import green
    from opbench.runtime.executor import ParallelExecutor
    from opbench.runtime.kernels import relative_error
    from opbench.schedule import Greedy, Nimble, Opara, Sequential, SmPartitioner

    clock = time.perf_counter()
    alone = operator_latencies(backend, args.repeat, args.number)
    cost = scheduling_cost(backend, alone)
    bound = critical_path(backend, args.repeat, args.number, alone)
    runs: dict[str, Any] = {}
    plans: dict[str, Any] = {}
    first: dict[str, float] = {}
    reference = None
    for scheduler in (Sequential(), Greedy(), Nimble(), Opara()):
        plan = scheduler.schedule(backend.graph, cost)
        executor = ParallelExecutor(backend, plan)
        outputs = host_arrays(executor.run())
        reference = reference if reference is not None else outputs
        assert relative_error(outputs, reference) <= 1e-5, plan.name
        runs[plan.name], plans[plan.name] = executor.cuda_graph.replay, plan
        first[plan.name] = statistics.median(replay_ms(executor.cuda_graph.replay, args.number) for _ in range(5))
    best = min((k for k in first if k != "sequential"), key=first.get)
    shape = green.layout()
    partitioner = SmPartitioner(shape["sm_count"], shape["granularity"], partitionable=shape["partitionable"])
    variants = partitioner.variants(plans[best], cost)
    predicted = {"unpartitioned": cost.predict(plans[best]) * 1e3}
    # a diagnostic, not a policy choice: the side streams on green contexts holding every SM partitions can
    # take (no confinement to speak of): what green-context streams cost by themselves
    main, side = partitioner.roles(plans[best], cost)
    group_of = [None if s in main else 0 for s in range(max(plans[best].stream_of) + 1)]
    everything = plans[best].with_partition([shape["partitionable"]], group_of, f"{best}+green-all")
    # and every stream, the main ones too, on one green context of those SMs: no stream confined, no
    # event crossing between contexts (against green-all: what crossing contexts costs)
    one = plans[best].with_partition([shape["partitionable"]], [0] * len(group_of), f"{best}+green-one")
    variants = [*variants, (everything, cost.predict(everything)), (one, cost.predict(one))]
    for plan, seconds in variants:
        executor = ParallelExecutor(backend, plan)
        outputs = host_arrays(executor.run())
        error = relative_error(outputs, reference)
        assert error <= 1e-5, (plan.name, error)
        runs[plan.name], plans[plan.name] = executor.cuda_graph.replay, plan
        predicted[plan.name] = seconds * 1e3
    for base in baselines or []:
        runs[base.label] = base.run_once
    keep = ["sequential", best, *(p.name for p, _ in variants), *(b.label for b in baselines or [])]
    times = side_by_side({k: runs[k] for k in keep}, args.rounds, args.number)
    partitioned = {k: v for k, v in times.items() if "+sm-" in k}  # the policy's variants
    best_part = min(partitioned, key=partitioned.get) if partitioned else None
    chain = bound["chain_ms"]
    result = {
        "model": name, "backend": backend.name, "operators": len(backend.graph), "sm_count": shape["sm_count"],
        "granularity": shape["granularity"], "critical_path_ms": chain, "critical_path_sum_ms": bound["path_ms"],
        "sum_alone_ms": bound["sum_ms"], "first_pass_ms": first, "best": best, "best_ms": times[best],
        "best_partitioned": best_part, "best_partitioned_ms": times.get(best_part),
        "partition": plans[best_part].partition_label() if best_part else None,
        "gap_without": times[best] / chain - 1, "gap_with": (times[best_part] / chain - 1) if best_part else None,
        "with_vs_without": times[best] / times[best_part] if best_part else None,
        "times_ms": times, "predicted_ms": predicted,
        "labels": {k: plans[k].partition_label() for k in keep if k in plans},
    }
    print(f"{name} [{backend.name}]: best {best} {times[best]:.4f} ms, partitioned {best_part} "
          f"{times.get(best_part, float('nan')):.4f} ms ({result['partition']}), critical path {chain:.4f} ms: "
          f"gap {result['gap_without']:.1%} -> {result['gap_with'] if best_part else float('nan'):.1%}", flush=True)
    for k in keep:
        label = plans[k].partition_label() if k in plans else ""
        guess = predicted.get(k, predicted["unpartitioned"] if k == best else float("nan"))
        print(f"  {k:<28}{times[k]:9.4f} ms  {label:<24}pred {guess:.4f}", flush=True)
    kept, rows = evaluate(backend, ["sequential", "greedy", "nimble", "opara"], cost, None, baseline=baselines,
                          repeat=args.repeat, number=args.number, sm_partition="auto")
    result["auto"] = [{k: r.get(k) for k in ("schedule", "latency_ms", "sm", "sched_error", "kept")} for r in rows]
    result["auto_kept"] = next(r["schedule"] for r in rows if r["kept"])
    print(f"  evaluate(sm_partition='auto') keeps {result['auto_kept']}: " + ", ".join(
        f"{r['schedule']} {r['latency_ms']:.4f}" for r in rows if r["latency_ms"] is not None), flush=True)
    result["seconds"] = time.perf_counter() - clock
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="out")
    parser.add_argument("--models", default="googlenet,inception_v3,nasnet,randwire",
                        help="local-zoo models run with PyTorch's kernels (comma-separated; '' for none)")
    parser.add_argument("--tvm", default="", help="NAME=DATABASE[,...]: models run with TVM kernels tuned in DATABASE")
    parser.add_argument("--fused", default="", help="models run as Inductor-compiled regions")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--number", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--matmul", type=int, default=8192, help="matmul size of step 1 (0: skip)")
    args = parser.parse_args()
    import torch

    from opbench.models import load_workload
    from opbench.pipeline.compile import BackendSpec, model_backend
    from opbench.runtime import green, resolve_target

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    reason = green.support()
    report: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                              "green_contexts": reason or "available", "results": []}
    if reason is not None:
        raise SystemExit(f"SM partitions unavailable: {reason}")
    report["layout"] = green.layout()
    if args.matmul:
        report["matmul"] = matmul_study(args.matmul, [64, 32, 16], args.number)
    path = out / "bench_partition.json"
    path.write_text(json.dumps(report, indent=1))
    target = resolve_target("cuda")
    jobs = [(m, "torch", None) for m in args.models.split(",") if m]
    jobs += [(spec.split("=")[0], "tvm", spec.split("=", 1)[1]) for spec in args.tvm.split(",") if spec]
    jobs += [(m, "fused", None) for m in args.fused.split(",") if m]
    for name, kind, database in jobs:
        workload = load_workload("local", name, 1)
        spec = BackendSpec(kind, repeat=args.repeat, number=args.number)
        backend, baselines = model_backend(workload, target, spec, database)
        with torch.no_grad():
            report["results"].append(study(name, backend, baselines, args))
        path.write_text(json.dumps(report, indent=1))
        del backend, baselines
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
