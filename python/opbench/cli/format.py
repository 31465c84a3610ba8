"""What the commands print and write: one-line messages, tables, JSON, and the checks of output paths
(made before any work)."""

from __future__ import annotations

import json
import re
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from ..errors import OpBenchError
from ..utils import check_output_path


def one_line(text: Any) -> str:
    """``text`` on one line: newlines and other control characters escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


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


def human(args: Any) -> TextIO:
    """Where tables and summaries go: stdout, or stderr when stdout carries JSON (``--json -``)."""
    return sys.stderr if getattr(args, "json", None) == "-" else sys.stdout


def _fmt(value: Any, scale: float = 1.0, digits: int = 3) -> str:
    if value is None:
        return "-"
    return f"{value * scale:.{digits}f}"


def shape_text(shapes: Any) -> str:
    shapes = json.loads(shapes) if isinstance(shapes, str) else shapes
    return " ".join("x".join(str(d) for d in s) for s in shapes)


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """The per-operator table printed after a collection."""
    header = ["#", "operator", "kind", "inputs", "output", "MFLOP", "MB", "median ms", "p90 ms", "p99 ms",
              "spread ms", "GFLOP/s", "status"]
    lines = []
    for r in rows:
        spread = None
        if r.get("latency_max_s") is not None:
            spread = r["latency_max_s"] - r["latency_min_s"]
        lines.append([
            str(r["op_index"]), r["func"][:44], r["kind"],
            shape_text(r["input_shapes"])[:40], shape_text(r["output_shapes"])[:20],
            _fmt(r["flops"], 1e-6, 2), _fmt(r["bytes"], 1e-6, 2),
            _fmt(r["latency_median_s"], 1e3, 4), _fmt(r.get("latency_p90_s"), 1e3, 4),
            _fmt(r.get("latency_p99_s"), 1e3, 4), _fmt(spread, 1e3, 4),
            _fmt(r["gflops"], 1.0, 1), r["status"],
        ])
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h)
              for i, h in enumerate(header)]
    numeric = {0, 5, 6, 7, 8, 9, 10, 11}

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


def format_comparison(rows: Sequence[dict[str, Any]]) -> str:
    """The comparison table: schedule, streams, events, latency, the host time a call takes to return (on a
    GPU), speedup, error, scheduling and predicted time (``-`` where a row was not measured or does not
    apply), and each stream group's SMs when some schedule is SM-partitioned."""
    width = max([18, *(len(r["schedule"]) + 2 for r in rows)])
    partitioned = any(r.get("sm", "-") != "-" for r in rows)
    head = (f"{'schedule':<{width}}{'streams':>8}{'events':>8}{'median ms':>11}{'p90 ms':>9}{'p99 ms':>9}{'host ms':>9}"
            f"{'speedup':>9}{'max err':>10}"
            f"{'sched ms':>10}{'pred ms':>10}" + ("  SMs (streams=SMs)" if partitioned else ""))
    lines = [head, "-" * len(head)]

    def num(value: Any, fmt: str, width: int) -> str:
        return f"{value:>{width}{fmt}}" if isinstance(value, int | float) and value == value else f"{'-':>{width}}"

    for r in rows:
        mark = " *" if r.get("kept") else f"  refused: {r['refused']}" if r.get("refused") else ""
        sms = f"  {r.get('sm', '-'):<17}" if partitioned else ""
        lines.append(f"{r['schedule']:<{width}}{r['streams']:>8}{r['events']:>8}{num(r['latency_ms'], '.4f', 11)}"
                     f"{num(r.get('p90_ms'), '.4f', 9)}{num(r.get('p99_ms'), '.4f', 9)}"
                     f"{num(r.get('host_ms'), '.4f', 9)}{num(r.get('speedup'), '.2f', 9)}{num(r['error'], '.1e', 10)}"
                     f"{num(r['scheduling_ms'], '.1f', 10)}{num(r.get('predicted_ms'), '.4f', 10)}{sms}{mark}")
    return "\n".join(lines)


def format_stages(stages: dict[str, Any]) -> str:
    """IOS's view of each staged schedule: every stage, its strategy, latency and operators."""
    lines = []
    for name, found in stages.items():
        lines.append(f"\nstages of {name} ({len(found['stages'])} stages, {found['total_ms']:.4f} ms with a barrier "
                     "after each):")
        for s in found["stages"]:
            groups = " | ".join(" ".join(f"{op}:{kind}" for op, kind in zip(g, k, strict=True))
                                for g, k in zip(s["groups"], s["operators"], strict=True))
            lines.append(f"  stage {s['stage']:>3}  {s['strategy']:<10} {s['latency_ms']:>9.4f} ms  {groups}")
    return "\n".join(lines)


__all__ = ["check_output_path", "format_comparison", "format_kinds", "format_stages", "format_table", "format_tuning",
           "human", "kind_totals", "one_line", "public_command", "shape_text", "write_json"]
