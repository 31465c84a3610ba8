"""Why the capturer's own rows of ``torch.compile`` differ from a later timing of the same module at batch 1.

At batch 1 a ``torch.compile(mode="reduce-overhead")`` module is bound by the host: a call takes 0.35-0.72 ms of
the CPU's time against 0.32-0.45 ms of the GPU's, and the host's time for the same call changed by up to 1.7x
between the capturer's build, which times it first, and a timing at the end of the same process. This script
looks at what else uses the CPU while the host-bound rows are timed.

``scripts/exp_compile_moment.py`` found the host itself slower during the build (a fixed pure-Python loop took
1.5-3x as long), with no other thread, child process or garbage collection busy. This script follows the host's
speed over time after the build, and records what could slow one core that runs all the time: the memory's
placement (NUMA hinting faults and page migrations of the kernel's automatic balancing, the process's page
faults), the container's CPU quota (throttled periods) and the main thread's time in the kernel.

For each model it builds the capturer in new processes, one after the other, each from an empty capturer cache
(as ``scripts/bench_fused.py``'s measured run does, so that each build times its baselines), the first also with
Inductor's caches as they are: first one to fill Inductor's caches, then ``--reps`` in each variant (as shipped;
Inductor with one compile thread, so without its pool of compile workers; the process kept on the CPUs of the
GPU's NUMA node from its start, where the machine has more than one node). In each process every timing of the
capturer (each call of ``opbench.pipeline.compare.time_rounds``, in the build and after it) is a *window*, which
records each row's latency, host and device ms, the time of a fixed pure-Python loop just before it (the host's
own speed), and what ran meanwhile: the CPU seconds of the main thread (user and kernel) and of each other thread
of this process (by name), of its child processes and of the whole machine, the garbage collector's passes, the
process's page faults and context switches, the machine's NUMA hinting faults and migrated pages, and the
container's throttled periods. After the build the baselines and the kept schedule are timed again at
``--moments`` seconds after the build's end, interleaved as in the build, and ``torch.compile`` alone. The
machine's layout (NUMA nodes, the GPU's node, automatic NUMA balancing, transparent huge pages, the CPU quota)
goes with each process. Writes ``OUT/exp_host_drift.json`` after every process.

    PYTHONUNBUFFERED=1 PYTHONPATH=python python3 scripts/exp_host_drift.py --out out --models mobilenet_v3_large
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

from _cli import GcWatch, as_child, bad_input, checked_models, in_child, measure_models, model_device_args
from bench_fused import stem

#: the processes after the first: the environment each adds (``one NUMA node``: see :func:`pin_to_gpu_node`)
VARIANTS = {"as shipped": {}, "one compile thread": {"TORCHINDUCTOR_COMPILE_THREADS": "1"}, "one NUMA node": {}}
#: iterations of the fixed pure-Python loop that gauges the host's speed before each window
LOOP = 200_000


def read(path: str) -> str | None:
    """A kernel file's text, stripped; None where it cannot be read."""
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def counters() -> dict[str, float]:
    """Machine and process counters a window differs by: NUMA hinting faults and migrated pages (``/proc/vmstat``),
    the container's throttled periods and seconds (cgroup ``cpu.stat``), the process's minor and major page
    faults (``/proc/self/stat``)."""
    out: dict[str, float] = {}
    for line in (read("/proc/vmstat") or "").splitlines():
        name, _, value = line.partition(" ")
        if name in ("numa_hint_faults", "numa_hint_faults_local", "numa_pages_migrated", "pgmigrate_success",
                    "thp_collapse_alloc"):
            out[name] = float(value)
    for path in ("/sys/fs/cgroup/cpu.stat", "/sys/fs/cgroup/cpu/cpu.stat", "/sys/fs/cgroup/cpu,cpuacct/cpu.stat"):
        for line in (read(path) or "").splitlines():
            name, _, value = line.partition(" ")
            if name in ("nr_periods", "nr_throttled", "throttled_usec", "throttled_time"):
                out[name] = float(value)
    stat = (read("/proc/self/stat") or "").rpartition(")")[2].split()
    if len(stat) > 10:
        out["minor_faults"], out["major_faults"] = float(stat[7]), float(stat[9])
    return out


