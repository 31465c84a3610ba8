"""Experiment: does the trials cost model rank better with one row per candidate, or with more columns per store?

The trials predictor (``opbench.predict.trials``) is MetaSchedule's ``XGBModel``: a tree score for each buffer
store of a candidate (its ``PerStoreFeature`` row) and the candidate's score their sum, trained with the
pairwise loss inside each task. A sum cannot say that one store's cost hides another's. Here each candidate
is one row instead: its stores' features summed, their maximum, optionally the last store's (the kernel's
output), and how many stores there are; the same trees, the same pairs and the same loss
(:func:`opbench.predict.trials.pair_gradients`), on the same held-out models (5 folds over the models of a
records folder, resnet-50 left out as ``bench_predict.py --part records`` does). The store variants keep the
per-store sum and widen each store's row: the launch as the GPU sees it (blocks, waves over the SMs and the
last wave's fill, warps and the share of their lanes used), and each row relative to its task's mean row.
``--baseline yes`` trains the per-store model on the same folds too; ``--gaps yes`` says where the shipped
model errs: its pairwise accuracy by how far apart a pair's latencies are, and by its task's kernel time.

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
CANDIDATE_VARIANTS = ("sum-max", "sum-max-last")
#: per-store rows with more columns, scored as shipped (a sum over stores): ``launch`` adds what the GPU
#: makes of each store's launch (:func:`launch_columns`); ``relative`` adds each row minus the mean row of
#: its task's candidates (the features are log2 scaled, so a difference is a log ratio against the task's
#: typical candidate); ``launch-relative`` both
STORE_VARIANTS = ("launch", "relative", "launch-relative")
#: the shipped per-store model with other pair weights: ``uniform`` weighs every pair whose speeds differ by
#: more than 2 % alike (the shipped weight, ``|log ratio|`` capped at 1, puts little on close pairs, which
#: the pairwise accuracy counts as much as far ones); ``sqrt`` the square root of the shipped weight
WEIGHT_VARIANTS = ("uniform", "sqrt")
VARIANTS = CANDIDATE_VARIANTS + STORE_VARIANTS + WEIGHT_VARIANTS
#: the H100's SMs and resident threads per SM, for the launch columns
SMS, THREADS_PER_SM, BLOCKS_PER_SM = 132, 2048, 32
#: where ``PerStoreFeature`` keeps the lengths of the loops bound to blockIdx.x/y/z, then threadIdx.x/y/z
#: (its first group: 16 arithmetic counts, 3 x 11 for vectorised / unrolled / parallel loops, is_gpu, then these)
BOUND_COLUMNS = slice(50, 56)
#: the other pair weights of :data:`WEIGHT_VARIANTS`, from the shipped ones
PAIR_WEIGHTS = {"uniform": lambda w: np.where(w > 0.02, 1.0, 0.0), "sqrt": np.sqrt}


def launch_columns(stores: np.ndarray) -> np.ndarray:
    """What a GPU makes of each store's launch, from the bound loops' lengths (stored as log2(1 + length)):
    log2 of blocks, waves over the SMs, the last wave's fill, warps per block and the share of their lanes
    used, the resident blocks per SM that the block size allows, waves at that residency and its fill."""
    lens = np.maximum(np.exp2(stores[:, BOUND_COLUMNS]) - 1.0, 1.0)
    blocks, threads = np.prod(lens[:, :3], axis=1), np.prod(lens[:, 3:], axis=1)
    warps = np.ceil(threads / 32.0)
    resident = np.clip(np.floor(THREADS_PER_SM / np.maximum(warps * 32.0, 32.0)), 1.0, BLOCKS_PER_SM)
    waves = blocks / SMS
    waves_resident = blocks / (SMS * resident)
    return np.stack([np.log2(blocks), waves, waves / np.ceil(waves), warps, threads / (warps * 32.0), resident,
                     waves_resident, waves_resident / np.ceil(waves_resident),
                     np.log2(blocks * threads / (SMS * THREADS_PER_SM))], axis=1).astype("float32")


def store_rows(tasks: dict[Any, dict[str, Any]], variant: str, width: int) -> dict[Any, dict[str, Any]]:
    """The tasks with each candidate's store rows widened as ``variant`` says (:data:`STORE_VARIANTS`)."""
    out = {}
    for key, task in tasks.items():
        xs = [np.asarray(x, dtype="float32").reshape(-1, width) for x in task["xs"]]
        stacked = [x for x in xs if len(x)]
        mean = np.concatenate(stacked).mean(0) if stacked else np.zeros(width, "float32")
        rows = []
        for x in xs:
            parts = [x]
            if "launch" in variant:
                parts.append(launch_columns(x))
            if "relative" in variant:
                parts.append(x - mean)
            rows.append(np.concatenate(parts, axis=1))
        out[key] = {**task, "xs": rows}
    return out


