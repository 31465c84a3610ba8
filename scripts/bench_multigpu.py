"""Scaling over the GPUs of one host: a sweep and a tuning run on 1 device and on N, timed side by side.

A. The same sweep (models x batch sizes, one dtype) with ``opbench collect --devices 0`` and with
   ``--devices 0,1,...``: wall time of each, the speedup, and checks of the rows (every point's rows
   present once, each point's rows tagged with the GPU UUID, name and clocks of the GPU that measured it).
B. Tuning of one model through a local TVM RPC tracker with one ``tvm.exec.rpc_server`` per GPU (each
   with ``CUDA_VISIBLE_DEVICES`` set, all with one key: :class:`opbench.profile.rpc.LocalFarm`), on 1
   server and on N: trials per second of each, and the sessions each server served.
C. ``opbench sample`` of one job of the shipped collection (``scripts/collect_records.py``'s ``PLAN``,
   resumed from ``--records``) with ``--devices 0`` and then with all the devices, ``--sample-seconds``
   each: stored records per second (whole run and steady state), the builders' and each device's busy
   fraction, the records each GPU (UUID) measured. ``--builders-per-device N`` gives each phase N
   builders per measuring device (a one-GPU machine's share of the cores); 0 lets every core build in
   both. The working dataset is packed into ``DIR/records.tar`` (the records folder, new records included).

With ``--target llvm`` the "devices" are CPU workers on disjoint cores (A) and CPU servers (B), which
checks the code path on any machine. Writes ``DIR/bench_multigpu.json``.

    PYTHONPATH=python python3 scripts/bench_multigpu.py --out DIR --devices 0,1 \\
        --models googlenet,resnet-18,resnet-50,mobilenet,squeezenet_v1.1,inception_v3 --batches 1,8
    PYTHONPATH=python python3 scripts/bench_multigpu.py --out DIR --parts c --builders-per-device 15
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import time
from pathlib import Path

from _cli import ROOT, run_opbench

sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def sweep_rows(db: Path) -> dict:
    """What the sweep's dataset holds: rows per point, duplicates, and the GPU tags of each point."""
    if not db.exists():
        return {"error": "no dataset"}
    with sqlite3.connect(db) as conn:
        ops = conn.execute("SELECT model, batch_size, COUNT(*), COUNT(DISTINCT op_index) FROM operators "
                           "GROUP BY workload_id ORDER BY model, batch_size").fetchall()
        models = conn.execute("SELECT model, batch_size, gpu_uuid, gpu_name, gpu_clock_start_mhz, gpu_clock_end_mhz, "
                              "thread_settings, vm_latency_median_s FROM models ORDER BY model, batch_size").fetchall()
        mixed = conn.execute("SELECT COUNT(*) FROM operators o JOIN models m ON o.workload_id = m.workload_id AND "
                             "o.device_id = m.device_id AND o.config = m.config AND "
                             "o.l2_flush = m.l2_flush WHERE o.gpu_uuid IS NOT m.gpu_uuid").fetchone()[0]
    return {"points": [{"model": m, "batch": b, "rows": n, "distinct_ops": d} for m, b, n, d in ops],
            "duplicated_rows": sum(n - d for _, _, n, d in ops),
            "rows_tagged_with_another_gpu_than_their_model_row": mixed,
            "models": [{"model": m, "batch": b, "gpu_uuid": u, "gpu_name": g, "clock_start_mhz": c0,
                        "clock_end_mhz": c1, "threads": t, "vm_ms": (v or 0) * 1e3}
                       for m, b, u, g, c0, c1, t, v in models]}


def point_phases(out: Path, tag: str) -> dict:
    """Where the sweep's points spent their time, summed over the points (each point's ``phases_s`` and
    ``process_s`` from its ``--json``; the rest of ``process_s`` is start-up), and each point's own."""
    points = []
    for state in out.glob(f"{tag}.sweep-*.json"):
        for record in json.loads(state.read_text()).get("points", {}).values():
            summary = record.get("summary") or {}
            phases = dict(summary.get("phases_s") or {})
            if phases and summary.get("process_s") is not None:
                phases["startup"] = summary["process_s"] - sum(phases.values())
            points.append({"model": record.get("model"), "batch": record.get("batch"), "seconds": record.get("seconds"),
                           "phases_s": {k: round(v, 2) for k, v in phases.items()}})
    totals: dict[str, float] = {}
    for point in points:
        for phase, seconds in point["phases_s"].items():
            totals[phase] = round(totals.get(phase, 0.0) + seconds, 1)
    return {"phases_s": totals, "point_phases": points}


