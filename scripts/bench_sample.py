"""Sampling benchmark: stored tensor-program records per second with ``opbench sample``.

Each phase runs the ``opbench sample`` command a user runs (``--json`` for its summary) and reads the rows
it stored, then writes one JSON summary to ``--out``:

* ``compilers``: the same tasks sampled with ``--cuda-compiler nvcc``, ``nvrtc`` and ``nvrtc-pch``, side by
  side: build seconds per candidate, records per second, the share of builds that hit the timeout;
* ``compile`` (no GPU needed, NVRTC and CUDA's headers are): the CUDA sources of ``--count`` stored float16
  candidates of ``--records`` compiled by TVM's own NVRTC callback and by the ``nvrtc-pch`` one that
  builders register, interleaved in one process: seconds per candidate and whether each kernel's PTX is the
  same (but for unused header constants);
* ``before-after``: records per second of a tuning run (``opbench collect --iftune true --trials N``, the
  only way to get schedule records before ``opbench sample``) and of ``opbench sample`` on the same model,
  one after the other: trial rows stored over the command's wall time;
* ``timers``: the same candidates (one seed) of ``--models`` timed by ``time_evaluator`` (``--timer
  evaluator``) and then from CUDA Graph replays (``--timer graph``) into one dataset: per timer, the share of
  records with a repeat spread of at most 3 % by kernel time, records per second, and per candidate the ratio
  of the two medians and how often the two timers order a task's candidates alike;
* ``memo`` (no GPU needed): ``--count`` stored tasks of ``--records``, drawn at random in proportion to
  the sampling seconds each took in the collection (where the samplers' time went), each sampled for
  ``--per-task`` candidates by ``opbench.tune.sampler.sample_task`` (what the sampler's workers call) with the
  memo of trace outcomes and without it, the first of each pair alternating: seconds per task, in all, and
  whether the two runs keep the same candidates in the same order with the same counts;
* ``main``: the tasks of ``--models`` (``source:name`` items) at ``--dtypes``: records per second over the
  whole run and in steady state (from the 10th percentile of the rows' ``measured_at`` to the last), where
  the time went, how busy builders and each device were, the share of records whose repeat spread is at
  most 3 %, and the audit's median and p95 relative difference.

    PYTHONPATH=python python3 scripts/bench_sample.py --phase compilers --out DIR
    PYTHONPATH=python python3 scripts/bench_sample.py --phase compile --count 60 --out DIR
    PYTHONPATH=python python3 scripts/bench_sample.py --phase memo --count 40 --per-task 16 --out DIR
    PYTHONPATH=python python3 scripts/bench_sample.py --phase main --models local:resnet-50,transformers:bert \
        --dtypes float32,float16 --time-limit 240 --out DIR
    PYTHONPATH=python python3 scripts/bench_sample.py --phase main --target llvm --models simple:matmul:n=128 \
        --dtypes float32 --per-task 8 --out DIR   # a CPU check
    PYTHONPATH=python python3 scripts/bench_sample.py --phase timers --models local:resnet-18 --dtypes float16 \
        --tasks 8 --per-task 16 --out DIR
    PYTHONPATH=python python3 scripts/bench_sample.py --phase before-after --target llvm \
        --models local:resnet-18 --tasks 4 --per-task 16 --out DIR
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sqlite3
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cli import run_opbench  # noqa: E402


def _rows(dataset: Path, since_run: int | None = None) -> list[dict]:
    with sqlite3.connect(dataset) as conn:
        conn.row_factory = sqlite3.Row
        where = "tuner='sample'" + (f" AND run_id={int(since_run)}" if since_run is not None else "")
        return [dict(r) for r in conn.execute(f"SELECT build_status, spread, measured_at, build_s, audit_secs, "
                                               f"latency_median_s, dtype FROM trials WHERE {where} ORDER BY id")]


def _steady(rows: list[dict]) -> float | None:
    """Records per second from the 10th percentile of the rows' times to the last."""
    times = sorted(datetime.datetime.fromisoformat(r["measured_at"]).timestamp() for r in rows if r["measured_at"])
    if len(times) < 20:
        return None
    k = len(times) // 10
    span = times[-1] - times[k]
    return (len(times) - 1 - k) / span if span > 0 else None


