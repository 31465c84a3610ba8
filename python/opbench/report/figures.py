"""The report's figures, each drawn from dataset rows into one PNG file.

Every drawing function takes the loaded :class:`ReportData` and the PNG path, raises
:class:`Missing` when the dataset lacks what it needs, and returns the figure's caption.
"""

from __future__ import annotations

import dataclasses
import html
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from ..dataset import json_value
from ..errors import OpBenchError
from ..predict.latency import sampled

# peak figures for the roofline by device name: fp32 without tensor cores, memory bandwidth, and
# dense fp16/bf16 on tensor cores (the compute roof of half-precision rows)
PEAKS = {
    "H100": (67e12, 3.35e12, 989e12),
    "H200": (67e12, 4.8e12, 989e12),
    "A100": (19.5e12, 2.0e12, 312e12),
}
KIND_COLORS = {"conv2d": "#1f77b4", "matmul": "#ff7f0e", "pool": "#2ca02c", "concat": "#d62728",
               "elementwise": "#9467bd", "transform": "#8c564b", "reduction": "#e377c2", "softmax": "#7f7f7f",
               "norm": "#bcbd22", "conv_transpose": "#17becf"}


def _log_axes(ax: Any, which: str) -> None:
    """Log scales whose tick labels are plain text ("1000", "0.01"): the report draws with TeX parsing
    off (names are text), where matplotlib's default ``10^{n}`` labels would show as TeX source."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    for name in which:
        axis = ax.xaxis if name == "x" else ax.yaxis
        getattr(ax, f"set_{name}scale")("log")
        axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        axis.set_minor_formatter(NullFormatter())


class Missing(Exception):
    """The dataset lacks what a figure needs (the message says what to collect)."""


@dataclasses.dataclass
class ReportData:
    """The rows of one device: operators (default kernels), models, co-runs, trials."""

    path: Path
    device: str
    ops: list[dict[str, Any]]
    models: list[dict[str, Any]]
    coruns: list[dict[str, Any]]
    trials: list[dict[str, Any]]

    @classmethod
    def load(cls, path: str | Path, device: str | None = None) -> ReportData:
        from ..predict.base import dataset_rows, open_dataset

        with open_dataset(path) as ds:  # one read: a compressed dataset is decompressed once
            ops, name = dataset_rows(ds, "operators", device)
            models, _ = dataset_rows(ds, "models", name, required=False)
            coruns, _ = dataset_rows(ds, "corun", name, required=False)
            trials, _ = dataset_rows(ds, "trials", name, required=False)
        ops = [o for o in ops if o["config"] == "default" and o.get("latency_median_s")]
        return cls(Path(path), name, ops, [m for m in models if m["config"] == "default"], coruns, trials)

    def by_model(self) -> dict[str, list[dict[str, Any]]]:
        """Default-kernel operator rows per model label (sampled-kernel sets left out)."""
        out: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for o in self.ops:
            if not sampled(o):
                out[self.label(o)].append(o)
        return dict(out)

    @staticmethod
    def label(row: dict[str, Any]) -> str:
        return row["model"] if row.get("batch_size") in (1, None) else f"{row['model']} (batch {row['batch_size']})"

    def summary_table(self) -> str:
        """An HTML table: each model's operators, summed latency and whole-model latency."""
        head = "<table><tr><th>model</th><th>operators</th><th>sum of operators (ms)</th><th>whole model (ms)</th></tr>"
        rows = [f"<tr><td>{html.escape(self.label(m))}</td><td>{m['num_ops']}</td>"
                f"<td>{(m['sum_op_latency_s'] or 0) * 1e3:.3f}</td>"
                f"<td>{(m['vm_latency_median_s'] or 0) * 1e3:.3f}</td></tr>" for m in self.models
                if not sampled(m)]
        return head + "".join(rows) + "</table>"


def _save(fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)


def latency_breakdown(data: ReportData, path: Path, **_: Any) -> str:
    """Per model, the summed operator latency split by operator kind (stacked bars)."""
    import matplotlib.pyplot as plt

    per_model = data.by_model()
    if not per_model:
        raise Missing("no model's operators were measured")
    names = sorted(per_model, key=lambda m: sum(o["latency_median_s"] for o in per_model[m]))
    kinds = sorted({o["kind"] for ops in per_model.values() for o in ops})
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(names) + 1.8))
    left = np.zeros(len(names))
    for kind in kinds:
        widths = np.array([sum(o["latency_median_s"] for o in per_model[m] if o["kind"] == kind) * 1e3
                           for m in names])
        ax.barh(names, widths, left=left, label=kind, color=KIND_COLORS.get(kind))
        left += widths
    ax.set_xlabel("summed operator latency (ms)")
    ax.set_title(f"Latency by operator kind, default kernels, {data.device}")
    ax.legend(loc="lower right", fontsize=8)
    _save(fig, path)
    return "Each bar is one model's operators run one at a time, split by the kind of the fused operator."


