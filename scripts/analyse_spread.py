"""Why sampled records are unsteady: the repeat spread of the shipped records by kernel time and by how long
one timed sample lasted, and how far one call alone overstated the kernel's time (the number of calls per
sample was chosen from it). CPU only; reads the records folder.

    PYTHONPATH=python python3 scripts/analyse_spread.py --records data/dataset --out DIR
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def analyse(folder: str, min_repeat_ms: float, steady: float) -> dict:
    """The figures (see the module docstring) of the records in ``folder``."""
    from opbench.dataset import records

    t = records.read(folder)
    t = t[(t.build_status == "ok") & t.spread.notna()]
    samples = t.run_secs.apply(lambda v: np.asarray(v, float))
    median = samples.apply(np.median)
    spread = t.spread.astype(float)
    sample_ms = t.number * median * 1e3
    steady_rows = spread <= steady
    # the calls per sample were ceil(min_repeat_ms / one call): one call's time, to within the rounding
    chosen = (t.number > 1) & (t.number < 10_000)
    one_call = (min_repeat_ms * 1e-3 / t.number)[chosen]
    overstated = one_call / median[chosen]
    by_kernel = []
    edges = [0, 5e-6, 10e-6, 20e-6, 50e-6, 100e-6, 1e-3, float("inf")]
    for lo, hi in zip(edges, edges[1:], strict=False):
        sel = (median > lo) & (median <= hi)
        by_kernel.append({"kernel_us": [lo * 1e6, hi * 1e6 if hi != float("inf") else None], "records": int(sel.sum()),
                          "steady_share": float(steady_rows[sel].mean()) if sel.any() else None,
                          "sample_ms_median": float(sample_ms[sel].median()) if sel.any() else None})
    long = sample_ms >= 1.5
    return {
        "records": int(len(t)), "steady_spread": steady, "min_repeat_ms_asked": min_repeat_ms,
        "steady_share": float(steady_rows.mean()),
        "steady_share_samples_ge_1.5ms": float(steady_rows[long].mean()),
        "records_samples_ge_1.5ms": int(long.sum()),
        "steady_share_samples_lt_1.5ms": float(steady_rows[~long].mean()),
        "records_samples_lt_1.5ms": int((~long).sum()),
        "sample_ms_p10_p50_p90": [float(x) for x in np.percentile(sample_ms, [10, 50, 90])],
        "sample_ms_median_unsteady": float(sample_ms[~steady_rows].median()),
        "one_call_over_median_unsteady": float(overstated[~steady_rows[chosen]].median()),
        "one_call_over_median_steady": float(overstated[steady_rows[chosen]].median()),
        "by_kernel_time": by_kernel,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", default="data/dataset")
    parser.add_argument("--min-repeat-ms", type=float, default=2.0, help="what the records' sampler asked for")
    parser.add_argument("--steady", type=float, default=0.03, help="a record is steady within this spread")
    parser.add_argument("--out", required=True, help="folder for spread_by_sample_length.json")
    args = parser.parse_args()
    result = analyse(args.records, args.min_repeat_ms, args.steady)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "spread_by_sample_length.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"{result['records']} records, {result['steady_share']:.1%} within {args.steady:.0%}: "
          f"{result['steady_share_samples_ge_1.5ms']:.1%} of those whose samples lasted 1.5 ms or more "
          f"({result['records_samples_ge_1.5ms']}), {result['steady_share_samples_lt_1.5ms']:.1%} of the shorter "
          f"({result['records_samples_lt_1.5ms']}); unsteady records' samples lasted "
          f"{result['sample_ms_median_unsteady']:.2f} ms (median) of {args.min_repeat_ms:g} asked for, one call "
          f"overstated their kernel {result['one_call_over_median_unsteady']:.2f}x "
          f"(steady ones {result['one_call_over_median_steady']:.2f}x)")
    for row in result["by_kernel_time"]:
        lo, hi = row["kernel_us"]
        print(f"  kernel {lo:g}-{hi if hi is not None else 'inf'} us: {row['records']:5d} records, "
              f"{row['steady_share']:.1%} steady, samples {row['sample_ms_median']:.2f} ms")


if __name__ == "__main__":
    main()
