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

from ..dataset import json_value, row_dtype
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
# rows of several precisions: one marker (scatter plots) and one colour (histograms) per precision
DTYPE_MARKERS = {"float32": "o", "float16": "^", "bfloat16": "s"}
DTYPE_COLORS = {"float32": "#1f77b4", "float16": "#ff7f0e", "bfloat16": "#2ca02c"}


def per_dtype(rows: list[dict[str, Any]], value: Any, fmt: str) -> str:
    """``value(rows of one precision)`` for each precision among ``rows``, as 'float16 V (n=N), ...';
    empty when the rows have one precision only."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[row_dtype(r)].append(r)
    if len(groups) < 2:
        return ""
    return ", ".join(f"{d} {format(value(g), fmt)} (n={len(g)})" for d, g in sorted(groups.items()))


def _log_axes(ax: Any, which: str) -> None:
    """Log scales whose tick labels are plain text ("1000", "0.01"): the report draws with TeX parsing
    off (names are text), where matplotlib's default ``10^{n}`` labels would show as TeX source."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    for name in which:
        axis = ax.xaxis if name == "x" else ax.yaxis
        getattr(ax, f"set_{name}scale")("log")
        axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        axis.set_minor_formatter(NullFormatter())


def _cell(value: Any, spec: str) -> str:
    """A table cell: ``value`` formatted by ``spec``, ``-`` where there is none."""
    return "-" if value is None else format(value, spec)


class Missing(Exception):
    """The dataset lacks what a figure needs (the message says what to collect)."""