def roofline(data: ReportData, path: Path, **_: Any) -> str:
    """Arithmetic intensity against achieved GFLOP/s, with the device's compute and memory roofs."""
    import matplotlib.pyplot as plt

    ops = [o for o in data.ops if (o.get("flops") or 0) > 0 and (o.get("bytes") or 0) > 0]
    if not ops:
        raise Missing("no operator with FLOPs and bytes")
    peak = next((v for k, v in PEAKS.items() if k in data.device), None)
    fig, ax = plt.subplots(figsize=(9, 6))
    for kind in sorted({o["kind"] for o in ops}):
        sub = [o for o in ops if o["kind"] == kind]
        ax.scatter([o["flops"] / o["bytes"] for o in sub], [o["flops"] / o["latency_median_s"] / 1e9 for o in sub],
                   s=10, alpha=0.6, label=kind, color=KIND_COLORS.get(kind))
    ai = np.logspace(np.log10(min(o["flops"] / o["bytes"] for o in ops)) - 0.3,
                     np.log10(max(o["flops"] / o["bytes"] for o in ops)) + 0.3, 200)
    dtypes = sorted({o.get("dtype") or "float32" for o in ops})
    if peak:
        flops, bandwidth, half = peak
        if "float32" in dtypes:
            ax.plot(ai, np.minimum(flops, bandwidth * ai) / 1e9, "k--", lw=1,
                    label=f"roof: {flops / 1e12:.0f} TFLOP/s fp32, {bandwidth / 1e12:.2f} TB/s")
        if any(d in ("float16", "bfloat16") for d in dtypes):
            ax.plot(ai, np.minimum(half, bandwidth * ai) / 1e9, "k:", lw=1,
                    label=f"roof: {half / 1e12:.0f} TFLOP/s fp16/bf16 tensor cores, {bandwidth / 1e12:.2f} TB/s")
        note = (f"Roofs: the {data.device}'s memory bandwidth and its compute peak for the precisions of "
                f"these rows ({', '.join(dtypes)}): fp32 without tensor cores, fp16/bf16 dense on tensor cores.")
    else:
        note = "No roof: the device's peak figures are not known to OpBench."
    _log_axes(ax, "xy")
    ax.set_xlabel("arithmetic intensity (FLOP per byte)")
    ax.set_ylabel("achieved GFLOP/s")
    ax.set_title(f"Roofline, {len(ops)} operators ({', '.join(dtypes)}), default kernels, {data.device}")
    ax.legend(fontsize=8)
    _save(fig, path)
    return note


def corun_speedups(data: ReportData, path: Path, **_: Any) -> str:
    """Co-run speedup distribution and the mean speedup of operator-kind pairs."""
    import matplotlib.pyplot as plt

    groups = [g for g in data.coruns if g.get("speedup") and not sampled(g)] or \
        [g for g in data.coruns if g.get("speedup")]
    if not groups:
        raise Missing("no co-run groups (collect with --corun on a GPU)")
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5))
    speedups = np.array([g["speedup"] for g in groups])
    left.hist(speedups, bins=40, color="#1f77b4")
    left.axvline(1.0, color="k", ls="--", lw=1)
    left.set_xlabel("speedup: one after another / launched together")
    left.set_ylabel("co-run groups")
    left.set_title(f"{len(groups)} groups: median {np.median(speedups):.2f}x, {np.mean(speedups > 1):.0%} faster")
    pairs: dict[tuple[str, str], list[float]] = defaultdict(list)
    for g in groups:
        kinds = sorted(json_value(g["kinds"]) or [])
        if len(kinds) == 2:
            pairs[(kinds[0], kinds[1])].append(g["speedup"])
    kinds = sorted({k for pair in pairs for k in pair})
    grid = np.full((len(kinds), len(kinds)), np.nan)
    for (a, b), values in pairs.items():
        i, j = kinds.index(a), kinds.index(b)
        grid[i, j] = grid[j, i] = float(np.mean(values))
    image = right.imshow(grid, cmap="RdYlGn", vmin=0.5, vmax=1.5)
    right.set_xticks(range(len(kinds)), kinds, rotation=45, ha="right")
    right.set_yticks(range(len(kinds)), kinds)
    for i in range(len(kinds)):
        for j in range(len(kinds)):
            if not np.isnan(grid[i, j]):
                right.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=8)
    right.set_title("mean speedup of two-operator groups, by kinds")
    fig.colorbar(image, ax=right, label="speedup (x)")
    _save(fig, path)
    return "Speedup above 1: the operators finished sooner together on separate streams than one after another."


