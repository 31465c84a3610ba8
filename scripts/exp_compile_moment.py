"""When the capturer's table times ``torch.compile`` slower than the same callable timed after the build.

On googlenet (batch 1, float32, H100) the fused capturer's table timed its ``torch.compile`` row at 0.726 ms,
while the very same callable, timed a minute later by the same timer and the same interleaved rounds
(``scripts/bench_fused.py``'s ``ms_capturer_timer``), took 0.571 ms, and 0.578 ms by an independent timer;
every other row agreed within 3 %. The timer and the call are the same: the moment differs. This script
times one model's candidates at several moments through the capturer's own timer (``timer=``), each call
with the process's CPU seconds and what Dynamo and Inductor counted meanwhile (recompiles, CUDA Graph
re-recordings and skips), so that a CPU-bound row, a recompiled graph or a CUDA Graph tree that records
again shows:

* ``build``: the capturer's own table (``capturer(..., timer=)``);
* ``after build``: the same baselines and the kept schedule, again in interleaved rounds;
* ``alone``: the ``torch.compile`` baseline timed alone, five times;
* ``fresh``: a new ``torch.compile`` of the model in this process, timed alone, five times;
* ``loaded`` (with ``--load N``): the baselines and the kept result again in interleaved rounds while ``N``
  processes keep ``N`` of the host's cores busy, as a neighbour's compile does;
* with ``--probe``, three more moments after the build, each the interleaved rounds of ``after build`` with one
  thing changed: ``no combo`` (the rows without the ``torch.compile`` + combo module, a second CUDA Graph tree
  of the same process), ``gc frozen`` (``gc.collect(); gc.freeze()`` first: the build's objects leave the
  collector's generations) and ``gc off`` (the collector disabled while a row is timed).

What the host did meanwhile, per entry: the seconds Python's garbage collector ran (``gc_ms_per_call``, by
generation, from ``gc.callbacks``), the CPU seconds of this process's other threads (``other_threads_cpu_s``) and
of its child processes (``children_cpu_s``, Inductor's compile workers), and the host time of the first call of
the entry (``host_first_ms``: the call right after another row's, where a CUDA Graph tree may switch paths),
the time of a fixed pure-Python loop just before the entry (``python_loop_ms``: the host's own speed, whatever
the call does) and the clock of the core the process ran on (``cpu_mhz``, from ``/proc/cpuinfo``). With
``--profile-calls``, each ``torch.compile`` entry also profiles ``number`` calls (cProfile) and keeps the
functions of most own time (``profile``), so that two moments' calls can be compared function by function.

Every entry also records the host's CPU use since the previous entry (all cores, percent) and the host
seconds one call takes to return (``host_ms_per_call``: ``number`` calls without waiting for the GPU): a call
whose host time nears its GPU time becomes as slow as its host when the host's cores are taken.

Each entry also keeps the GPU's SM clock before and after its samples (NVML), so that a GPU that left a long
compile at a low clock shows. ``--cold`` starts from empty Inductor and OpBench caches (new folders under
``--out``), as a first build on a new machine does.

Writes ``OUT/exp_compile_moment.json``.

    PYTHONUNBUFFERED=1 PYTHONPATH=python python3 scripts/exp_compile_moment.py --out out --model googlenet
    PYTHONUNBUFFERED=1 PYTHONPATH=python python3 scripts/exp_compile_moment.py --out out --model googlenet --cold
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from _cli import ROOT, GcWatch

sys.path.insert(0, str(ROOT / "python"))


def counters() -> dict:
    """Dynamo's and Inductor's counters now (a flat copy)."""
    from torch._dynamo.utils import counters as torch_counters

    return {f"{group}.{key}": value for group, c in torch_counters.items() for key, value in c.items()}


def launches(run) -> dict:
    """The CUDA launch calls (and their count) that three calls of ``run`` make, by the profiler."""
    from collections import Counter

    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            run()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    names = Counter(e.name for e in prof.events())
    return {k: v for k, v in names.items() if "aunch" in k or "Graph" in k or "copy" in k.lower()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--model", default="googlenet")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--dtype", default="float32", help="float32, float16 or bfloat16")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--number", type=int, default=20)
    parser.add_argument("--launches", action="store_true",
                        help="after each torch.compile entry, count the CUDA launch calls of three calls (profiler): "
                             "a CUDA Graph replay shows as cudaGraphLaunch, an eager run as one launch per kernel")
    parser.add_argument("--load", type=int, default=0,
                        help="also time the candidates while this many busy processes take the host's cores")
    parser.add_argument("--profile-calls", action="store_true",
                        help="profile each torch.compile entry's calls (cProfile) and keep the top functions")
    parser.add_argument("--probe", action="store_true",
                        help="also time the rounds without the combo row, with the collector frozen and with it off")
    parser.add_argument("--cold", action="store_true",
                        help="empty Inductor and OpBench caches (new folders under --out), as on a new machine")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.cold:  # before torch is imported: Inductor reads its cache folder once
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str((out / "inductor-cache").resolve())
        os.environ["OPBENCH_CACHE"] = str((out / "opbench-cache").resolve())

    import bench_fused
    import psutil
    import torch

    from opbench.parallel import capturer
    from opbench.pipeline.compare import rounds_timer, time_rounds
    from opbench.profile.cuda import _nvml_clock_and_throttle
    from opbench.profile.timer import host_seconds
    from opbench.runtime.graphs import CompiledModel

    bench_fused.DTYPE = args.dtype
    torch.manual_seed(0)
    model, inputs = bench_fused.load(args.model, args.batch)
    base = rounds_timer(True, args.repeat, args.number)
    moment = ["build"]
    log: list[dict] = []

    def clock() -> int | None:
        got = _nvml_clock_and_throttle()
        return got[0] if got else None

    process = psutil.Process()
    main_thread = threading.main_thread().native_id
    collecting = GcWatch()
    gc_off = [False]

    def cpu_of_others() -> tuple[float, float]:
        threads = sum(t.user_time + t.system_time for t in process.threads() if t.id != main_thread)
        children = 0.0
        for child in process.children(recursive=True):
            try:
                times = child.cpu_times()
                children += times.user + times.system
            except psutil.Error:
                pass
        return threads, children

    def python_loop_ms() -> float:
        start = time.perf_counter()
        total = 0
        for i in range(200_000):
            total += i
        return (time.perf_counter() - start) * 1e3

    def cpu_mhz() -> float | None:
        try:
            core = process.cpu_num()
            blocks = Path("/proc/cpuinfo").read_text().split("\n\n")
            for block in blocks:
                fields = dict(line.split(":", 1) for line in block.splitlines() if ":" in line)
                if fields.get("processor\t", "").strip() == str(core):
                    return float(fields["cpu MHz\t\t"])
        except (OSError, KeyError, ValueError, psutil.Error):
            return None
        return None

    def profiled(run) -> list:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        torch.cuda.synchronize()
        profiler.enable()
        for _ in range(args.number):
            run()
        profiler.disable()
        torch.cuda.synchronize()
        stats = pstats.Stats(profiler).stats
        top = sorted(stats.items(), key=lambda kv: -kv[1][2])[:25]
        return [[f"{Path(f).name}:{line}:{name}", calls, own / args.number * 1e3, cum / args.number * 1e3]
                for (f, line, name), (_, calls, own, cum, _) in top]

    def timer(label: str, run):
        loop_ms, mhz = python_loop_ms(), cpu_mhz()
        clocks = [clock()]
        torch.cuda.synchronize()
        first = time.perf_counter()
        run()
        first = time.perf_counter() - first
        torch.cuda.synchronize()
        others = cpu_of_others()
        collected = (list(collecting.seconds), list(collecting.passes))
        if gc_off[0]:
            gc.disable()
        before, cpu, wall = counters(), time.process_time(), time.perf_counter()
        samples = base(label, run)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        host = host_seconds(run, args.number, torch.cuda.synchronize)
        gc.enable()
        others = [b - a for a, b in zip(others, cpu_of_others(), strict=True)]
        clocks.append(clock())
        calls = len(samples) * args.number
        after = counters()
        log.append({"moment": moment[0], "label": label, "median_ms": statistics.median(samples) * 1e3,
                    "samples_ms": [s * 1e3 for s in samples], "wall_ms_per_call": wall / calls * 1e3,
                    "cpu_ms_per_call": cpu / calls * 1e3, "host_ms_per_call": host * 1e3,
                    "host_cpu_percent": psutil.cpu_percent(None), "sm_clock_mhz_before_after": clocks,
                    "host_first_ms": first * 1e3, "python_loop_ms": loop_ms, "cpu_mhz": mhz,
                    "gc_ms_per_call": [(b - a) / (calls + args.number) * 1e3
                                       for a, b in zip(collected[0], collecting.seconds, strict=True)],
                    "gc_collections": [b - a for a, b in zip(collected[1], collecting.passes, strict=True)],
                    "other_threads_cpu_s": others[0], "children_cpu_s": others[1],
                    "threads": sorted(t.name for t in threading.enumerate() if t is not threading.main_thread()),
                    "counters": {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}})
        if args.launches and label.startswith("torch.compile"):
            log[-1]["launches"] = launches(run)
        if args.profile_calls and label.startswith("torch.compile"):
            log[-1]["profile"] = profiled(run)
        return samples

    fused = capturer(inputs, model, kernels="fused", repeat=args.repeat, number=args.number, timer=timer)
    table = [{k: r.get(k) for k in ("schedule", "latency_ms", "kept", "measured")} for r in fused.table]
    compiled = next(b for b in fused.baselines if b.label == "torch.compile")

    def call(f):
        return lambda: f(*inputs)

    moment[0] = "after build"
    rows = [({"schedule": b.label}, call(b)) for b in fused.baselines] + [({"schedule": "capturer"}, call(fused))]
    time_rounds(rows, timer)
    if args.probe:
        moment[0] = "no combo"
        time_rounds([(row, run) for row, run in rows if "combo" not in row["schedule"]], timer)
        moment[0] = "gc frozen"
        gc.collect()
        gc.freeze()
        time_rounds(rows, timer)
        gc.unfreeze()
        moment[0] = "gc off"
        gc_off[0] = True
        time_rounds(rows, timer)
        gc_off[0] = False
    moment[0] = "alone"
    for _ in range(5):
        timer("torch.compile", call(compiled))
    moment[0] = "fresh"
    fresh = CompiledModel(model, inputs)
    for _ in range(5):
        timer("torch.compile", call(fresh))
    if args.load > 0:
        moment[0] = f"loaded ({args.load} busy processes)"
        burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load)]
        try:
            time.sleep(1.0)
            time_rounds(rows, timer)
        finally:
            for proc in burners:
                proc.kill()
                proc.wait()
    summary: dict = {}
    host: dict = {}
    probes: dict = {}
    for entry in log:
        key = f"{entry['moment']} / {entry['label']}"
        summary.setdefault(key, []).append(entry["median_ms"])
        host.setdefault(key, []).append(entry["host_ms_per_call"])
        for name in ("host_first_ms", "other_threads_cpu_s", "children_cpu_s", "python_loop_ms"):
            probes.setdefault(key, {}).setdefault(name, []).append(entry[name])
        probes[key].setdefault("gc_ms_per_call", []).append(sum(entry["gc_ms_per_call"]))
    result = {"model": args.model, "batch": args.batch, "dtype": args.dtype, "device": torch.cuda.get_device_name(0),
              "torch": torch.__version__, "cold": args.cold, "build_s": fused.build_s, "table": table,
              "median_ms": {k: statistics.median(v) for k, v in summary.items()},
              "host_ms_per_call": {k: statistics.median(v) for k, v in host.items()},
              "probes": {k: {name: statistics.median(v) for name, v in p.items()} for k, p in probes.items()},
              "log": log}
    (out / "exp_compile_moment.json").write_text(json.dumps(result, indent=1, default=str))
    for key, value in result["median_ms"].items():
        p = result["probes"][key]
        print(f"{key:<52}{value:9.4f} ms  host {result['host_ms_per_call'][key]:.4f} ms a call, first "
              f"{p['host_first_ms']:.3f}, gc {p['gc_ms_per_call']:.4f} ms a call, other threads "
              f"{p['other_threads_cpu_s']:.3f} s, children {p['children_cpu_s']:.3f} s, "
              f"loop {p['python_loop_ms']:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