def part_a(args: argparse.Namespace, devices: list[str], out: Path, env: dict[str, str]) -> dict:
    result: dict = {}

    def collect(models: str, batches: str, subset: list[str], tag: str) -> tuple[int | str, float]:
        argv = ["collect", "--modelsource", "local", "--modelname", models, "--batchsize", batches, "--dtype",
                args.dtype, "--target", args.target, "--devices", ",".join(subset), "--dataset",
                str(out / f"{tag}.sqlite"), "--json", str(out / f"{tag}.json"), "-q"]
        code, wall, _ = run_opbench(argv, env, out / f"{tag}.log", args.limit)
        return code, wall

    if args.warmup:  # fill what the first sweep would otherwise pay alone (imports, the compiler's header cache)
        model = args.models.split(",")[-1]
        code, wall = collect(model, "1", devices[:1], "warmup")
        result["warmup"] = {"model": model, "exit": code, "wall_s": round(wall, 1)}
    runs = {"1": ("1", devices[:1]), "N": (str(len(devices)), devices)}
    for label, subset in (runs[key] for key in args.order.split(",")):
        db = out / f"sweep_{label}.sqlite"
        code, wall = collect(args.models, args.batches, subset, f"sweep_{label}")
        result[f"{label} device{'s' if label != '1' else ''}"] = {
            "exit": code, "wall_s": round(wall, 1), **sweep_rows(db), **point_phases(out, f"sweep_{label}")}
    result["order"] = args.order
    one, many = result.get("1 device", {}).get("wall_s"), result.get(f"{len(devices)} devices", {}).get("wall_s")
    result["speedup"] = round(one / many, 3) if one and many else None
    return result


def part_b(args: argparse.Namespace, devices: list[str], out: Path, env: dict[str, str]) -> dict:
    from opbench.profile.rpc import LocalFarm

    result: dict = {}
    cpu = args.target == "llvm"
    target = args.target
    if not cpu:  # a remote GPU's architecture is not read through RPC: name this host's (its servers' GPUs)
        import torch

        major, minor = torch.cuda.get_device_capability(int(devices[0]))
        target = json.dumps({"kind": "cuda", "arch": f"sm_{major}{minor}"})
    for label, subset in (("1", devices[:1]), (str(len(devices)), devices)):
        tag = f"tune_{label}"
        servers = [None if cpu else d for d in subset]
        with LocalFarm("bench", servers, out / f"{tag}_farm") as farm:
            argv = ["collect", "--modelsource", "local", "--modelname", args.tune_model, "--dtype", args.dtype,
                    "--target", target, "--dataset", str(out / f"{tag}.sqlite"), "--iftune", "true", "--tuner",
                    args.tuner, "--trials", str(args.trials), "--tune-tasks", str(args.tasks), "--rpc-tracker",
                    farm.address, "--rpc-key", "bench", "--json", str(out / f"{tag}.json")]
            code, wall, _ = run_opbench(argv, env, out / f"{tag}.log", args.limit)
            sessions = farm.sessions()
        tuning = {}
        try:
            tuning = json.loads((out / f"{tag}.json").read_text()).get("tuning") or {}
        except (OSError, ValueError):
            pass
        result[f"{label} server{'s' if label != '1' else ''}"] = {
            "exit": code, "wall_s": round(wall, 1), "trials": tuning.get("trials"),
            "tuning_s": tuning.get("tuning_s"), "trials_per_s": tuning.get("trials_per_s"),
            "sessions_per_server": sessions}
    rates = [v.get("trials_per_s") for v in result.values()]
    result["speedup"] = round(rates[1] / rates[0], 3) if all(rates) else None
    return result


def _by_gpu(dataset: Path, run_id: int | None) -> dict[str, int]:
    """Records of one run per GPU UUID that measured them."""
    if run_id is None or not dataset.exists():
        return {}
    with sqlite3.connect(dataset) as conn:
        return {str(u): n for u, n in conn.execute("SELECT gpu_uuid, COUNT(*) FROM trials WHERE run_id=? "
                                                     "GROUP BY gpu_uuid", (run_id,))}