@dataclasses.dataclass
class ReportData:
    """Everything the report draws, read once from stored results (nothing is measured or trained).

    The filters live here, once: ``ops`` are the ok default-kernel operator rows of models (sampled-kernel
    sets left out), ``models`` their whole-model rows, ``coruns`` the ok co-run groups with a speedup (of
    models; of sampled sets only when the dataset has no others), ``trials`` the built and timed tuning
    candidates. :meth:`counts` and every figure use these lists, so the counts the report states agree.
    """

    path: Path
    device: str
    ops: list[dict[str, Any]]
    models: list[dict[str, Any]]
    coruns: list[dict[str, Any]]
    trials: list[dict[str, Any]]
    figures: dict[str, Any] | None = None
    heldout: dict[str, Any] | None = None
    trace: dict[str, Any] | None = None

    @classmethod
    def load(cls, path: str | Path, device: str | None = None, heldout: dict[str, Any] | None = None,
             trace: dict[str, Any] | None = None) -> ReportData:
        from ..predict.base import dataset_rows, open_dataset

        with open_dataset(path) as ds:  # one read: a compressed dataset is decompressed once
            ops, name = dataset_rows(ds, "operators", device)
            models, _ = dataset_rows(ds, "models", name, required=False)
            coruns, _ = dataset_rows(ds, "corun", name, required=False)
            trials, _ = dataset_rows(ds, "trials", name, required=False)
            runs = {r["run_id"]: r for r in ds.rows("runs")}
        default_ops = [o for o in ops if o["config"] == "default" and o.get("latency_median_s")]
        timed = [g for g in coruns if g.get("speedup")]
        figures = None
        for run_id in sorted({o["run_id"] for o in default_ops if o.get("run_id") is not None}, reverse=True):
            env = json_value(runs.get(run_id, {}).get("env")) or {}
            if env.get("device_figures"):
                figures = env["device_figures"]
                break
        return cls(Path(path), name, [o for o in default_ops if not sampled(o)],
                   [m for m in models if m["config"] == "default" and not sampled(m)],
                   [g for g in timed if not sampled(g)] or timed, trials, figures, heldout, trace)

    @staticmethod
    def label(row: dict[str, Any]) -> str:
        """A workload's name in the figures: the model, with its batch size and dtype where not 1 and fp32."""
        batch = "" if row.get("batch_size") in (1, None) else f" b{row['batch_size']}"
        dtype = "" if row_dtype(row) == "float32" else f" {row_dtype(row)}"
        return f"{row['model']}{batch}{dtype}"

    def by_model(self) -> dict[str, list[dict[str, Any]]]:
        """The operator rows per workload label."""
        out: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for o in self.ops:
            out[self.label(o)].append(o)
        return dict(out)

    def workloads(self) -> list[dict[str, Any]]:
        """One row per workload with operators: its operators, their summed latency, the whole model's
        latency (when timed), its co-run groups and tuning trials, in order of summed latency."""
        vm = {m["workload_id"]: m for m in self.models}
        coruns = Counter(g["workload_id"] for g in self.coruns)
        trials = Counter(t["workload_id"] for t in self.trials)
        groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for o in self.ops:
            groups[o["workload_id"]].append(o)
        rows = []
        for wid, ops in groups.items():
            model = vm.get(wid) or {}
            rows.append({"workload": self.label(ops[0]), "model": ops[0]["model"],
                         "batch_size": ops[0].get("batch_size"), "dtype": row_dtype(ops[0]),
                         "operators": len(ops), "sum_ms": sum(o["latency_median_s"] for o in ops) * 1e3,
                         "whole_model_ms": (model.get("vm_latency_median_s") or 0) * 1e3 or None,
                         "whole_model_p90_ms": (model.get("vm_latency_p90_s") or 0) * 1e3 or None,
                         "corun_groups": coruns.get(wid, 0), "trials": trials.get(wid, 0)})
        return sorted(rows, key=lambda r: r["sum_ms"])

    def counts(self) -> dict[str, int]:
        """The report's counts, from the same lists the figures draw."""
        return {"workloads": len({o["workload_id"] for o in self.ops}), "models": len({o["model"] for o in self.ops}),
                "operators": len(self.ops), "corun_groups": len(self.coruns), "trials": len(self.trials),
                "tuned_tasks": len({(t["workload_id"], t["task"], t["tuner"]) for t in self.trials})}

    def top_operators(self, top: int = 15) -> list[dict[str, Any]]:
        """The slowest operators over every workload, with their share of their workload's summed latency."""
        totals: dict[str, float] = defaultdict(float)
        for o in self.ops:
            totals[o["workload_id"]] += o["latency_median_s"]
        ranked = sorted(self.ops, key=lambda o: -o["latency_median_s"])[:top]
        return [{"workload": self.label(o), "op_index": o["op_index"], "func": o["func"], "kind": o["kind"],
                 "output": " ".join("x".join(map(str, s)) for s in json_value(o["output_shapes"]) or []),
                 "median_ms": o["latency_median_s"] * 1e3,
                 "p90_ms": o["latency_p90_s"] * 1e3 if o.get("latency_p90_s") is not None else None,
                 "share": o["latency_median_s"] / totals[o["workload_id"]] if totals[o["workload_id"]] else None,
                 "gflops": o["flops"] / o["latency_median_s"] / 1e9 if o.get("flops") else None} for o in ranked]

    def summary(self) -> dict[str, Any]:
        """What the report states, as JSON: the counts, the workloads table and the top operators."""
        return {"dataset": str(self.path), "device": self.device, "counts": self.counts(),
                "workloads": self.workloads(), "top_operators": self.top_operators()}

    def summary_table(self) -> str:
        """An HTML table: each workload's operators, summed and whole-model latency, co-runs, trials; totals."""
        def ms(v: Any) -> str:
            return _cell(v, ".3f")

        head = ("<table><tr><th>workload</th><th>operators</th><th>sum of operators (ms)</th>"
                "<th>whole model (ms)</th><th>whole model p90 (ms)</th><th>co-run groups</th><th>trials</th></tr>")
        rows = self.workloads()
        body = [f"<tr><td>{html.escape(r['workload'])}</td><td>{r['operators']}</td><td>{ms(r['sum_ms'])}</td>"
                f"<td>{ms(r['whole_model_ms'])}</td><td>{ms(r['whole_model_p90_ms'])}</td>"
                f"<td>{r['corun_groups']}</td><td>{r['trials']}</td></tr>" for r in rows]
        c = self.counts()
        total = (f"<tr><th>{c['workloads']} workloads ({c['models']} models)</th><th>{c['operators']}</th><th></th>"
                 f"<th></th><th></th><th>{c['corun_groups']}</th><th>{c['trials']}</th></tr>")
        return head + "".join(body) + total + "</table>"

    def top_table(self) -> str:
        """An HTML table of the slowest operators."""
        head = ("<table><tr><th>workload</th><th>#</th><th>operator</th><th>kind</th><th>output</th>"
                "<th>median ms</th><th>p90 ms</th><th>share of workload</th><th>GFLOP/s</th></tr>")
        body = []
        for t in self.top_operators():
            body.append(f"<tr><td>{html.escape(t['workload'])}</td><td>{t['op_index']}</td>"
                        f"<td>{html.escape(t['func'][:48])}</td><td>{html.escape(t['kind'])}</td>"
                        f"<td>{html.escape(t['output'])}</td><td>{t['median_ms']:.4f}</td>"
                        f"<td>{_cell(t['p90_ms'], '.4f')}</td><td>{_cell(t['share'], '.0%')}</td>"
                        f"<td>{_cell(t['gflops'], '.0f')}</td></tr>")
        return head + "".join(body) + "</table>"