def gpu_node() -> int | None:
    """The NUMA node of the first GPU the process sees (from the PCI bus id); None where unknown."""
    import torch

    try:
        props = torch.cuda.get_device_properties(0)
        bus = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    except (AttributeError, RuntimeError, AssertionError):  # no GPU, or a torch without these properties
        return None
    node = read(f"/sys/bus/pci/devices/{bus}/numa_node")
    return int(node) if node is not None and int(node) >= 0 else None


def node_cpus(node: int) -> set[int]:
    """The CPUs of NUMA node ``node`` (its ``cpulist``: ranges such as 0-15,32-47)."""
    cpus: set[int] = set()
    for part in (read(f"/sys/devices/system/node/node{node}/cpulist") or "").split(","):
        if part:
            low, _, high = part.partition("-")
            cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def layout() -> dict[str, Any]:
    """The machine's NUMA nodes, the GPU's node, automatic NUMA balancing, transparent huge pages, the container's
    CPU quota, and the CPUs this process may run on."""
    nodes = sorted(int(p.name[4:]) for p in Path("/sys/devices/system/node").glob("node[0-9]*"))
    return {"numa_nodes": nodes, "gpu_node": gpu_node(), "numa_balancing": read("/proc/sys/kernel/numa_balancing"),
            "transparent_hugepage": read("/sys/kernel/mm/transparent_hugepage/enabled"),
            "cpu_max": read("/sys/fs/cgroup/cpu.max"), "affinity": len(os.sched_getaffinity(0)),
            "cpus": os.cpu_count()}


def pin_to_gpu_node() -> str:
    """Keep this process (and the threads it starts) on the CPUs of the GPU's NUMA node, so that the memory it
    touches first is that node's; what was done, in words."""
    info = layout()
    if len(info["numa_nodes"]) < 2:
        return f"not pinned: {len(info['numa_nodes'])} NUMA node"
    node = info["gpu_node"] if info["gpu_node"] is not None else info["numa_nodes"][0]
    cpus = node_cpus(node) & os.sched_getaffinity(0)
    if not cpus:
        return f"not pinned: no CPU of node {node} allowed"
    os.sched_setaffinity(0, cpus)
    return f"pinned to node {node} ({len(cpus)} CPUs)"


def python_loop_ms() -> float:
    """The time of a fixed pure-Python loop (:data:`LOOP` iterations), ms: the host's own speed."""
    clock = time.perf_counter()
    total = 0
    for i in range(LOOP):
        total += i & 7
    return (time.perf_counter() - clock) * 1e3
#: the row whose host time drifted
COMPILE_ROW = "torch.compile"


