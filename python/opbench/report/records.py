"""The report of a records folder (``opbench report --dataset data/dataset``): the sampled tensor programs.

Drawn from the folder's stored rows and, for the learning curve, from a stored evaluation of the trials cost
model (the JSON ``scripts/bench_predict.py --part records`` writes, passed as ``--evaluation``); nothing is
measured or trained. Figures, each per precision: how far a task's candidates lie from its best one, and how
steady their timing was (the repeat spread); then the cost model's held-out ranking against the records it
trained on.
"""

from __future__ import annotations

import dataclasses
import functools
import html
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from ..dataset import row_dtype
from ..dataset.records import timer_of
from ..errors import OpBenchError
from .figures import DTYPE_COLORS, Missing, _cell, _log_axes, _save

#: the spread below which a record counts as steady (the sampler issue's figure)
STEADY = 0.03


@dataclasses.dataclass
class RecordsData:
    """A records folder's trial rows (with their tasks' count) and an optional stored evaluation."""

    path: Path
    device: str
    trials: list[dict[str, Any]]
    tasks: int
    evaluation: dict[str, Any] | None = None

    @classmethod
    def load(cls, folder: str | Path, evaluation: dict[str, Any] | None = None) -> RecordsData:
        from ..dataset import records

        trials = records.read_rows(folder)
        if not trials:
            raise OpBenchError(f"records folder '{folder}' holds no records")
        device = Counter(str(r.get("device_name") or r.get("gpu_name") or "-") for r in trials).most_common(1)[0][0]
        tasks = int(records.manifest(folder).get("tasks") or 0)  # the count the manifest keeps: no module is read
        return cls(Path(folder), device, trials, tasks, evaluation)

    @functools.cached_property
    def ok(self) -> list[dict[str, Any]]:
        """The records that built and ran, with a latency."""
        return [r for r in self.trials if _ran(r)]

    def by_dtype(self) -> dict[str, dict[str, Any]]:
        """Per precision: records, those that ran, tasks with records, the median spread and the steady share."""
        out: dict[str, dict[str, Any]] = {}
        rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in self.trials:
            rows[row_dtype(r)].append(r)
        for dtype, group in sorted(rows.items()):
            ran = [r for r in group if _ran(r)]
            spreads = [float(r["spread"]) for r in ran if r.get("spread") is not None]
            out[dtype] = {"records": len(group), "ok": len(ran), "tasks": len({r["workload_id"] for r in group}),
                          "median_spread": float(np.median(spreads)) if spreads else None,
                          "steady": float(np.mean(np.array(spreads) <= STEADY)) if spreads else None}
        return out

    def counts(self) -> dict[str, int]:
        return {"records": len(self.trials), "ok": len(self.ok), "tasks": self.tasks,
                "tasks_with_records": len({r["workload_id"] for r in self.trials})}

    def summary(self) -> dict[str, Any]:
        """What the report states, as JSON."""
        evaluation = None
        if self.evaluation:
            evaluation = {k: self.evaluation.get(k) for k in ("metrics", "by_dtype", "learning_curve", "noise")}
        return {"dataset": str(self.path), "device": self.device, "counts": self.counts(),
                "by_dtype": self.by_dtype(), "evaluation": evaluation}

    def header(self) -> str:
        """The report's opening paragraph and its table by precision (HTML)."""
        c = self.counts()
        rows = "".join(f"<tr><td>{html.escape(d)}</td><td>{v['records']}</td><td>{v['ok']}</td><td>{v['tasks']}</td>"
                       f"<td>{_cell(v['median_spread'], '.2%')}</td><td>{_cell(v['steady'], '.0%')}</td></tr>"
                       for d, v in self.by_dtype().items())
        return (f"<p>Records folder <code>{html.escape(str(self.path))}</code>, device <b>{html.escape(self.device)}"
                f"</b>: {c['records']} sampled tensor programs ({c['ok']} built and ran) of {c['tasks_with_records']} "
                f"tasks ({c['tasks']} tasks stored).</p><table><tr><th>precision</th><th>records</th><th>ran</th>"
                f"<th>tasks</th><th>median spread</th><th>spread &le; {STEADY:.0%}</th></tr>{rows}</table>")


def _ran(row: dict[str, Any]) -> bool:
    """Whether a record built and ran (it has a latency)."""
    return row.get("build_status") == "ok" and bool(row.get("latency_median_s"))


