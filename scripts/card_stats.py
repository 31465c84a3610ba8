"""The figures of the dataset card (``docs/dataset.md``) from a records folder: records and tasks by precision,
build failures by cause, how steady the records are (by kernel time), the audit, the timers and devices.
CPU only; reads the folder, writes nothing but ``--out``.

    PYTHONPATH=python python3 scripts/card_stats.py --records data/dataset --out DIR
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

#: a build error's cause, by the first pattern its message contains (the card's "build failures by cause")
CAUSES = (("NVRTC compilation failed", "CUDA compiler (NVRTC) error"),
          ("lane", "odd half-precision vector lanes"),
          ("Check failed", "TVM lowering check"))


def cause(message: str) -> str:
    """The card's name for a build error's ``message`` (``other`` when no pattern matches)."""
    return next((name for pattern, name in CAUSES if pattern in message), "other")


def median_s(value) -> float:
    """The median of a list of seconds, stored as a list or as its JSON text; NaN for none."""
    from opbench.dataset.frames import json_value

    value = json_value(value)
    return float(np.median(np.asarray(value, float))) if value else float("nan")


def points(uses_of: list[list[dict]]) -> dict[str, int]:
    """Tasks per point of source / dtype / batch, from each task's uses (a task used at several points counts
    at each)."""
    out: dict[str, int] = {}
    for uses in uses_of:
        for point in {f"{u['source']} {u['dtype']} batch {u['batch_size']}" for u in uses}:
            out[point] = out.get(point, 0) + 1
    return dict(sorted(out.items()))


def card(folder: str, steady: float = 0.03) -> dict:
    """The card's figures of the records folder ``folder`` (a record is steady within a spread of ``steady``)."""
    from opbench.dataset import records
    from opbench.dataset.frames import json_value

    t = records.read(folder)
    tasks = records.read(folder, "tasks")
    uses_of = [json_value(u) or [] for u in tasks.uses]  # each task's uses, decoded once
    sampled = set(t.workload_id)
    ok = t[t.build_status == "ok"]
    errors = t[t.build_status == "build_error"]
    by_cause: dict[str, dict[str, int]] = {}
    for (message, dtype) in zip(errors.error.fillna(""), errors.dtype, strict=True):
        entry = by_cause.setdefault(cause(message), {})
        entry[dtype] = entry.get(dtype, 0) + 1
    timed = ok[ok.spread.notna()]
    kernel_us = timed.run_secs.apply(median_s) * 1e6
    spread = timed.spread.astype(float)
    buckets = {"under 5 us": kernel_us < 5, "5-20 us": (kernel_us >= 5) & (kernel_us < 20),
               "20 us or more": kernel_us >= 20}
    audit = (ok.audit_secs.apply(median_s) / ok.run_secs.apply(median_s) - 1).abs().dropna()
    files = json.loads((Path(folder) / "manifest.json").read_text())["files"]
    with_records = t.drop_duplicates("workload_id")
    return {
        "records": len(t), "records_by_dtype": t.dtype.value_counts().to_dict(),
        "by_status": t.build_status.value_counts().to_dict(),
        "build_errors_by_cause": by_cause,
        "tasks_stored": len(tasks), "tasks_with_records": len(with_records),
        "tasks_with_records_by_dtype": with_records.dtype.value_counts().to_dict(),
        "models": sorted({use["model"] for uses in uses_of for use in uses}),
        "points_with_records": points([u for u, key in zip(uses_of, tasks.workload_id, strict=True) if key in sampled]),
        "timer_configs": t.config.value_counts().to_dict(),
        "steady": steady,
        "spread_median": float(spread.median()),
        "steady_share": float((spread <= steady).mean()),
        "kernel_us": {"median": float(kernel_us.median()), "p10": float(kernel_us.quantile(0.1)),
                      "p90": float(kernel_us.quantile(0.9))},
        "steady_share_by_kernel_time": {k: float((spread[m] <= steady).mean()) for k, m in buckets.items()},
        "share_by_kernel_time": {k: float(m.mean()) for k, m in buckets.items()},
        "audit": {"n": len(audit), "median": float(audit.median()) if len(audit) else None,
                  "p95": float(audit.quantile(0.95)) if len(audit) else None},
        "gpu_uuids": int(t.gpu_uuid.dropna().nunique()),
        "rows_with_gpu_columns": int(t.gpu_driver.notna().sum()),
        "mib": {f["name"]: round(f["bytes"] / 2**20, 2) for f in files},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", default="data/dataset", help="the records folder")
    parser.add_argument("--steady", type=float, default=0.03, help="a record is steady within this spread")
    parser.add_argument("--out", required=True, help="folder for card_stats.json")
    args = parser.parse_args()
    figures = card(args.records, args.steady)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "card_stats.json").write_text(json.dumps(figures, indent=1) + "\n")
    print(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
