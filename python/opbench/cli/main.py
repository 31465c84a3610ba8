"""The ``opbench`` command: parse, run a job of :mod:`opbench.pipeline`, print (:mod:`.format`).

Subcommands: ``collect`` (the default when the first argument is a flag), ``compare``, ``export``,
``models``, ``configspace``, ``sample`` (:mod:`.sample`), and ``train``, ``predict``, ``report`` (:mod:`.learn`).
``python/performance_collector/op_performance_collector.py`` maps OpBench's flags onto ``collect``.

Exit status: 0 ok, 1 runtime failure, 2 usage or bad input, 3 finished with failed operators,
130 interrupted (Ctrl-C; 143 for SIGTERM).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import signal
import sys
import time
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

from .. import signals
from .._version import __version__
from ..errors import OpBenchError, first_line
from ..utils import PERCENTILES, announced
from . import learn
from . import sample as sample_cmd
from .args import (
    DEFAULT_DATASET,
    EXIT_FAILED_OPS,
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    Formatter,
    Parser,
    add_common,
    add_database_flag,
    add_dataset_flag,
    add_device_flags,
    add_json_flag,
    add_model_flags,
    add_predictor_flag,
    add_schedule_flags,
    boolean,
    compare_options,
    dataset_path,
    load_model,
    model_spec,
    nonneg_float,
    nonneg_int,
    positive_float,
    positive_int,
    sweep_points,
)
from .collect_job import apply_config, config_path
from .format import (
    check_output_path,
    format_comparison,
    format_kinds,
    format_stages,
    format_table,
    format_tuning,
    human,
    kind_totals,
    one_line,
    public_command,
    write_json,
)

log = logging.getLogger(__name__)


def _add_collect(sub: Any) -> None:
    p = sub.add_parser("collect", help="measure every operator of a model (or a sweep of models, batches, dtypes)",
                       formatter_class=Formatter,
                       description="Measure every operator of a model and write the dataset. Lists in --modelname, "
                                   "--batchsize and --dtype make a sweep: every combination, each in its own process "
                                   "(a crash loses one point), resumable, with one summary table at the end.")
    add_model_flags(p, sweep=True)
    m = p.add_argument_group("measurement")
    add_device_flags(m, sweep=True)
    m.add_argument("--repeat", type=positive_int, default=10,
                   help="timed samples per operator (p10/p50/p90/p99 come from these: 100 or more for a "
                        "meaningful p99)")
    m.add_argument("--warmup", type=nonneg_int, default=1, help="untimed calls before timing")
    m.add_argument("--min-repeat-ms", type=nonneg_float, default=5.0,
                   help="minimum duration of a sample in ms (CPU: whole ms, a fraction rounds up)")
    m.add_argument("--flush-l2", action="store_true", help="flush caches before every timed call")
    m.add_argument("--no-check", action="store_true", help="skip the replay-vs-VM check")
    m.add_argument("--corun", action="store_true", help="also measure co-run groups (cuda)")
    m.add_argument("--corun-k", type=positive_int, default=4, help="largest co-run group")
    m.add_argument("--corun-limit", type=positive_int, default=200, help="co-run groups to measure")
    m.add_argument("--force", action="store_true", help="re-measure rows already in the dataset")
    t = p.add_argument_group("tuning")
    t.add_argument("--iftune", type=boolean, default=False,
                   help="tune every unique task with MetaSchedule, then measure the tuned kernels (true/false)")
    t.add_argument("--tuner", default="xgb", choices=_tuner_names(), help="tuner")
    t.add_argument("--trials", type=positive_int, default=64, help="measured candidates per task when tuning")
    add_predictor_flag(t, "a trials predictor starts tuning's cost model (with --iftune and --tuner xgb); latency "
                          "and co-run predictors are the operator costs of --cost predicted", deprecated="--pretrained")
    t.add_argument("--tune-tasks", type=positive_int, default=None,
                   help="tune only the N heaviest tasks (default: every task)")
    t.add_argument("--tune-time", type=positive_float, default=None, metavar="SECONDS",
                   help="start no new task after this much tuning (the rest keep default kernels; a re-run "
                        "continues)")
    add_database_flag(t)
    r = p.add_argument_group("remote devices (TVM RPC tracker; builds stay on this machine)")
    r.add_argument("--rpc-tracker", default=None, metavar="HOST:PORT",
                   help="measure operators, the model and tuning candidates on devices registered here")
    r.add_argument("--rpc-key", default=None, help="the key the remote devices registered with")
    r.add_argument("--rpc-workers", type=positive_int, default=None,
                   help="candidates measured at once while tuning, one per remote device (default: every "
                        "device registered with the key, e.g. one rpc_server per GPU)")
    g = add_schedule_flags(p, predictor=False)
    g.add_argument("--ifcompare", type=boolean, default=False, help="compare parallel schedules (true/false)")
    o = add_common(p)
    add_dataset_flag(o)
    add_json_flag(o, "the summary")
    o.add_argument("--sweep-state", default=None, metavar="FILE",
                   help="a sweep's state (what finished; the same command again runs only the rest; default: "
                        "<dataset>.sweep-<digest>.json beside the dataset)")
    o.add_argument("--point-timeout", type=positive_float, default=None, metavar="SECONDS",
                   help="a sweep point running longer is killed (and counted as failed)")
    o.add_argument("--config", default=None, metavar="FILE",
                   help="the job as JSON or TOML (.toml; a CollectJob, opbench.pipeline.CollectJob: its fields are the "
                        "defaults of these flags; flags given here override them)")
    p.set_defaults(func=cmd_collect)


def _tuner_names() -> list[str]:
    from ..tune.tuners import TUNERS

    return list(TUNERS)


def _add_compare(sub: Any) -> None:
    from ..ir.depthwise import DEPTHWISE
    from ..ir.regions import CUTS, KERNELS
    from ..runtime.backend import BACKENDS
    from ..runtime.fused import LAYOUTS, PIECE_OPS

    p = sub.add_parser("compare", help="run a model under each schedule and compare", formatter_class=Formatter,
                       description="Run a model under each inter-operator schedule (CUDA Graph on GPU, "
                                   "threads on CPU) and print latency (median and p90/p99), speedup and output "
                                   "error; --trace writes the kept schedule's measured timeline.")
    add_model_flags(p)
    k = p.add_argument_group("kernels")
    k.add_argument("--backend", default="tvm", choices=BACKENDS,
                   help="tvm (TVM kernels), torch (the PyTorch model's kernels, see --kernels) or fused "
                        "(--backend torch --kernels fused)")
    k.add_argument("--kernels", default="aten", choices=KERNELS,
                   help="with --backend torch: aten (PyTorch's kernels, one per traced call) or fused (the traced "
                        "graph cut into regions, each compiled by Inductor; adds a torch.compile row)")
    k.add_argument("--cut", default="auto", choices=("auto", *CUTS),
                   help="with fused kernels, where to cut: auto (= branches), branches (one region per parallel "
                        "branch), blocks (also merges the fork-join blocks not worth running side by side, from "
                        "each operator's measured time) or whole (one region)")
    k.add_argument("--layout", default=None, choices=LAYOUTS,
                   help="with fused kernels, the layout of the regions' convolutions: inductor (Inductor's choice, "
                        "channels-last; the default) or pytorch (the model's own: where the model has grouped "
                        "convolutions, a later build starts seconds sooner and runs a few percent slower)")
    k.add_argument("--depthwise", default=None, choices=DEPTHWISE,
                   help="with fused kernels, how the regions run depthwise convolutions: aten (PyTorch's "
                        "convolution), taps (unfolded into the regions' own kernels: later builds make no cuDNN "
                        "plans for them, cold builds compile longer) or auto (on a GPU, taps where every "
                        "depthwise convolution is at most 3x3, else aten; the default)")
    k.add_argument("--piece-ops", type=int, default=None, metavar="N",
                   help="with fused kernels, the most a region of a new cut weighs (an operator one, an unfolded "
                        "depthwise convolution one per tap) before it is cut into pieces that worker processes "
                        f"compile at once; 0: no limit (default: {PIECE_OPS} where depthwise convolutions are "
                        "unfolded, by --depthwise taps or auto; none otherwise)")
    k.add_argument("--torch-compile", action="store_true",
                   help="with --backend torch: also measure torch.compile(model, mode='reduce-overhead') (always "
                        "with fused kernels)")
    k.add_argument("--merge", nargs="?", const="all", default="none", choices=("none", "all", "ios"),
                   help="IOS's merge first: convolutions reading the same input with the same kernel size, stride, "
                        "padding and dilation run as one, their output split (TVM: a Relax rewrite before "
                        "lowering; fused kernels: the traced graph, before it is cut). all (the same as --merge "
                        "alone): every such group; ios: the groups IOS's dynamic "
                        "programme finds faster merged than concurrent (TVM: two more builds, every group merged "
                        "to time the merged kernels, then the chosen ones)")
    add_database_flag(k)
    add_device_flags(p.add_argument_group("device"))
    add_schedule_flags(p)
    o = add_common(p)
    add_json_flag(o, "the table")
    o.add_argument("--trace", default=None, metavar="FILE.json",
                   help="write the kept schedule and sequential, replayed with a timing event around each "
                        "operator, as a Chrome trace (open in chrome://tracing or ui.perfetto.dev; one lane per "
                        "stream; the events perturb the timing a little)")
    o.add_argument("--nvtx", action="store_true",
                   help="also run the kept schedule uncaptured under torch.profiler with an NVTX range per "
                        "operator (cuda), so that Nsight Systems shows the operators' names on their streams; "
                        "with --trace, the profiler's own trace goes to FILE.torch.json")
    p.set_defaults(func=cmd_compare)


def _add_export(sub: Any) -> None:
    p = sub.add_parser("export", help="write dataset tables as CSV or Parquet", formatter_class=Formatter,
                       description="Write tables of a dataset as CSV or Parquet (read only: the dataset is "
                                   "not changed). With several tables, OUT gets a -TABLE suffix each.")
    add_dataset_flag(p)
    p.add_argument("--format", default=None, choices=("csv", "parquet"),
                   help="default: from --out's suffix, .csv or .parquet")
    p.add_argument("--out", required=True, help="output file")
    p.add_argument("--table", default="all", help="runs, operators, models, corun, trials (comma-separated) or all")
    add_json_flag(add_common(p), "what was written")
    p.set_defaults(func=cmd_export)


def _add_configspace(sub: Any) -> None:
    p = sub.add_parser("configspace", help="write each task's tuning design space as JSON", formatter_class=Formatter,
                       description="Write every unique task's MetaSchedule design space as JSON: its sketches, "
                                   "every sampling instruction with its domain, and the space size.")
    add_model_flags(p)
    add_json_flag(add_common(p), "the design spaces", default="-")
    p.set_defaults(func=cmd_configspace)


def _add_models(sub: Any) -> None:
    p = sub.add_parser("models", help="list model sources and names", formatter_class=Formatter)
    add_json_flag(add_common(p), "the list")
    p.set_defaults(func=cmd_models)


def build_parser(prog: str = "opbench") -> argparse.ArgumentParser:
    parser = Parser(prog=prog, description="Operator-level profiling of DNN models on TVM.",
                    epilog="Exit status: 0 ok, 1 runtime failure, 2 usage or bad input, 3 finished with failed "
                           "operators, 130 interrupted.")
    parser.add_argument("--version", action="version", version=f"opbench {__version__}")
    parser.add_argument("--debug", action="store_true", help="debug logs and tracebacks")
    sub = parser.add_subparsers(dest="command", parser_class=Parser)
    for add in (_add_collect, _add_export, _add_models, _add_compare, _add_configspace, sample_cmd.add_parser,
                learn.add_parsers):
        add(sub)
    return parser


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parser's subcommands by name."""
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


