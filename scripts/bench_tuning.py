"""Tuning benchmark: a model's default kernels against its tuned ones, side by side in one run.

Runs ``collect --iftune true --ifcompare true`` (default kernels measured, every task tuned, tuned
kernels measured, then the parallel schedules of the tuned kernels), then ``compare`` on the default
kernels and, with ``--torch``, on PyTorch's kernels, and writes one JSON summary:
whole-model Relax VM latency before and after, the sequential CUDA Graph (or CPU) latency and the
best parallel schedule of default and tuned kernels, per-task speedups, tuning time and trials/s.

The dataset and the tuning database live in ``--work`` (kept between runs, so a second run resumes
the tuning); the summary, the collect JSON and a copy of the database go to ``--out``. With
``--phase tune`` only the tuning runs (``--tune-time`` bounds it), so a long tuning can be split
over several invocations before the comparison. With ``--torch``, the ten operators that take the
longest with default kernels are listed with their default, tuned and ATen (PyTorch) times.

    PYTHONPATH=python python3 scripts/bench_tuning.py --model resnet-18 --target llvm --trials 64 --out DIR
    PYTHONPATH=python python3 scripts/bench_tuning.py --model googlenet --target cuda --tune-time 600 --phase tune
    PYTHONPATH=python python3 scripts/bench_tuning.py --model googlenet --target cuda --tune-time 1 --torch --out DIR
    PYTHONPATH=python python3 scripts/bench_tuning.py --model resnet-50 --dtype float16 --target cuda --torch \
        --tune-tasks 10 --trials 32 --skip-default-compare --out DIR
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
CLI = [sys.executable, "-m", "opbench"]


def _run(args: list[str], log: Path) -> subprocess.CompletedProcess:
    """Run the CLI, its output going to ``log`` and to stdout line by line (a run cut short keeps it)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python"), "PYTHONUNBUFFERED": "1"}
    print("+", " ".join(args), flush=True)
    lines = []
    with open(log, "a") as out, subprocess.Popen([*CLI, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                                 stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout:
            out.write(line)
            out.flush()
            print(line, end="", flush=True)
            lines.append(line)
    return subprocess.CompletedProcess(proc.args, proc.returncode, "".join(lines), None)


def _row(schedules: list[dict], name: str) -> dict:
    """The row named ``name`` (the table also holds the model's own CUDA Graph for torch kernels)."""
    return next(s for s in schedules if s["schedule"] == name)


def _best(schedules: list[dict]) -> dict:
    kept = [s for s in schedules if s.get("kept")]
    return kept[0] if kept else min(schedules, key=lambda s: s["latency_ms"])


def _aligned(mine: list[dict], theirs: list[dict]) -> dict[int, float]:
    """ATen time of each of ``mine`` (in graph order) paired with the next of ``theirs`` whose output
    has as many elements (TVM flattens a linear layer's leading dimensions, and may fuse an operator
    ATen runs alone, which is skipped); empty unless every one of ``mine`` finds its pair."""
    pairs: dict[int, float] = {}
    rest = iter(theirs)
    for op in mine:
        size = math.prod(op["output_shape"])
        match = next((t for t in rest if math.prod(t["output_shape"]) == size), None)
        if match is None:
            return {}
        pairs[op["index"]] = match["alone_ms"]
    return pairs


def top_operators(tasks: list[dict], tvm_ops: list[dict], torch_ops: list[dict] | None, n: int = 10
                  ) -> list[dict]:
    """The ``n`` operators slowest with default kernels: default, tuned and (matched by position among
    the convolutions, and among the matmuls and linear layers, output sizes checked) ATen time of the
    same operator."""
    by_task = {t["func"]: t for t in tasks}
    aten: dict[int, float] = {}
    torch_kinds = {"conv": ("conv",), "matmul": ("matmul", "linear", "addmm", "bmm", "mm")}
    for kind, theirs_kinds in torch_kinds.items():
        mine = [o for o in tvm_ops if kind in o["kind"]]
        theirs = [o for o in torch_ops or [] if any(k in o["kind"] for k in theirs_kinds)]
        aten.update(_aligned(mine, theirs))
    rows = []
    for op in tvm_ops:
        task = by_task.get(op["name"])
        if task is None or task["default_s"] is None:
            continue
        tuned = task["tuned_s"] if task["kept"] else task["default_s"]
        rows.append({"operator": op["index"], "func": op["name"], "kind": op["kind"],
                     "output_shape": op["output_shape"], "dlight_ms": task["default_s"] * 1e3,
                     "tuned_ms": tuned * 1e3 if tuned else None, "aten_ms": aten.get(op["index"]),
                     "tuned_kept": task["kept"]})
    rows.sort(key=lambda r: -r["dlight_ms"])
    return rows[:n]


def median_aten_fraction(rows: list[dict]) -> float | None:
    """Median over ``rows`` (see :func:`top_operators`) of the ATen kernel's speed reached by the tuned
    kernel (ATen time / tuned time); None when no row has both times."""
    fractions = [r["aten_ms"] / r["tuned_ms"] for r in rows if r["aten_ms"] and r["tuned_ms"]]
    return statistics.median(fractions) if fractions else None


def format_top(rows: list[dict]) -> str:
    head = f"{'op':>4} {'func':<44}{'shape':>18}{'dlight ms':>11}{'tuned ms':>10}{'ATen ms':>9}"
    lines = [head, "-" * len(head)]
    for r in rows:
        shape = "x".join(str(d) for d in r["output_shape"])
        aten = "-" if r["aten_ms"] is None else f"{r['aten_ms']:.4f}"
        tuned = "-" if r["tuned_ms"] is None else f"{r['tuned_ms']:.4f}"
        lines.append(f"{r['operator']:>4} {r['func'][:43]:<44}{shape:>18}{r['dlight_ms']:>11.4f}{tuned:>10}{aten:>9}")
    fraction = median_aten_fraction(rows)
    if fraction is not None:
        lines.append(f"median operator: the tuned kernel reaches {fraction:.0%} of ATen's speed")
    return "\n".join(lines)


def pytorch_reference(args: argparse.Namespace) -> dict:
    """The model in PyTorch, measured like ``scripts/bench_parallel.py`` does (same settings)."""
    from bench_parallel import torch_baselines

    from opbench.models import load_workload

    workload = load_workload(args.source, args.model, int(args.batchsize), dtype=args.dtype)
    module = workload.torch_module.cuda().eval()
    x = workload.torch_inputs(0, "cuda")[0]
    res: dict = {}
    torch_baselines(module, x, res, args.compare_repeat or 10, args.compare_number or 20)
    return res


def _copy_database(database: Path, out: Path) -> None:
    if database.is_dir():
        copy = out / "database"
        copy.mkdir(exist_ok=True)
        for name in ("database_workload.json", "database_tuning_record.json"):
            if (database / name).is_file():
                shutil.copy(database / name, copy / name)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet-18")
    p.add_argument("--source", default="local")
    p.add_argument("--target", default="llvm")
    p.add_argument("--batchsize", default="1")
    p.add_argument("--dtype", default="float32", help="float32, float16 (tuned on tensor cores) or bfloat16")
    p.add_argument("--tuner", default="xgb")
    p.add_argument("--trials", type=int, default=64)
    p.add_argument("--tune-tasks", type=int, default=None, help="tune only the N heaviest tasks")
    p.add_argument("--tune-time", type=float, default=None, help="start no new task after this many seconds")
    p.add_argument("--phase", default="all", choices=["all", "tune"],
                   help="tune: only the tuning (collect --iftune), no comparisons")
    p.add_argument("--torch", action="store_true", help="also compare PyTorch's kernels (ATen, same schedules)")
    p.add_argument("--compare-repeat", type=int, default=None, help="samples per schedule (default: 10 GPU, 3 CPU)")
    p.add_argument("--compare-number", type=int, default=None, help="runs per sample (default: 20 GPU, 2 CPU)")
    p.add_argument("--skip-default-compare", action="store_true",
                   help="do not run the default kernels under every schedule (slow for untuned CPU kernels; the "
                        "Relax VM before/after is measured anyway)")
    p.add_argument("--work", default=os.path.expanduser("~/opbench-tuning"), help="dataset and database folder")
    p.add_argument("--out", default=os.environ.get("OUT", "out"), help="where the JSON summary goes")
    args = p.parse_args()
    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    dataset, database = work / "tuning.sqlite", work / f"db-{args.target}"
    log = out / "bench_tuning.log"
    model = ["--modelsource", args.source, "--modelname", args.model, "--target", args.target,
             "--batchsize", args.batchsize, "--dtype", args.dtype]
    cpu = args.target == "llvm" or '"llvm"' in args.target
    repeat = args.compare_repeat or (3 if cpu else 10)
    number = args.compare_number or (2 if cpu else 20)
    sched = ["--compare-repeat", str(repeat), "--compare-number", str(number)]
    start = time.perf_counter()
    tuned_json, default_json, torch_json = out / "collect_tuned.json", out / "compare_default.json", \
        out / "compare_torch.json"
    extra = ["--tune-tasks", str(args.tune_tasks)] if args.tune_tasks else []
    extra += ["--tune-time", str(args.tune_time)] if args.tune_time else []
    compare = ["--ifcompare", "true", *sched] if args.phase == "all" else []
    proc = _run(["collect", *model, "--iftune", "true", "--tuner", args.tuner, "--trials", str(args.trials), *extra,
                 *compare, "--dataset", str(dataset), "--database", str(database),
                 "--json", str(tuned_json)], log)
    _copy_database(database, out)
    if proc.returncode not in (0, 3) or args.phase == "tune":
        return proc.returncode
    default = None if args.skip_default_compare else \
        _run(["compare", *model, "--backend", "tvm", *sched, "--json", str(default_json)], log)
    summary: dict = {"model": args.model, "target": args.target, "dtype": args.dtype, "tuner": args.tuner,
                     "trials": args.trials, "tune_tasks": args.tune_tasks}
    collected = json.loads(tuned_json.read_text())
    tuning = collected["tuning"]
    summary["tuning"] = {k: v for k, v in tuning.items() if k != "tasks"}
    summary["tasks"] = tuning["tasks"]
    summary["environment"] = collected["environment"]
    tuned_rows = collected.get("schedules", [])
    if default is not None and default.returncode == 0:
        default_rows = json.loads(default_json.read_text())["schedules"]
        summary["default_kernels"] = {"sequential_ms": _row(default_rows, "sequential")["latency_ms"],
                                      "best": _best(default_rows)}
    if tuned_rows:
        summary["tuned_kernels"] = {"sequential_ms": _row(tuned_rows, "sequential")["latency_ms"],
                                    "best": _best(tuned_rows),
                                    "critical_path": collected.get("critical_path")}
    if "default_kernels" in summary and "tuned_kernels" in summary:
        summary["sequential_speedup"] = (summary["default_kernels"]["sequential_ms"]
                                         / summary["tuned_kernels"]["sequential_ms"])
    if args.torch:
        t = _run(["compare", *model, "--backend", "torch", *sched, "--json", str(torch_json)], log)
        if t.returncode == 0:
            rows = json.loads(torch_json.read_text())["schedules"]
            summary["torch_kernels"] = {"sequential_ms": _row(rows, "sequential")["latency_ms"], "best": _best(rows)}
            graph = [r for r in rows if r["schedule"].startswith("model,")]
            if graph:
                summary["torch_kernels"]["model_graph_ms"] = graph[0]["latency_ms"]
    summary["top_operators"] = top_operators(
        tuning["tasks"], collected.get("operator_times", []),
        json.loads(torch_json.read_text()).get("operator_times") if args.torch and torch_json.is_file() else None)
    summary["median_tuned_fraction_of_aten_speed"] = median_aten_fraction(summary["top_operators"])
    print(format_top(summary["top_operators"]))
    if args.torch and not cpu:  # PyTorch itself in this process: eager, its own CUDA Graph, torch.compile
        summary["pytorch"] = pytorch_reference(args)
    if "torch_kernels" in summary:
        summary["tvm_tuned_vs_torch_sequential"] = (summary["torch_kernels"]["sequential_ms"]
                                                    / (tuning["model_tuned_s"] * 1e3))
    summary["compare_settings"] = {"repeat": repeat, "number": number}
    summary["wall_s"] = time.perf_counter() - start
    (out / "bench_tuning.json").write_text(json.dumps(summary, indent=2, default=str))
    print(json.dumps({k: v for k, v in summary.items() if k not in ("tasks", "environment")}, indent=1,
                     default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
