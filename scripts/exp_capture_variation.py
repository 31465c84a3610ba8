"""How far apart are two CUDA Graph captures of one schedule, and does keeping the fastest of several pay?

``capturer(kernels="fused")`` measured each schedule in one capture and returned the kept schedule in another
(``CapturedSchedule`` captured it again; since this script's findings it returns the fastest of several). The
twenty-eighth session's priority experiment
(``scripts/exp_node_priority.py``) saw variants that should run alike, each its own capture, differ steadily by up
to 5 %, and two processes agree on each within 0.12 %. This script builds the fused regions (``FusedBackend``, as
the capturer compiles them), makes the schedules of greedy (3 and 4 streams), Nimble and Opara, and for each one:

- captures it ``--captures`` times (each a new :class:`~opbench.runtime.executor.ParallelExecutor`: new streams, a
  new private memory pool, so new addresses for every region's outputs);
- instantiates the first capture's template ``--instances`` more times (the same nodes and addresses; what the
  instantiation alone changes), with the flags PyTorch instantiates with;

checks every capture's outputs against the sequential run, and times every variant in alternating rounds (CUDA
Graph replays, medians of CUDA-event samples) beside the critical path run alone. The held-out test of keeping the
fastest capture: the capture picked by the first half of the rounds, timed in the second half, against the first
capture and against the median capture.

With ``--capturer N`` it then times the lever through the user's path: ``capturer(kernels="fused", cache=True)``
builds the model once (its choice kept in a cache of this run), and the same model is built again from that cache
``N`` times with ``captures=1`` (one capture, a draw) and ``N`` times with ``captures`` at its default (the fastest
of several), alternately; every returned callable is timed through the user's call (``run(x)``, the input copy
included) in alternating rounds.

With ``--trace``, every variant is then replayed once under PyTorch's profiler (CUPTI), and its kernels are kept in
the order they started: name, the stream CUDA ran it on, start and duration (microseconds from the replay's first
kernel), the graph node it came from, its thread blocks, threads a block, registers a thread and shared memory
(``traces``), so that a fast and a slow instantiation of one template can be compared kernel by kernel. From these,
each kernel's share of the GPU's block slots (:func:`gpu_share`) and, with ``sequential`` among ``--schedulers``,
the bound they set (``slots_bound_ms``: the kernels' shares times their times alone; no schedule holds more blocks
at once than the GPU does), beside the critical path. Writes ``OUT/exp_capture_variation.json`` after every model.

    PYTHONUNBUFFERED=1 PYTHONPATH=python python3 scripts/exp_capture_variation.py --out out --models googlenet
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path
from typing import Any

from _cli import ROOT, checked_models, experiment_doc, measure_each, model_device_args, timing_args
from bench_fused import relative_err
from exp_launch_order import fused_regions
from exp_node_priority import (
    AUTO_FREE_ON_LAUNCH,
    DEVICE_LAUNCH,
    SCHEDULERS,
    NodePriorityGraph,
    schedule_of,
    sequential_output,
)

sys.path.insert(0, str(ROOT / "python"))

from opbench.pipeline.compare import FINALISTS  # noqa: E402

#: bytes of a large page of the GPU's memory (addresses are summarised modulo it)
PAGE = 2 << 20
#: the limits of one SM of compute capability 9.0 (H100, H200): threads, blocks, registers (allocated per warp in
#: units), shared memory (allocated per block in units, plus the driver's reserve for each block)
SM90 = {"threads": 2048, "blocks": 32, "registers": 65536, "register_unit": 256, "shared": 233472,
        "shared_unit": 128, "shared_reserved": 1024}
#: how ``--instance-flags`` instantiates a template again: (flags, upload it at once)
INSTANCE_FLAGS = {"auto": (AUTO_FREE_ON_LAUNCH, False), "upload": (AUTO_FREE_ON_LAUNCH, True),
                  "device": (DEVICE_LAUNCH, True)}


def node_count(graph: Any) -> int | None:
    """The number of nodes of a kept CUDA Graph template (None without ``cuda-bindings``)."""
    try:
        from cuda.bindings import runtime
    except ImportError:
        return None
    from opbench.runtime.green import _check

    return int(_check(runtime.cudaGraphGetNodes(graph.raw_cuda_graph(), 0), "cudaGraphGetNodes")[1])


def addresses(backend: Any) -> dict[str, Any]:
    """Where the capture put the regions' values: the span of their addresses, and how many start in each
    eighth of a :data:`PAGE` (a capture's memory pool is new, so these move from one capture to the next)."""
    import torch

    ptrs = sorted({t.data_ptr() for t in backend.env.values() if isinstance(t, torch.Tensor) and t.is_cuda})
    eighths = [0] * 8
    for p in ptrs:
        eighths[(p % PAGE) * 8 // PAGE] += 1
    return {"tensors": len(ptrs), "span_mib": (ptrs[-1] - ptrs[0]) / 2**20 if ptrs else 0.0,
            "page_eighths": eighths}


def halves(samples: dict[str, list[float]], labels: list[str]) -> dict[str, Any]:
    """Keeping the fastest of ``labels`` (captures of one schedule), tested out of sample: the capture with the
    least median over the first half of the rounds, and its median over the second half against the first
    capture's and the median capture's there; and the pick of the library's screening (``screened``: the fastest
    :data:`~opbench.pipeline.compare.FINALISTS` of the first round, of which the fastest over the rest of the first
    half), timed in the second half too."""
    cut = len(samples[labels[0]]) // 2
    first = {k: statistics.median(samples[k][:cut]) for k in labels}
    second = {k: statistics.median(samples[k][cut:]) for k in labels}
    pick = min(first, key=first.get)
    typical = statistics.median(second.values())
    # the library's screening (pipeline/compare.py::fastest_capture): the fastest FINALISTS of the first round,
    # of which the fastest over the rest of the first half, tested in the second half as above
    finalists = sorted(labels, key=lambda k: samples[k][0])[:FINALISTS]
    rest = {k: statistics.median(samples[k][1:cut]) for k in finalists} if cut > 1 else first
    screened = min(finalists, key=rest.get)
    return {"picked": pick, "picked_ms": second[pick], "first_capture_ms": second[labels[0]],
            "median_capture_ms": typical, "gain_vs_first": second[labels[0]] / second[pick] - 1,
            "gain_vs_median": typical / second[pick] - 1,
            "best_in_second_half": min(second, key=second.get),
            "screened": screened, "screened_ms": second[screened], "screened_vs_picked": second[screened] /
            second[pick] - 1, "screened_gain_vs_median": typical / second[screened] - 1}


def measure_capturer(name: str, args: Any, cache: Path) -> dict[str, Any]:
    """``capturer``'s rebuilds of ``name`` with one capture and with :data:`~opbench.parallel.CAPTURES`, side by
    side through the user's call."""
    import os

    import torch

    from opbench.models import get_source
    from opbench.parallel import CAPTURES, capturer
    from opbench.profile.timer import cuda_event_samples

    os.environ["OPBENCH_CACHE"] = str(cache)
    torch.manual_seed(0)
    model, x = get_source("local").torch_model(name, args.batch, dtype=args.dtype)
    model, x = model.to(args.device).eval(), x.to(args.device)
    with torch.no_grad():
        expected = model(x)
    first = capturer([x], model, kernels="fused", cache=True)
    arms: dict[str, list[Any]] = {"captures=1": [], f"captures={CAPTURES}": []}
    builds: dict[str, list[float]] = {k: [] for k in arms}
    for _ in range(args.capturer):
        for arm, captures in zip(arms, (1, CAPTURES), strict=True):
            run = capturer([x], model, kernels="fused", cache=True, captures=captures)
            builds[arm].append(run.build_s)
            arms[arm].append(run)
    user = x.detach().clone()
    runs = [(arm, i, run) for arm, made in arms.items() for i, run in enumerate(made)]
    samples: dict[tuple[str, int], list[float]] = {(arm, i): [] for arm, i, _ in runs}
    errors = {}
    for arm, i, run in runs:
        with torch.no_grad():
            errors[(arm, i)] = relative_err(run(user), expected)
    for r in range(args.rounds):
        for arm, i, run in runs[r % len(runs):] + runs[:r % len(runs)]:
            samples[(arm, i)].append(statistics.median(cuda_event_samples(lambda run=run: run(user), args.repeat,
                                                                          args.number)) * 1e3)
    out: dict[str, Any] = {"first_build": {"kept": next(r["schedule"] for r in first.table if r["kept"]),
                                           "build_s": first.build_s}}
    for arm in arms:
        ms = [statistics.median(samples[(arm, i)]) for i in range(args.capturer)]
        out[arm] = {"ms": ms, "median_ms": statistics.median(ms), "build_s": builds[arm],
                    "err": [errors[(arm, i)] for i in range(args.capturer)]}
        print(f"{name}: capturer rebuilt with {arm}: {' '.join(f'{m:.4f}' for m in ms)} ms (median "
              f"{out[arm]['median_ms']:.4f}), builds {' '.join(f'{b:.1f}' for b in builds[arm])} s", flush=True)
    one, many = out["captures=1"]["median_ms"], out[f"captures={CAPTURES}"]["median_ms"]
    out["gain"] = one / many - 1
    print(f"{name}: the fastest of {CAPTURES} captures against one: {out['gain']:+.1%} (medians over "
          f"{args.capturer} rebuilds each)", flush=True)
    return out


def _outputs_of(instance: Any, executor: Any) -> Any:
    """The outputs of one replay of ``instance``, another instantiation of ``executor``'s capture (same addresses:
    its outputs land where the capture's do)."""
    import torch

    instance.replay()
    torch.cuda.synchronize()
    return list(executor._captured[1])


def _product(dims: Any) -> int | None:
    """The product of a profiler's ``grid`` or ``block`` (three sizes), None without one."""
    return None if not isinstance(dims, list) or not dims else int(math.prod(dims))


def resident_blocks(threads: int | None, registers: int | None, shared: int | None,
                    limits: dict[str, int] = SM90) -> int | None:
    """How many blocks of a kernel one SM holds at once (the occupancy calculator's arithmetic: threads, registers
    allocated per warp in each of the SM's four quarters, shared memory with the driver's reserve), None when the
    block size is not known; registers or shared memory not known count as none."""
    if not threads:
        return None
    warps = -(-threads // 32)
    unit = limits["register_unit"]
    per_warp = -(-(registers or 0) * 32 // unit) * unit
    by_registers = 4 * (limits["registers"] // 4 // per_warp) // warps if per_warp else limits["blocks"]
    unit = limits["shared_unit"]
    per_block = -(-((shared or 0) + limits["shared_reserved"]) // unit) * unit
    return max(0, min(limits["blocks"], limits["threads"] // (warps * 32), by_registers,
                      limits["shared"] // per_block))


def gpu_share(blocks: int | None, threads: int | None, registers: int | None, shared: int | None,
              sms: int) -> float | None:
    """The share of the GPU's block slots (:func:`resident_blocks` on each of ``sms`` SMs) a kernel's blocks hold
    while it runs: its blocks over the slots times its waves (1 for a kernel that fills every slot in each wave;
    the last wave's empty slots count as free). None when not known."""
    per_sm = resident_blocks(threads, registers, shared)
    if not blocks or not per_sm:
        return None
    slots = per_sm * sms
    return blocks / (slots * math.ceil(blocks / slots))


def occupancy(trace: dict[str, Any], sms: int) -> dict[str, Any]:
    """What a traced replay's kernels ask of the GPU's block slots (:func:`gpu_share`): ``area_us``, the sum of
    each kernel's share times its duration (from a sequential replay, where each kernel runs alone, a lower bound
    on any schedule's time, beside the critical path: no schedule runs more blocks at once than the GPU holds);
    ``full_us``, how long the running kernels' shares added up to the whole GPU or more; ``busy_us``, how long any
    kernel ran; kernels whose share is not known count as filling the GPU (``unknown``: how many)."""
    shares = [gpu_share(*k[5:9], sms) for k in trace["kernels"]]
    filled = [1.0 if s is None else s for s in shares]
    area = sum(f * k[3] for k, f in zip(trace["kernels"], filled, strict=True))
    edges = sorted(e for k, f in zip(trace["kernels"], filled, strict=True) for e in ((k[2], f), (k[2] + k[3], -f)))
    full = busy = demand = 0.0
    running, last = 0, 0.0
    for at, change in edges:
        if running:
            busy += at - last
            full += (at - last) if demand >= 1.0 - 1e-9 else 0.0
        demand += change
        running += 1 if change > 0 else -1
        last = at
    return {"area_us": round(area, 2), "full_us": round(full, 2), "busy_us": round(busy, 2),
            "unknown": sum(s is None for s in shares)}


def kernel_trace(replay: Any, folder: Path) -> dict[str, Any]:
    """The kernels of one ``replay()`` (after a warm one), from PyTorch's profiler: each as ``[name, stream,
    start_us, duration_us, graph node id, thread blocks, threads a block, registers a thread, shared memory
    bytes]`` (what :func:`gpu_share` sets against the GPU's SMs; None where the profiler does not say), starts
    counted from the first kernel's, in the order they started."""
    import json

    import torch
    from torch.profiler import ProfilerActivity, profile

    replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        replay()
        torch.cuda.synchronize()
    path = folder / "trace.json"
    prof.export_chrome_trace(str(path))
    events = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("cat") == "kernel"]
    path.unlink()
    events.sort(key=lambda e: e["ts"])
    t0 = events[0]["ts"] if events else 0.0
    kernels = []
    for e in events:
        a = e.get("args", {})
        kernels.append([e["name"][:60], a.get("stream"), round(e["ts"] - t0, 2), round(e["dur"], 2),
                        a.get("graph node id"), _product(a.get("grid")), _product(a.get("block")),
                        a.get("registers per thread"), a.get("shared memory")])
    span = max((k[2] + k[3] for k in kernels), default=0.0)
    return {"span_us": round(span, 2), "kernel_us": round(sum(k[3] for k in kernels), 2),
            "streams": len({k[1] for k in kernels}), "kernels": kernels}


def measure(name: str, args: Any) -> dict:
    """The captures and instances of each schedule of ``name``'s fused regions, timed side by side."""

    from opbench.errors import OpBenchError
    from opbench.profile.timer import cuda_event_samples
    from opbench.runtime.executor import ParallelExecutor

    backend, _, cost, _, row = fused_regions(name, args)
    reference = sequential_output(backend, cost)
    runs: dict[str, dict[str, Any]] = {}
    groups: dict[str, list[str]] = {}
    for label in args.schedulers:
        plan = schedule_of(label, backend.graph, cost)
        groups[label] = []
        first = None
        for i in range(args.captures):
            executor = ParallelExecutor(backend, plan).capture(keep=True)
            key = f"{label} #{i + 1}"  # run(): a replay, returning this capture's outputs
            runs[key] = {"replay": executor.replay, "err": relative_err(executor.run(), reference), "samples": [],
                         "nodes": node_count(executor.cuda_graph.graph), "memory": addresses(backend),
                         "keep": executor}
            groups[label].append(key)
            first = first or executor
        for j in range(args.instances):
            how = args.instance_flags[j % len(args.instance_flags)]
            key = f"{label} #1, instance {j + 2}" + ("" if args.instance_flags == ["auto"] else f" ({how})")
            try:
                instance = NodePriorityGraph(first.cuda_graph.graph, *INSTANCE_FLAGS[how])
            except OpBenchError as err:  # e.g. a node kind a graph for device launch cannot hold
                print(f"{name}: {key}: not instantiated ({err})", flush=True)
                row.setdefault("not_instantiated", {})[key] = str(err)
                continue
            runs[key] = {"replay": instance.replay, "err": relative_err(_outputs_of(instance, first), reference),
                         "samples": [], "keep": instance}
    labels = list(runs)
    for r in range(args.rounds):  # alternating, the first variant of a round rotating
        for key in labels[r % len(labels):] + labels[:r % len(labels)]:
            run = runs[key]
            run["samples"].append(statistics.median(cuda_event_samples(run["replay"], args.repeat, args.number)) * 1e3)
    row["variants"] = {k: {"ms": statistics.median(v["samples"]), "err": v["err"], "samples_ms": v["samples"]}
                       | {f: v[f] for f in ("nodes", "memory") if f in v} for k, v in runs.items()}
    if args.trace:
        import torch

        sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
        row["traces"] = {key: kernel_trace(runs[key]["replay"], Path(args.out)) for key in labels}
        for key in labels:
            t = row["traces"][key]
            t["occupancy"] = o = occupancy(t, sms)
            print(f"{name}: {key:<24} {row['variants'][key]['ms']:.4f} ms; traced: span {t['span_us']:.1f} us, "
                  f"kernels {len(t['kernels'])} ({t['kernel_us']:.1f} us in all) on {t['streams']} streams; their "
                  f"share of the GPU's block slots times their time {o['area_us']:.1f} us, the GPU's slots all "
                  f"asked for {o['full_us']:.1f} of {o['busy_us']:.1f} us ({o['unknown']} kernels not known)",
                  flush=True)
        alone = [row["traces"][k] for k in groups.get("sequential", [])[:1]]
        if alone:  # each kernel alone: the slots its blocks take, a bound beside the critical path
            row["slots_bound_ms"] = alone[0]["occupancy"]["area_us"] / 1e3
            row["sms"] = sms
            print(f"{name}: bound of the block slots {row['slots_bound_ms']:.4f} ms (each kernel's share of the "
                  f"{sms} SMs' slots times its time alone), critical path {row['chain_ms']:.4f} ms", flush=True)
    row["schedules"] = {}
    for label, keys in groups.items():
        caps = [row["variants"][k]["ms"] for k in keys]
        inst = [row["variants"][k]["ms"] for k in runs if k.startswith(f"{label} #1, instance")]
        summary = {"captures_ms": caps, "capture_spread": max(caps) / min(caps) - 1,
                   "instances_ms": inst, "instance_spread": (max(inst + caps[:1]) / min(inst + caps[:1]) - 1),
                   "held_out": halves({k: runs[k]["samples"] for k in keys}, keys),
                   "gap_best_capture": min(caps) / row["chain_ms"] - 1,
                   "gap_first_capture": caps[0] / row["chain_ms"] - 1}
        row["schedules"][label] = summary
        h = summary["held_out"]
        print(f"{name}: {label:<9} captures {' '.join(f'{c:.4f}' for c in caps)} ms (spread "
              f"{summary['capture_spread']:.1%}); capture 1 instantiated again {' '.join(f'{c:.4f}' for c in inst)} "
              f"(spread {summary['instance_spread']:.1%}); held out: picked {h['picked']} {h['picked_ms']:.4f} ms, "
              f"{h['gain_vs_first']:+.1%} against capture 1, {h['gain_vs_median']:+.1%} against the median capture; "
              f"screened: {h['screened']} {h['screened_ms']:.4f} ms, {h['screened_gain_vs_median']:+.1%} against "
              "the median capture",
              flush=True)
    best = min(min(s["captures_ms"]) for s in row["schedules"].values())
    firsts = min(s["captures_ms"][0] for s in row["schedules"].values())
    row |= {"best_first_capture_ms": firsts, "best_any_capture_ms": best,
            "gap_first_capture": firsts / row["chain_ms"] - 1, "gap_best_capture": best / row["chain_ms"] - 1}
    print(f"{name}: chain {row['chain_ms']:.4f} ms; best schedule's first capture {firsts:.4f} "
          f"({row['gap_first_capture']:+.1%}), best capture of any {best:.4f} ({row['gap_best_capture']:+.1%})",
          flush=True)
    if args.capturer:
        row["capturer"] = measure_capturer(name, args, Path(args.out) / "cache")
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    model_device_args(parser, "googlenet,inception_v3,nasnet")
    timing_args(parser)
    parser.add_argument("--captures", type=int, default=6, help="captures of each schedule (at least 2)")
    parser.add_argument("--instances", type=int, default=2,
                        help="further instantiations of each schedule's first capture")
    parser.add_argument("--capturer", type=int, default=0, metavar="N",
                        help="also rebuild capturer(kernels='fused') from its cache N times with one capture and N "
                        "times with the default number, and time them side by side")
    parser.add_argument("--instance-flags", default="auto",
                        help=f"comma-separated, taken in turn by the instances: {', '.join(INSTANCE_FLAGS)} (auto: "
                        "PyTorch's flag; upload: the same, uploaded at once; device: instantiated for device launch)")
    parser.add_argument("--trace", action="store_true",
                        help="also replay every variant once under PyTorch's profiler and keep its kernels' timeline")
    parser.add_argument("--cudnn-benchmark", action="store_true",
                        help="cuDNN's benchmark mode from the start (torch.backends.cudnn.benchmark): each "
                        "convolution runs the engine cuDNN times fastest, not the one its heuristics pick")
    parser.add_argument("--schedulers", default="greedy-3,greedy-4,opara",
                        help=f"comma-separated, of: {', '.join(SCHEDULERS)}")
    args = parser.parse_args()
    args.schedulers = args.schedulers.split(",")
    args.instance_flags = args.instance_flags.split(",")
    if any(f not in INSTANCE_FLAGS for f in args.instance_flags):
        parser.error(f"--instance-flags {','.join(args.instance_flags)!r}: accepted: {', '.join(INSTANCE_FLAGS)}")
    unknown = [s for s in args.schedulers if s not in SCHEDULERS]
    if unknown:
        parser.error(f"unknown --schedulers {','.join(unknown)!r} (accepted: {', '.join(SCHEDULERS)})")
    if args.captures < 2 or args.instances < 0 or args.rounds < 4 or args.capturer < 0:
        parser.error(f"--captures {args.captures}, --instances {args.instances}, --rounds {args.rounds}, --capturer "
                     f"{args.capturer}: accepted: at least 2 captures, 0 or more instances, at least 4 rounds (two "
                     "halves), 0 or more capturer builds")
    if args.device != "cuda":
        parser.error(f"--device {args.device!r}: CUDA Graph captures need a GPU (accepted: cuda)")
    models = checked_models(args)
    if args.cudnn_benchmark:  # before any convolution makes its plan (a plan once made is kept, whatever the flag)
        import torch

        torch.backends.cudnn.benchmark = True
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    measure_each(models, experiment_doc("exp_capture_variation.py", args.device),
                 out / "exp_capture_variation.json", lambda name: measure(name, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