def _cdf(ax: Any, values_by_dtype: dict[str, list[float]]) -> None:
    for dtype, values in sorted(values_by_dtype.items()):
        x = np.sort(np.asarray(values, dtype=float))
        ax.plot(x, np.arange(1, len(x) + 1) / len(x), color=DTYPE_COLORS.get(dtype), lw=1.8,
                label=f"{dtype} (n={len(x)})")
    ax.set_ylabel("share of records")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def distance_to_best(data: RecordsData, path: Path) -> str:
    """Each record's latency over its task's best record (CDF per precision, log axis)."""
    import matplotlib.pyplot as plt

    by_task: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in data.ok:  # a task's records of one timer against their own best
        by_task[(r["workload_id"], timer_of(r.get("config")))].append(r)
    ratios: dict[str, list[float]] = defaultdict(list)
    for rows in by_task.values():
        if len(rows) < 2:
            continue
        best = min(float(r["latency_median_s"]) for r in rows)
        for r in rows:
            ratios[row_dtype(r)].append(float(r["latency_median_s"]) / best)
    if not ratios:
        raise Missing("no task has two records that ran")
    fig, ax = plt.subplots(figsize=(8, 4.8))
    _cdf(ax, ratios)
    _log_axes(ax, "x")
    ax.set_xlabel("latency over the task's best record")
    ax.set_title(f"How far the sampled candidates lie from their task's best, {data.device}")
    _save(fig, path)
    medians = ", ".join(f"{d} {np.median(v):.2f}x" for d, v in sorted(ratios.items()))
    return (f"One line per precision: the share of records within a factor of their task's fastest record (tasks "
            f"with two or more records that ran). Median: {medians}.")


def spread(data: RecordsData, path: Path) -> str:
    """The repeat spread ((max - min) / median of a record's samples), CDF per precision."""
    import matplotlib.pyplot as plt

    spreads: dict[str, list[float]] = defaultdict(list)
    for r in data.ok:
        if r.get("spread") is not None:
            spreads[row_dtype(r)].append(max(float(r["spread"]), 1e-5))
    if not spreads:
        raise Missing("no record stores its repeat spread")
    fig, ax = plt.subplots(figsize=(8, 4.8))
    _cdf(ax, spreads)
    ax.axvline(STEADY, color="k", lw=0.8, ls="--")
    _log_axes(ax, "x")
    ax.set_xlabel("repeat spread, (max - min) / median of the samples")
    ax.set_title(f"How steady the timings were, {data.device}")
    _save(fig, path)
    steady = ", ".join(f"{d} {np.mean(np.array(v) <= STEADY):.0%}" for d, v in sorted(spreads.items()))
    return f"The dashed line is a {STEADY:.0%} spread; records at or below it: {steady}."


def learning_curve(data: RecordsData, path: Path) -> str:
    """The trials cost model's held-out pairwise accuracy, top-1 and top-5 against the records it trained on."""
    import matplotlib.pyplot as plt

    curve = (data.evaluation or {}).get("learning_curve")
    if not curve:
        raise Missing("no evaluation of the trials cost model: 'scripts/bench_predict.py --part records' writes "
                      "one (predict_records.json); pass it with --evaluation FILE")
    keys = ("n_train", "pairwise", "top1", "top5")
    if not isinstance(curve, list) or not all(isinstance(p, dict) and all(isinstance(p.get(k), int | float)
                                                                          for k in keys) for p in curve):
        raise Missing(f"the evaluation's learning_curve is not a list of points with {', '.join(keys)}")
    points = sorted(curve, key=lambda p: p["n_train"])
    x = [p["n_train"] for p in points]
    fig, ax = plt.subplots(figsize=(8, 4.8))
    for key, style in (("pairwise", "o-"), ("top1", "s--"), ("top5", "^:")):
        ax.plot(x, [p.get(key) for p in points], style, label=key)
    ceiling = (data.evaluation.get("noise") or {}).get("pairwise_ceiling")
    if ceiling:
        ax.axhline(ceiling, color="grey", lw=0.8, ls="--", label=f"pairwise ceiling of the noise ({ceiling:.3f})")
    _log_axes(ax, "x")
    ax.set_xticks(x, [f"{n:,}" if n < 10_000 else f"{n / 1000:.0f}k" for n in x])  # short: close points fit
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("records trained on (per fold)")
    ax.set_ylabel("held-out score")
    ax.set_title("Trials cost model on tasks of held-out models")
    ax.legend(fontsize=8)
    _save(fig, path)
    last = points[-1]
    return (f"Each point trains on at most that many records and tests on the tasks of models no training record "
            f"shares; with {last['n_train']} records per fold: pairwise {last['pairwise']:.3f}, top-1 "
            f"{last['top1']:.3f}, top-5 {last['top5']:.3f}.")


RECORD_FIGURES = [
    ("Candidates against their task's best, by precision", "records_distance_to_best.png", distance_to_best),
    ("Repeat spread, by precision", "records_spread.png", spread),
    ("Trials cost model: learning curve", "records_learning_curve.png", learning_curve),
]

__all__ = ["RECORD_FIGURES", "STEADY", "RecordsData"]
