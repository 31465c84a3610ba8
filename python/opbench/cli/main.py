"""The ``opbench`` command.

Subcommands: ``collect`` (the default when the first argument is a flag), ``export``, ``models``.
``python/performance_collector/op_performance_collector.py`` maps OpBench's flags onto
``collect``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from ..errors import OpBenchError
from ..utils import parse_bool

DEFAULT_DATASET = os.path.join("data", "opbench.sqlite")
TUNERS = ("xgb", "xgb_knob", "xgb_itervar", "ga", "random", "gridsearch", "evolutionary")
LATER = {
    "iftune": "--iftune true: schedule tuning with MetaSchedule (every trial kept) is not "
              "implemented in this version yet; run without --iftune to measure default schedules",
}


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors and exit status 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"opbench: error: {message} (see --help)\n")
        raise SystemExit(2)


def _bool(text: str) -> bool:
    try:
        return parse_bool(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"'{text}' is not a positive integer")
    return value


def _add_collect(sub: Any) -> None:
    p = sub.add_parser("collect", help="measure every operator of a model",
                       description="Measure every operator of a model and write the dataset.")
    g = p.add_argument_group("OpBench-compatible flags")
    g.add_argument("--modelsource", default="local",
                   help="local, simple, remoteonnx (path or URL), transformers (default: local)")
    g.add_argument("--modelname", required=True, help="model name, ONNX path/URL (see 'opbench models')")
    g.add_argument("--target", default="llvm", help="llvm or cuda, or a JSON target (default: llvm)")
    g.add_argument("--batchsize", default="1", help="batch size (default: 1)")
    g.add_argument("--iftune", type=_bool, default=False, help="tune schedules (true/false)")
    g.add_argument("--ifcompare", type=_bool, default=False, help="compare parallel schedules (true/false)")
    g.add_argument("--tuner", default="xgb", help=f"tuner ({', '.join(TUNERS)})")
    g.add_argument("--trials", type=_positive_int, default=64, help="tuning trials per task")
    p.add_argument("--dataset", default=None, help=f"SQLite dataset (default: {DEFAULT_DATASET})")
    p.add_argument("--force", action="store_true", help="re-measure rows already in the dataset")
    p.add_argument("--repeat", type=_positive_int, default=10, help="timed samples per operator")
    p.add_argument("--warmup", type=int, default=1, help="untimed calls before timing")
    p.add_argument("--min-repeat-ms", type=float, default=5.0, help="minimum duration of a sample")
    p.add_argument("--flush-l2", action="store_true", help="flush caches before every sample")
    p.add_argument("--seqlen", type=_positive_int, default=128, help="sequence length (transformers)")
    p.add_argument("--image-size", type=_positive_int, default=None, help="input resolution (local)")
    p.add_argument("--sha256", default=None, help="expected checksum of the ONNX file")
    p.add_argument("--cache-dir", default=None, help="download cache for remoteonnx")
    p.add_argument("--seed", type=int, default=0, help="seed of random weights and inputs")
    p.add_argument("--no-check", action="store_true", help="skip the replay-vs-VM check")
    p.add_argument("--corun", action="store_true", help="also measure co-run groups (cuda)")
    p.add_argument("--corun-k", type=_positive_int, default=4, help="largest co-run group")
    p.add_argument("--corun-limit", type=_positive_int, default=200, help="co-run groups to measure")
    p.add_argument("--json", default=None, help="also write the summary as JSON to this file")
    p.add_argument("--quiet", action="store_true", help="no progress bar or table")
    _add_schedule_flags(p)
    p.set_defaults(func=cmd_collect)


def _add_schedule_flags(p: Any) -> None:
    p.add_argument("--schedulers", default="sequential,greedy,nimble,opara,ios",
                   help="schedulers to compare (comma-separated; sequential is always first)")
    p.add_argument("--compare-repeat", type=_positive_int, default=10, help="timed samples per schedule")
    p.add_argument("--compare-number", type=_positive_int, default=20, help="runs per sample")
    p.add_argument("--save-schedule", default=None, help="write the kept schedule as JSON")


def _add_compare(sub: Any) -> None:
    p = sub.add_parser("compare", help="run a model under each schedule and compare",
                       description="Run a model under each inter-operator schedule (CUDA Graph on GPU, "
                                   "threads on CPU) and print latency, speedup and output error.")
    p.add_argument("--modelsource", default="local")
    p.add_argument("--modelname", required=True)
    p.add_argument("--target", default="llvm")
    p.add_argument("--batchsize", default="1")
    p.add_argument("--backend", default="tvm", help="tvm (TVM kernels) or torch (ATen kernels)")
    p.add_argument("--image-size", type=_positive_int, default=None)
    p.add_argument("--seqlen", type=_positive_int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write the table as JSON")
    _add_schedule_flags(p)
    p.set_defaults(func=cmd_compare)


def _add_export(sub: Any) -> None:
    p = sub.add_parser("export", help="write dataset tables as CSV or Parquet")
    p.add_argument("--dataset", default=DEFAULT_DATASET, help="SQLite dataset")
    p.add_argument("--format", default="csv", help="csv or parquet")
    p.add_argument("--out", required=True, help="output file")
    p.add_argument("--table", default="operators", help="operators, models, corun (comma-separated)")
    p.set_defaults(func=cmd_export)


def _add_models(sub: Any) -> None:
    p = sub.add_parser("models", help="list model sources and names")
    p.set_defaults(func=cmd_models)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="opbench", description="Operator-level profiling of DNN models on TVM.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    _add_collect(sub)
    _add_export(sub)
    _add_models(sub)
    _add_compare(sub)
    return parser


def _fmt(value: Any, scale: float = 1.0, digits: int = 3) -> str:
    if value is None:
        return "-"
    return f"{value * scale:.{digits}f}"


def _shape(shapes: Any) -> str:
    shapes = json.loads(shapes) if isinstance(shapes, str) else shapes
    return " ".join("x".join(str(d) for d in s) for s in shapes)


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """The per-operator table printed after a collection."""
    header = ["#", "operator", "kind", "inputs", "output", "MFLOP", "MB", "median ms",
              "spread ms", "GFLOP/s", "status"]
    lines = []
    for r in rows:
        spread = None
        if r.get("latency_max_s") is not None:
            spread = r["latency_max_s"] - r["latency_min_s"]
        lines.append([
            str(r["op_index"]), r["func"][:44], r["kind"],
            _shape(r["input_shapes"])[:40], _shape(r["output_shapes"])[:20],
            _fmt(r["flops"], 1e-6, 2), _fmt(r["bytes"], 1e-6, 2),
            _fmt(r["latency_median_s"], 1e3, 4), _fmt(spread, 1e3, 4),
            _fmt(r["gflops"], 1.0, 1), r["status"],
        ])
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h)
              for i, h in enumerate(header)]
    numeric = {0, 5, 6, 7, 8, 9}

    def render(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if i in numeric else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    return "\n".join([render(header), render(["-" * w for w in widths])] + [render(x) for x in lines])


def cmd_collect(args: argparse.Namespace) -> int:
    from ..dataset import Dataset
    from ..models import load_workload
    from ..profile import CollectOptions, TimingConfig, collect
    from ..runtime import is_gpu, resolve_target

    if args.iftune:
        raise OpBenchError(LATER["iftune"])
    if args.tuner not in TUNERS:
        raise OpBenchError(f"unknown tuner '{args.tuner}' (accepted: {', '.join(TUNERS)})")
    if args.ifcompare:
        _scheduler_names(args)
    target = resolve_target(args.target)
    if args.corun and not is_gpu(target):
        raise OpBenchError("--corun needs --target cuda (co-runs are measured on CUDA streams)")
    options = {"seqlen": args.seqlen, "image_size": args.image_size, "sha256": args.sha256,
               "cache_dir": args.cache_dir, "seed": args.seed}
    workload = load_workload(args.modelsource, args.modelname, args.batchsize, **options)
    profiler = None
    if is_gpu(target):
        from ..profile.cuda import CudaProfiler

        profiler = CudaProfiler(corun_k=args.corun_k, corun_limit=args.corun_limit if args.corun else 0)
    timing = TimingConfig(warmup=args.warmup, repeat=args.repeat, min_repeat_ms=args.min_repeat_ms,
                          flush_l2=args.flush_l2)
    path = args.dataset or os.environ.get("OPBENCH_DATASET") or DEFAULT_DATASET
    command = shlex.join(["opbench", *sys.argv[1:]])
    with Dataset(path) as dataset:
        result = collect(workload, target, dataset,
                         CollectOptions(timing=timing, force=args.force, check=not args.no_check,
                                        progress=not args.quiet, seed=args.seed),
                         command=command, profiler=profiler)
    m = result.model_row
    summary = {
        "model": workload.name, "source": workload.source, "batch_size": workload.batch_size,
        "target": m["target"], "operators": m["num_ops"], "unique_tasks": m["unique_tasks"],
        "measured": result.measured, "skipped": result.skipped, "failed": result.failed,
        "sum_op_latency_ms": m["sum_op_latency_s"] * 1e3,
        "vm_latency_ms": (m["vm_latency_median_s"] or 0.0) * 1e3,
        "replay_rel_error": m["replay_rel_error"], "compile_s": result.compile_s,
        "measure_s": result.measure_s, "dataset": os.path.abspath(result.dataset_path),
        **result.extra.get("summary", {}),
    }
    if not args.quiet:
        print(format_table(result.rows))
        print()
    err = summary["replay_rel_error"]
    print(f"{summary['model']} ({summary['source']}, batch {summary['batch_size']}, "
          f"{summary['target']}): {summary['operators']} operators, "
          f"{summary['unique_tasks']} unique tasks, {result.failed} failed; "
          f"sum of operator latencies {summary['sum_op_latency_ms']:.3f} ms; "
          f"Relax VM {summary['vm_latency_ms']:.3f} ms; replay error "
          f"{'-' if err is None else f'{err:.1e}'}; "
          f"measured {result.measured}, skipped {result.skipped} already in {summary['dataset']}")
    if args.ifcompare:
        from ..parallel import TVMBackend

        backend = TVMBackend(result.extra["kernels"], workload.example_inputs(args.seed),
                             result.extra.get("resources") or None)
        summary.update(_compare(backend, args))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2, default=str))
    return 0


def _scheduler_names(args: argparse.Namespace) -> list[str]:
    """``--schedulers`` checked (unknown names fail before any work), sequential first."""
    from ..schedule import get_scheduler

    names = [get_scheduler(n.strip()).name for n in args.schedulers.split(",") if n.strip()]
    return ["sequential"] + [n for n in names if n != "sequential"]


def _compare(backend: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Schedules side by side, then the critical path that bounds them all; the table as JSON."""
    from ..parallel import evaluate_with_bound, format_comparison, table_rows

    kept, rows, bound = evaluate_with_bound(backend, _scheduler_names(args), repeat=args.compare_repeat,
                                            number=args.compare_number)
    how = "CUDA Graph" if backend.is_cuda else "threads"
    print(f"\n{backend.name} kernels, {len(backend.graph)} operators ({how}):")
    print(format_comparison(rows))
    print(f"kept: {kept.name} ({kept.num_streams} streams, {kept.num_events} events)")
    print(f"critical path: {len(bound['ops'])} operators, {bound['chain_ms']:.4f} ms run alone; no schedule of "
          f"these kernels is faster (at most {rows[0]['latency_ms'] / bound['chain_ms']:.2f}x over sequential)")
    if args.save_schedule:
        kept.save(args.save_schedule)
    return {"schedules": table_rows(rows), "critical_path": bound}


