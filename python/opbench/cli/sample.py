"""The ``sample`` command: tensor-program records at the machine's speed (:mod:`opbench.pipeline.sample`).

Flags map onto the fields of :class:`~opbench.pipeline.sample.SampleJob` through :data:`FLAGS`, so that
an error about a field names the flag; ``--config job.json`` loads the same spec (flags given on the
command line override it).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Any

from ..dataset.records import TIMER_CHOICES
from ..errors import OpBenchError
from .args import (
    EXIT_OK,
    Formatter,
    add_common,
    add_json_flag,
    batch_sizes,
    dtypes,
    model_names,
    nonneg_int,
    positive_float,
    positive_int,
)
from .format import check_output_path, human, write_json

#: SampleJob field -> the flag that sets it
FLAGS = {
    "models": "--modelname", "source": "--modelsource", "dtypes": "--dtype", "batch_sizes": "--batchsize",
    "target": "--target", "per_task": "--per-task", "seed": "--seed", "devices": "--devices",
    "builders": "--builders", "repeat": "--repeat", "min_repeat_ms": "--min-repeat-ms", "flush_l2": "--flush-l2",
    "timer": "--timer",
    "build_timeout_s": "--build-timeout", "run_timeout_s": "--run-timeout", "audit": "--audit",
    "compiler": "--cuda-compiler", "tasks_limit": "--tasks", "time_limit_s": "--time-limit", "dataset": "--dataset",
    "export_database": "--export-database", "rpc_tracker": "--rpc-tracker", "rpc_key": "--rpc-key",
    "rpc_workers": "--rpc-workers", "tasks_only": "--tasks-only",
}


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"an integer is needed, got '{text}'") from None


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"a fraction between 0 and 1 is needed, got '{text}'")
    return value


def add_parser(sub: Any) -> None:
    """Register ``opbench sample``."""
    p = sub.add_parser("sample", formatter_class=Formatter,
                       help="sample, build and measure tensor programs of every task of models (a cost-model dataset)",
                       description="Extract the tuning tasks of models (de-duplicated across them), sample --per-task "
                                   "distinct schedules of each from MetaSchedule's design space without hardware "
                                   "(random samples, then random mutations; programs the target cannot run are "
                                   "rejected before they are built), build them on every core and measure them on "
                                   "each device, one row of the trials table per candidate. The same command again "
                                   "resumes.")
    m = p.add_argument_group("models")
    m.add_argument("--modelsource", default=None, help="model source (default: local)")
    m.add_argument("--modelname", default=None, help="model names, comma-separated, or 'all' (every model of the "
                                                     "source; default: resnet-18)")
    m.add_argument("--dtype", default=None, help="dtypes, comma-separated (float32, float16, bfloat16)")
    m.add_argument("--batchsize", default=None, help="batch sizes, comma-separated")
    s = p.add_argument_group("sampling")
    s.add_argument("--target", default=None, help="llvm, cuda or a JSON target (default: llvm)")
    s.add_argument("--per-task", type=_int, default=None, metavar="N",
                   help="distinct candidates per task (default: 64; at most 100000)")
    s.add_argument("--seed", type=_int, default=None, help="sampling seed: the same seed samples the same candidates")
    s.add_argument("--tasks", type=positive_int, default=None, metavar="N",
                   help="sample only the N heaviest tasks (uses x FLOPs)")
    s.add_argument("--time-limit", type=positive_float, default=None, metavar="SECONDS",
                   help="start no new candidate after this long; what is built is measured (a re-run resumes)")
    s.add_argument("--devices", default=None, metavar="N,N",
                   help="one measuring process per device: GPU indices on cuda; on a CPU, that many workers "
                        "each on its share of the cores")
    s.add_argument("--tasks-only", action="store_const", const=True, default=None,
                   help="extract and store the models' tasks, sample nothing: no device needed (a CUDA target "
                        "names its arch, e.g. '{\"kind\": \"cuda\", \"arch\": \"sm_90\"}'); the job "
                        "on the GPU's machine then loads no model")
    s.add_argument("--rpc-tracker", default=None, metavar="HOST:PORT",
                   help="measure on the devices registered with this TVM RPC tracker (builds stay here)")
    s.add_argument("--rpc-key", default=None, help="the key the remote devices registered with")
    s.add_argument("--rpc-workers", type=positive_int, default=None, metavar="N",
                   help="RPC sessions measuring at once (default: one per device registered with the key)")
    s.add_argument("--builders", type=nonneg_int, default=None,
                   help="sampling and building processes (default 0: every core not measuring)")
    s.add_argument("--cuda-compiler", default=None, choices=["nvrtc-pch", "nvrtc", "nvcc"],
                   help="CUDA's kernel compiler (default: nvrtc-pch, NVRTC parsing the headers every kernel "
                        "includes once per builder: the same kernels, about 3x faster to compile)")
    s.add_argument("--build-timeout", type=positive_float, default=None, metavar="SECONDS",
                   help="a candidate's build is killed after this long and recorded as build_timeout (default 10)")
    s.add_argument("--run-timeout", type=positive_float, default=None, metavar="SECONDS",
                   help="a candidate's measurement is killed after this long and recorded as run_timeout "
                        "(default 10)")
    t = p.add_argument_group("timing")
    t.add_argument("--repeat", type=positive_int, default=None, help="timed samples per candidate (default 5; "
                                                                     "twice as many for kernels under 20 us)")
    t.add_argument("--min-repeat-ms", type=positive_float, default=None,
                   help="least duration of one sample (default 2); calls per sample from a first timing")
    t.add_argument("--flush-l2", action="store_const", const=True, default=None,
                   help="flush caches before every sample (one call per sample)")
    t.add_argument("--timer", choices=list(TIMER_CHOICES), default=None,
                   help="graph (cuda on this host): CUDA Graph replays timed with CUDA events, as collect times "
                        "operators (records under config sample:sSEED:graph); evaluator: TVM's time_evaluator, "
                        "back-to-back calls, each sample with its launches; auto (default): graph on a local "
                        "cuda target, else evaluator")
    t.add_argument("--audit", type=_fraction, default=None, metavar="FRACTION",
                   help="measure this fraction of candidates again at the end and report the difference")
    o = add_common(p)
    o.add_argument("--dataset", default=None, help="SQLite dataset (default: $OPBENCH_DATASET or "
                                                   "data/opbench.sqlite)")
    o.add_argument("--export-database", default=None, metavar="DIR",
                   help="also write the records as MetaSchedule's JSONDatabase in DIR (new, empty, or one already)")
    o.add_argument("--config", default=None, metavar="FILE",
                   help="the job as JSON or TOML (.toml; a SampleJob; flags given here override its fields)")
    add_json_flag(o, "the summary")
    p.set_defaults(func=cmd_sample)


def job_from_args(args: argparse.Namespace) -> Any:
    """The :class:`SampleJob` the flags (over ``--config``) describe, validated; an error names the flag."""
    from ..pipeline.sample import SampleJob
    from ..pipeline.spec import SpecError
    from ..runtime.device import parse_devices

    try:
        base = SampleJob.load(args.config) if args.config else SampleJob()
        given: dict[str, Any] = {}
        if args.modelname is not None:
            given["models"] = tuple(model_names(args.modelname))
        if args.dtype is not None:
            given["dtypes"] = tuple(dtypes(args.dtype))
        if args.batchsize is not None:
            given["batch_sizes"] = tuple(batch_sizes(args))
        if args.devices is not None:
            given["devices"] = tuple(parse_devices(args.devices))
        simple = {"source": args.modelsource, "target": args.target, "per_task": args.per_task, "seed": args.seed,
                  "builders": args.builders, "repeat": args.repeat, "min_repeat_ms": args.min_repeat_ms,
                  "flush_l2": args.flush_l2, "timer": args.timer, "build_timeout_s": args.build_timeout,
                  "run_timeout_s": args.run_timeout,
                  "audit": args.audit, "compiler": args.cuda_compiler, "tasks_limit": args.tasks,
                  "time_limit_s": args.time_limit,
                  "dataset": args.dataset, "export_database": args.export_database,
                  "rpc_tracker": args.rpc_tracker, "rpc_key": args.rpc_key, "rpc_workers": args.rpc_workers,
                  "tasks_only": args.tasks_only}
        given.update({k: v for k, v in simple.items() if v is not None})
        if "dataset" not in given and not args.config and os.environ.get("OPBENCH_DATASET"):
            given["dataset"] = os.environ["OPBENCH_DATASET"]
        job = dataclasses.replace(base, **given)
        job.validate()
    except SpecError as err:
        flag = FLAGS.get(err.field, err.field)
        raise OpBenchError(f"{flag}: {err.message}") from None
    return job


def cmd_sample(args: argparse.Namespace) -> int:
    from ..pipeline.sample import sample
    from .format import public_command

    check_output_path(args.json, "--json")
    job = job_from_args(args)
    # sample() checks every model, the target, the devices and the export folder before any work
    result = sample(job, command=public_command([args.prog_name, *args.argv]))
    summary = result.summary()
    if job.tasks_only:
        print(f"sample: {summary['tasks']} distinct tasks of {len(summary['models'])} models stored in "
              f"{job.dataset}; nothing sampled (--tasks-only)", file=human(args))
    else:
        print(format_summary(summary), file=human(args))
    if args.json:
        write_json(args.json, summary)
    return EXIT_OK


def format_summary(s: dict[str, Any]) -> str:
    """The lines a sampling run ends with: records, rate, failures, rejections, where the time went."""
    sec = s["seconds"]
    busy = ", ".join(f"{k} {100 * v:.0f}%" for k, v in s["device_busy"].items())
    audit = s["audit"]
    lines = [
        f"sample: {s['records']} records in {s['wall_s']:.1f} s ({s['records_per_s']:.2f}/s), {s['ok']} measured, "
        f"{s['build_failures']} failed to build ({s['build_timeouts']} timeouts), {s['run_failures']} failed to run; "
        f"{s['skipped']} already stored; {s['stored']} rows for these {s['tasks']} tasks",
        f"rejected before building: {s['rejected_total']}"
        + (f" ({', '.join(f'{k} {v}' for k, v in sorted(s['rejected'].items(), key=lambda kv: -kv[1]))})"
           if s["rejected"] else ""),
        f"time: sampling {sec['sample']:.1f} s, building {sec['build']:.1f} s, waiting for a device "
        f"{sec['queue_wait']:.1f} s, measuring {sec['measure']:.1f} s, writing {sec['write']:.2f} s (summed over "
        f"workers); builders {100 * s['builder_busy']:.0f}% busy ({s['builders']}), {busy}",
    ]
    if audit["n"]:
        lines.append(f"audit: {audit['n']} candidates measured again, relative difference median "
                     f"{100 * audit['median']:.2f}%, p95 {100 * audit['p95']:.2f}%")
    if s.get("exported"):
        e = s["exported"]
        lines.append(f"MetaSchedule database {e['folder']}: {e['records']} records added, {e['already_there']} "
                     "already there")
    return "\n".join(lines)


__all__ = ["FLAGS", "add_parser", "cmd_sample", "format_summary", "job_from_args"]