def _save(fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")  # long tick labels are not clipped
    import matplotlib.pyplot as plt

    plt.close(fig)


def latency_breakdown(data: ReportData, path: Path, **_: Any) -> str:
    """Per workload, the summed operator latency split by operator kind (stacked bars), with the whole
    model's latency (Relax VM) marked."""
    import matplotlib.pyplot as plt

    rows = data.workloads()
    if not rows:
        raise Missing("no model's operators were measured")
    per_model = data.by_model()
    names = [r["workload"] for r in rows]
    kinds = sorted({o["kind"] for o in data.ops})
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(names) + 1.8))
    left = np.zeros(len(names))
    for kind in kinds:
        widths = np.array([sum(o["latency_median_s"] for o in per_model[m] if o["kind"] == kind) * 1e3
                           for m in names])
        ax.barh(names, widths, left=left, label=kind, color=KIND_COLORS.get(kind))
        left += widths
    timed = [(i, r["whole_model_ms"]) for i, r in enumerate(rows) if r["whole_model_ms"]]
    if timed:
        ax.scatter([v for _, v in timed], [i for i, _ in timed], marker="|", s=260, color="black", lw=2, zorder=3,
                   label="whole model (Relax VM)")
    _log_axes(ax, "x")
    ax.set_xlabel("summed operator latency (ms)")
    ax.set_title(f"Latency by operator kind, default kernels, {data.device}: {len(names)} workloads, "
                 f"{len(data.ops)} operators")
    ax.legend(loc="lower right", fontsize=8)
    _save(fig, path)
    return ("Each bar is one workload's operators run one at a time, split by the kind of the fused operator; the "
            "black mark is the whole model run by the Relax VM (where it was timed).")


def device_peaks(data: ReportData) -> tuple[float, float, float, str] | None:
    """(fp32 FLOP/s, memory bytes/s, fp16/bf16 tensor-core FLOP/s, where they come from): the figures the
    rows' runs stored (measured device properties), else published figures by GPU name."""
    fig = data.figures or {}
    if fig.get("peak_flops") and fig.get("bandwidth"):
        return (float(fig["peak_flops"]), float(fig["bandwidth"]), float(fig.get("peak_flops_half") or 0.0),
                "the device figures stored with these runs (clocks, SMs and bus width of the GPU)")
    peak = next((v for k, v in PEAKS.items() if k in data.device), None)
    if peak:
        return (*peak, f"published figures of the {data.device} (these rows' runs stored none)")
    return None