def cmd_compare(args: argparse.Namespace) -> int:
    from ..models import load_workload
    from ..parallel import TorchBackend, tvm_backend
    from ..runtime import is_gpu, resolve_target

    if args.backend not in ("tvm", "torch"):
        raise OpBenchError(f"unknown backend '{args.backend}' (accepted: tvm, torch)")
    _scheduler_names(args)
    target = resolve_target(args.target)
    workload = load_workload(args.modelsource, args.modelname, args.batchsize, image_size=args.image_size,
                             seqlen=args.seqlen, seed=args.seed)
    if args.backend == "tvm":
        backend = tvm_backend(workload, target, workload.example_inputs(args.seed))
    else:
        if workload.torch_module is None:
            raise OpBenchError(f"--backend torch needs a torch model; source '{workload.source}' has none "
                               "(accepted sources: local, transformers)")
        import torch

        device = "cuda" if is_gpu(target) else "cpu"
        module = workload.torch_module.to(device)
        inputs = [torch.from_numpy(x).to(device) for x in workload.example_inputs(args.seed)]
        backend = TorchBackend(module, inputs)
    table = _compare(backend, args)
    if args.json:
        Path(args.json).write_text(json.dumps(table, indent=2, default=str))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from ..dataset import export

    tables = [t.strip() for t in args.table.split(",") if t.strip()]
    for path in export(args.dataset, args.format, args.out, tables):
        print(f"wrote {path}")
    return 0


def cmd_models(_args: argparse.Namespace) -> int:
    from ..models import list_sources

    for source, names in list_sources().items():
        print(f"{source}: {', '.join(names)}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``opbench`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = ("collect", "export", "models", "compare")
    if argv and argv[0].startswith("--") and argv[0] not in ("--help", "--debug") \
            and not any(a in commands for a in argv):
        argv.insert(0, "collect")
    if argv[:1] == ["--debug"] and len(argv) > 1 and argv[1] not in commands:
        argv.insert(1, "collect")
    debug = "--debug" in argv
    if debug:
        argv.remove("--debug")
        argv.insert(0, "--debug")
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    logging.basicConfig(level=logging.WARNING if getattr(args, "quiet", False) else logging.INFO,
                        format="opbench: %(message)s", stream=sys.stderr)
    try:
        return args.func(args)
    except OpBenchError as err:
        if debug:
            traceback.print_exc()
        sys.stderr.write(f"opbench: error: {err}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("opbench: interrupted; every finished measurement is in the dataset\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
