"""What the benchmark scripts share: running one ``opbench`` command with a time limit, its output logged."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def shown(path: str | Path) -> str:
    """``path`` as a JSON result records it: relative to the repository when inside it."""
    full = Path(path).resolve()
    return str(full.relative_to(ROOT)) if full.is_relative_to(ROOT) else str(path)


def bad_input(message: str) -> None:
    """Stop on bad input before any work: ``error: MESSAGE`` on stderr, exit code 2 (as argparse does)."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def model_device_args(parser: Any, models: str, dtype: bool = True) -> None:
    """The options every model experiment takes: ``--out``, ``--models`` (default ``models``), ``--batch``,
    ``--device`` and, with ``dtype``, ``--dtype``."""
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--models", default=models, help="zoo models, comma-separated")
    parser.add_argument("--batch", type=int, default=1)
    if dtype:
        parser.add_argument("--dtype", default="float32", help="float32, float16 or bfloat16")
    parser.add_argument("--device", default="cuda", help="cuda, or cpu for a dry run")


def timing_args(parser: Any) -> None:
    """``--repeat``, ``--number`` and ``--rounds`` of an experiment that times variants side by side: each round
    takes ``repeat`` samples of ``number`` runs of every variant in turn."""
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--number", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=9, help="alternating samples of each variant")


def variant_args(parser: Any, variants: tuple[str, ...], default: tuple[str, ...], what: str,
                 timeout: float) -> None:
    """``--reps``, ``--variants`` (of ``variants``, ``default`` unless given), ``--timeout`` and the hidden
    ``--child`` of an experiment whose ``what`` (builds, say) each run in a new process, the variants taking turns
    (:func:`in_child`); :func:`checked_variants` checks them."""
    import argparse

    parser.add_argument("--reps", type=int, default=3, help=f"{what} of each variant")
    parser.add_argument("--variants", default=",".join(default),
                        help=f"the {what}' variants, comma-separated (default: {', '.join(default)}; accepted: "
                             f"{', '.join(variants)})")
    parser.add_argument("--timeout", type=float, default=timeout, help="seconds one may take")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)


def checked_variants(args: Any, variants: tuple[str, ...]) -> None:
    """``args.variants`` as a tuple of names, after :func:`variant_args`'s options are checked: an unknown variant,
    none, fewer than one rep or a timeout not above zero stops with one line (:func:`bad_input`)."""
    args.variants = tuple(v.strip() for v in args.variants.split(",") if v.strip())
    unknown = [v for v in args.variants if v not in variants]
    if unknown or not args.variants:
        bad_input(f"--variants {','.join(unknown) or repr('')}: accepted: comma-separated names of "
                  f"{', '.join(variants)}")
    if args.reps < 1 or args.timeout <= 0:
        bad_input(f"--reps {args.reps}, --timeout {args.timeout}: accepted: 1 or more, a positive timeout")


