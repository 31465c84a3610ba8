"""``collect``'s flags and :class:`~opbench.pipeline.collect.CollectJob`: one table between them.

``opbench collect --config job.json`` loads a ``CollectJob`` and makes its fields the defaults of
``collect``'s flags (:func:`apply_config`), so that a flag given on the command line overrides the
file, and everything after parsing (sweeps, tuning, comparison) runs exactly as if the flags had
been typed. :func:`job_from_args` reads the job back from parsed flags: the same job either way.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import OpBenchError

#: CollectJob field -> (the argparse destination, the flag that sets it)
COLLECT_FLAGS: dict[str, tuple[str, str]] = {
    "models": ("modelname", "--modelname"), "source": ("modelsource", "--modelsource"),
    "target": ("target", "--target"), "batch_sizes": ("batchsize", "--batchsize"), "dtypes": ("dtype", "--dtype"),
    "image_size": ("image_size", "--image-size"), "seqlen": ("seqlen", "--seqlen"), "seed": ("seed", "--seed"),
    "sha256": ("sha256", "--sha256"), "devices": ("devices", "--devices"), "repeat": ("repeat", "--repeat"),
    "warmup": ("warmup", "--warmup"), "min_repeat_ms": ("min_repeat_ms", "--min-repeat-ms"),
    "flush_l2": ("flush_l2", "--flush-l2"), "check": ("no_check", "--no-check"), "corun": ("corun", "--corun"),
    "corun_k": ("corun_k", "--corun-k"), "corun_limit": ("corun_limit", "--corun-limit"),
    "force": ("force", "--force"), "tune": ("iftune", "--iftune"), "tuner": ("tuner", "--tuner"),
    "trials": ("trials", "--trials"), "predictor": ("predictor", "--predictor"),
    "tune_tasks": ("tune_tasks", "--tune-tasks"), "tune_time_s": ("tune_time", "--tune-time"),
    "database": ("database", "--database"), "rpc_tracker": ("rpc_tracker", "--rpc-tracker"),
    "rpc_key": ("rpc_key", "--rpc-key"), "rpc_workers": ("rpc_workers", "--rpc-workers"),
    "compare": ("ifcompare", "--ifcompare"), "schedulers": ("schedulers", "--schedulers"),
    "compare_repeat": ("compare_repeat", "--compare-repeat"), "compare_number": ("compare_number", "--compare-number"),
    "cost": ("cost", "--cost"), "ios_cost": ("ios_cost", "--ios-cost"),
    "ios_time_limit_s": ("ios_time_limit", "--ios-time-limit"), "sm_partition": ("sm_partition", "--sm-partition"),
    "dataset": ("dataset", "--dataset"),
}


def flag_defaults(job: Any) -> dict[str, Any]:
    """The job's fields as the values argparse would hold for ``collect``'s flags (lists as ``a,b``)."""
    out: dict[str, Any] = {}
    for field, (dest, _flag) in COLLECT_FLAGS.items():
        value = getattr(job, field)
        if field == "check":
            value = not value  # --no-check
        elif isinstance(value, tuple):
            value = ",".join(str(v) for v in value)
        out[dest] = value
    return out


#: the flags of COLLECT_FLAGS that take no value
SWITCHES = ("--flush-l2", "--no-check", "--corun", "--force")


def job_flags() -> dict[str, bool]:
    """Every flag that sets a field of the job (``True`` when it takes a value), ``--config`` and the
    deprecated ``--pretrained`` among them: what a sweep's point receives in its spec, not on its command line."""
    flags = {flag: flag not in SWITCHES for _dest, flag in COLLECT_FLAGS.values()}
    return {**flags, "--config": True, "--pretrained": True}


def job_from_args(args: argparse.Namespace) -> Any:
    """The :class:`CollectJob` that parsed ``collect`` flags describe (lists parsed as the flags parse them)."""
    from ..pipeline.collect import CollectJob
    from ..runtime.device import parse_devices
    from .args import batch_sizes, dtypes, model_names

    values: dict[str, Any] = {field: getattr(args, dest) for field, (dest, _flag) in COLLECT_FLAGS.items()}
    values.update(models=tuple(model_names(args.modelname)), batch_sizes=tuple(batch_sizes(args)),
                  dtypes=tuple(dtypes(args.dtype)), check=not args.no_check,
                  devices=None if args.devices is None else tuple(parse_devices(args.devices)),
                  schedulers=tuple(s.strip() for s in str(args.schedulers).split(",") if s.strip()))
    return CollectJob(**values)


def config_path(argv: list[str]) -> str | None:
    """The file of ``--config FILE`` (or ``--config=FILE``) in ``collect``'s arguments, if any."""
    for i, arg in enumerate(argv):
        if arg == "--config":
            if i + 1 >= len(argv) or argv[i + 1].startswith("-"):
                raise OpBenchError("--config: a file name is needed (a CollectJob as JSON, or TOML: job.toml)")
            return argv[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return None


def apply_config(parser: argparse.ArgumentParser, path: str) -> Any:
    """Load ``path`` as a :class:`CollectJob` (validated; an error names the file and the field) and make its
    fields the defaults of ``parser``'s flags; ``--modelname`` is then no longer required."""
    from ..pipeline.collect import CollectJob
    from ..pipeline.spec import SpecError

    try:
        job = CollectJob.load(path)
        job.validate()
    except SpecError as err:
        raise OpBenchError(f"--config {path}: {err.field}: {err.message}") from None
    use_job(parser, job)
    return job


def use_job(parser: argparse.ArgumentParser, job: Any) -> None:
    """Make ``job``'s fields the defaults of ``collect``'s flags in ``parser``; ``--modelname`` is then no
    longer required."""
    parser.set_defaults(**flag_defaults(job))
    for action in parser._actions:
        if action.dest == "modelname":
            action.required = False


def run_collect(job: Any, quiet: bool = True) -> dict[str, Any]:
    """Run ``job`` (a :class:`CollectJob`) in this process, through the very code ``opbench collect --config``
    runs; returns the summary ``--json`` would write (a sweep's: its points). ``opbench.collect`` is this.

    A bad field raises :class:`~opbench.pipeline.spec.SpecError` before any work; other problems raise
    :class:`~opbench.errors.OpBenchError` (the command line prints the same as one line).
    """
    import json
    import tempfile
    from pathlib import Path

    from .main import EXIT_OK, _subcommands, build_parser, cmd_collect

    job.validate()
    parser = build_parser()
    use_job(_subcommands(parser)["collect"], job)
    with tempfile.TemporaryDirectory(prefix="opbench-collect-") as tmp:
        out = Path(tmp) / "summary.json"
        argv = ["collect", "--json", str(out), *(["-q"] if quiet else [])]
        args = parser.parse_args(argv)
        args.prog_name, args.argv = "opbench", argv[1:]
        code = cmd_collect(args)
        summary = json.loads(out.read_text()) if out.is_file() else {}
    if code != EXIT_OK:
        summary["exit"] = code  # 1: a runtime failure (a sweep's failed points), 3: some operators failed
    return summary


__all__ = ["COLLECT_FLAGS", "SWITCHES", "apply_config", "config_path", "flag_defaults", "job_flags", "job_from_args",
           "run_collect", "use_job"]