def predicted_vs_measured(data: ReportData, path: Path, **_: Any) -> str:
    """Held-out latency predictions (models held out) against measurements, with the ±10 % band."""
    import matplotlib.pyplot as plt

    from ..predict.latency import MIN_ROWS, evaluate

    kernel = all(o.get("grid") is not None for o in data.ops)  # rows measured on a GPU: launch dimensions
    models = {o["workload_id"] for o in data.ops if not sampled(o)}
    if len(data.ops) < MIN_ROWS or len(models) < 2:
        raise Missing(f"too few rows to hold out models (needed: {MIN_ROWS} operator rows of at least 2 models)")
    features = "graph+launch" if kernel else "graph"
    result = evaluate(data.ops, "by_model", feature_set=features)
    held = [o for o in data.ops if not sampled(o)]
    measured = np.array([o["latency_median_s"] for o in held]) * 1e3
    predicted = result["predicted"] * 1e3
    fig, ax = plt.subplots(figsize=(7, 6.5))
    for kind in sorted({o["kind"] for o in held}):
        idx = [i for i, o in enumerate(held) if o["kind"] == kind]
        ax.scatter(measured[idx], predicted[idx], s=10, alpha=0.6, label=kind, color=KIND_COLORS.get(kind))
    span = np.array([min(measured.min(), predicted.min()) * 0.8, max(measured.max(), predicted.max()) * 1.2])
    ax.plot(span, span, "k-", lw=1, label="exact")
    ax.fill_between(span, span * 0.9, span * 1.1, color="gray", alpha=0.25, label="±10 %")
    _log_axes(ax, "xy")
    ax.set_xlabel("measured latency (ms)")
    ax.set_ylabel("predicted latency (ms)")
    m = result["metrics"]
    ax.set_title(f"Latency predictor ({features} features), models held out\n"
                 f"MAPE {m['mape']:.1%}, {m['within_10pct']:.0%} of operators within ±10 %", fontsize=10)
    ax.legend(fontsize=8)
    _save(fig, path)
    return (f"Every operator predicted by a model trained without its model ({result['folds']}-fold cross-validation "
            "over models).")


def tuning_curves(data: ReportData, path: Path, **_: Any) -> str:
    """Best latency so far against the trial number, one line per tuned task."""
    import matplotlib.pyplot as plt

    if not data.trials:
        raise Missing("no tuning trials (collect with --iftune true)")
    curves: dict[tuple[str, str, str], list[tuple[int, float]]] = defaultdict(list)
    for t in data.trials:
        curves[(t["model"], t["task"], t["tuner"])].append((t["trial"], t["latency_median_s"]))
    fig, ax = plt.subplots(figsize=(9, 5.5))
    per_task = len(curves) <= 14  # a legend entry per task; beyond that, one colour and entry per model
    runs = sorted({(model, tuner) for model, _, tuner in curves})
    colours = {run: plt.get_cmap("tab10")(i % 10) for i, run in enumerate(runs)}
    counts = Counter((model, tuner) for model, _, tuner in curves)
    labelled: set[tuple[str, str]] = set()
    for (model, task, tuner), points in sorted(curves.items()):
        points.sort()
        best = np.minimum.accumulate([lat for _, lat in points]) * 1e3
        if per_task:
            short = task if len(task) <= 34 else f"{task[:18]}…{task[-15:]}"
            style: dict[str, Any] = {"label": f"{model} {short} ({tuner})"}
        else:
            style = {"color": colours[(model, tuner)], "alpha": 0.8}
            if (model, tuner) not in labelled:
                style["label"] = f"{model}, {counts[(model, tuner)]} tasks ({tuner})"
                labelled.add((model, tuner))
        ax.plot([i + 1 for i, _ in points], best, lw=1.2, drawstyle="steps-post", **style)  # best so far: steps
    _log_axes(ax, "y")
    ax.set_xlabel("trial (measured candidates)")
    ax.set_ylabel("best latency so far (ms)")
    ax.set_title(f"Tuning curves, {len(curves)} tasks, {data.device}")
    ax.legend(fontsize=7 if per_task else 9)
    _save(fig, path)
    return "Each line is one task: the fastest candidate measured up to that trial."