def candidate_row(stores: np.ndarray, variant: str, width: int) -> np.ndarray:
    """One candidate's row from its ``PerStoreFeature`` rows (stores x ``width``)."""
    x = np.asarray(stores, dtype="float32").reshape(-1, width)
    parts = [x.sum(0), x.max(0) if len(x) else np.zeros(width, "float32")]
    if variant == "sum-max-last":
        parts.append(x[-1] if len(x) else np.zeros(width, "float32"))
    return np.concatenate([*parts, np.array([len(x)], "float32")])


def pair_booster(train: list[dict[str, Any]], seed: int, rows: Any, ids: np.ndarray | None = None,
                 reweigh: Any = None) -> Any:
    """Trees trained with the shipped ranking loss (:func:`opbench.predict.trials.pair_gradients` over
    :func:`opbench.predict.trials.task_pairs`) on a fold's tasks. ``rows`` (a DMatrix) holds one row per
    candidate, or with ``ids`` (each row's candidate) several, a candidate's score the sum of its rows';
    ``reweigh`` maps the shipped pair weights to others."""
    import xgboost as xgb

    from opbench.predict import trials

    ys = np.nan_to_num(np.concatenate([t["latency"].min() / t["latency"] for t in train]))
    i, j, weight = trials.task_pairs([len(t["xs"]) for t in train], ys, seed)
    if reweigh is not None:
        weight = reweigh(weight)
    sign = np.where(ys[i] > ys[j], 1.0, -1.0)

    def objective(preds: np.ndarray, _data: Any) -> tuple[np.ndarray, np.ndarray]:
        if ids is None:
            return trials.pair_gradients(preds, i, j, sign, weight)
        grad, hess = trials.pair_gradients(np.bincount(ids, weights=preds, minlength=len(ys)), i, j, sign, weight)
        return grad[ids], hess[ids]

    return xgb.train({**trials.XGB_PARAMS, "seed": seed}, rows, num_boost_round=trials.RANK_ROUNDS, obj=objective)


class CandidateRanker:
    """Trees on one row per candidate, trained with the ranking loss on a fold's tasks (a :data:`trials.Fit`)."""

    def __init__(self, variant: str, train: list[dict[str, Any]], seed: int) -> None:
        from opbench.predict import trials

        self.variant, self.width = variant, trials.FEATURE_WIDTH
        self.booster = pair_booster(train, seed, self._rows([x for t in train for x in t["xs"]]))

    def _rows(self, xs: list[np.ndarray]) -> Any:
        import xgboost as xgb

        return xgb.DMatrix(np.stack([candidate_row(x, self.variant, self.width) for x in xs]))

    def _predict(self, xs: list[np.ndarray]) -> np.ndarray:
        return self.booster.predict(self._rows(xs))


class StoreRanker:
    """The shipped per-store model (a tree score per store, a candidate's score their sum) with the pair
    weights of ``variant`` (:data:`WEIGHT_VARIANTS`), trained on a fold's tasks (a :data:`trials.Fit`)."""

    def __init__(self, variant: str, train: list[dict[str, Any]], seed: int) -> None:
        from tvm.s_tir.meta_schedule.cost_model.xgb_model import PackSum

        packed = PackSum(xs=[x for t in train for x in t["xs"]], ys=None)
        self.booster = pair_booster(train, seed, packed.dmatrix, packed.ids, PAIR_WEIGHTS[variant])

    def _predict(self, xs: list[np.ndarray]) -> np.ndarray:
        from tvm.s_tir.meta_schedule.cost_model.xgb_model import PackSum

        packed = PackSum(xs=xs, ys=None)
        return np.bincount(packed.ids, weights=self.booster.predict(packed.dmatrix), minlength=len(xs))