# collect ------------------------------------------------------------------------------------------
def cmd_collect(args: argparse.Namespace) -> int:
    with contextlib.ExitStack() as held:
        return _collect(args, held)


def _split_predictors(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """``--predictor``'s files split by kind: the trials predictor (tuning) and the latency/co-run ones
    (``--cost predicted``), each checked to read."""
    from ..predict.base import predictor_kind

    trials, costs = [], []
    for name in [f.strip() for f in (args.predictor or "").split(",") if f.strip()]:
        (trials if predictor_kind(name) == "trials" else costs).append(name)
    if len(trials) > 1:
        raise OpBenchError(f"--predictor: {len(trials)} trials predictors given, tuning takes one")
    if trials and not args.iftune:
        raise OpBenchError(f"--predictor {trials[0]} is a trials predictor, which applies to tuning: add "
                           "--iftune true")
    return (trials[0] if trials else None), (",".join(costs) or None)


def _collect(args: argparse.Namespace, held: contextlib.ExitStack) -> int:
    from ..dataset import inspect_file
    from ..pipeline import CollectOptions
    from ..pipeline.tune import load_pretrained
    from ..runtime import is_gpu
    from ..tune import get_tuner
    from .collect_job import job_from_args

    tuner = get_tuner(args.tuner)
    pretrained, args.predictor = _split_predictors(args)
    check_output_path(args.json, "--json")
    check_output_path(args.save_schedule, "--save-schedule")
    check_output_path(args.sweep_state, "--sweep-state")
    if args.schedule:  # a bad file fails before any work
        from ..schedule import Schedule

        Schedule.load(args.schedule)
    compare = compare_options(args) if args.ifcompare else None
    rpc = _rpc_spec(args)
    if rpc is not None and (args.corun or args.ifcompare):
        raise OpBenchError(f"{'--corun' if args.corun else '--ifcompare'} runs on this machine's GPU, not over "
                           "--rpc-tracker (accepted with RPC: collect and --iftune)")
    points = sweep_points(args)  # every model, size and dtype checked (and memory estimated) before any work
    path = dataset_path(args)
    inspect_file(Path(path))  # a file that is not a dataset is refused before the model is loaded
    database_dir = _database_dir(args, path)
    if len(points) > 1 or args.devices is not None:
        return _sweep(args, path)
    if rpc is not None:
        rpc.check()  # an unreachable tracker or an unknown key fails before any work
    measure = job_from_args(args).measure_spec()
    target = measure.resolve_target()
    if args.corun and not is_gpu(target):
        raise OpBenchError("--corun needs --target cuda (co-runs are measured on CUDA streams)")
    _check_applies(args, is_gpu(target), compare.load_schedule() if compare else None)
    if pretrained:
        tuner = load_pretrained(tuner, pretrained, target.kind.name)
    if args.iftune:  # a second tuning run on this database is refused now, not after measuring
        from ..tune.database import database_lock

        held.enter_context(database_lock(database_dir))
    profiler = measure.profiler(target)
    timing = measure.timing()
    command = public_command([args.prog_name, *args.argv])
    options = CollectOptions(timing=timing, force=args.force, check=not args.no_check, progress=not args.quiet,
                             seed=args.seed, database=database_dir)
    point = points[0]
    args.dtype = point.dtype
    loading = time.perf_counter()
    workload = load_model(args, point.batch)
    load_s = time.perf_counter() - loading
    code, summary = _collect_point(args, workload, target, profiler, path, options, tuner, command, compare)
    summary["phases_s"] = {"load": load_s, **summary["phases_s"]}
    if args.json:
        write_json(args.json, summary)
    return code


def _sweep(args: argparse.Namespace, path: str) -> int:
    """Run the collection as a sweep (:func:`opbench.pipeline.sweep.sweep`): each point in its own process, one
    worker per ``--devices`` GPU; print the summary table; exit 0 when every point finished, 1 otherwise."""
    from ..pipeline.spec import SpecError
    from ..pipeline.sweep import POINT_FLAGS, SweepJob, strip_flags, sweep
    from .collect_job import COLLECT_FLAGS, job_flags, job_from_args

    if args.devices is not None and args.gpu is not None:
        raise OpBenchError("--device and --devices name the GPUs twice: use --devices N,N for a sweep")
    job = dataclasses.replace(job_from_args(args), dataset=path)
    if args.iftune and len(job.devices or ()) > 1:
        raise OpBenchError("--iftune with several --devices: the workers would share one tuning database; "
                           "tune on one GPU first, then sweep the tuned kernels with --database")
    # each point receives its job as a spec (the sweep's job narrowed to it), plus the flags that are not the job's
    spec = SweepJob(job, args.sweep_state, args.point_timeout,
                    tuple(strip_flags(args.argv, {**POINT_FLAGS, **job_flags()})))
    try:
        result = sweep(spec, progress=not args.quiet)
    except SpecError as err:  # the flags were checked as they were parsed: a field here is the flag's
        flag = COLLECT_FLAGS.get(err.field.removeprefix("job."), (None, err.field))[1]
        raise OpBenchError(f"{flag}: {err.message}") from None
    out = human(args)
    print(result.table(), file=out)
    earlier = f" ({result.resumed} in an earlier run)" if result.resumed else ""
    print(f"sweep: {result.finished} of {len(result.records)} points finished{earlier}; rows in "
          f"{os.path.abspath(path)}; state in {result.state} (the same command again runs only the points not "
          "finished)", file=out)
    if args.json:
        write_json(args.json, {"dataset": os.path.abspath(path), "state": str(result.state),
                               "points": result.records})
    return EXIT_OK if result.finished == len(result.records) else EXIT_FAILURE


def _collect_point(args: argparse.Namespace, workload: Any, target: Any, profiler: Any, path: str, options: Any,
                   tuner: Any, command: str, compare: Any) -> tuple[int, dict[str, Any]]:
    """One workload of ``collect`` (one batch size): measured (tuned first with --iftune), printed,
    compared with --ifcompare; its exit code and summary."""
    from ..dataset import Dataset
    from ..pipeline import collect
    from ..pipeline.tune import TuneSpec, tune_and_measure

    tuned = None
    with Dataset(path) as dataset:
        if args.iftune:
            tune = TuneSpec(options.database, tuner, args.trials, args.tune_tasks, args.tune_time)
            tuned = tune_and_measure(workload, target, dataset, options, tune, command=command, profiler=profiler)
            result = tuned.tuned
        else:
            result = collect(workload, target, dataset, options, command=command, profiler=profiler)
    summary = _collect_summary(result, args)
    if tuned is not None:
        summary["tuning"] = tuned.summary()
    out = human(args)
    if not args.quiet:
        print(format_table(result.rows), file=out)
        print(file=out)
        print(format_kinds({k: summary[k] for k in ("by_kind", "top_operators")}), file=out)
    if tuned is not None:
        print(format_tuning(summary["tuning"]), file=out)
    print(_collect_line(summary, result, target), file=out)
    if args.ifcompare:
        from ..pipeline.compare import compare as compare_job
        from ..runtime.backend import KernelBackend

        backend = KernelBackend.create("tvm", result.kernels, workload.example_inputs(args.seed),
                                       result.resources or None)
        # the operators were just timed alone (or read from the dataset): no second measurement
        by_index = {r["op_index"]: r.get("latency_median_s") for r in result.rows}
        latencies = [by_index.get(n.index) for n in backend.graph]
        known = all(t is not None for t in latencies)
        log.info("parallel schedules: %s", "reusing the operator times just measured" if known
                 else "some operator has no time, timing every operator again")
        summary.update(_print_comparison(compare_job(backend, compare, latencies=latencies if known else None),
                                         args))
    return (EXIT_FAILED_OPS if result.failed else EXIT_OK), summary


def _collect_summary(result: Any, args: argparse.Namespace) -> dict[str, Any]:
    """The collect JSON: the run, the keys, the latencies, per-kind totals, environment and co-runs."""
    import psutil

    from ..dataset import SCHEMA_VERSION

    workload, m = result.workload, result.model_row
    return {
        "run_id": result.run_id, "schema_version": SCHEMA_VERSION,
        "model": workload.name, "source": workload.source, "batch_size": workload.batch_size,
        "dtype": workload.dtype, "workload": workload.fingerprint(), "workload_id": result.key["workload_id"],
        "device_id": result.key["device_id"], "config": result.key["config"], "l2_flush": bool(args.flush_l2),
        "target": result.key["target"], "operators": len(result.graph), "unique_tasks": len(result.graph.tasks()),
        "measured": result.measured, "skipped": result.skipped, "failed": result.failed,
        "sum_op_latency_ms": sum(r["latency_median_s"] or 0.0 for r in result.rows) * 1e3,
        "vm_latency_ms": (m["vm_latency_median_s"] or 0.0) * 1e3,
        **{f"vm_latency_p{q}_ms": m[f"vm_latency_p{q}_s"] * 1e3 if m.get(f"vm_latency_p{q}_s") is not None else None
           for q in PERCENTILES},
        "vm_run_id": m["run_id"],
        "replay_rel_error": m["replay_rel_error"], "compile_s": result.compile_s,
        "measure_s": result.measure_s, "phases_s": dict(result.phases_s),
        "process_s": time.time() - psutil.Process().create_time(),  # startup: what the phases leave of it
        "dataset": os.path.abspath(result.dataset_path),
        **kind_totals(result.rows), "environment": result.tags, **result.corun,
    }


def _tail(summary: dict[str, Any]) -> str:
    """`` (p90 X, p99 Y ms)`` of the whole model, when it was timed in this run."""
    p90, p99 = summary.get("vm_latency_p90_ms"), summary.get("vm_latency_p99_ms")
    return "" if p90 is None or p99 is None else f" (p90 {p90:.3f}, p99 {p99:.3f})"


def _collect_line(summary: dict[str, Any], result: Any, target: Any) -> str:
    """The one-line summary a collection ends with."""
    err = summary["replay_rel_error"]
    vm_from = "" if result.model_row_written else f" (from run {result.model_row['run_id']})"
    kernels = "" if result.key["config"] == "default" else f", tuned kernels {result.key['config']}"
    dtype = "" if summary["dtype"] == "float32" else f", {summary['dtype']}"
    return (f"{summary['model']} ({summary['source']}, batch {summary['batch_size']}{dtype}, "
            f"{target.kind.name}{kernels}): {summary['operators']} operators, "
            f"{summary['unique_tasks']} unique tasks, {result.failed} failed; "
            f"sum of operator latencies {summary['sum_op_latency_ms']:.3f} ms; "
            f"Relax VM {summary['vm_latency_ms']:.3f} ms{_tail(summary)}{vm_from}; replay error "
            f"{'-' if err is None else f'{err:.1e}'}; "
            f"measured {result.measured}, skipped {result.skipped} already in {summary['dataset']} "
            f"(run {result.run_id})")


def _rpc_spec(args: argparse.Namespace) -> Any:
    """``--rpc-tracker``/``--rpc-key``/``--rpc-workers`` checked, or None without a tracker."""
    from ..profile.rpc import RPCSpec

    if args.rpc_tracker is None:
        if args.rpc_key is not None:
            raise OpBenchError("--rpc-key needs --rpc-tracker HOST:PORT")
        return None
    return RPCSpec.parse(args.rpc_tracker, args.rpc_key, args.rpc_workers)


def _database_dir(args: argparse.Namespace, dataset: str) -> Path | None:
    """``--database``, else (with ``--iftune``) ``<dataset>.tuning``; checked before any work."""
    from ..tune.database import check_database, default_database_dir

    tuning = getattr(args, "iftune", False)
    if args.database is None and not tuning:
        return None
    folder = Path(args.database) if args.database else default_database_dir(dataset)
    check_database(folder, write=tuning)
    return folder


# compare ------------------------------------------------------------------------------------------
def _print_comparison(result: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Print the compare job's table, what was kept, the bound (and stages); save the kept schedule
    (``--save-schedule``); the table as JSON."""
    backend, rows, bound, kept = result.backend, result.rows, result.bound, result.kept
    out = human(args)
    how = "CUDA Graph" if backend.is_cuda else "threads"
    print(f"\n{backend.name} kernels, {len(backend.graph)} operators ({how}):", file=out)
    print(format_comparison(rows), file=out)
    if result.kept_baseline is not None:
        print(f"kept: the {result.kept_baseline['schedule']} (no schedule beats it by more than 2%; best schedule: "
              f"{kept.name})", file=out)
    else:
        print(f"kept: {kept.name} ({kept.num_streams} streams, {kept.num_events} events)", file=out)
    line = f"critical path: {len(bound['ops'])} operators, {bound['chain_ms']:.4f} ms run alone"
    if backend.is_cuda:
        sequential = next(r for r in rows if r["plan"] is not None)
        line += (f"; no schedule of these kernels is faster (at most "
                 f"{sequential['latency_ms'] / bound['chain_ms']:.2f}x over sequential)")
    elif backend.name == "tvm":
        line += ("; on the CPU each stream is a thread: untuned TVM kernels run on one core each and release "
                 "Python's lock, so streams overlap up to the number of cores (tuned kernels use every core)")
    else:
        line += ("; on the CPU each stream is a thread and PyTorch's kernels already use every core, so streams "
                 "mostly contend: the speedups are a GPU's")
    print(line, file=out)
    if args.save_schedule:
        kept.save(args.save_schedule)
    if result.stages is not None:
        print(format_stages(result.stages), file=out)
    return result.table()


def _check_applies(args: argparse.Namespace, gpu: bool, schedule: Any) -> None:
    """One rule for every option of ``compare`` that does not apply to the run asked for: it is refused (one
    line, exit 2, before any work), never ignored."""
    from ..pipeline.compile import saved_cut as saved_cut_fields

    backend, kernels = getattr(args, "backend", "tvm"), getattr(args, "kernels", "aten")
    cut, torch_compile = getattr(args, "cut", "auto"), getattr(args, "torch_compile", False)
    fused = backend == "fused" or (backend == "torch" and kernels == "fused")
    if getattr(args, "nvtx", False) and not gpu:
        raise OpBenchError("--nvtx marks operators for Nsight Systems on a GPU: use it with --target cuda "
                           "(on the CPU, --trace shows each stream's thread)")
    if cut != "auto" and not fused:
        raise OpBenchError(f"--cut {cut} cuts a PyTorch model into Inductor-compiled regions: it applies to "
                           "--backend torch --kernels fused (or --backend fused), not to this run")
    layout = getattr(args, "layout", None)
    if layout is not None and not fused:
        raise OpBenchError(f"--layout {layout} lays out the convolutions of Inductor-compiled regions: it applies to "
                           "--backend torch --kernels fused (or --backend fused), not to this run")
    if torch_compile and backend == "tvm":
        raise OpBenchError("--torch-compile adds a torch.compile row to the PyTorch backends: it applies to "
                           "--backend torch or fused, not to --backend tvm")
    if args.sm_partition != "off" and not gpu:
        raise OpBenchError(f"--sm-partition {args.sm_partition} confines CUDA streams to groups of SMs: it applies "
                           "to --target cuda (on the CPU, streams are threads)")
    if schedule is not None and schedule.partitioned and not gpu:
        raise OpBenchError("--schedule: this schedule confines its streams to groups of SMs, which applies to a GPU "
                           "(--target cuda); on the CPU use a schedule saved without --sm-partition")
    saved_cut = schedule.meta.get("cut") if schedule is not None and schedule.meta.get("regions") else None
    if saved_cut and cut not in ("auto", saved_cut):
        raise OpBenchError(f"--cut {cut}, but the schedule was saved with its regions cut '{saved_cut}' "
                           f"(accepted: --cut {saved_cut} or auto, which reuses the saved regions)")
    depthwise = getattr(args, "depthwise", None)
    if depthwise is not None and not fused:
        raise OpBenchError(f"--depthwise {depthwise} sets how Inductor-compiled regions run depthwise convolutions: "
                           "it applies to --backend torch --kernels fused (or --backend fused), not to this run")
    piece_ops = getattr(args, "piece_ops", None)
    if piece_ops is not None and piece_ops < 0:
        raise OpBenchError(f"--piece-ops {piece_ops}: the most a region weighs before it is cut into pieces is a "
                           "whole number from 0 (0: no limit)")
    if piece_ops is not None and not fused:
        raise OpBenchError(f"--piece-ops {piece_ops} limits the regions Inductor compiles: it applies to --backend "
                           "torch --kernels fused (or --backend fused), not to this run")
    saved_depthwise = saved_cut_fields(schedule.meta).get("depthwise") if saved_cut else None
    if saved_depthwise and depthwise not in (None, "auto", saved_depthwise):
        raise OpBenchError(f"--depthwise {depthwise}, but the schedule's regions ran depthwise convolutions as "
                           f"'{saved_depthwise}' (accepted: --depthwise {saved_depthwise}, or no --depthwise, which "
                           "reuses the saved one)")
    saved_layout = saved_cut_fields(schedule.meta).get("layout") if saved_cut else None
    if saved_layout and layout not in (None, saved_layout):
        raise OpBenchError(f"--layout {layout}, but the schedule's regions were compiled in layout '{saved_layout}' "
                           f"(accepted: --layout {saved_layout}, or no --layout, which reuses the saved one)")


def compare_job(args: argparse.Namespace, options: Any) -> Any:
    """The :class:`~opbench.pipeline.compare_job.CompareJob` that ``compare``'s flags describe."""
    from ..pipeline.compare_job import CompareJob
    from ..pipeline.compile import BackendSpec, merge_mode
    from ..runtime.fused import DEFAULT_DEPTHWISE, DEFAULT_LAYOUT

    database = _database_dir(args, "") if args.backend == "tvm" else None
    backend = BackendSpec(args.backend, args.kernels, merge_mode(args.merge), args.cut,
                          compiled=True if args.torch_compile else None, layout=args.layout or DEFAULT_LAYOUT,
                          depthwise=args.depthwise or DEFAULT_DEPTHWISE, piece_ops=args.piece_ops,
                          repeat=args.compare_repeat,
                          number=args.compare_number)
    return CompareJob(model_spec(args), args.target, backend, options, None if database is None else str(database))


def cmd_compare(args: argparse.Namespace) -> int:
    from ..pipeline.compare_job import run_compare
    from ..runtime import is_gpu, resolve_target

    # --backend, --kernels and --cut are argparse choices: checked before this runs
    check_output_path(args.json, "--json")
    check_output_path(args.save_schedule, "--save-schedule")
    check_output_path(args.trace, "--trace")
    options = compare_options(args)  # a bad schedule file or scheduler name fails before any work
    _check_applies(args, is_gpu(resolve_target(args.target)), options.load_schedule())
    result = run_compare(compare_job(args, options))
    workload = result.workload
    table = _print_comparison(result, args)
    if args.trace:
        from ..runtime.trace import traced_label

        trace = result.trace(args.trace, nvtx=args.nvtx, meta={"model": workload.name, "dtype": workload.dtype,
                                                               "batch_size": workload.batch_size})
        runs = "; ".join(f"{s['schedule']} {traced_label(s)}" for s in trace["otherData"]["schedules"])
        print(f"trace written to {args.trace} ({runs}; traced with a timing mark around each operator; open it "
              "in chrome://tracing or ui.perfetto.dev)", file=human(args))
        table["trace"] = args.trace
    elif args.nvtx:
        from ..runtime.trace import nvtx_profile

        nvtx_profile(result.backend, result.kept)
    if args.json:
        write_json(args.json, table)
    return EXIT_OK


# export, configspace, models ----------------------------------------------------------------------
def cmd_export(args: argparse.Namespace) -> int:
    from ..dataset import Dataset, check_tables, export, export_format, export_targets

    path = dataset_path(args)
    tables = check_tables([t.strip() for t in args.table.split(",") if t.strip()])
    check_output_path(args.out, "--out")  # a folder is refused (the tables would land beside it)
    fmt = export_format(args.out, args.format)
    for target in export_targets(args.out, tables):
        check_output_path(target, "--out")
    check_output_path(args.json, "--json")
    Dataset(path, readonly=True).close()  # a file that is not a dataset is refused before anything is said
    log.info("exporting %s from %s", ", ".join(tables), path)
    written = export(path, fmt, args.out, tables)
    with Dataset(path, readonly=True) as ds:
        files = [{"table": t, "path": str(w), "rows": ds.count(t)} for t, w in zip(tables, written, strict=True)]
    if args.json:
        write_json(args.json, {"dataset": os.path.abspath(path), "format": fmt, "files": files})
    if args.json != "-":
        for f in files:
            print(f"wrote {f['path']} ({f['rows']} rows of {f['table']})")
    return EXIT_OK


def cmd_configspace(args: argparse.Namespace) -> int:
    from ..pipeline.tune import extracted_tasks
    from ..runtime import resolve_target
    from ..runtime.target import tuning_target
    from ..tune.space import space_kind, task_space

    check_output_path(args.json, "--json")
    # no device is needed to generate a design space: a CUDA target naming its arch works on any machine
    target = resolve_target(args.target, local_device="arch" not in str(args.target))
    workload = load_model(args)
    with announced(f"generating the design spaces of {workload.name}'s tasks"):
        tasks = extracted_tasks(workload, target)
        ms_target = tuning_target(target)
        kind = space_kind(target, workload.dtype)
        spaces = [{**task_space(t.dispatched[0], ms_target, t.task_name, kind), "weight": int(t.weight)}
                  for t in tasks]
    write_json(args.json, {"model": workload.name, "dtype": workload.dtype, "workload": workload.fingerprint(),
                           "target": str(ms_target), "design_space": kind, "tasks": spaces,
                           "space_size": sum(t["space_size"] for t in spaces)})
    if args.json != "-":
        print(f"wrote {args.json}: {len(spaces)} tasks, {sum(len(t['sketches']) for t in spaces)} sketches")
    return EXIT_OK


def cmd_models(args: argparse.Namespace) -> int:
    from ..models import list_sources

    check_output_path(args.json, "--json")
    sources = list_sources()
    if args.json:
        write_json(args.json, sources)
    if args.json == "-":
        return EXIT_OK
    for source, names in sources.items():
        print(f"{source}: {', '.join(names)}")
    return EXIT_OK


# the process ---------------------------------------------------------------------------------------
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


_COMMON = ("-q", "--quiet", "-v", "--verbose")  # flags every command takes, accepted before its name too


def _normalise(argv: list[str], commands: Sequence[str]) -> list[str]:
    """``collect`` is the default command (when no subcommand is named); ``--debug`` goes first, and
    ``-q``/``-v`` given before the command's name go after it (``opbench -q train ...``)."""
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    named = next((i for i, a in enumerate(argv) if a in commands), None)
    if named is None:
        if argv and argv[0].startswith("-") and argv[0] not in ("--help", "-h", "--version"):
            argv.insert(0, "collect")
    elif named and all(a in _COMMON for a in argv[:named]):
        argv = [argv[named], *argv[:named], *argv[named + 1:]]
    return ["--debug", *argv] if debug else argv


def main(argv: Sequence[str] | None = None, prog: str = "opbench") -> int:
    """Run one command and return its exit status (``prog`` names the program in help and errors)."""
    parser = build_parser(prog)
    commands = _subcommands(parser)
    argv = _normalise(list(sys.argv[1:] if argv is None else argv), list(commands))
    if prog != "opbench":  # the OpBench-compatible script: its own name in collect's help and errors
        commands["collect"].prog = prog
    if "collect" in argv[:2]:  # a job file fills in collect's flags before they are parsed
        try:
            path = config_path(argv)
            if path is not None:
                apply_config(commands["collect"], path)
        except OpBenchError as err:
            sys.stderr.write(f"{prog}: error: {one_line(err)}\n")
            return EXIT_USAGE
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    args.prog_name, args.argv = prog, [a for a in argv if a != "collect" or prog == "opbench"]
    quiet = getattr(args, "quiet", False)
    level = logging.DEBUG if args.debug or getattr(args, "verbose", False) else \
        logging.WARNING if quiet else logging.INFO
    signals.install()
    verbose = args.debug or getattr(args, "verbose", False)
    # a log file that cannot be written (MetaSchedule's, on a full disk) is not worth a traceback; with --debug it is
    logging.raiseExceptions = bool(args.debug)
    with native_stderr(not verbose):  # TVM's C++ warnings belong behind -v (they are not about the user's input)
        # with --debug each line names the module that wrote it (loggers follow the packages: opbench.tune.farm, ...)
        logging.basicConfig(level=level, format="%(name)s: %(message)s" if args.debug else "opbench: %(message)s",
                            stream=sys.stderr, force=True)
        logging.captureWarnings(True)  # other libraries' Python warnings (matplotlib's) also only with -v
        logging.getLogger("py.warnings").setLevel(logging.WARNING if verbose else logging.CRITICAL)
        try:
            signals.check()  # a signal while the command started (opbench._startup) stops it here
            if getattr(args, "gpu", None) is not None and getattr(args, "devices", None) is None:
                from ..runtime.device import select_gpu

                select_gpu(args.gpu)  # before anything touches CUDA: the process then sees that GPU only
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
            first = first_line(err)
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
    message = f"{prog}: interrupted while exiting; every finished measurement is in the dataset"
    try:
        signals.exiting(message)
    except KeyboardInterrupt:  # the signal came while the handlers changed: it was recorded
        sys.stderr.write(message + "\n")
        sys.stderr.flush()
        os._exit(128 + (signals.received() or signal.SIGINT))
    signals.forget_handled_interrupt()  # else Python may turn a handled Ctrl-C into a SIGINT at exit
    sys.exit(code)


def _interrupted(prog: str) -> int:
    signum = signals.received()
    sys.stderr.write(f"{prog}: interrupted; every finished measurement is in the dataset\n")
    return 128 + signum if signum else EXIT_INTERRUPTED


__all__ = ["DEFAULT_DATASET", "build_parser", "main", "run"]

if __name__ == "__main__":
    run()