def part_c(args: argparse.Namespace, devices: list[str], out: Path, env: dict[str, str]) -> dict:
    from bench_sample import _quality, _rows
    from collect_records import count, job_config, pack_into, prepare

    dataset = Path(args.sample_dataset)
    result: dict = {"job": args.sample_job, "seconds": args.sample_seconds, "unpacked": prepare(dataset,
                                                                                                 Path(args.records))}
    phases = [(str(len(d.split(","))), d.split(","), int(b)) for d, b in
              (item.split(":") for item in args.sample_phases.split())] if args.sample_phases else \
        [(label, subset, args.builders_per_device * len(subset))
         for label, subset in (("1", devices[:1]), (str(len(devices)), devices))]
    for label, subset, builders in phases:
        tag = f"sample_{label}_{builders}"
        job = job_config(args.sample_job, dataset, args.per_task, [int(d) for d in subset], builders)
        if args.target != "cuda":
            job["target"] = args.target
        (out / f"{tag}.job.json").write_text(json.dumps(job))
        before = count(dataset)
        code, wall, _ = run_opbench(["sample", "--config", str(out / f"{tag}.job.json"), "--time-limit",
                                     str(args.sample_seconds), "--json", str(out / f"{tag}.json"), "-q"], env,
                                    out / f"{tag}.log", args.limit)
        summary: dict = {}
        try:
            summary = json.loads((out / f"{tag}.json").read_text())
        except (OSError, ValueError):
            pass
        run_id = summary.get("run_id")
        rows = _rows(dataset, run_id) if run_id is not None else []
        result[f"{label} device{'s' if label != '1' else ''}, {builders or 'all'} builders"] = {
            "devices": subset, "exit": code, "wall_s": round(wall, 1), "builders": summary.get("builders"),
            "stored": count(dataset) - before, "records_per_s": summary.get("records_per_s"),
            "builder_busy": summary.get("builder_busy"), "device_busy": summary.get("device_busy"),
            "seconds": summary.get("seconds"), "by_gpu_uuid": _by_gpu(dataset, run_id), **_quality(rows)}
    done = [v for k, v in result.items() if k.endswith("builders")]
    rates = [p.get("steady_records_per_s") for p in done[:2]]
    result["speedup_steady"] = round(rates[1] / rates[0], 3) if len(rates) == 2 and all(rates) else None
    runs = [p.get("records_per_s") for p in done[:2]]
    result["speedup_run"] = round(runs[1] / runs[0], 3) if len(runs) == 2 and all(runs) else None
    if args.target == "cuda":
        result["records"] = pack_into(dataset, out)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description="A sweep and a tuning run on 1 device and on several, side by side.")
    parser.add_argument("--out", default=os.environ.get("OUT", "out"), help="output folder (default: $OUT or out)")
    parser.add_argument("--target", default="cuda", choices=["cuda", "llvm"])
    parser.add_argument("--devices", default="0,1", help="GPU indices (CPU: worker numbers) (default: 0,1)")
    parser.add_argument("--models", default="googlenet,resnet-18,resnet-50,mobilenet,squeezenet_v1.1,inception_v3")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--tune-model", default="resnet-18")
    parser.add_argument("--tuner", default="xgb")
    parser.add_argument("--trials", type=int, default=32, help="trials per task (default: 32)")
    parser.add_argument("--tasks", type=int, default=4, help="tasks tuned (default: the 4 heaviest)")
    parser.add_argument("--order", default="1,N", choices=["1,N", "N,1", "1", "N"],
                        help="part a: the sweeps to run, in order (1: the first device, N: all); a single one "
                        "lets each run in its own command (default: 1,N)")
    parser.add_argument("--warmup", action="store_true",
                        help="part a: collect the last model at batch 1 once before the sweeps, so that the first "
                        "sweep does not pay alone for cold caches")
    parser.add_argument("--parts", default="a,b,c", help="a (sweep), b (tuning), c (sampling), comma-separated "
                        "(default: a,b,c)")
    parser.add_argument("--sample-job", type=int, default=3, help="the job of collect_records.PLAN that part c "
                        "samples (default: 3, the zoo at float32)")
    parser.add_argument("--sample-seconds", type=float, default=170, help="part c: --time-limit of each phase")
    parser.add_argument("--builders-per-device", type=int, default=0,
                        help="part c: builders per measuring device (default 0: every core builds in both phases)")
    parser.add_argument("--sample-phases", default=None, metavar="'DEVS:BUILDERS ...'",
                        help="part c: its phases, e.g. '0:15 0,1:30 0:30' (default: the first device, then all, "
                        "with --builders-per-device builders per device); speedups compare the first two")
    parser.add_argument("--per-task", type=int, default=16, help="part c: candidates per task (default: 16)")
    parser.add_argument("--records", default=str(ROOT / "data" / "dataset"), help="part c: the records folder "
                        "its working dataset starts from")
    parser.add_argument("--sample-dataset", default="/tmp/opbench-records/records.sqlite",
                        help="part c: the working dataset (resumed when it exists)")
    parser.add_argument("--limit", type=float, default=1800, help="seconds per opbench command (default: 1800)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    devices = [d.strip() for d in args.devices.split(",") if d.strip()]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python"), "PYTHONUNBUFFERED": "1"}
    summary: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "target": args.target, "devices": devices,
                     "models": args.models, "batches": args.batches, "dtype": args.dtype}
    if "a" in args.parts:
        summary["sweep"] = part_a(args, devices, out, env)
    if "b" in args.parts:
        summary["tuning"] = {"model": args.tune_model, "tuner": args.tuner, "trials_per_task": args.trials,
                             "tasks": args.tasks, **part_b(args, devices, out, env)}
    if "c" in args.parts:
        summary["sampling"] = part_c(args, devices, out, env)
    name = "bench_multigpu.json" if args.parts == "a,b,c" else f"bench_multigpu_{args.parts.replace(',', '')}.json"
    (out / name).write_text(json.dumps(summary, indent=1, default=str) + "\n")
    print(json.dumps({k: v.get("speedup", v.get("speedup_steady")) if isinstance(v, dict) else v
                      for k, v in summary.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
