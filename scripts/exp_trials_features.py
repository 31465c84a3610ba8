"""Experiment: does the trials cost model rank better with one row per candidate than with one per buffer store?

The trials predictor (``opbench.predict.trials``) is MetaSchedule's ``XGBModel``: a tree score for each buffer
store of a candidate (its ``PerStoreFeature`` row) and the candidate's score their sum, trained with the
pairwise loss inside each task. A sum cannot say that one store's cost hides another's. Here each candidate
is one row instead: its stores' features summed, their maximum, optionally the last store's (the kernel's
output), and how many stores there are; the same trees, the same pairs and the same loss
(:func:`opbench.predict.trials.pair_gradients`), on the same held-out models (5 folds over the models of a
records folder, resnet-50 left out as ``bench_predict.py --part records`` does). ``--baseline yes`` trains the
per-store model on the same folds too.

Writes OUT/exp_trials_features.json (every variant's pairwise, top-1 and top-5, overall and by dtype).

    PYTHONPATH=python python3 scripts/exp_trials_features.py --out out --variants sum-max
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
from _cli import ROOT, shown

#: the per-candidate rows: the stores' sum and maximum, and with ``last`` the last store's row too
VARIANTS = ("sum-max", "sum-max-last")


def candidate_row(stores: np.ndarray, variant: str, width: int) -> np.ndarray:
    """One candidate's row from its ``PerStoreFeature`` rows (stores x ``width``)."""
    x = np.asarray(stores, dtype="float32").reshape(-1, width)
    parts = [x.sum(0), x.max(0) if len(x) else np.zeros(width, "float32")]
    if variant == "sum-max-last":
        parts.append(x[-1] if len(x) else np.zeros(width, "float32"))
    return np.concatenate([*parts, np.array([len(x)], "float32")])


class CandidateRanker:
    """Trees on one row per candidate, trained with the ranking loss on a fold's tasks (a :data:`trials.Fit`)."""

    def __init__(self, variant: str, train: list[dict[str, Any]], seed: int) -> None:
        import xgboost as xgb

        from opbench.predict import trials

        self.variant, self.width = variant, trials.FEATURE_WIDTH
        ys = np.nan_to_num(np.concatenate([t["latency"].min() / t["latency"] for t in train]))
        i, j, weight = trials.task_pairs([len(t["xs"]) for t in train], ys, seed)
        sign = np.where(ys[i] > ys[j], 1.0, -1.0)

        def objective(preds: np.ndarray, _data: Any) -> tuple[np.ndarray, np.ndarray]:
            return trials.pair_gradients(preds, i, j, sign, weight)

        self.booster = xgb.train({**trials.XGB_PARAMS, "seed": seed}, self._rows([x for t in train for x in t["xs"]]),
                                 num_boost_round=trials.RANK_ROUNDS, obj=objective)

    def _rows(self, xs: list[np.ndarray]) -> Any:
        import xgboost as xgb

        return xgb.DMatrix(np.stack([candidate_row(x, self.variant, self.width) for x in xs]))

    def _predict(self, xs: list[np.ndarray]) -> np.ndarray:
        return self.booster.predict(self._rows(xs))


def evaluate(tasks: dict[Any, dict[str, Any]], variant: str, folds_k: int, seed: int) -> dict[str, Any]:
    """Held-out-model metrics of ``variant`` (or ``per-store``, the predictor as shipped) on fold seed ``seed``."""
    from opbench.predict import trials

    fit = None if variant == "per-store" else lambda train, s: CandidateRanker(variant, train, s)
    return trials.evaluate(tasks, "by_model", folds_k, seed, fit=fit)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for exp_trials_features.json")
    parser.add_argument("--records", default=str(ROOT / "data" / "dataset"), help="a records folder")
    parser.add_argument("--variants", default="sum-max", help=f"comma-separated, of: {', '.join(VARIANTS)}")
    parser.add_argument("--baseline", choices=["yes", "no"], default="no",
                        help="also train the per-store model (the shipped one) on the same folds")
    parser.add_argument("--seed", type=int, default=0, help="fold seed")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--exclude", default="resnet-50", help="models left out with every task they use")
    args = parser.parse_args()
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in variants if v not in VARIANTS]
    if bad or not variants:
        parser.error(f"unknown variant(s) {', '.join(bad) or '(none)'} (accepted: {', '.join(VARIANTS)})")
    from opbench.pipeline.train import task_modules
    from opbench.predict import trials

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tasks, device = trials.trial_examples(args.records, task_modules)
    skip = {m.strip() for m in args.exclude.split(",") if m.strip()}
    tasks = {k: t for k, t in tasks.items() if not skip & set(t["models"])}
    print(f"{len(tasks)} tasks, {sum(len(t['xs']) for t in tasks.values())} records on {device}", flush=True)
    results = []
    for variant in (["per-store"] if args.baseline == "yes" else []) + variants:
        start = time.perf_counter()
        got = evaluate(tasks, variant, args.folds, args.seed)
        m = got["metrics"]
        results.append({"variant": variant, "seconds": round(time.perf_counter() - start, 1),
                        **{k: m[k] for k in ("pairwise", "top1", "top5", "tasks", "candidates")},
                        "by_dtype": {d: {k: v[k] for k in ("pairwise", "top1", "top5")}
                                     for d, v in got["by_dtype"].items()}})
        print(f"{variant}: pairwise {m['pairwise']:.3f} top-1 {m['top1']:.3f} top-5 {m['top5']:.3f} "
              + " ".join(f"{d} {v['pairwise']:.3f}" for d, v in got["by_dtype"].items()), flush=True)
        (out / "exp_trials_features.json").write_text(json.dumps(
            {"records": shown(args.records), "device_name": device, "seed": args.seed, "folds": args.folds,
             "excluded": sorted(skip), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
