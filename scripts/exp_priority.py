"""Experiment: do CUDA stream priorities for the critical path's streams shorten a parallel schedule?

For each model (torch kernels, PyTorch's default precision), the kept-style schedules are run with
all streams at one priority and with the streams that hold critical-path operators at the highest
priority, side by side; writes OUT/exp_priority.json.

    PYTHONPATH=python python3 scripts/exp_priority.py --out out
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="out")
    parser.add_argument("--models", default="googlenet,inception_v3,nasnet")
    args = parser.parse_args()
    import torch

    from opbench.models import load_workload
    from opbench.pipeline.compare import critical_path, scheduling_cost
    from opbench.profile.schedule import operator_times
    from opbench.profile.timer import cuda_event_samples
    from opbench.runtime.backend import TorchBackend
    from opbench.runtime.executor import ParallelExecutor
    from opbench.schedule import get_scheduler

    low, high = torch.cuda.Stream.priority_range() if hasattr(torch.cuda.Stream, "priority_range") else (0, -1)
    results = []
    for name in args.models.split(","):
        w = load_workload("local", name, 1)
        model = w.torch_module.cuda().eval()
        x = torch.from_numpy(w.example_inputs()[0]).cuda()
        backend = TorchBackend(model, [x], trace="auto")
        times = operator_times(backend)
        cost = scheduling_cost(backend, times)
        path = set(critical_path(backend, latencies=times)["ops"])
        for sched in ("greedy", "nimble", "opara"):
            plan = get_scheduler(sched).schedule(backend.graph, cost)
            crit = {plan.stream_of[op] for op in path}
            row = {"model": name, "schedule": sched, "streams": plan.num_streams, "critical_streams": len(crit)}
            for label, prio in (("same", {}), ("critical_high", {s: high for s in crit})):
                ex = ParallelExecutor(backend, plan, prio)
                ex.run()
                row[label + "_ms"] = statistics.median(cuda_event_samples(ex.cuda_graph.replay, 15, 20)) * 1e3
            again = ParallelExecutor(backend, plan)
            again.run()
            row["same_again_ms"] = statistics.median(cuda_event_samples(again.cuda_graph.replay, 15, 20)) * 1e3
            print(row, flush=True)
            results.append(row)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "exp_priority.json").write_text(json.dumps({"priority_range": [low, high],
                                                                   "results": results}, indent=1))


if __name__ == "__main__":
    main()
