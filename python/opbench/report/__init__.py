"""The HTML report of a dataset: ``opbench report --dataset PATH --out DIR``.

:func:`write_report` draws the figures of :mod:`opbench.report.figures` as PNG files in ``DIR``
and writes ``DIR/index.html``, which embeds them (it opens offline, on its own) and links each
PNG file. A figure whose data the dataset lacks (no co-runs, no trials) is replaced by a line
saying what to collect.
"""

from __future__ import annotations

import base64
import html
import logging
import time
from pathlib import Path
from typing import Any

from ..errors import OpBenchError

log = logging.getLogger(__name__)


def default_heldout(dataset: str | Path) -> Path | None:
    """Held-out predictions kept beside the dataset: ``<stem>.*.heldout.json`` in its folder (the newest)."""
    dataset = Path(dataset)
    stem = dataset.name.split(".")[0]
    found = sorted(dataset.parent.glob(f"{stem}.*heldout.json"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def write_report(dataset: str | Path, out: str | Path, device: str | None = None, schedule: str | None = None,
                 schedule_model: str | None = None, predictor: str | Path | None = None,
                 trace: str | Path | None = None, evaluation: str | Path | None = None) -> Path:
    """Write the figures, ``index.html`` and ``report.json`` (the counts and tables) into ``out``; returns
    the index path. Everything comes from stored results: the dataset's rows, the held-out predictions
    ``opbench train --out`` kept beside ``predictor`` (default: :func:`default_heldout`), a trace written by
    ``opbench compare --trace``; nothing is measured or trained. A records folder (``data/dataset``) gets the
    figures of :mod:`opbench.report.records`, its learning curve from ``evaluation`` (the JSON
    ``scripts/bench_predict.py --part records`` writes)."""
    import matplotlib

    matplotlib.use("Agg")
    from ..predict import read_heldout
    from ..runtime.trace import read_trace
    from ..utils import read_json
    from . import figures, records

    out = Path(out)
    if out.exists() and not out.is_dir():
        raise OpBenchError(f"--out '{out}' is a file (accepted: a folder for the report)")
    # every input is read before DIR is made: a missing dataset, predictor or trace leaves nothing behind
    if Path(dataset).is_dir():
        stored = read_json(evaluation, what=f"--evaluation '{evaluation}'") if evaluation else None
        folder = records.RecordsData.load(dataset, stored)
        return _write(folder, records.RECORD_FIGURES, out, lambda draw, path: draw(folder, path), folder.header())
    if evaluation:
        raise OpBenchError("--evaluation draws a records folder's learning curve: give --dataset a records folder "
                           "(e.g. data/dataset)")
    heldout_file = predictor or (default_heldout(dataset) if Path(dataset).is_file() else None)
    heldout = read_heldout(heldout_file) if heldout_file else None
    traced = read_trace(trace) if trace else None
    data = figures.ReportData.load(dataset, device, heldout, traced)
    return _write(data, figures.FIGURES, out,
                  lambda draw, path: draw(data, path, schedule=schedule, schedule_model=schedule_model),
                  _header(data))


def _write(data: Any, drawings: list[tuple[str, str, Any]], out: Path, draw_one: Any, header: str) -> Path:
    """Draw each figure into ``out`` (a figure whose data are missing says what to collect), then write
    ``index.html`` (``header``, the figures) and ``report.json``."""
    import json

    import matplotlib

    from .figures import Missing

    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OpBenchError(f"cannot create the report folder '{out}': {err.strerror}") from None
    sections: list[tuple[str, str, str | None, str]] = []  # title, file, note if missing, caption
    for title, name, draw in drawings:
        start = time.perf_counter()
        try:
            # names are text, not TeX: a model named 'm$x$' is drawn as it is written
            with matplotlib.rc_context({"text.parse_math": False}):
                caption = draw_one(draw, out / name)
        except Missing as missing:
            sections.append((title, name, str(missing), ""))
            log.info("report: %s skipped (%s)", title, missing)
            continue
        sections.append((title, name, None, caption))
        log.info("report: %s (%.1f s)", title, time.perf_counter() - start)
    index = out / "index.html"
    index.write_text(_html(header, sections, out))
    summary = {**data.summary(), "figures": [{"title": t, "file": n, "missing": m, "caption": c}
                                             for t, n, m, c in sections]}
    (out / "report.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    return index


def _header(data: Any) -> str:
    """The opening of a dataset's report: its counts, the workloads table and the slowest operators."""
    c = data.counts()
    return "\n".join([
        f"<p>Dataset <code>{html.escape(str(data.path))}</code>, device <b>{html.escape(data.device)}</b>: "
        f"{c['workloads']} workloads of {c['models']} models, {c['operators']} measured operators, "
        f"{c['corun_groups']} co-run groups, {c['trials']} tuning trials of {c['tuned_tasks']} tasks "
        "(default kernels; every figure below draws these rows).</p>",
        data.summary_table(),
        "<h2>Slowest operators</h2>",
        data.top_table(),
    ])


def _html(header: str, sections: list[tuple[str, str, str | None, str]], out: Path) -> str:
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>OpBench report</title>",
        "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}"
        "img{max-width:100%;border:1px solid #ddd}figure{margin:2em 0}figcaption{color:#555}"
        "table{border-collapse:collapse}td,th{padding:2px 10px;text-align:right}"
        "th:first-child,td:first-child{text-align:left}.missing{color:#a33}</style></head><body>",
        "<h1>OpBench report</h1>",
        header,
    ]
    for title, name, missing, caption in sections:
        parts.append(f"<figure><h2>{html.escape(title)}</h2>")
        if missing:
            parts.append(f"<p class='missing'>Not drawn: {html.escape(missing)}</p></figure>")
            continue
        encoded = base64.b64encode((out / name).read_bytes()).decode()
        parts.append(f"<a href='{name}'><img src='data:image/png;base64,{encoded}' alt='{html.escape(title)}'></a>")
        parts.append(f"<figcaption>{html.escape(caption)} (<a href='{name}'>{name}</a>)</figcaption></figure>")
    parts.append("</body></html>")
    return "\n".join(parts)


__all__ = ["default_heldout", "write_report"]