def roofline(data: ReportData, path: Path, **_: Any) -> str:
    """Arithmetic intensity against achieved GFLOP/s, with the device's compute and memory roofs, and the
    L2-warm ceiling the rows reached when their data was not flushed."""
    import matplotlib.pyplot as plt

    ops = [o for o in data.ops if (o.get("flops") or 0) > 0 and (o.get("bytes") or 0) > 0]
    if not ops:
        raise Missing("no operator with FLOPs and bytes")
    peaks = device_peaks(data)
    fig, ax = plt.subplots(figsize=(9, 6))
    dtypes = sorted({row_dtype(o) for o in ops})
    for kind in sorted({o["kind"] for o in ops}):
        for n, dtype in enumerate(dtypes):
            sub = [o for o in ops if o["kind"] == kind and row_dtype(o) == dtype]
            ax.scatter([o["flops"] / o["bytes"] for o in sub], [o["flops"] / o["latency_median_s"] / 1e9 for o in sub],
                       s=10, alpha=0.6, label=kind if n == 0 else None, color=KIND_COLORS.get(kind),
                       marker=DTYPE_MARKERS.get(dtype, "o"))
    if len(dtypes) > 1:  # the markers' key: one grey marker per precision
        for dtype in dtypes:
            ax.scatter([], [], s=14, color="grey", marker=DTYPE_MARKERS.get(dtype, "o"), label=dtype)
    ai = np.logspace(np.log10(min(o["flops"] / o["bytes"] for o in ops)) - 0.3,
                     np.log10(max(o["flops"] / o["bytes"] for o in ops)) + 0.3, 200)
    flushed = sum(1 for o in ops if o.get("l2_flush"))
    warm = len(ops) - flushed
    if peaks:
        flops, bandwidth, half, source = peaks
        if "float32" in dtypes:
            ax.plot(ai, np.minimum(flops, bandwidth * ai) / 1e9, "k--", lw=1,
                    label=f"roof: {flops / 1e12:.0f} TFLOP/s fp32, {bandwidth / 1e12:.2f} TB/s memory")
        if half and any(d in ("float16", "bfloat16") for d in dtypes):
            ax.plot(ai, np.minimum(half, bandwidth * ai) / 1e9, "k:", lw=1,
                    label=f"roof: {half / 1e12:.0f} TFLOP/s fp16/bf16 tensor cores, {bandwidth / 1e12:.2f} TB/s")
        above = [o for o in ops if o["bytes"] / o["latency_median_s"] > bandwidth * 1.02]
        note = (f"{len(ops)} operators ({', '.join(dtypes)}); roofs from {source}: memory bandwidth and the compute "
                f"peak of each precision present (fp32 without tensor cores, fp16/bf16 dense on tensor cores). ")
        if above:
            ceiling = max(o["bytes"] / o["latency_median_s"] for o in above)
            top = half if half and any(d in ("float16", "bfloat16") for d in dtypes) else flops
            ax.plot(ai, np.minimum(top, ceiling * ai) / 1e9, color="#555", ls="-.", lw=1,
                    label=f"L2-warm ceiling reached by these rows: {ceiling / 1e12:.2f} TB/s")
            note += (f"{len(above)} operators sit above the memory roof: they were timed without --flush-l2 "
                     f"({warm} of {len(ops)} rows), so their inputs stayed in the L2 cache between calls; the dash-"
                     f"dotted line is the fastest such rate the rows reached, not a device figure. Collect with "
                     f"--flush-l2 to place every operator under the memory roof.")
        else:
            note += f"{flushed} of {len(ops)} rows were timed with the caches flushed (--flush-l2)."
    else:
        note = (f"{len(ops)} operators; no roof: the rows' runs stored no device figures and OpBench has no "
                f"published ones for {data.device}.")
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
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.5))
    speedups = np.array([g["speedup"] for g in groups])
    dtypes = sorted({row_dtype(g) for g in groups})
    if len(dtypes) > 1:  # one outlined histogram per precision, on the same bins
        bins = np.histogram_bin_edges(speedups, bins=40)
        for dtype in dtypes:
            left.hist([g["speedup"] for g in groups if row_dtype(g) == dtype], bins=bins, histtype="step", lw=1.5,
                      color=DTYPE_COLORS.get(dtype), label=dtype)
        left.legend(fontsize=8)
    else:
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
    count = np.zeros((len(kinds), len(kinds)), dtype=int)
    for (a, b), values in pairs.items():
        i, j = kinds.index(a), kinds.index(b)
        grid[i, j] = grid[j, i] = float(np.mean(values))
        count[i, j] = count[j, i] = len(values)
    image = right.imshow(grid, cmap="RdYlGn", vmin=0.5, vmax=1.5)
    right.set_xticks(range(len(kinds)), kinds, rotation=45, ha="right")
    right.set_yticks(range(len(kinds)), kinds)
    for i in range(len(kinds)):
        for j in range(len(kinds)):
            if not np.isnan(grid[i, j]):
                right.text(j, i, f"{grid[i, j]:.2f}\nn={count[i, j]}", ha="center", va="center", fontsize=7)
    right.set_title(f"mean speedup of {sum(len(v) for v in pairs.values())} two-operator groups, by kinds")
    fig.colorbar(image, ax=right, label="speedup (x)")
    _save(fig, path)
    note = "Speedup above 1: the operators finished sooner together on separate streams than one after another."
    by_dtype = per_dtype(groups, lambda g: float(np.median([x["speedup"] for x in g])), ".2f")
    return f"{note} Median speedup by precision: {by_dtype}." if by_dtype else note