def _quality(rows: list[dict]) -> dict:
    ok = [r for r in rows if r["build_status"] == "ok"]
    spreads = [r["spread"] for r in ok if r["spread"] is not None]
    return {"rows": len(rows), "ok": len(ok),
            "spread_le_3pct": sum(s <= 0.03 for s in spreads) / len(spreads) if spreads else None,
            "spread_median": statistics.median(spreads) if spreads else None,
            "by_status": {s: sum(r["build_status"] == s for r in rows) for s in sorted({r["build_status"]
                                                                                        for r in rows})},
            "steady_records_per_s": _steady(rows)}


def _sample(args: argparse.Namespace, work: Path, name: str, extra: list[str], log: Path) -> dict:
    dataset = work / f"{name}.sqlite"
    summary_file = work / f"{name}.json"
    cmd = ["sample", "--target", args.target, "--per-task", str(args.per_task), "--dataset", str(dataset),
           "--json", str(summary_file), *extra]
    if args.time_limit:
        cmd += ["--time-limit", str(args.time_limit)]
    code, wall, text = run_opbench(cmd, dict(os.environ), log, limit=args.limit)
    summary = json.loads(summary_file.read_text()) if summary_file.exists() else {}
    rows = _rows(dataset, summary.get("run_id")) if dataset.exists() else []
    tail = [line for line in text.splitlines() if line.startswith(("sample:", "rejected", "time:", "audit:"))]
    return {"command": "opbench " + " ".join(cmd), "exit": code, "wall_s": wall, "summary": summary,
            "quality": _quality(rows), "tail": tail}


EDGES_US = [0, 5, 10, 20, 50, 100, 1000, None]


def timers_phase(args: argparse.Namespace, work: Path, log: Path) -> dict:
    """The ``timers`` phase (see the module docstring)."""
    import numpy as np

    from opbench.dataset.records import TIMERS, timer_of
    from opbench.predict.metrics import pair_counts

    dataset = work / "timers.sqlite"
    dataset.unlink(missing_ok=True)
    out: dict = {}
    for timer in TIMERS:
        runs = []
        for item in args.models.split(","):
            source, _, model = item.partition(":")
            extra = ["--modelsource", source, "--modelname", model, "--dtype", args.dtypes, "--timer", timer,
                     "--audit", "0"]
            if args.tasks:
                extra += ["--tasks", str(args.tasks)]
            (work / "timers.json").unlink(missing_ok=True)
            run = _sample(args, work, "timers", extra, log)
            runs.append({k: run[k] for k in ("command", "exit", "wall_s", "tail")} |
                        {"records": run["summary"].get("records"), "records_per_s": run["summary"].get("records_per_s"),
                         "seconds": run["summary"].get("seconds")})
        out[timer] = {"runs": runs}
    with sqlite3.connect(dataset) as conn:
        rows = conn.execute("SELECT task, candidate_hash, config, latency_median_s, spread, number, repeats "
                            "FROM trials WHERE tuner='sample' AND build_status='ok' AND spread IS NOT NULL").fetchall()
    by: dict[str, dict] = {timer: {} for timer in TIMERS}
    for task, cand, config, median, spread, number, repeats in rows:
        by[timer_of(config)][(task, cand)] = (median, spread, number, repeats)
    both = sorted(set(by["evaluator"]) & set(by["graph"]))
    out["candidates_both"] = len(both)
    ev = np.array([by["evaluator"][k][0] for k in both])
    gr = np.array([by["graph"][k][0] for k in both])
    buckets = []
    for lo, hi in zip(EDGES_US, EDGES_US[1:], strict=False):
        sel = (ev > lo * 1e-6) & ((ev <= hi * 1e-6) if hi is not None else True)
        keys = [k for k, s in zip(both, sel, strict=True) if s]
        if not keys:
            continue
        row = {"kernel_us": [lo, hi], "candidates": len(keys),
               "graph_over_evaluator_median": float(np.median(gr[sel] / ev[sel]))}
        for timer in TIMERS:
            spreads = np.array([by[timer][k][1] for k in keys])
            row[f"{timer}_spread_le_3pct"] = float((spreads <= 0.03).mean())
            row[f"{timer}_spread_median"] = float(np.median(spreads))
        buckets.append(row)
    out["by_kernel_time"] = buckets
    for timer in TIMERS:
        spreads = np.array([v[1] for v in by[timer].values()])
        out[timer].update(records_ok=len(spreads), spread_le_3pct=float((spreads <= 0.03).mean()) if len(spreads)
                          else None, spread_median=float(np.median(spreads)) if len(spreads) else None,
                          calls_per_sample_median=float(np.median([v[2] for v in by[timer].values()]))
                          if len(spreads) else None)
    # pairs of one task's candidates that both timers order alike (those within 1 % by time_evaluator left out)
    agree, total = pair_counts(ev, gr, [k[0] for k in both], tie=0.01)
    out["pairwise_order_agreement"] = agree / total if total else None
    out["pairs"] = total
    out["graph_over_evaluator_median"] = float(np.median(gr / ev)) if len(both) else None
    for row in buckets:
        print(f"{row['kernel_us']} us: {row['candidates']} candidates, spread <= 3 %: evaluator "
              f"{row['evaluator_spread_le_3pct']:.2f} graph {row['graph_spread_le_3pct']:.2f}; graph/evaluator "
              f"{row['graph_over_evaluator_median']:.3f}")
    return out


