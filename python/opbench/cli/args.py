"""What the commands share about their arguments: the parser with one-line errors, help that shows
defaults, value parsers, the flag groups several commands take, and reading a model from them."""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from typing import Any, NoReturn

from ..dataset import DEFAULT_PATH, default_path
from ..errors import OpBenchError
from ..utils import announced, parse_bool
from .format import one_line

DEFAULT_DATASET = DEFAULT_PATH
EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_FAILED_OPS, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


_INVALID_CHOICE = re.compile(r"argument (\S+?): invalid choice: '(.*)' \(choose from (.*)\)$", re.DOTALL)


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors and exit status 2."""

    def error(self, message: str) -> NoReturn:
        choice = _INVALID_CHOICE.match(message)
        if choice:  # argparse's "argument --x: invalid choice: 'v' (choose from 'a', 'b')" in our words
            accepted = ", ".join(re.findall(r"'([^']*)'", choice.group(3)))
            message = f"unknown {choice.group(1).split('/')[-1]} '{choice.group(2)}' (accepted: {accepted})"
        sys.stderr.write(f"{self.prog}: error: {one_line(message)} (see --help)\n")
        raise SystemExit(EXIT_USAGE)


class Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Help that shows every default (and no 'default: None')."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default in (None, False, argparse.SUPPRESS) or "%(default)" in (action.help or ""):
            return action.help or ""
        return super()._get_help_string(action)


def boolean(text: str) -> bool:
    """An argparse type: true/false, 1/0, yes/no, on/off."""
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


positive_int = _int_at_least(1, "a positive integer")
nonneg_int = _int_at_least(0, "a non-negative integer")


def nonneg_float(text: str) -> float:
    """An argparse type: a finite number >= 0."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number >= 0")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0."""
    value = nonneg_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number > 0")
    return value


def add_common(p: argparse.ArgumentParser) -> Any:
    """The output group (``-q``, ``-v``) every command has; returned for the command's own output flags."""
    g = p.add_argument_group("output")
    g.add_argument("-q", "--quiet", action="store_true", help="warnings and the summary only: no progress, "
                   "no table")
    g.add_argument("-v", "--verbose", action="store_true",
                   help="debug log lines, and TVM's own C++ messages and other libraries' warnings (hidden otherwise)")
    return g


def add_json_flag(p: Any, what: str, default: str | None = None) -> None:
    """``--json [FILE]``: ``what`` as JSON to FILE, or to stdout with ``-`` or no FILE (the tables then go
    to stderr)."""
    p.add_argument("--json", nargs="?", const="-", default=default, metavar="FILE",
                   help=f"also write {what} as JSON to FILE ('-' or no FILE: stdout, the tables go to stderr)")


class Deprecated(argparse.Action):
    """An old flag name kept for one release: each use warns and stores into the new flag's place
    (values of list flags are joined with commas)."""

    def __init__(self, option_strings: Any, dest: str, new: str = "", **kwargs: Any) -> None:
        kwargs.setdefault("help", f"deprecated: use {new}")
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        sys.stderr.write(f"{parser.prog}: warning: {option_string} is deprecated and will be removed: use "
                         f"{self.new}\n")
        old = getattr(namespace, self.dest, None)
        setattr(namespace, self.dest, f"{old},{values}" if old else values)


def add_predictor_flag(p: Any, what: str, deprecated: str | None = None, required: bool = False) -> None:
    """``--predictor FILE[,FILE]``, the one name of a predictor file (``deprecated``: its old name)."""
    p.add_argument("--predictor", default=None, metavar="FILE[,FILE]", required=required,
                   help=f"predictor files made by 'opbench train --out': {what}")
    if deprecated:
        p.add_argument(deprecated, dest="predictor", action=Deprecated, new="--predictor", metavar="FILE")


def add_dataset_flag(p: Any, what: str = "SQLite dataset") -> None:
    p.add_argument("--dataset", default=None, help=f"{what} (default: $OPBENCH_DATASET or {DEFAULT_DATASET})")


def _source_names() -> list[str]:
    from ..models import list_sources

    return list(list_sources())