def predicted_vs_measured(data: ReportData, path: Path, **_: Any) -> str:
    """Held-out latency predictions stored by ``opbench train --out`` against the measurements, with the
    ±10 % band (nothing is trained here)."""
    import matplotlib.pyplot as plt

    if data.heldout is None:
        raise Missing("no stored held-out predictions: train with 'opbench train --what latency --out FILE' "
                      "and give --predictor FILE (or keep FILE.heldout.json beside the dataset)")
    ours = {(o["workload_id"], o["op_index"]): o for o in data.ops}
    pairs = [(ours[(r["workload_id"], r["op_index"])], r["predicted_s"]) for r in data.heldout["rows"]
             if (r["workload_id"], r["op_index"]) in ours and r.get("config", "default") == "default"]
    if not pairs:
        raise Missing("the stored held-out predictions name none of this dataset's operators on this device")
    measured = np.array([o["latency_median_s"] for o, _ in pairs]) * 1e3
    predicted = np.array([p for _, p in pairs]) * 1e3
    fig, ax = plt.subplots(figsize=(7, 6.5))
    for kind in sorted({o["kind"] for o, _ in pairs}):
        idx = [i for i, (o, _) in enumerate(pairs) if o["kind"] == kind]
        ax.scatter(measured[idx], predicted[idx], s=10, alpha=0.6, label=kind, color=KIND_COLORS.get(kind))
    span = np.array([min(measured.min(), predicted.min()) * 0.8, max(measured.max(), predicted.max()) * 1.2])
    ax.plot(span, span, "k-", lw=1, label="exact")
    ax.fill_between(span, span * 0.9, span * 1.1, color="gray", alpha=0.25, label="±10 %")
    _log_axes(ax, "xy")
    ax.set_xlabel("measured latency (ms)")
    ax.set_ylabel("predicted latency (ms)")
    err = np.abs(predicted - measured) / measured
    h = data.heldout
    ax.set_title(f"Latency predictor ({h.get('features')} features), {h.get('split')} split, {len(pairs)} operators"
                 f"\nMAPE {err.mean():.1%}, {np.mean(err <= 0.1):.0%} of operators within ±10 %", fontsize=10)
    ax.legend(fontsize=8)
    _save(fig, path)
    skipped = len(data.ops) - len(pairs)
    note = f"; {skipped} operators have no stored prediction" if skipped else ""
    rows = [{"dtype": row_dtype(o), "error": e} for (o, _), e in zip(pairs, err, strict=True)]
    by_dtype = per_dtype(rows, lambda g: float(np.mean([r["error"] for r in g])), ".1%")
    return (f"Every operator predicted by a fold trained without its group ({h.get('split')}, {h.get('folds')} "
            f"folds), as 'opbench train' stored them{note}." + (f" MAPE by precision: {by_dtype}." if by_dtype else ""))