def compile_phase(args: argparse.Namespace) -> dict:
    """The ``compile`` phase (see the module docstring)."""
    import random
    import statistics
    import time

    import tvm
    import tvm_ffi
    from tvm.s_tir import Schedule
    from tvm.s_tir.schedule import Trace
    from tvm.support.nvcc import compile_cuda

    from opbench.dataset import records
    from opbench.predict.trials import target_for
    from opbench.runtime.startup import import_tensor_intrinsics
    from opbench.tune.measure import _PCH, build_candidate, use_cuda_compiler

    import_tensor_intrinsics()
    tasks = {t["workload_id"]: t for t in records.read_rows(args.records, "tasks")}
    rows = [r for r in records.read_rows(args.records) if r["build_status"] == "ok" and r["dtype"] == "float16"]
    random.Random(0).shuffle(rows)
    sources = []
    for r in rows[:args.count]:  # each candidate's CUDA source, as TVM's codegen writes it
        task = tasks[r["workload_id"]]
        sch = Schedule(tvm.ir.load_json(task["mod"]))
        Trace.apply_json_to_schedule(json.loads(r["trace"]), sch)
        lib = build_candidate(sch.mod, target_for(task["target"]))
        sources.append((r["task"], (lib.imports if hasattr(lib, "imports") else lib.imported_modules)[0]
                        .inspect_source()))
    os.environ["TVM_CUDA_COMPILE_MODE"] = "nvrtc"
    plain = tvm_ffi.get_global_func("tvm_callback_cuda_compile")  # TVM's own
    use_cuda_compiler("nvrtc-pch")
    pch = tvm_ffi.get_global_func("tvm_callback_cuda_compile")
    times: dict[str, list[float]] = {"nvrtc": [], "nvrtc-pch": []}
    with tvm.target.Target({"kind": "cuda", "arch": "sm_90"}):
        for i, (_name, source) in enumerate(sources):  # interleaved, the first of each pair alternating
            for mode in (("nvrtc", "nvrtc-pch") if i % 2 == 0 else ("nvrtc-pch", "nvrtc")):
                start = time.perf_counter()
                (plain if mode == "nvrtc" else pch)(source)
                times[mode].append(time.perf_counter() - start)
    same = 0
    for _name, source in sources:
        a = bytes(compile_cuda(source, target_format="ptx", arch="sm_90", compiler="nvrtc")).decode()
        b = bytes(compile_cuda(source, target_format="ptx", arch="sm_90", compiler="nvrtc",
                               options=_PCH["options"])).decode()
        same += [x for x in a.splitlines() if not x.startswith(".global .align")] == \
            [x for x in b.splitlines() if not x.startswith(".global .align")]
    out = {"candidates": len(sources), "cpu_cores": os.cpu_count(), "same_ptx": same,
           "pch_failed": _PCH.get("failed")}
    for mode, ts in times.items():
        out[mode] = {"median_s": statistics.median(ts), "mean_s": statistics.mean(ts), "total_s": sum(ts),
                     "first_s": ts[0]}
    out["speedup_total"] = out["nvrtc"]["total_s"] / out["nvrtc-pch"]["total_s"]
    out["speedup_median"] = out["nvrtc"]["median_s"] / out["nvrtc-pch"]["median_s"]
    print(f"{len(sources)} candidates: nvrtc {out['nvrtc']['median_s']:.3f} s median, nvrtc-pch "
          f"{out['nvrtc-pch']['median_s']:.3f} s ({out['speedup_total']:.2f}x in total); same PTX {same}")
    return out