class Windows:
    """Records what the process and the machine did during each timing (a window)."""

    def __init__(self) -> None:
        import psutil

        self.proc = psutil.Process()
        self.start = time.perf_counter()
        self.windows: list[dict[str, Any]] = []
        self.when = "build"
        self.gc = GcWatch()

    def _snapshot(self) -> dict[str, Any]:
        import psutil

        names = {t.native_id: t.name for t in threading.enumerate()}
        threads = {}
        for t in self.proc.threads():
            try:
                comm = Path(f"/proc/self/task/{t.id}/comm").read_text().strip()
            except OSError:
                comm = "?"
            threads[t.id] = (names.get(t.id, comm), t.user_time + t.system_time, t.system_time)
        children = {}
        for child in self.proc.children(recursive=True):
            try:
                cpu = child.cpu_times()
                children[child.pid] = (" ".join(child.cmdline()[1:4])[:80], cpu.user + cpu.system)
            except psutil.Error:
                pass
        machine, own, switches = psutil.cpu_times(), self.proc.cpu_times(), self.proc.num_ctx_switches()
        return {"t": time.perf_counter(), "threads": threads, "children": children, "counters": counters(),
                "switches": (switches.voluntary, switches.involuntary),
                "process_cpu": own.user + own.system, "reaped_cpu": own.children_user + own.children_system,
                "machine_busy": machine.user + machine.system + machine.nice, "machine_all": sum(machine),
                "gc_s": sum(self.gc.seconds), "gc_passes": list(self.gc.passes)}

    def around(self, timed: Any, call: Any) -> None:
        """``call()`` (a timing of the rows of ``timed``) as one window."""
        main = threading.main_thread().native_id
        loop_ms = python_loop_ms()
        before = self._snapshot()
        call()
        after = self._snapshot()
        seconds = after["t"] - before["t"]
        main_cpu = after["threads"][main][1] - before["threads"][main][1]
        was = before["threads"]
        others = sorted(((n, cpu - was.get(tid, ("", 0.0, 0.0))[1]) for tid, (n, cpu, _) in after["threads"].items()
                         if tid != main), key=lambda x: -x[1])
        children = sorted(((name, cpu - before["children"].get(pid, ("", 0.0))[1])
                           for pid, (name, cpu) in after["children"].items()), key=lambda x: -x[1])
        busy = after["machine_busy"] - before["machine_busy"]
        every = after["machine_all"] - before["machine_all"]
        self.windows.append({
            "when": self.when, "at_s": before["t"] - self.start, "seconds": seconds,
            "rows": {row["schedule"]: {k: row.get(k) for k in ("latency_ms", "host_ms", "device_ms")}
                     for row, _ in timed},
            "python_loop_ms": loop_ms,
            "main_cpu_s": main_cpu,
            "main_kernel_s": after["threads"][main][2] - before["threads"][main][2],
            "counters": {k: v - before["counters"].get(k, 0.0) for k, v in after["counters"].items()},
            "voluntary_switches": after["switches"][0] - before["switches"][0],
            "involuntary_switches": after["switches"][1] - before["switches"][1],
            # ended threads and ended child processes count too (in the process's and its reaped children's times)
            "other_threads_cpu_s": after["process_cpu"] - before["process_cpu"] - main_cpu,
            "busiest_threads": [(n, c) for n, c in others[:4] if c > 0],
            "children": len(after["children"]), "children_cpu_s": sum(c for _, c in children)
            + after["reaped_cpu"] - before["reaped_cpu"],
            "busiest_children": [(n, c) for n, c in children[:3] if c > 0],
            "machine_busy_share": busy / every if every else None,
            "gc_s": after["gc_s"] - before["gc_s"],
            "gc_passes": [a - b for a, b in zip(after["gc_passes"], before["gc_passes"], strict=True)]})


def probe(name: str, args: Any, variant: str) -> dict[str, Any]:
    """One build of ``name`` in ``variant`` (:data:`VARIANTS`, or "first") in this new process, from an empty
    capturer cache, every timing of the capturer a window; then the timings after the build."""
    pinned = pin_to_gpu_node() if variant == "one NUMA node" else None  # before torch starts its threads
    import bench_fused
    import torch

    from opbench.parallel import capturer
    from opbench.pipeline import compare

    windows = Windows()
    time_rounds = compare.time_rounds

    def recorded(timed, timer, rounds=compare.ROUNDS, host=None, device=None):
        windows.around(timed, lambda: time_rounds(timed, timer, rounds, host, device))

    compare.time_rounds = recorded
    bench_fused.DTYPE = args.dtype
    torch.manual_seed(0)
    model, inputs = bench_fused.load(name, args.batch)
    clock = time.perf_counter()
    run = capturer(inputs, model, kernels="fused", cache=True)
    built = time.perf_counter()
    kept = next(r for r in run.table if r["kept"])
    calls = {b.label: (lambda b=b: b(*inputs)) for b in run.baselines}
    calls[f"kept: {kept['schedule']}"] = lambda: run(*inputs)
    timer = compare.rounds_timer(True, 10, 20)
    host, device = compare.call_clocks(True, 20)
    for moment in args.moments:
        time.sleep(max(0.0, built + moment - time.perf_counter()))
        windows.when = f"after {moment:g} s"
        recorded([({"schedule": label}, call) for label, call in calls.items()], timer, host=host, device=device)
        if COMPILE_ROW in calls:
            windows.when = f"after {moment:g} s, {COMPILE_ROW} alone"
            recorded([({"schedule": COMPILE_ROW}, calls[COMPILE_ROW])], timer, host=host, device=device)
    return {"variant": variant, "build_s": built - clock, "kept": kept["schedule"], "pinned": pinned,
            "layout": layout(), "windows": windows.windows}