def add_model_flags(p: argparse.ArgumentParser, sweep: bool = False) -> Any:
    """The model group: which model, at which batch size and precision, for which target (``sweep``:
    ``--modelname``, ``--batchsize`` and ``--dtype`` take lists)."""
    g = p.add_argument_group("model")
    g.add_argument("--modelsource", default="local", choices=_source_names(),
                   help="where the model comes from (remoteonnx: a path or URL)")
    g.add_argument("--modelname", required=True,
                   help="model name, ONNX path/URL (see 'opbench models')" + ("; a list a,b,c sweeps" if sweep else ""))
    g.add_argument("--target", default="llvm", help="llvm or cuda, or a JSON target such as "
                   '\'{"kind":"llvm","mcpu":"x86-64"}\'')
    g.add_argument("--batchsize", default="1", help="batch size" + ("; a list 1,8,32 sweeps" if sweep else ""))
    g.add_argument("--dtype", default="float32", help="precision of the weights and activations: float32, float16 "
                   "or bfloat16 (fp32, fp16, bf16); ONNX models keep their own" +
                   ("; a list fp16,bf16 sweeps" if sweep else ""))
    g.add_argument("--image-size", type=positive_int, default=None,
                   help="input resolution (local; default: the model's own, 224 or 299)")
    g.add_argument("--seqlen", type=positive_int, default=128, help="sequence length (transformers)")
    g.add_argument("--seed", type=nonneg_int, default=0, help="seed of random weights and inputs")
    g.add_argument("--sha256", default=None, help="expected SHA-256 of the ONNX file (64 hex digits)")
    g.add_argument("--cache-dir", default=None, help="download cache for remoteonnx "
                   "(default: $OPBENCH_CACHE/onnx or ~/.cache/opbench/onnx)")
    g.add_argument("--max-download-mb", type=nonneg_float, default=None,
                   help="refuse ONNX downloads larger than this (default: $OPBENCH_MAX_DOWNLOAD_MB or 2048)")
    return g


def add_device_flags(p: Any, sweep: bool = False) -> None:
    """``--device N`` (and, for sweeps, ``--devices N,N``): which GPU the command measures on."""
    p.add_argument("--device", type=nonneg_int, default=None, dest="gpu", metavar="N",
                   help="GPU to run on: its index among the GPUs this process sees (CUDA_VISIBLE_DEVICES "
                        "honoured; default 0)")
    if sweep:
        p.add_argument("--devices", default=None, metavar="N,N,...",
                       help="run the sweep's points on these GPUs, one worker process per GPU (each point in its "
                            "own process either way); with a CPU target, N workers, each pinned to its share of "
                            "the cores (--devices 0,1: two workers on the two halves)")


def add_database_flag(p: Any) -> None:
    p.add_argument("--database", default=None,
                   help="MetaSchedule tuning database folder: tuned kernels where it has records (default with "
                        "--iftune: <dataset>.tuning beside the dataset)")


def add_schedule_flags(p: Any, predictor: bool = True) -> Any:
    """The parallel-schedule group (returned; ``predictor``: with ``--predictor`` for ``--cost predicted``)."""
    g = p.add_argument_group("parallel schedules (--ifcompare, compare)")
    g.add_argument("--schedulers", default="sequential,greedy,nimble,opara,ios",
                   help="schedulers to compare (comma-separated; sequential is always first; NAME+critical-first: "
                        "NAME's streams with the operator of the longest way to the end launched first)")
    g.add_argument("--compare-repeat", type=positive_int, default=10, help="timed samples per schedule")
    g.add_argument("--compare-number", type=positive_int, default=20, help="runs per sample")
    g.add_argument("--save-schedule", default=None, help="write the kept schedule as JSON")
    g.add_argument("--ios-cost", default="model",
                   help="stage cost of the ios scheduler: model (the scheduling cost), measured (every candidate "
                        "stage captured and timed, memoised), or model,measured (one row each)")
    g.add_argument("--ios-time-limit", type=positive_float, default=60.0,
                   help="seconds the ios dynamic programme may search (then one operator per stage)")
    g.add_argument("--cost", default="measured",
                   help="operator costs of the ios and greedy schedulers: measured (timed operators), predicted "
                        "(a trained predictor, nothing timed: rows ios-predicted, greedy-predicted), or "
                        "measured,predicted (both)")
    if predictor:
        add_predictor_flag(g, "for --cost predicted, a latency predictor and, optionally, a co-run predictor")
    g.add_argument("--stages", action="store_true",
                   help="also print, for sequential and each staged schedule, every stage with its operators, "
                        "strategy and measured latency (the stages run with a barrier between them)")
    g.add_argument("--schedule", default=None, metavar="FILE",
                   help="a schedule saved earlier for this model (--save-schedule): no search, it is measured "
                        "beside sequential; a schedule of another graph is refused")
    g.add_argument("--sm-partition", default="off", choices=("off", "auto"),
                   help="auto: also measure the best parallel schedule with its streams confined to disjoint "
                        "groups of SMs (CUDA green contexts; needs the cuda-bindings package and driver 12.4+: the "
                        "critical path's stream keeps most SMs, the other branches share the rest); off: none")
    return g


def dataset_path(args: argparse.Namespace) -> str:
    """``--dataset``, else ``$OPBENCH_DATASET``, else ``data/opbench.sqlite``."""
    return args.dataset or default_path()


def _source_options(args: argparse.Namespace) -> dict[str, Any]:
    return {"image_size": args.image_size, "seqlen": args.seqlen, "seed": args.seed, "sha256": args.sha256,
            "cache_dir": args.cache_dir, "max_download_mb": args.max_download_mb}


def batch_sizes(args: argparse.Namespace) -> list[int]:
    """``--batchsize`` as a list (``1,8,32``), each size checked (a bad item is a one-line error; the
    memory each would take is estimated by :func:`sweep_points`)."""
    from ..models import check_batch_size

    text = str(args.batchsize)
    items = [item.strip() for item in text.split(",")]
    if not all(items):
        raise OpBenchError(f"bad --batchsize '{text}': an empty item (accepted: positive integers, comma-separated, "
                           "e.g. 1,8,32)")
    return list(dict.fromkeys(check_batch_size(item) for item in items))