class RowGraph:
    """The operator DAG of one model rebuilt from its dataset rows (``preds``), for the schedulers."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = sorted(rows, key=lambda r: r["op_index"])
        self._preds = [list(json_value(r["preds"]) or []) for r in self.rows]
        self._succs: list[list[int]] = [[] for _ in self.rows]
        for v, ps in enumerate(self._preds):
            for u in ps:
                self._succs[u].append(v)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> Any:
        row = self.rows[i]
        return type("Node", (), {"flops": row["flops"] or 0.0, "bytes": row["bytes"] or 0,
                                 "output_shapes": json_value(row["output_shapes"]) or [], "kind": row["kind"]})()

    def preds(self, i: int) -> list[int]:
        return self._preds[i]

    def succs(self, i: int) -> list[int]:
        return self._succs[i]


def timeline(data: ReportData, path: Path, schedule: str | None = None, schedule_model: str | None = None,
             **_: Any) -> str:
    """A stream timeline (Gantt) of a schedule with the operators' measured latencies."""
    import matplotlib.pyplot as plt

    from ..schedule import IOS, Schedule, SchedulingCost

    per_model = data.by_model()
    if not per_model:
        raise Missing("no model's operators were measured")
    if schedule_model is not None:
        if schedule_model not in per_model:
            raise OpBenchError(f"--schedule-model '{schedule_model}' has no operator rows on {data.device} "
                               f"(accepted: {', '.join(sorted(per_model))})")
        name = schedule_model
    else:
        counts = defaultdict(int)
        for g in data.coruns:
            counts[g["model"]] += 1
        name = max(per_model, key=lambda m: (counts.get(m, 0), len(per_model[m])))
    graph = RowGraph(per_model[name])
    resources = {i: {k: r.get(k) for k in ("grid", "threads", "occupancy", "registers", "static_smem",
                                            "dynamic_smem")} for i, r in enumerate(graph.rows)}
    for res in resources.values():
        res["grid"] = json_value(res["grid"])
    sms = next((o.get("gpu_sm_count") for o in graph.rows if o.get("gpu_sm_count")), None)
    cost = SchedulingCost(graph, [r["latency_median_s"] for r in graph.rows], resources,
                          **({"sm_count": sms} if sms else {}))
    if schedule:
        plan = Schedule.load(schedule)
        if len(plan.stream_of) != len(graph):
            raise OpBenchError(f"schedule '{schedule}' has {len(plan.stream_of)} operators, {name} has {len(graph)}: "
                               "give the model it was made for with --schedule-model")
        how = f"schedule {Path(schedule).name}"
    else:
        plan = IOS(time_limit_s=20).schedule(graph, cost)
        how = "the ios schedule with the scheduling cost"
    spans: list[tuple[int, int, float, float]] = []
    total = cost.predict(plan, spans)
    sequential = sum(r["latency_median_s"] for r in graph.rows)
    fig, ax = plt.subplots(figsize=(12, 1.0 + 0.6 * plan.num_streams))
    for op, stream, start, end in spans:
        kind = graph.rows[op]["kind"]
        ax.barh(stream, (end - start) * 1e3, left=start * 1e3, color=KIND_COLORS.get(kind), edgecolor="white",
                lw=0.3)
    ax.set_yticks(range(plan.num_streams), [f"stream {i}" for i in range(plan.num_streams)])
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_title(f"{name}: {how}, {plan.num_streams} streams, {total * 1e3:.3f} ms simulated "
                 f"(one after another: {sequential * 1e3:.3f} ms)", fontsize=10)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for k, c in KIND_COLORS.items()
               if any(r["kind"] == k for r in graph.rows)]
    ax.legend(handles, [k for k in KIND_COLORS if any(r["kind"] == k for r in graph.rows)], fontsize=7,
              loc="upper left", bbox_to_anchor=(1.0, 1.0))
    _save(fig, path)
    return ("Operators placed on streams with their measured alone-times; operators sharing the GPU slow down "
            "by the scheduling cost's fluid model (opbench.schedule.cost).")


FIGURES = [
    ("Latency by operator kind", "latency_by_kind.png", latency_breakdown),
    ("Roofline", "roofline.png", roofline),
    ("Co-run speedups", "corun_speedup.png", corun_speedups),
    ("Predicted vs measured latency", "predicted_vs_measured.png", predicted_vs_measured),
    ("Tuning curves", "tuning_curves.png", tuning_curves),
    ("Stream timeline", "timeline.png", timeline),
]

__all__ = ["FIGURES", "Missing", "ReportData", "RowGraph"]
