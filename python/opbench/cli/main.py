"""The ``opbench`` command.

Subcommands: ``collect`` (the default when the first argument is a flag), ``compare``, ``export``,
``models``. ``python/performance_collector/op_performance_collector.py`` maps OpBench's flags onto
``collect``.

Exit status: 0 ok, 1 runtime failure, 2 usage or bad input, 3 finished with failed operators,
130 interrupted (Ctrl-C; 143 for SIGTERM).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import re
import shlex
import sys
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO

from .. import __version__, signals
from ..errors import OpBenchError
from ..utils import announced, parse_bool

DEFAULT_DATASET = os.path.join("data", "opbench.sqlite")
EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_FAILED_OPS, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
COMMANDS = ("collect", "export", "models", "compare", "configspace")
log = logging.getLogger("opbench")


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors and exit status 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {one_line(message)} (see --help)\n")
        raise SystemExit(EXIT_USAGE)


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Help that shows every default (and no 'default: None')."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default in (None, False, argparse.SUPPRESS) or "%(default)" in (action.help or ""):
            return action.help or ""
        return super()._get_help_string(action)


def one_line(text: Any) -> str:
    """``text`` on one line: newlines and other control characters escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


def _bool(text: str) -> bool:
    try:
        return parse_bool(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _int_at_least(low: int, what: str) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
        return value

    return parse


_positive_int = _int_at_least(1, "a positive integer")
_nonneg_int = _int_at_least(0, "a non-negative integer")


def _nonneg_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number >= 0")
    return value


def _positive_float(text: str) -> float:
    value = _nonneg_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number > 0")
    return value


def _add_common(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("output")
    g.add_argument("-q", "--quiet", action="store_true", help="warnings and the summary only: no progress, "
                   "no table, TVM's own warnings hidden")
    g.add_argument("-v", "--verbose", action="store_true", help="debug log lines")


def _add_model_flags(p: argparse.ArgumentParser, g: Any = None) -> None:
    g = g or p
    g.add_argument("--modelsource", default="local",
                   help="local, simple, remoteonnx (path or URL), transformers")
    g.add_argument("--modelname", required=True, help="model name, ONNX path/URL (see 'opbench models')")
    g.add_argument("--target", default="llvm", help="llvm or cuda, or a JSON target such as "
                   '\'{"kind":"llvm","mcpu":"x86-64"}\'')
    g.add_argument("--batchsize", default="1", help="batch size")
    p.add_argument("--image-size", type=_positive_int, default=None,
                   help="input resolution (local; default: the model's own, 224 or 299)")
    p.add_argument("--seqlen", type=_positive_int, default=128, help="sequence length (transformers)")
    p.add_argument("--seed", type=_nonneg_int, default=0, help="seed of random weights and inputs")
    p.add_argument("--sha256", default=None, help="expected SHA-256 of the ONNX file (64 hex digits)")
    p.add_argument("--cache-dir", default=None, help="download cache for remoteonnx "
                   "(default: $OPBENCH_CACHE/onnx or ~/.cache/opbench/onnx)")
    p.add_argument("--max-download-mb", type=_nonneg_float, default=None,
                   help="refuse ONNX downloads larger than this (default: $OPBENCH_MAX_DOWNLOAD_MB or 2048)")


def _add_collect(sub: Any, prog: str | None = None) -> None:
    p = sub.add_parser("collect", help="measure every operator of a model", formatter_class=_Formatter,
                       description="Measure every operator of a model and write the dataset.", **(
                           {"prog": prog} if prog else {}))
    g = p.add_argument_group("OpBench-compatible flags")
    _add_model_flags(p, g)
    g.add_argument("--iftune", type=_bool, default=False,
                   help="tune every unique task with MetaSchedule, then measure the tuned kernels (true/false)")
    g.add_argument("--ifcompare", type=_bool, default=False, help="compare parallel schedules (true/false)")
    g.add_argument("--tuner", default="xgb", help=f"tuner ({', '.join(_tuner_names())})")
    g.add_argument("--trials", type=_positive_int, default=64, help="measured candidates per task when tuning")
    p.add_argument("--pretrained", default=None, metavar="MODEL",
                   help="with --iftune and --tuner xgb: start from a trials predictor ('opbench train --what "
                        "trials'), MetaSchedule's cost model with what earlier tuning learned")
    p.add_argument("--tune-tasks", type=_positive_int, default=None,
                   help="tune only the N heaviest tasks (default: every task)")
    p.add_argument("--tune-time", type=_positive_float, default=None, metavar="SECONDS",
                   help="start no new task after this much tuning (the rest keep default kernels; a re-run "
                        "continues)")
    _add_database_flag(p)
    r = p.add_argument_group("remote devices (TVM RPC tracker; builds stay on this machine)")
    r.add_argument("--rpc-tracker", default=None, metavar="HOST:PORT",
                   help="measure operators, the model and tuning candidates on devices registered here")
    r.add_argument("--rpc-key", default=None, help="the key the remote devices registered with")
    r.add_argument("--rpc-workers", type=_positive_int, default=1,
                   help="candidates measured at once while tuning (one per remote device)")
    p.add_argument("--dataset", default=None, help=f"SQLite dataset (default: $OPBENCH_DATASET or {DEFAULT_DATASET})")
    p.add_argument("--force", action="store_true", help="re-measure rows already in the dataset")
    p.add_argument("--repeat", type=_positive_int, default=10, help="timed samples per operator")
    p.add_argument("--warmup", type=_nonneg_int, default=1, help="untimed calls before timing")
    p.add_argument("--min-repeat-ms", type=_nonneg_float, default=5.0,
                   help="minimum duration of a sample in ms (CPU: whole ms, a fraction rounds up)")
    p.add_argument("--flush-l2", action="store_true", help="flush caches before every timed call")
    p.add_argument("--no-check", action="store_true", help="skip the replay-vs-VM check")
    p.add_argument("--corun", action="store_true", help="also measure co-run groups (cuda)")
    p.add_argument("--corun-k", type=_positive_int, default=4, help="largest co-run group")
    p.add_argument("--corun-limit", type=_positive_int, default=200, help="co-run groups to measure")
    p.add_argument("--json", default=None, help="also write the summary as JSON to this file ('-': stdout)")
    _add_schedule_flags(p)
    _add_common(p)
    p.set_defaults(func=cmd_collect)


def _tuner_names() -> list[str]:
    from ..tune.tuners import TUNERS

    return list(TUNERS)


def _add_database_flag(p: Any) -> None:
    p.add_argument("--database", default=None,
                   help="MetaSchedule tuning database folder: tuned kernels where it has records (default with "
                        "--iftune: <dataset>.tuning beside the dataset)")


def _add_schedule_flags(p: Any) -> None:
    g = p.add_argument_group("parallel schedules (--ifcompare, compare)")
    g.add_argument("--schedulers", default="sequential,greedy,nimble,opara,ios",
                   help="schedulers to compare (comma-separated; sequential is always first)")
    g.add_argument("--compare-repeat", type=_positive_int, default=10, help="timed samples per schedule")
    g.add_argument("--compare-number", type=_positive_int, default=20, help="runs per sample")
    g.add_argument("--save-schedule", default=None, help="write the kept schedule as JSON")
    g.add_argument("--ios-cost", default="model",
                   help="stage cost of the ios scheduler: model (the scheduling cost), measured (every candidate "
                        "stage captured and timed, memoised), or model,measured (one row each)")
    g.add_argument("--ios-time-limit", type=_positive_float, default=60.0,
                   help="seconds the ios dynamic programme may search (then one operator per stage)")
    g.add_argument("--cost", default="measured",
                   help="operator costs of the ios and greedy schedulers: measured (timed operators), predicted "
                        "(a trained predictor, nothing timed: rows ios-predicted, greedy-predicted), or "
                        "measured,predicted (both)")
    g.add_argument("--predictor", default=None, metavar="FILE[,FILE]",
                   help="for --cost predicted: a latency predictor and, optionally, a co-run predictor "
                        "('opbench train --what latency|corun')")
    g.add_argument("--stages", action="store_true",
                   help="also print, for sequential and each staged schedule, every stage with its operators, "
                        "strategy and measured latency (the stages run with a barrier between them)")
    g.add_argument("--schedule", default=None, metavar="FILE",
                   help="a schedule saved earlier for this model (--save-schedule): no search, it is measured "
                        "beside sequential; a schedule of another graph is refused")


def _add_compare(sub: Any) -> None:
    p = sub.add_parser("compare", help="run a model under each schedule and compare", formatter_class=_Formatter,
                       description="Run a model under each inter-operator schedule (CUDA Graph on GPU, "
                                   "threads on CPU) and print latency, speedup and output error.")
    _add_model_flags(p)
    p.add_argument("--backend", default="tvm", help="tvm (TVM kernels) or torch (ATen kernels)")
    p.add_argument("--merge", nargs="?", const="all", default="none", choices=("none", "all", "ios"),
                   help="IOS's merge first: convolutions reading the same input with the same kernel size, stride, "
                        "padding and dilation run as one, their output split (TVM: a Relax rewrite before "
                        "lowering). all (the same as --merge alone): every such group; ios: the groups IOS's dynamic "
                        "programme finds faster merged than concurrent (TVM: two more builds, every group merged "
                        "to time the merged kernels, then the chosen ones)")
    _add_database_flag(p)
    p.add_argument("--json", default=None, help="also write the table as JSON ('-': stdout)")
    _add_schedule_flags(p)
    _add_common(p)
    p.set_defaults(func=cmd_compare)


def _add_export(sub: Any) -> None:
    p = sub.add_parser("export", help="write dataset tables as CSV or Parquet", formatter_class=_Formatter,
                       description="Write tables of a dataset as CSV or Parquet (read only: the dataset is "
                                   "not changed). With several tables, OUT gets a -TABLE suffix each.")
    p.add_argument("--dataset", default=None, help=f"SQLite dataset (default: $OPBENCH_DATASET or {DEFAULT_DATASET})")
    p.add_argument("--format", default=None, help="csv or parquet (default: from --out's suffix, .csv or .parquet)")
    p.add_argument("--out", required=True, help="output file")
    p.add_argument("--table", default="all", help="runs, operators, models, corun, trials (comma-separated) or all")
    p.add_argument("--json", action="store_true", help="print what was written as JSON")
    _add_common(p)
    p.set_defaults(func=cmd_export)


def _add_configspace(sub: Any) -> None:
    p = sub.add_parser("configspace", help="write each task's tuning design space as JSON", formatter_class=_Formatter,
                       description="Write every unique task's MetaSchedule design space as JSON: its sketches, "
                                   "every sampling instruction with its domain, and the space size.")
    _add_model_flags(p)
    p.add_argument("--json", default="-", help="output file ('-': stdout)")
    _add_common(p)
    p.set_defaults(func=cmd_configspace)


def _add_models(sub: Any) -> None:
    p = sub.add_parser("models", help="list model sources and names", formatter_class=_Formatter)
    p.add_argument("--json", action="store_true", help="print the list as JSON")
    _add_common(p)
    p.set_defaults(func=cmd_models)


def build_parser(prog: str = "opbench") -> argparse.ArgumentParser:
    parser = _Parser(prog=prog, description="Operator-level profiling of DNN models on TVM.",
                     epilog="Exit status: 0 ok, 1 runtime failure, 2 usage or bad input, 3 finished with failed "
                            "operators, 130 interrupted.")
    parser.add_argument("--version", action="version", version=f"opbench {__version__}")
    parser.add_argument("--debug", action="store_true", help="debug logs and tracebacks")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    _add_collect(sub)
    _add_export(sub)
    _add_models(sub)
    _add_compare(sub)
    _add_configspace(sub)
    from .learn import add_parsers

    add_parsers(sub, _Formatter, _add_common, _add_model_flags, DEFAULT_DATASET)
    return parser


def dataset_path(args: argparse.Namespace) -> str:
    """``--dataset``, else ``$OPBENCH_DATASET``, else ``data/opbench.sqlite``."""
    return args.dataset or os.environ.get("OPBENCH_DATASET") or DEFAULT_DATASET


def check_output_path(path: str | Path | None, flag: str) -> None:
    """Refuse an output path that cannot be written, before any work is done (``-`` is stdout).

    The check opens the file for appending (an existing file's bytes stay as they are; a new one is
    removed again), so a file the permissions allow but the file system refuses (``/proc/version``
    for root, a read-only mount) is refused too."""
    if path is None or str(path) == "-":
        return
    p = Path(path)
    if p.is_dir():
        raise OpBenchError(f"{flag} {str(path)!r} is a folder (accepted: a file path)")
    folder = p.parent if str(p.parent) else Path(".")
    if not folder.is_dir():
        raise OpBenchError(f"{flag} {str(path)!r}: folder {str(folder)!r} does not exist")
    existed = p.exists()
    try:
        with open(p, "ab"):
            pass
    except OSError as err:
        raise OpBenchError(f"{flag} {str(path)!r} is not writable ({err.strerror})") from None
    if not existed:
        p.unlink(missing_ok=True)


_URL = re.compile(r"https?://[^\s'\"]+", re.IGNORECASE)


def public_command(argv: Sequence[str]) -> str:
    """The command line as the dataset's ``runs`` table records it: URLs without their query
    strings and fragments (tokens), as the download cache and the workload record them."""
    from ..models.remoteonnx import redact

    return shlex.join(_URL.sub(lambda m: redact(m.group(0)), a) for a in argv)


def write_json(path: str, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` (``-``: stdout)."""
    text = json.dumps(data, indent=2, default=str)
    if path == "-":
        sys.stdout.write(text + "\n")
        return
    try:
        Path(path).write_text(text + "\n")
    except OSError as err:
        raise OpBenchError(f"cannot write --json {path!r}: {err.strerror}") from None


def _human(args: argparse.Namespace) -> TextIO:
    """Where tables and summaries go: stdout, or stderr when stdout carries JSON (``--json -``)."""
    return sys.stderr if getattr(args, "json", None) == "-" else sys.stdout


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


def kind_totals(rows: Sequence[dict[str, Any]], top: int = 5) -> dict[str, Any]:
    """Per-kind latency totals and the operators with the largest share of the summed latency."""
    total = sum(r["latency_median_s"] or 0.0 for r in rows)
    kinds: dict[str, dict[str, Any]] = {}
    for r in rows:
        k = kinds.setdefault(r["kind"], {"kind": r["kind"], "operators": 0, "latency_ms": 0.0})
        k["operators"] += 1
        k["latency_ms"] += (r["latency_median_s"] or 0.0) * 1e3
    for k in kinds.values():
        k["share"] = k["latency_ms"] / (total * 1e3) if total else 0.0
    ranked = sorted(rows, key=lambda r: -(r["latency_median_s"] or 0.0))[:top]
    return {
        "by_kind": sorted(kinds.values(), key=lambda k: -k["latency_ms"]),
        "top_operators": [{"op_index": r["op_index"], "func": r["func"], "kind": r["kind"],
                           "latency_ms": (r["latency_median_s"] or 0.0) * 1e3,
                           "share": (r["latency_median_s"] or 0.0) / total if total else 0.0} for r in ranked],
    }


def format_kinds(totals: dict[str, Any]) -> str:
    """The per-kind totals and top operators as text."""
    kinds = "  ".join(f"{k['kind']} {k['latency_ms']:.3f} ms ({k['share']:.0%}, {k['operators']})"
                      for k in totals["by_kind"])
    top = "  ".join(f"#{t['op_index']} {t['kind']} {t['latency_ms']:.3f} ms ({t['share']:.0%})"
                    for t in totals["top_operators"])
    return f"by kind: {kinds}\ntop operators: {top}"


def cmd_collect(args: argparse.Namespace) -> int:
    with contextlib.ExitStack() as held:
        return _cmd_collect(args, held)


def _cmd_collect(args: argparse.Namespace, held: contextlib.ExitStack) -> int:
    from ..dataset import SCHEMA_VERSION, Dataset, inspect_file
    from ..pipeline import CollectOptions, collect
    from ..profile import TimingConfig
    from ..runtime import is_gpu, resolve_target
    from ..tune import get_tuner

    tuner = get_tuner(args.tuner)
    if args.pretrained and not args.iftune:
        raise OpBenchError("--pretrained applies to tuning: add --iftune true")
    check_output_path(args.json, "--json")
    check_output_path(args.save_schedule, "--save-schedule")
    if args.schedule:  # a bad file fails before any work
        from ..schedule import Schedule

        Schedule.load(args.schedule)
    if args.ifcompare:
        _scheduler_names(args)
    rpc = _rpc_spec(args)
    if rpc is not None and (args.corun or args.ifcompare):
        raise OpBenchError(f"{'--corun' if args.corun else '--ifcompare'} runs on this machine's GPU, not over "
                           "--rpc-tracker (accepted with RPC: collect and --iftune)")
    if rpc is not None:
        rpc.check()  # an unreachable tracker or an unknown key fails before any work
    target = resolve_target(args.target, local_device=rpc is None)
    if args.corun and not is_gpu(target):
        raise OpBenchError("--corun needs --target cuda (co-runs are measured on CUDA streams)")
    if args.pretrained:
        from ..tune import pretrained_tuner

        tuner = pretrained_tuner(tuner, args.pretrained, target.kind.name)
    path = dataset_path(args)
    inspect_file(Path(path))  # a file that is not a dataset is refused before the model is loaded
    database_dir = _database_dir(args, path)
    if args.iftune:  # a second tuning run on this database is refused now, not after measuring
        from ..tune.database import database_lock

        held.enter_context(database_lock(database_dir))
    workload = _load(args)
    profiler = _profiler(args, target, rpc)
    timing = TimingConfig(warmup=args.warmup, repeat=args.repeat, min_repeat_ms=args.min_repeat_ms,
                          flush_l2=args.flush_l2)
    command = public_command([args.prog_name, *args.argv])
    out = _human(args)

    def options(applied: Any = None, force: bool = args.force) -> Any:
        return CollectOptions(timing=timing, force=force, check=not args.no_check, progress=not args.quiet,
                              seed=args.seed, config=applied.config if applied else "default",
                              database=applied.database if applied else None)

    tuning: dict[str, Any] | None = None
    with Dataset(path) as dataset:
        if args.iftune:
            result, tuning = _collect_tuned(args, workload, target, dataset, database_dir, tuner, options,
                                            command, profiler, out)
        else:
            applied = _applied(database_dir, workload, target, device=getattr(profiler, "remote", None)) \
                if database_dir else None
            result = collect(workload, target, dataset, options(applied), command=command, profiler=profiler)
    m = result.model_row
    totals = kind_totals(result.rows)
    summary = {
        "run_id": result.run_id, "schema_version": SCHEMA_VERSION,
        "model": workload.name, "source": workload.source, "batch_size": workload.batch_size,
        "workload": workload.fingerprint(), "workload_id": result.key["workload_id"],
        "device_id": result.key["device_id"], "config": result.key["config"], "l2_flush": bool(args.flush_l2),
        "target": result.key["target"], "operators": len(result.graph), "unique_tasks": len(result.graph.tasks()),
        "measured": result.measured, "skipped": result.skipped, "failed": result.failed,
        "sum_op_latency_ms": sum(r["latency_median_s"] or 0.0 for r in result.rows) * 1e3,
        "vm_latency_ms": (m["vm_latency_median_s"] or 0.0) * 1e3, "vm_run_id": m["run_id"],
        "replay_rel_error": m["replay_rel_error"], "compile_s": result.compile_s,
        "measure_s": result.measure_s, "dataset": os.path.abspath(result.dataset_path),
        **totals, "environment": result.tags,
        **result.extra.get("summary", {}),
    }
    if tuning is not None:
        summary["tuning"] = tuning
    if not args.quiet:
        print(format_table(result.rows), file=out)
        print(file=out)
        print(format_kinds(totals), file=out)
    if tuning is not None:
        print(format_tuning(tuning), file=out)
    err = summary["replay_rel_error"]
    vm_from = "" if result.model_row_written else f" (from run {m['run_id']})"
    kernels = "" if result.key["config"] == "default" else f", tuned kernels {result.key['config']}"
    print(f"{summary['model']} ({summary['source']}, batch {summary['batch_size']}, "
          f"{target.kind.name}{kernels}): {summary['operators']} operators, "
          f"{summary['unique_tasks']} unique tasks, {result.failed} failed; "
          f"sum of operator latencies {summary['sum_op_latency_ms']:.3f} ms; "
          f"Relax VM {summary['vm_latency_ms']:.3f} ms"
          f"{vm_from}; replay error "
          f"{'-' if err is None else f'{err:.1e}'}; "
          f"measured {result.measured}, skipped {result.skipped} already in {summary['dataset']} "
          f"(run {result.run_id})", file=out)
    if args.ifcompare:
        from ..parallel import TVMBackend

        backend = TVMBackend(result.extra["kernels"], workload.example_inputs(args.seed),
                             result.extra.get("resources") or None)
        # the operators were just timed alone (or read from the dataset): no second measurement
        by_index = {r["op_index"]: r.get("latency_median_s") for r in result.rows}
        latencies = [by_index.get(n.index) for n in backend.graph]
        known = all(t is not None for t in latencies)
        log.info("parallel schedules: %s", "reusing the operator times just measured" if known
                 else "some operator has no time, timing every operator again")
        summary.update(_compare(backend, args, latencies=latencies if known else None))
    if args.json:
        write_json(args.json, summary)
    return EXIT_FAILED_OPS if result.failed else EXIT_OK


def _rpc_spec(args: argparse.Namespace) -> Any:
    """``--rpc-tracker``/``--rpc-key``/``--rpc-workers`` checked, or None without a tracker."""
    from ..profile.rpc import RPCSpec

    if args.rpc_tracker is None:
        if args.rpc_key is not None:
            raise OpBenchError("--rpc-key needs --rpc-tracker HOST:PORT")
        return None
    return RPCSpec.parse(args.rpc_tracker, args.rpc_key, args.rpc_workers)


def _profiler(args: argparse.Namespace, target: Any, rpc: Any) -> Any:
    """Where operators are timed: a remote device, this machine's GPU, or this machine's CPU."""
    from ..profile import LocalProfiler
    from ..runtime import is_gpu

    if rpc is not None:
        from ..profile.rpc import RPCProfiler

        return RPCProfiler(rpc, target)
    if is_gpu(target):
        from ..profile.cuda import CudaProfiler

        return CudaProfiler(corun_k=args.corun_k, corun_limit=args.corun_limit if args.corun else 0)
    return LocalProfiler()


def _database_dir(args: argparse.Namespace, dataset: str) -> Path | None:
    """``--database``, else (with ``--iftune``) ``<dataset>.tuning``; checked before any work."""
    from ..tune.database import check_database, default_database_dir

    tuning = getattr(args, "iftune", False)
    if args.database is None and not tuning:
        return None
    folder = Path(args.database) if args.database else default_database_dir(dataset)
    check_database(folder, write=tuning)
    return folder


def _applied(database_dir: Path, workload: Any, target: Any, exclude: set[str] | None = None,
             device: Any = None) -> Any:
    from ..pipeline.tune import extracted_tasks
    from ..tune.database import applied_database

    applied = applied_database(database_dir, extracted_tasks(workload, target, device), target, exclude)
    if applied is None:
        log.warning("tuning database %s has no record for this model's tasks; default kernels", database_dir)
    return applied


def _task_latency(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Median latency of each task (by its fused function name) from operator rows."""
    return {r["func"]: r["latency_median_s"] for r in rows if r["latency_median_s"] is not None}


def _collect_tuned(args: argparse.Namespace, workload: Any, target: Any, dataset: Any, database_dir: Path,
                   tuner: Any, options: Any, command: str, profiler: Any, out: TextIO) -> tuple[Any, dict[str, Any]]:
    """--iftune: default kernels, tuning, tuned kernels (a tuned kernel slower than its default one is
    dropped), and the comparison."""
    from ..pipeline import collect
    from ..pipeline.tune import tune_workload
    from ..tune.database import applied_database

    log.info("1/3 measuring the default kernels")
    default = collect(workload, target, dataset, options(), command=command, profiler=profiler)
    before = _task_latency(default.rows)
    log.info("2/3 tuning with '%s', %d trials per task", tuner.name, args.trials)
    run = tune_workload(workload, target, dataset, database_dir, tuner, args.trials, order=before,
                        tasks_limit=args.tune_tasks, command=command, profiler=profiler,
                        time_limit=args.tune_time)
    log.info("3/3 measuring the tuned kernels")
    applied = applied_database(database_dir, run.extracted, target)
    tuned = default
    dropped: set[str] = set()
    rejected: dict[str, float] = {}  # a dropped task's tuned time, as measured (the table shows it)
    if applied is not None:
        tuned = collect(workload, target, dataset, options(applied), command=command, profiler=profiler)
        after = _task_latency(tuned.rows)
        dropped = {t for t in applied.tasks if t in after and t in before and after[t] >= before[t]}
        rejected = {t: after[t] for t in dropped}
        if dropped:
            log.info("%d tuned kernels are not faster than the default ones; measuring without them: %s",
                     len(dropped), ", ".join(sorted(dropped)))
            applied = applied_database(database_dir, run.extracted, target, exclude=dropped)
            if applied is not None:
                tuned = collect(workload, target, dataset, options(applied), command=command, profiler=profiler)
            else:
                tuned = default
    after = {**_task_latency(tuned.rows), **rejected}
    tasks = []
    for t in run.tasks:
        d, a = before.get(t.task), after.get(t.task)
        tasks.append({"task": t.task, "func": t.task, "uses": t.weight, "default_s": d, "tuned_s": a,
                      "speedup": d / a if d and a else None, "trials": t.trials, "trials_before": t.before,
                      "valid": t.valid, "best_trial_s": t.best_s, "kept": t.task not in dropped and
                      applied is not None and t.task in applied.tasks, "seconds": t.seconds})
    model_default = default.model_row["vm_latency_median_s"]
    model_tuned = tuned.model_row["vm_latency_median_s"]
    return tuned, {
        "tuner": tuner.name, "trials_per_task": args.trials, "tasks": tasks, "database": str(database_dir),
        "config": tuned.key["config"], "model_default_s": model_default, "model_tuned_s": model_tuned,
        "model_speedup": model_default / model_tuned if model_default and model_tuned else None,
        "tuning_s": run.seconds, "trials": run.measured,
        "trials_per_s": run.measured / run.seconds if run.seconds else None,
    }


def format_tuning(tuning: dict[str, Any]) -> str:
    """Per task: default and tuned latency, speedup, trials; then the whole model before and after."""
    head = f"{'task':<44}{'uses':>5}{'default ms':>12}{'tuned ms':>11}{'speedup':>9}{'trials':>8}{'valid':>7}"
    lines = ["", head, "-" * len(head)]

    def ms(v: Any) -> str:
        return "-" if v is None else f"{v * 1e3:.4f}"

    for t in tuning["tasks"]:
        mark = "" if t["kept"] else "  (default kept)"
        speed = "-" if t["speedup"] is None else f"{t['speedup']:.2f}x"
        lines.append(f"{t['task'][:43]:<44}{t['uses']:>5}{ms(t['default_s']):>12}{ms(t['tuned_s']):>11}"
                     f"{speed:>9}{t['trials'] + t['trials_before']:>8}{t['valid']:>7}{mark}")
    speed = "-" if tuning["model_speedup"] is None else f"{tuning['model_speedup']:.2f}x"
    rate = "-" if tuning["trials_per_s"] is None else f"{tuning['trials_per_s']:.2f}"
    lines.append(f"Relax VM: default kernels {ms(tuning['model_default_s'])} ms, "
                 f"tuned {ms(tuning['model_tuned_s'])} ms "
                 f"({speed}); tuned {tuning['trials']} candidates in {tuning['tuning_s']:.0f} s ({rate} trials/s) "
                 f"with '{tuning['tuner']}'; database {tuning['database']}")
    return "\n".join(lines) + "\n"


def _load(args: argparse.Namespace) -> Any:
    from ..models import load_workload

    with announced(f"loading {args.modelsource} model {one_line(args.modelname)} (batch {args.batchsize})"):
        return load_workload(args.modelsource, args.modelname, args.batchsize, image_size=args.image_size,
                             seqlen=args.seqlen, seed=args.seed, sha256=args.sha256, cache_dir=args.cache_dir,
                             max_download_mb=args.max_download_mb)


IOS_COSTS = ("model", "measured")
COSTS = ("measured", "predicted")
PREDICTED = ("ios", "greedy")  # the schedulers that take predicted costs


def _scheduler_names(args: argparse.Namespace) -> list[str]:
    """``--schedulers`` checked (unknown names fail before any work), sequential first."""
    from ..schedule import get_scheduler

    names = [get_scheduler(n.strip()).name for n in args.schedulers.split(",") if n.strip()]
    _choices(args.ios_cost, IOS_COSTS, "--ios-cost")
    costs = _choices(getattr(args, "cost", "measured"), COSTS, "--cost")
    if "predicted" in costs and not getattr(args, "predictor", None):
        raise OpBenchError("--cost predicted needs --predictor FILE (a latency predictor from 'opbench train')")
    if "predicted" in costs and not any(n in PREDICTED for n in names):
        raise OpBenchError(f"--cost predicted applies to the {' and '.join(PREDICTED)} schedulers; --schedulers "
                           f"names neither")
    return ["sequential"] + [n for n in names if n != "sequential"]


def _choices(text: str, accepted: Sequence[str], flag: str) -> list[str]:
    """A comma-separated flag's values, each one of ``accepted``, once each in the order given."""
    values = list(dict.fromkeys(c.strip() for c in text.split(",") if c.strip()))
    bad = [c for c in values if c not in accepted] or ([] if values else [text])
    if bad:
        raise OpBenchError(f"unknown {flag} '{bad[0]}' (accepted: {', '.join(accepted)}, comma-separated)")
    return values


def _predictors(args: argparse.Namespace, backend: Any) -> tuple[Any, Any]:
    """The latency (and co-run) predictor of ``--predictor``, checked against the device in use."""
    from ..parallel import device_name
    from ..predict import load_predictor
    from ..profile.env import cpu_model

    if backend.name != "tvm":
        raise OpBenchError("--cost predicted costs TVM kernels (the predictors learn from TVM kernel rows); "
                           "use it with --backend tvm")
    files = [f.strip() for f in args.predictor.split(",") if f.strip()]
    if not 1 <= len(files) <= 2:
        raise OpBenchError(f"--predictor takes a latency predictor and optionally a co-run predictor, "
                           f"got {len(files)} files")
    latency = load_predictor(files[0], "latency")
    corun = load_predictor(files[1], "corun") if len(files) > 1 else None
    kind = "cuda" if backend.is_cuda else "llvm"
    for p in (latency, corun):
        if p is not None:
            p.check_device(device_name(backend) if backend.is_cuda else cpu_model(), kind)
    return latency, corun


def _schedulers(names: list[str], backend: Any, args: argparse.Namespace) -> list[Any]:
    """Scheduler names, with ``ios`` once per ``--ios-cost`` (``ios-measured`` times its stages)."""
    from ..profile.schedule import measured_stage_cost
    from ..schedule import IOS

    out: list[Any] = []
    costs = _choices(getattr(args, "cost", "measured"), COSTS, "--cost")
    for name in names:
        if "measured" in costs or name not in PREDICTED:
            if name != "ios":
                out.append(name)
            else:
                for cost in _choices(args.ios_cost, IOS_COSTS, "--ios-cost"):
                    measured = measured_stage_cost(backend) if cost == "measured" else None
                    out.append(IOS(time_limit_s=args.ios_time_limit, stage_cost=measured,
                                   name="ios" if cost == "model" else "ios-measured"))
    if "predicted" in costs:
        from ..predict.scheduling import predicted_schedulers
        from ..profile.cuda import device_figures

        latency, corun = _predictors(args, backend)
        chosen = [IOS(time_limit_s=args.ios_time_limit) if n == "ios" else n for n in names if n in PREDICTED]
        out += predicted_schedulers(chosen, latency, corun, backend.resources,
                                    device_figures() if backend.is_cuda else None)
    return out


def _compare(backend: Any, args: argparse.Namespace, baseline: Any = None,
             latencies: list[float] | None = None) -> dict[str, Any]:
    """Schedules side by side (and the model's own CUDA Graph, for a torch model), then the critical
    path that bounds them all; the table as JSON. ``latencies`` (seconds by operator) are the
    operators' alone-times when they were just measured."""
    from ..parallel import evaluate_with_bound, format_comparison, table_rows
    from ..schedule import Schedule

    given = Schedule.load(args.schedule) if getattr(args, "schedule", None) else None
    what = f"schedule {args.schedule}" if given else f"schedules {args.schedulers}"
    log.info("comparing %s on %d operators", what, len(backend.graph))
    kept, rows, bound = evaluate_with_bound(backend, _schedulers(_scheduler_names(args), backend, args),
                                            repeat=args.compare_repeat,
                                            number=args.compare_number, latencies=latencies, baseline=baseline,
                                            schedule=given)
    out = _human(args)
    how = "CUDA Graph" if backend.is_cuda else "threads"
    print(f"\n{backend.name} kernels, {len(backend.graph)} operators ({how}):", file=out)
    print(format_comparison(rows), file=out)
    if baseline is not None and rows[0]["kept"]:
        print(f"kept: the {rows[0]['schedule']} (no schedule beats it by more than 2%; best schedule: {kept.name})",
              file=out)
    else:
        print(f"kept: {kept.name} ({kept.num_streams} streams, {kept.num_events} events)", file=out)
    line = f"critical path: {len(bound['ops'])} operators, {bound['chain_ms']:.4f} ms run alone"
    if backend.is_cuda:
        line += (f"; no schedule of these kernels is faster (at most {rows[0]['latency_ms'] / bound['chain_ms']:.2f}x "
                 "over sequential)")
    else:
        line += ("; on the CPU each stream is a thread: untuned TVM kernels run on one core each and release "
                 "Python's lock, so streams overlap up to the number of cores (tuned kernels use every core)")
    print(line, file=out)
    if args.save_schedule:
        kept.save(args.save_schedule)
    stages = _print_stages(backend, rows, args, out) if args.stages else None
    times = [{"index": n.index, "name": n.func, "kind": n.kind,
              "output_shape": list(n.output_shapes[0]) if n.output_shapes else [],
              "alone_ms": bound["alone_ms"][n.index]} for n in backend.graph]
    table = {"schedules": table_rows(rows), "critical_path": {k: v for k, v in bound.items() if k != "alone_ms"},
             "operator_times": times}
    if stages is not None:
        table["stages"] = stages
    return table


def _print_stages(backend: Any, rows: list[dict[str, Any]], args: argparse.Namespace, out: Any) -> dict[str, Any]:
    """IOS's view: every stage of sequential and of each staged schedule, with its measured latency."""
    from ..profile.schedule import stage_table

    found: dict[str, Any] = {}
    for row in rows:
        plan = row.get("plan")
        if plan is None or (plan.name != "sequential" and not plan.stages):
            continue
        stages = stage_table(backend, plan, args.compare_repeat)
        total = sum(s["latency_ms"] for s in stages)
        found[plan.name] = {"total_ms": total, "stages": stages}
        print(f"\nstages of {plan.name} ({len(stages)} stages, {total:.4f} ms with a barrier after each):", file=out)
        for s in stages:
            groups = " | ".join(" ".join(f"{op}:{kind}" for op, kind in zip(g, k, strict=True))
                                for g, k in zip(s["groups"], s["operators"], strict=True))
            print(f"  stage {s['stage']:>3}  {s['strategy']:<10} {s['latency_ms']:>9.4f} ms  {groups}", file=out)
    return found


def cmd_compare(args: argparse.Namespace) -> int:
    from ..parallel import CapturedModel, merge_mode, torch_backend, tvm_backend
    from ..runtime import is_gpu, resolve_target

    if args.backend not in ("tvm", "torch"):
        raise OpBenchError(f"unknown backend '{args.backend}' (accepted: tvm, torch)")
    merge = merge_mode(args.merge)
    check_output_path(args.json, "--json")
    check_output_path(args.save_schedule, "--save-schedule")
    if args.schedule:  # a bad file fails before any work
        from ..schedule import Schedule

        Schedule.load(args.schedule)
    _scheduler_names(args)
    target = resolve_target(args.target)
    workload = _load(args)
    baseline = None
    if args.backend == "tvm":
        database_dir = _database_dir(args, "")
        applied = _applied(database_dir, workload, target) if database_dir else None
        log.info("extracting and compiling %s for %s", workload.name, target.kind.name)
        backend = tvm_backend(workload, target, workload.example_inputs(args.seed),
                              database=applied.database if applied else None, merge=merge,
                              repeat=args.compare_repeat, number=args.compare_number)
    else:
        if workload.torch_module is None:
            raise OpBenchError(f"--backend torch needs a torch model; source '{workload.source}' has none "
                               "(accepted sources: local, transformers)")
        import torch

        device = "cuda" if is_gpu(target) else "cpu"
        module = workload.torch_module.to(device)
        inputs = [torch.from_numpy(x).to(device) for x in workload.example_inputs(args.seed)]
        backend = torch_backend(module, inputs, merge, trace="export", repeat=args.compare_repeat,
                                number=args.compare_number)
        baseline = CapturedModel(module, inputs)
    table = _compare(backend, args, baseline)
    if args.json:
        write_json(args.json, table)
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    from ..dataset import Dataset, check_tables, export, export_format, export_targets

    path = dataset_path(args)
    tables = check_tables([t.strip() for t in args.table.split(",") if t.strip()])
    check_output_path(args.out, "--out")  # a folder is refused (the tables would land beside it)
    fmt = export_format(args.out, args.format)
    for target in export_targets(args.out, tables):
        check_output_path(target, "--out")
    Dataset(path, readonly=True).close()  # a file that is not a dataset is refused before anything is said
    log.info("exporting %s from %s", ", ".join(tables), path)
    written = export(path, fmt, args.out, tables)
    with Dataset(path, readonly=True) as ds:
        files = [{"table": t, "path": str(w), "rows": ds.count(t)} for t, w in zip(tables, written, strict=True)]
    if args.json:
        write_json("-", {"dataset": os.path.abspath(path), "format": fmt, "files": files})
    else:
        for f in files:
            print(f"wrote {f['path']} ({f['rows']} rows of {f['table']})")
    return EXIT_OK


def cmd_configspace(args: argparse.Namespace) -> int:
    from ..pipeline.tune import extracted_tasks, tuning_target
    from ..runtime import resolve_target
    from ..tune.space import task_space

    check_output_path(args.json, "--json")
    target = resolve_target(args.target)
    workload = _load(args)
    with announced(f"generating the design spaces of {workload.name}'s tasks"):
        tasks = extracted_tasks(workload, target)
        ms_target = tuning_target(target)
        spaces = [{**task_space(t.dispatched[0], ms_target, t.task_name), "weight": int(t.weight)} for t in tasks]
    write_json(args.json, {"model": workload.name, "workload": workload.fingerprint(), "target": str(ms_target),
                           "tasks": spaces, "space_size": sum(t["space_size"] for t in spaces)})
    if args.json != "-":
        print(f"wrote {args.json}: {len(spaces)} tasks, {sum(len(t['sketches']) for t in spaces)} sketches")
    return EXIT_OK


def cmd_models(args: argparse.Namespace) -> int:
    from ..models import list_sources

    sources = list_sources()
    if args.json:
        write_json("-", sources)
        return EXIT_OK
    for source, names in sources.items():
        print(f"{source}: {', '.join(names)}")
    return EXIT_OK


@contextlib.contextmanager
def native_stderr(quiet: bool) -> Iterator[None]:
    """With ``quiet``, send what native code (TVM's C++ logging) writes to stderr to /dev/null;
    Python's own messages still reach the terminal through a copy of the original stderr."""
    if not quiet:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)
    original, sys.stderr = sys.stderr, os.fdopen(os.dup(saved), "w", buffering=1)
    try:
        yield
    finally:
        sys.stderr.flush()
        sys.stderr.close()
        sys.stderr = original
        os.dup2(saved, 2)
        os.close(saved)


def _normalise(argv: list[str]) -> list[str]:
    """``collect`` is the default command; ``--debug`` goes first."""
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    if argv and argv[0].startswith("-") and argv[0] not in ("--help", "-h", "--version") \
            and not any(a in COMMANDS for a in argv):
        argv.insert(0, "collect")
    return ["--debug", *argv] if debug else argv


def main(argv: Sequence[str] | None = None, prog: str = "opbench") -> int:
    """Entry point of the ``opbench`` console script (``prog`` names the program in help and errors)."""
    argv = _normalise(list(sys.argv[1:] if argv is None else argv))
    parser = build_parser(prog)
    if prog != "opbench":  # the OpBench-compatible script: its own name in collect's help and errors
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        sub.choices["collect"].prog = prog
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    args.prog_name, args.argv = prog, [a for a in argv if a != "collect" or prog == "opbench"]
    quiet = getattr(args, "quiet", False)
    level = logging.DEBUG if args.debug or getattr(args, "verbose", False) else \
        logging.WARNING if quiet else logging.INFO
    signals.install()
    with native_stderr(quiet):
        logging.basicConfig(level=level, format="opbench: %(message)s", stream=sys.stderr, force=True)
        try:
            return args.func(args)
        except OpBenchError as err:
            if args.debug:
                traceback.print_exc()
            sys.stderr.write(f"{prog}: error: {one_line(err)}\n")
            return EXIT_USAGE
        except KeyboardInterrupt:
            return _interrupted(prog)
        except Exception as err:
            if signals.received():
                return _interrupted(prog)
            if args.debug:
                traceback.print_exc()
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            sys.stderr.write(f"{prog}: error: {type(err).__name__}: {one_line(first)} "
                             "(run with --debug for the traceback)\n")
            return EXIT_FAILURE


def run(argv: Sequence[str] | None = None, prog: str = "opbench") -> NoReturn:
    """The process's entry point: :func:`main`, then exit with its status. A signal that arrives
    while Python shuts down (its pools and threads stop) ends the process with one line and
    128 + the signal's number, not with a traceback."""
    try:
        code = main(argv, prog)
    except KeyboardInterrupt:  # a signal after the job returned, before the handlers below take over
        code = _interrupted(prog)
    signals.exiting(f"{prog}: interrupted while exiting; every finished measurement is in the dataset")
    sys.exit(code)


def _interrupted(prog: str) -> int:
    signum = signals.received()
    sys.stderr.write(f"{prog}: interrupted; every finished measurement is in the dataset\n")
    return 128 + signum if signum else EXIT_INTERRUPTED


if __name__ == "__main__":
    run()