def variant_main(script: str, description: str, models: str, variants: tuple[str, ...], default: tuple[str, ...],
                 what: str, timeout: float, build: Any, measure: Any, why_cuda: str) -> int:
    """The ``main`` of an experiment ``script`` whose ``what`` (builds, say) each run in a new process, its variants
    taking turns: the options (:func:`model_device_args` with ``models``, :func:`variant_args`), checked
    (:func:`checked_variants`, :func:`checked_models`, a GPU: ``why_cuda`` says why); in a child,
    ``build(name, args, variant)`` (:func:`as_child`), else ``measure(name, args, save)`` for each model
    (:func:`measure_models`)."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    model_device_args(parser, models)
    variant_args(parser, variants, default, what, timeout)
    args = parser.parse_args()
    if args.child is not None:  # one build, in this new process
        return as_child(args, lambda: build(args.models, args, args.child))
    checked_variants(args, variants)
    if args.device != "cuda":
        bad_input(f"--device {args.device!r}: {why_cuda} (accepted: cuda)")
    measure_models(Path(script).name, args, checked_models(args), lambda name, save: measure(name, args, save))
    return 0


def variant_medians(rows: list[dict[str, Any]], variants: tuple[str, ...], fields: dict[str, Any],
                    count: str) -> dict[str, dict[str, Any]]:
    """For each of ``variants`` with rows that ran (no ``error``): the median over them of each of ``fields``
    (name -> a row's value), and how many there were (``count``)."""
    import statistics

    summary = {}
    for variant in variants:
        done = [r for r in rows if r["variant"] == variant and "error" not in r]
        if done:
            summary[variant] = {name: statistics.median(value(r) for r in done) for name, value in fields.items()}
            summary[variant][count] = len(done)
    return summary


def checked_models(args: Any) -> list[str]:
    """``args.models`` as a list of zoo models after :func:`model_device_args`'s options are checked: a bad
    ``--dtype``, ``--device`` or model, or no model at all, stops with one line (:func:`bad_input`)."""
    from opbench.errors import OpBenchError
    from opbench.models import check_name

    if getattr(args, "dtype", "float32") not in ("float32", "float16", "bfloat16"):
        bad_input(f"--dtype: {args.dtype!r} (accepted: float32, float16, bfloat16)")
    if args.device not in ("cuda", "cpu"):
        bad_input(f"--device: {args.device!r} (accepted: cuda, cpu)")
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if not models:
        bad_input("--models: none given (accepted: zoo models, comma-separated, e.g. googlenet,nasnet)")
    for m in models:
        try:
            check_name("local", m)
        except OpBenchError as err:
            bad_input(f"--models: {err}")
    return models


def experiment_doc(script: str, device: str) -> dict[str, Any]:
    """The head of an experiment's JSON: its command as run, torch's and cuDNN's versions and the device's name;
    ``results`` to fill."""
    import torch

    return {"command": f"PYTHONPATH=python python3 scripts/{script} " + " ".join(sys.argv[1:]),
            "torch": torch.__version__, "cudnn": torch.backends.cudnn.version() if device == "cuda" else None,
            "device_name": torch.cuda.get_device_name() if device == "cuda" else "cpu", "results": []}


def measure_each(models: list[str], doc: dict[str, Any], path: Path, measure: Any) -> None:
    """``measure(name)`` for each model, its result (a row, or a list of rows) added to ``doc["results"]``, and
    ``doc`` written to ``path`` after every model, so that a run stopped part-way keeps what it measured; a
    model's failure is a row too."""
    import json

    for name in models:
        try:
            got = measure(name)
            doc["results"] += got if isinstance(got, list) else [got]
        except Exception as err:  # one model's failure is a result too
            doc["results"].append({"model": name, "error": f"{type(err).__name__}: {err}"})
            print(f"{name}: {doc['results'][-1]['error']}", flush=True)
        path.write_text(json.dumps(doc, indent=1) + "\n")


class GcWatch:
    """The seconds Python's garbage collector ran and its passes, by generation, since this was made (through
    ``gc.callbacks``; read ``seconds`` and ``passes`` before and after what is watched)."""

    def __init__(self) -> None:
        import gc

        self.seconds, self.passes, self._since = [0.0, 0.0, 0.0], [0, 0, 0], 0.0
        gc.callbacks.append(self._on)

    def _on(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._since = time.perf_counter()
        else:
            self.seconds[info["generation"]] += time.perf_counter() - self._since
            self.passes[info["generation"]] += 1


def in_child(script: str, args: Any, variant: str, flags: list[str], env: dict[str, str]) -> dict[str, Any]:
    """Run ``script`` with ``--child VARIANT`` and ``flags`` in a new process (``env`` its environment, at most
    ``args.timeout`` seconds); what it left in ``OUT/child.json`` (:func:`as_child`), or a row saying why not."""
    import json

    result = Path(args.out) / "child.json"
    result.unlink(missing_ok=True)
    try:
        subprocess.run([sys.executable, script, "--out", args.out, *flags, "--child", variant], env=env,
                       timeout=args.timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"variant": variant, "error": f"took over {args.timeout} s"}
    return json.loads(result.read_text()) if result.is_file() else {"variant": variant, "error": "no result"}


def as_child(args: Any, work: Any) -> int:
    """The child side of :func:`in_child`: ``work()``'s result (a JSON-able dict) into ``OUT/child.json``."""
    import json

    sys.path.insert(0, str(ROOT / "python"))
    (Path(args.out) / "child.json").write_text(json.dumps(work(), default=str))
    return 0


def measure_models(script: str, args: Any, models: list[str], measure: Any) -> None:
    """``measure(name, save)`` for each model (:func:`measure_each`) into ``OUT/<script's stem>.json``, where
    ``save(row)`` writes the model in progress after those done, so that a run stopped part-way keeps every build
    or timing it finished."""
    import json

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc, path = experiment_doc(script, args.device), out / f"{Path(script).stem}.json"

    def save(row: dict[str, Any]) -> None:  # the model in progress, after those done
        path.write_text(json.dumps({**doc, "results": [*doc["results"], row]}, indent=1, default=str) + "\n")

    measure_each(models, doc, path, lambda name: measure(name, save))


def run_opbench(args: list[str], env: dict[str, str], log: Path, limit: float, wrap: list[str] | None = None
                ) -> tuple[int | str, float, str]:
    """Run ``opbench ARGS`` (under ``wrap``, e.g. ``nsys profile ...``) from the repository root, appending the
    command and its output to ``log``; its exit code (or ``"timeout"``), wall seconds and output."""
    cmd = [*(wrap or []), sys.executable, "-m", "opbench", *args]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=limit)
        code: int | str = proc.returncode
        text = proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        code = "timeout"
        text = "".join(p.decode(errors="replace") if isinstance(p, bytes) else p for p in (exc.stdout, exc.stderr)
                       if p)
    wall = time.perf_counter() - start
    with open(log, "a") as fh:
        fh.write(f"$ {' '.join(cmd)}\n{text}\n(exit {code}, {wall:.1f} s)\n\n")
    print(f"opbench {' '.join(args[:3])} ...: exit {code} in {wall:.1f} s", flush=True)
    return code, wall, text