def tuning_curves(data: ReportData, path: Path, **_: Any) -> str:
    """Speedup of the best candidate so far over the task's default kernel, against the trial number: one
    thin line per tuned task, the median per model in bold."""
    import matplotlib.pyplot as plt

    if not data.trials:
        raise Missing("no tuning trials (collect with --iftune true)")
    default: dict[tuple[str, str], list[float]] = defaultdict(list)
    for o in data.ops:  # a tuning task is named after its function (operator rows key tasks by a digest)
        default[(o["workload_id"], o["func"])].append(o["latency_median_s"])
    curves: dict[tuple[str, str, str, str], list[tuple[int, float]]] = defaultdict(list)
    for t in data.trials:
        curves[(t["workload_id"], data.label(t), t["task"], t["tuner"])].append((t["trial"], t["latency_median_s"]))
    fig, ax = plt.subplots(figsize=(9, 5.5))
    runs = sorted({(label, tuner) for _, label, _, tuner in curves})
    colours = {run: plt.get_cmap("tab10")(i % 10) for i, run in enumerate(runs)}
    per_run: dict[tuple[str, str], list[np.ndarray]] = defaultdict(list)
    without = 0
    for (wid, label, task, tuner), points in sorted(curves.items()):
        base = default.get((wid, task))
        if not base:
            without += 1
            continue
        points.sort()
        speedup = float(np.median(base)) / np.minimum.accumulate([lat for _, lat in points])
        per_run[(label, tuner)].append(speedup)
        ax.plot(np.arange(1, len(speedup) + 1), speedup, lw=0.7, alpha=0.35, color=colours[(label, tuner)],
                drawstyle="steps-post")
    if not per_run:
        raise Missing("no tuned task has a default-kernel operator row to compare with (collect the model without "
                      "--iftune too)")
    finals = []
    for run, lines in per_run.items():
        length = max(len(x) for x in lines)
        padded = np.array([np.concatenate([x, np.full(length - len(x), x[-1])]) for x in lines])
        median = np.median(padded, axis=0)
        finals.append(median[-1])
        ax.plot(np.arange(1, length + 1), median, lw=2.6, color=colours[run], drawstyle="steps-post",
                label=f"{run[0]} ({run[1]}): median of {len(lines)} tasks, {median[-1]:.2f}x")
    ax.axhline(1.0, color="k", lw=0.8, ls="--")
    _log_axes(ax, "y")
    ax.set_xlabel("trial (measured candidates)")
    ax.set_ylabel("speedup over the default kernel (best so far)")
    tasks = sum(len(v) for v in per_run.values())
    ax.set_title(f"Tuning curves, {tasks} tasks, {data.device}")
    ax.legend(fontsize=8)
    _save(fig, path)
    note = f"; {without} tuned tasks have no default-kernel row and are not drawn" if without else ""
    return ("Each thin line is one task: its default kernel's time (the operator rows) over the fastest candidate "
            "measured up to that trial (MetaSchedule's runner); above 1, tuning paid; bold: the median task of each "
            f"model{note}.")


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