def memo_phase(args: argparse.Namespace) -> dict:
    """The ``memo`` phase (see the module docstring)."""
    import random
    import time

    import tvm

    from opbench.dataset import records
    from opbench.tune.sampler import SampleStats, sample_task

    tasks = []
    for task in records.read_rows(args.records, "tasks"):
        spent = json.loads(task["sampling"] or "{}").get("seed=0", {})
        if spent.get("seconds"):
            tasks.append((task, float(spent["seconds"])))
    rng = random.Random(0)
    chosen = [] if not tasks else rng.choices([t for t, _ in tasks], weights=[w for _, w in tasks], k=args.count)
    rows, same = [], 0
    if chosen:  # once untimed: the first sampling of a process loads MetaSchedule's rules and intrinsics
        task = chosen[0]
        list(sample_task(tvm.ir.load_json(task["mod"]), tvm.target.Target(json.loads(task["target"])), 1, 0,
                         task["space"]))
    for i, task in enumerate(chosen):
        mod, target = tvm.ir.load_json(task["mod"]), tvm.target.Target(json.loads(task["target"]))
        runs = {}
        for memo in ((True, False) if i % 2 == 0 else (False, True)):
            stats = SampleStats()
            start = time.perf_counter()
            kept = [(c.index, c.origin, c.sketch, c.trace, c.shash)
                    for c in sample_task(mod, target, args.per_task, 0, task["space"], stats=stats, memo=memo)]
            runs[memo] = (kept, stats.attempts, dict(stats.rejected), time.perf_counter() - start)
        identical = runs[True][:3] == runs[False][:3]
        same += identical
        rows.append({"task": task["task"], "dtype": task["dtype"], "space": task["space"], "kept": len(runs[True][0]),
                     "attempts": runs[True][1], "rejected": runs[True][2], "without_memo_s": runs[False][3],
                     "with_memo_s": runs[True][3], "identical": identical})
        print(f"{i + 1}/{len(chosen)} {task['task'][:40]} {task['dtype']}: {len(runs[True][0])} kept of "
              f"{runs[True][1]} attempts, {runs[False][3]:.2f} s without the memo, {runs[True][3]:.2f} s with it"
              f"{'' if identical else ', NOT the same candidates'}", flush=True)
    without, with_memo = sum(r["without_memo_s"] for r in rows), sum(r["with_memo_s"] for r in rows)
    ratios = [r["without_memo_s"] / r["with_memo_s"] for r in rows if r["with_memo_s"]]
    out = {"cpu_cores": os.cpu_count(), "tasks": rows, "per_task": args.per_task, "identical": same,
           "without_memo_s": without,
           "with_memo_s": with_memo, "speedup_total": without / with_memo if with_memo else None,
           "speedup_median": statistics.median(ratios) if ratios else None}
    print(f"{same}/{len(rows)} tasks kept the same candidates; {without:.1f} s without the memo, {with_memo:.1f} s "
          f"with it ({out['speedup_total']:.2f}x in all, median {out['speedup_median']:.2f}x per task)")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--work", default="/tmp/opbench-bench-sample")
    parser.add_argument("--phase", choices=["compilers", "compile", "memo", "main", "before-after", "timers"],
                        default="main")
    parser.add_argument("--records", default=str(Path(__file__).resolve().parents[1] / "data" / "dataset"),
                        help="--phase compile: the records folder whose candidates are compiled; --phase memo: "
                             "whose tasks are sampled")
    parser.add_argument("--count", type=int, default=60, help="--phase compile: candidates; --phase memo: tasks")
    parser.add_argument("--target", default="cuda")
    parser.add_argument("--models", default="local:resnet-50,transformers:bert")
    parser.add_argument("--dtypes", default="float32,float16")
    parser.add_argument("--per-task", type=int, default=32)
    parser.add_argument("--tasks", type=int, default=None, help="heaviest tasks per model")
    parser.add_argument("--time-limit", type=float, default=None)
    parser.add_argument("--audit", type=float, default=0.1)
    parser.add_argument("--compiler", default=None)
    parser.add_argument("--devices", default=None)
    parser.add_argument("--limit", type=float, default=540.0, help="seconds one command may take")
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    log = out / f"bench_sample_{args.phase}{args.tag}.log"
    result: dict = {"phase": args.phase, "target": args.target}
    if args.phase == "compile":
        result.update(compile_phase(args))
    elif args.phase == "memo":
        result.update(memo_phase(args))
    elif args.phase == "timers":
        result.update(timers_phase(args, work, log))
    elif args.phase == "compilers":
        for compiler in ("nvcc", "nvrtc", "nvrtc-pch"):
            run = _sample(args, work, f"compiler-{compiler}", ["--modelname", "resnet-50", "--tasks",
                                                               str(args.tasks or 3), "--cuda-compiler", compiler], log)
            s = run["summary"]
            run["build_s_per_candidate"] = s["seconds"]["build"] / max(s["records"], 1) if s else None
            result[compiler] = run
    elif args.phase == "before-after":
        source, _, model = args.models.split(",")[0].partition(":")
        tuned = work / "before.sqlite"
        tuned.unlink(missing_ok=True)
        shutil.rmtree(work / "before-db", ignore_errors=True)
        cmd = ["collect", "--modelsource", source, "--modelname", model, "--target", args.target, "--iftune", "true",
               "--trials", str(args.per_task), "--tune-tasks", str(args.tasks or 4), "--dataset", str(tuned),
               "--database", str(work / "before-db"), "-q"]  # the same tasks and candidates per task as after
        code, wall, _ = run_opbench(cmd, dict(os.environ), log, limit=args.limit)
        rows = 0
        if tuned.exists():
            with sqlite3.connect(tuned) as conn:
                rows = int(conn.execute("SELECT COUNT(*) FROM trials").fetchone()[0])
        result["before"] = {"command": "opbench " + " ".join(cmd), "exit": code, "wall_s": wall, "records": rows,
                            "records_per_s": rows / wall if wall else None}
        (work / "after.sqlite").unlink(missing_ok=True)
        extra = ["--modelsource", source, "--modelname", model, "--dtype", args.dtypes.split(",")[0]]
        if args.tasks:
            extra += ["--tasks", str(args.tasks)]
        after = _sample(args, work, "after", extra, log)
        records = after["quality"]["rows"]
        after.update(records=records, records_per_s=records / after["wall_s"] if after["wall_s"] else None)
        result["after"] = after
        result["speedup"] = (after["records_per_s"] / result["before"]["records_per_s"]
                             if result["before"]["records_per_s"] else None)
    else:
        for item in args.models.split(","):
            source, _, model = item.partition(":")
            extra = ["--modelsource", source, "--modelname", model, "--dtype", args.dtypes, "--audit", str(args.audit)]
            if args.tasks:
                extra += ["--tasks", str(args.tasks)]
            if args.compiler:
                extra += ["--cuda-compiler", args.compiler]
            if args.devices:
                extra += ["--devices", args.devices]
            safe = model.replace(":", "_").replace("=", "").replace(",", "_")
            result[f"{source}:{model}"] = _sample(args, work, f"main-{source}-{safe}", extra, log)
    path = out / f"bench_sample_{args.phase}{args.tag}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: (v.get("summary", {}).get("records_per_s"), v.get("quality")) if isinstance(v, dict) else v
                      for k, v in result.items()}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