def model_names(text: str) -> list[str]:
    """``--modelname a,b,c`` as names. A simple model's parameters stay with their name
    (``branchy:branches=2,depth=2`` is one model: an item ``key=value`` without ``:`` continues the one
    before), and an existing file whose name has a comma is one model."""
    if "," not in text or os.path.exists(text):
        return [text]
    names: list[str] = []
    for item in (i.strip() for i in text.split(",")):
        if names and "=" in item and ":" not in item:
            names[-1] += "," + item
        elif item:
            names.append(item)
        else:
            raise OpBenchError(f"bad --modelname '{text}': an empty item (accepted: model names, comma-separated)")
    return list(dict.fromkeys(names))


def dtypes(text: str) -> list[str]:
    """``--dtype fp16,bf16`` as dtypes, each checked (one-line error for an unknown one)."""
    from ..models import check_dtype

    items = [item.strip() for item in str(text).split(",")]
    if not all(items):
        raise OpBenchError(f"bad --dtype '{text}': an empty item (accepted: float32, float16, bfloat16, "
                           "comma-separated)")
    return list(dict.fromkeys(check_dtype(item) for item in items))


def sweep_points(args: argparse.Namespace) -> list[Any]:
    """Every (model, batch size, dtype) ``--modelname``, ``--batchsize`` and ``--dtype`` name, each
    checked before anything is measured: an unknown model, dtype or batch size, or a batch that would
    not fit in memory, is a one-line error."""
    from ..models import check_fits, check_name, get_source
    from ..pipeline.sweep import cross

    models = model_names(str(args.modelname))
    kinds = dtypes(args.dtype)
    source = get_source(args.modelsource)
    for name in models:  # every point's model is checked now, not when its turn comes
        check_name(source, name)
    sizes = batch_sizes(args)
    for name in models:
        for size in sizes:
            check_fits(args.modelsource, name, size, **_source_options(args))
    return cross(models, sizes, kinds)


def model_spec(args: argparse.Namespace, batch: int | None = None) -> Any:
    """The :class:`~opbench.pipeline.spec.ModelSpec` the model flags name (:func:`add_model_flags`), at ``batch``
    (default: ``--batchsize``, which must then be one size)."""
    from ..models import check_batch_size, check_dtype
    from ..pipeline.spec import ModelSpec

    if batch is None:
        if "," in str(args.batchsize):
            raise OpBenchError(f"--batchsize takes one size here, got '{args.batchsize}' (a list of sizes is for "
                               "collect)")
        batch = args.batchsize
    for flag, value in (("--modelname", model_names(str(args.modelname))), ("--dtype", dtypes(args.dtype))):
        if len(value) > 1:
            raise OpBenchError(f"{flag} takes one value here, got '{','.join(value)}' (a list is for collect's "
                               "sweeps)")
    return ModelSpec(args.modelname, args.modelsource, check_batch_size(batch), check_dtype(args.dtype),
                     **_source_options(args))


def load_model(args: argparse.Namespace, batch: int | None = None) -> Any:
    """The workload the model flags name (:func:`model_spec`)."""
    from ..models import load_workload

    spec = model_spec(args, batch)
    dtype = "" if str(spec.dtype) in ("float32", "fp32") else f", {spec.dtype}"
    with announced(f"loading {spec.source} model {one_line(spec.name)} (batch {spec.batch_size}{dtype})"):
        return load_workload(spec.source, spec.name, spec.batch_size, dtype=spec.dtype, **spec.options())


def compare_options(args: argparse.Namespace) -> Any:
    """The compare job's options from the schedule flags (:func:`add_schedule_flags`), checked before any
    work (unknown schedulers or costs, a schedule file that does not read)."""
    from ..pipeline.compare import CompareOptions, check_sm_partition

    options = CompareOptions(schedulers=args.schedulers, ios_cost=args.ios_cost, cost=args.cost,
                             predictor=args.predictor, ios_time_limit_s=args.ios_time_limit,
                             repeat=args.compare_repeat, number=args.compare_number, schedule=args.schedule,
                             stages=args.stages, sm_partition=check_sm_partition(args.sm_partition))
    options.scheduler_names()
    options.load_schedule()
    return options


__all__ = ["DEFAULT_DATASET", "Deprecated", "EXIT_FAILED_OPS", "EXIT_FAILURE", "EXIT_INTERRUPTED", "EXIT_OK",
           "EXIT_USAGE", "Formatter", "Parser", "add_common", "add_database_flag", "add_dataset_flag",
           "add_device_flags", "add_json_flag", "add_model_flags", "add_predictor_flag", "add_schedule_flags",
           "batch_sizes", "boolean", "compare_options", "dataset_path", "dtypes", "load_model", "model_names",
           "model_spec", "nonneg_float", "nonneg_int", "positive_float", "positive_int", "sweep_points"]