def measured_timeline(trace: dict[str, Any], path: Path) -> str:
    """The timeline of a measured trace (``opbench compare --trace``): one panel per traced schedule, one
    row per stream, each operator where its timing marks put it."""
    import matplotlib.pyplot as plt

    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    meta = [e for e in trace["traceEvents"] if e.get("ph") == "M"]
    names = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    lane_names = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    pids = sorted({e["pid"] for e in events})
    if not pids:
        raise Missing("the trace has no operator events")
    lanes = {pid: sorted({e["tid"] for e in events if e["pid"] == pid}) for pid in pids}
    fig, axes = plt.subplots(len(pids), 1, squeeze=False, sharex=True,
                             figsize=(12, 1.2 + sum(0.55 * len(v) + 0.6 for v in lanes.values())),
                             gridspec_kw={"height_ratios": [len(lanes[p]) + 1 for p in pids]})
    for ax, pid in zip(axes[:, 0], pids, strict=True):
        for e in (e for e in events if e["pid"] == pid):
            ax.barh(lanes[pid].index(e["tid"]), e["dur"] / 1e3, left=e["ts"] / 1e3, edgecolor="white", lw=0.3,
                    color=KIND_COLORS.get(e["args"].get("kind")))
        ax.set_yticks(range(len(lanes[pid])), [lane_names.get((pid, t), f"stream {t}") for t in lanes[pid]])
        ax.invert_yaxis()
        ax.set_title(names.get(pid, str(pid)), fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("time (ms)")
    other = trace.get("otherData", {})
    kinds = sorted({e["args"].get("kind") for e in events} & set(KIND_COLORS))
    fig.legend([plt.Rectangle((0, 0), 1, 1, color=KIND_COLORS[k]) for k in kinds], kinds, fontsize=7,
               loc="upper right")
    fig.suptitle(f"{other.get('model', '')} measured on {other.get('device', '?')}: {len(events)} operator runs",
                 fontsize=10)
    _save(fig, path)
    return f"Measured trace: each operator's median start and end over the traced replays, {other.get('note', '')}."


def timeline(data: ReportData, path: Path, schedule: str | None = None, schedule_model: str | None = None,
             **_: Any) -> str:
    """A stream timeline: the measured trace when one is given, else a schedule simulated with the
    operators' measured latencies (said so in the title)."""
    import matplotlib.pyplot as plt

    from ..schedule import IOS, Schedule, SchedulingCost

    if data.trace is not None:
        return measured_timeline(data.trace, path)

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
        plan = IOS(time_limit_s=3).schedule(graph, cost)
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
    ax.set_title(f"Simulated: {name}, {how}, {plan.num_streams} streams, {total * 1e3:.3f} ms "
                 f"(one after another: {sequential * 1e3:.3f} ms)", fontsize=10)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for k, c in KIND_COLORS.items()
               if any(r["kind"] == k for r in graph.rows)]
    ax.legend(handles, [k for k in KIND_COLORS if any(r["kind"] == k for r in graph.rows)], fontsize=7,
              loc="upper left", bbox_to_anchor=(1.0, 1.0))
    _save(fig, path)
    return ("Simulated, not measured: operators placed on streams with their measured alone-times, slowed where "
            "they share the GPU by the scheduling cost's fluid model (opbench.schedule.cost). Give a trace from "
            "'opbench compare --trace' (report --trace) to draw a measured timeline.")


FIGURES = [
    ("Latency by operator kind", "latency_by_kind.png", latency_breakdown),
    ("Roofline", "roofline.png", roofline),
    ("Co-run speedups", "corun_speedup.png", corun_speedups),
    ("Predicted vs measured latency", "predicted_vs_measured.png", predicted_vs_measured),
    ("Tuning curves", "tuning_curves.png", tuning_curves),
    ("Stream timeline", "timeline.png", timeline),
]

__all__ = ["FIGURES", "Missing", "ReportData", "RowGraph", "device_peaks", "measured_timeline"]
