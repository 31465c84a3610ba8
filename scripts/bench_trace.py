"""Measured timelines and stored rows on a GPU: a trace of a model's kept schedule, NVTX ranges, a report.

Runs, each as its own ``opbench`` process with a time limit:

1. ``opbench compare --trace`` for each backend asked (kept schedule and sequential, CUDA events around
   every operator) -> ``DIR/<model>.<backend>.trace.json`` and the compare JSON;
2. ``opbench compare --nvtx`` under ``nsys profile`` when ``nsys`` is installed (else under
   ``torch.profiler`` alone) -> ``DIR/<model>.nsys-rep`` or the profiler's trace;
3. ``opbench collect`` with co-runs -> ``DIR/opbench_gpu.sqlite``, then checks that the rows carry
   percentiles and the run stores the device's figures;
4. ``opbench report --trace`` over that dataset -> ``DIR/report/``.

``DIR/bench_trace.json`` summarises every step (exit codes, wall times, what each trace holds).

    PYTHONPATH=python python3 scripts/bench_trace.py --out DIR [--model googlenet] [--backends torch,tvm]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import sys
import time
from pathlib import Path

from _cli import ROOT, run_opbench


def opbench(args: list[str], env: dict, limit: float, log: Path, wrap: list[str] | None = None) -> dict:
    """One step: its exit code, wall time and the last lines of its output."""
    code, wall, text = run_opbench(args, env, log, limit, wrap)
    return {"exit": code, "wall_s": round(wall, 1), "tail": text.strip().splitlines()[-12:]}


def describe_trace(path: Path) -> dict:
    """What a Chrome trace holds: per schedule, its lanes, operator count, traced total and widest overlap."""
    data = json.loads(path.read_text())
    names = {e["pid"]: e["args"]["name"] for e in data["traceEvents"] if e.get("name") == "process_name"}
    out = {}
    for pid, name in names.items():
        spans = [e for e in data["traceEvents"] if e.get("ph") == "X" and e["pid"] == pid]
        lanes: dict[int, list] = {}
        for s in spans:
            lanes.setdefault(s["tid"], []).append(s)
        points = sorted([(s["ts"], 1) for s in spans] + [(s["ts"] + s["dur"], -1) for s in spans],
                        key=lambda p: (p[0], p[1]))
        depth = widest = 0
        for _, step in points:
            depth += step
            widest = max(widest, depth)
        busy = sum(s["dur"] for s in spans)
        end = max((s["ts"] + s["dur"] for s in spans), default=0.0)
        longest = sorted(spans, key=lambda s: -s["dur"])[:3]
        out[name] = {"operators": len(spans), "distinct_ops": len({s["args"]["op_index"] for s in spans}),
                     "lanes": {str(k): len(v) for k, v in sorted(lanes.items())}, "end_us": round(end, 1),
                     "busy_us": round(busy, 1), "overlap": round(busy / end, 2) if end else None,
                     "widest_overlap": widest,
                     "longest": [{"name": s["name"], "func": s["args"].get("func"), "stream": s["tid"],
                                  "dur_us": s["dur"]} for s in longest]}
    return {"note": data.get("otherData", {}).get("note"), "schedules": out,
            "device": data.get("otherData", {}).get("device")}


def check_rows(db: Path) -> dict:
    """Percentile columns filled and device figures stored with the run."""
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    ops = dict(conn.execute(
        "SELECT COUNT(*) n, SUM(latency_p90_s IS NOT NULL) p90, SUM(latency_p99_s >= latency_p90_s) ordered, "
        "SUM(latency_p10_s <= latency_median_s AND latency_median_s <= latency_p90_s) around_median FROM operators "
        "WHERE status='ok'").fetchone())
    corun = dict(conn.execute("SELECT COUNT(*) n, SUM(concurrent_p90_s IS NOT NULL) p90 FROM corun "
                              "WHERE status='ok'").fetchone())
    models = [dict(r) for r in conn.execute("SELECT model, gpu_name, gpu_uuid, vm_latency_median_s, vm_latency_p90_s, "
                                            "vm_latency_p99_s FROM models")]
    ops["gpu_uuids"] = [r[0] for r in conn.execute("SELECT DISTINCT gpu_uuid FROM operators")]
    env = [json.loads(r[0] or "{}") for r in conn.execute("SELECT env FROM runs")]
    return {"operators": ops, "corun": corun, "models": models,
            "device_figures": [e.get("device_figures") for e in env]}


def main() -> int:
    parser = argparse.ArgumentParser(description="A measured trace, NVTX ranges and a report on a GPU.")
    parser.add_argument("--out", default=os.environ.get("OUT", "out"), help="output folder (default: $OUT or out)")
    parser.add_argument("--model", default="googlenet")
    parser.add_argument("--backends", default="torch,tvm", help="compare backends to trace (default: torch,tvm)")
    parser.add_argument("--corun-limit", type=int, default=60)
    parser.add_argument("--limit", type=float, default=240, help="seconds per step (default: 240)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "bench_trace.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python"), "PYTHONUNBUFFERED": "1"}
    model = ["--modelsource", "local", "--modelname", args.model, "--target", "cuda"]
    summary: dict = {"model": args.model, "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "steps": {}}
    steps = summary["steps"]
    traces = []
    for backend in args.backends.split(","):
        trace = out / f"{args.model}.{backend}.trace.json"
        result = opbench(["compare", *model, "--backend", backend, "--trace", str(trace),
                          "--json", str(out / f"compare.{backend}.json")], env, args.limit, log)
        if trace.exists():
            result["trace"] = describe_trace(trace)
            traces.append(trace)
        steps[f"compare --trace ({backend})"] = result
    nsys = shutil.which("nsys")
    wrap = [nsys, "profile", "--trace", "cuda,nvtx", "--force-overwrite", "true", "-o",
            str(out / f"{args.model}")] if nsys else None
    steps["compare --nvtx"] = opbench(["compare", *model, "--backend", "torch", "--schedulers", "opara", "--nvtx",
                                      "--json", str(out / "compare.nvtx.json")], env, args.limit, log, wrap)
    steps["compare --nvtx"]["nsys"] = nsys
    db = out / "opbench_gpu.sqlite"
    steps["collect"] = opbench(["collect", *model, "--dataset", str(db), "--corun", "--corun-limit",
                                str(args.corun_limit), "--json", str(out / "collect.json")], env, args.limit, log)
    if db.exists():
        steps["collect"]["rows"] = check_rows(db)
        report = ["report", "--dataset", str(db), "--out", str(out / "report"), "--json", str(out / "report.json")]
        if traces:
            report += ["--trace", str(traces[0])]
        steps["report"] = opbench(report, env, args.limit, log)
    (out / "bench_trace.json").write_text(json.dumps(summary, indent=2, default=str))
    print(json.dumps(summary, indent=1, default=str)[-6000:])
    return 0 if all(s["exit"] in (0, 3) for s in steps.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