def in_new_process(name: str, args: Any, variant: str, cache: Path) -> dict[str, Any]:
    """:func:`probe` in a process of its own, ``$OPBENCH_CACHE`` at ``cache`` (emptied first: the build searches
    and times its candidates), with the variant's environment."""
    import shutil

    shutil.rmtree(cache, ignore_errors=True)
    flags = ["--models", name, "--batch", str(args.batch), "--dtype", args.dtype, "--moments",
             ",".join(f"{m:g}" for m in args.moments)]
    env = dict(os.environ, OPBENCH_CACHE=str(cache), **VARIANTS.get(variant, {}))
    return in_child(__file__, args, variant, flags, env)


def compile_host_ms(got: dict[str, Any]) -> dict[str, float]:
    """``torch.compile``'s host ms a call in each window of one process (the build's: its last)."""
    return {w["when"]: w["rows"][COMPILE_ROW]["host_ms"] for w in got.get("windows", [])
            if COMPILE_ROW in w["rows"] and w["rows"][COMPILE_ROW].get("host_ms") is not None}


def measure(name: str, args: Any, save: Any) -> dict[str, Any]:
    """The first build of ``name``, then ``--reps`` builds from the cache in each variant; ``save(row)`` after
    every process."""
    cache = Path(args.out) / "cache" / stem(name, args.batch, args.dtype)
    processes: list[dict[str, Any]] = []
    row = {"model": name, "batch": args.batch, "dtype": args.dtype, "processes": processes}
    names = list(VARIANTS)
    order = ["first"] + [v for r in range(args.reps) for v in names[r % len(names):] + names[:r % len(names)]]
    for variant in order:
        processes.append(in_new_process(name, args, variant, cache))
        save(row)
        got = processes[-1]
        print(f"{name}: {variant:<20} {got.get('pinned') or ''} {got.get('layout', '')}", flush=True)
        print(f"{name}: {variant:<20} build {got.get('build_s', float('nan')):5.1f} s, {COMPILE_ROW} host ms: "
              + ", ".join(f"{k} {v:.3f}" for k, v in compile_host_ms(got).items()) + f" {got.get('error', '')}",
              flush=True)
        for w in got.get("windows", []):
            print(f"   {w['when']:<34} {w['seconds']:5.2f} s  loop {w['python_loop_ms']:5.1f} ms  main "
                  f"{w['main_cpu_s']:5.2f} (kernel {w['main_kernel_s']:4.2f})  other threads "
                  f"{w['other_threads_cpu_s']:5.2f} {w['busiest_threads'][:2]}  children {w['children']} "
                  f"{w['children_cpu_s']:5.2f}  machine {w['machine_busy_share'] or 0:.2f}  gc {w['gc_s']:.3f}  "
                  + " ".join(f"{k} {v:g}" for k, v in w["counters"].items() if v), flush=True)
    summary = {}
    for variant in VARIANTS:
        done = [compile_host_ms(g) for g in processes if g.get("variant") == variant and "error" not in g]
        if done:
            summary[variant] = {when: statistics.median(d[when] for d in done if when in d) for when in done[0]}
    return row | {"summary": summary}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    model_device_args(parser, "mobilenet_v3_large")
    parser.add_argument("--reps", type=int, default=1, help="builds from the cache in each variant")
    parser.add_argument("--moments", default="0,5,15",
                        help="seconds after the build's end at which the rows are timed again, comma-separated")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a process may take")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    try:
        args.moments = sorted(float(m) for m in args.moments.split(",") if m.strip())
    except ValueError:
        bad_input(f"--moments {args.moments!r}: accepted: seconds, comma-separated, e.g. 0,5,15")
    if args.child is not None:  # one build, in this new process
        return as_child(args, lambda: probe(args.models, args, args.child))
    if args.reps < 1 or args.timeout <= 0 or not args.moments or args.moments[0] < 0:
        bad_input(f"--reps {args.reps}, --timeout {args.timeout}, --moments {args.moments}: accepted: 1 or more "
                  "builds, a positive timeout, one or more moments of 0 s or later")
    if args.device != "cuda":
        bad_input(f"--device {args.device!r}: the capturer's timings need a GPU (accepted: cuda)")
    measure_models("exp_host_drift.py", args, checked_models(args), lambda name, save: measure(name, args, save))
    return 0


if __name__ == "__main__":
    sys.exit(main())