def evaluate(tasks: dict[Any, dict[str, Any]], variant: str, folds_k: int, seed: int) -> dict[str, Any]:
    """Held-out-model metrics of ``variant`` (or ``per-store``, the predictor as shipped) on fold seed ``seed``."""
    from opbench.predict import trials

    if variant in STORE_VARIANTS:
        return trials.evaluate(store_rows(tasks, variant, trials.FEATURE_WIDTH), "by_model", folds_k, seed)
    if variant in WEIGHT_VARIANTS:
        return trials.evaluate(tasks, "by_model", folds_k, seed, fit=lambda train, s: StoreRanker(variant, train, s))
    fit = None if variant == "per-store" else lambda train, s: CandidateRanker(variant, train, s)
    return trials.evaluate(tasks, "by_model", folds_k, seed, fit=fit)


#: the buckets of a pair's gap, ``|log|`` of the two latencies' ratio, for ``--gaps``
GAP_EDGES = (0.0, 0.01, 0.03, 0.1, 0.3, 1.0, float("inf"))
#: the buckets of a task's median candidate latency (seconds), for ``--gaps``
KERNEL_EDGES = (0.0, 5e-6, 2e-5, 1e-4, float("inf"))


def where_it_errs(tasks: dict[Any, dict[str, Any]], folds_k: int, seed: int) -> dict[str, Any]:
    """The shipped model's held-out pairwise accuracy by how far apart a pair's latencies are, and by how long
    its task's kernels take (the same folds as :func:`evaluate`)."""
    from opbench.predict import trials

    items, entries, labels = trials._entries(tasks, "by_model")  # noqa: SLF001 (the folds evaluate uses)
    scores, _, _ = trials._cross_validate(items, entries, labels, "by_model", folds_k, seed)  # noqa: SLF001
    latency = np.array([items[t]["latency"][c] for t, c in entries])
    task = np.array([t for t, _ in entries])
    right, total = np.zeros(len(GAP_EDGES) - 1), np.zeros(len(GAP_EDGES) - 1)
    kernel_right, kernel_total = np.zeros(len(KERNEL_EDGES) - 1), np.zeros(len(KERNEL_EDGES) - 1)
    for t in np.unique(task[~np.isnan(scores)]):
        idx = np.flatnonzero((task == t) & ~np.isnan(scores))
        i, j = np.triu_indices(len(idx), 1)
        a, b = idx[i], idx[j]
        gap = np.abs(np.log(latency[a] / latency[b]))
        ok = ((latency[a] < latency[b]) == (scores[a] > scores[b]))[gap > 0]
        bucket = np.digitize(gap[gap > 0], GAP_EDGES[1:-1])
        np.add.at(right, bucket, ok)
        np.add.at(total, bucket, 1)
        k = int(np.digitize(np.median(latency[idx]), KERNEL_EDGES[1:-1]))
        kernel_right[k] += ok.sum()
        kernel_total[k] += len(ok)

    def rows(edges: tuple[float, ...], hits: np.ndarray, counts: np.ndarray) -> list[dict[str, Any]]:
        bounds = zip(edges[:-1], edges[1:], hits, counts, strict=True)
        return [{"from": lo, "to": None if hi == float("inf") else hi, "share_of_pairs": n / counts.sum(),
                 "pairwise": h / n if n else None} for lo, hi, h, n in bounds]

    return {"by_gap": rows(GAP_EDGES, right, total),
            "by_task_latency_s": rows(KERNEL_EDGES, kernel_right, kernel_total)}


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
    parser.add_argument("--gaps", choices=["yes", "no"], default="no",
                        help="also the shipped model's pairwise accuracy by the pairs' gap and by the tasks' latency")
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
    results: list[dict[str, Any]] = []
    gaps = None

    def write() -> None:
        (out / "exp_trials_features.json").write_text(json.dumps(
            {"records": shown(args.records), "device_name": device, "seed": args.seed, "folds": args.folds,
             "excluded": sorted(skip), "results": results, "where_it_errs": gaps}, indent=1))

    if args.gaps == "yes":
        gaps = where_it_errs(tasks, args.folds, args.seed)
        for name, buckets in gaps.items():
            print(name + ": " + ", ".join(f"{b['from']:g}-{b['to'] if b['to'] is not None else 'inf'}: "
                                          f"{b['pairwise']:.3f} ({b['share_of_pairs']:.1%})" for b in buckets),
                  flush=True)
        write()
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
        write()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
