"""The predictors' benchmark: held-out metrics on a dataset, and schedules found with predicted costs.

``--part metrics`` (any machine) trains every predictor on the dataset with its held-out split and
writes ``DIR/predict_metrics.json``; it also saves the predictors used by the schedule part, trained
without the models that part schedules (``--schedule-models``), into ``--predictors DIR``.

``--part pretrained`` tunes the heaviest tasks of a model (``--tune-model``) with plain ``xgb`` and
with ``--pretrained`` (a trials predictor trained on other models), and writes each task's best
latency by trial and the trials the pretrained run needs to reach plain xgb's final result. A long arm
can be split over calls into the same ``--out`` (``--arms``; ``--tune-time`` starts no new task after
that many seconds and a later call goes on), for example a model left out of the shipped records:

    PYTHONPATH=python python3 -m opbench train --what trials --dataset data/dataset \\
        --exclude resnet-50,bert --out trials.opm
    # plain xgb, one task per call (about 7 minutes each on an H100 with 16 cores); then the pretrained arm
    PYTHONPATH=python python3 scripts/bench_predict.py --part pretrained --tune-model resnet-50 \\
        --tune-dtype float16 --target cuda --tune-tasks 2 --trials 256 --arms xgb --tune-time 1 --out DIR
    PYTHONPATH=python python3 scripts/bench_predict.py --part pretrained --tune-model resnet-50 \\
        --tune-dtype float16 --target cuda --tune-tasks 2 --trials 256 --pretrained-trials 64 \\
        --pretrained trials.opm --arms xgb-pretrained --out DIR
    # or the pretrained arm alone against an earlier run's plain arm (its JSON, on the same kind of GPU)
    PYTHONPATH=python python3 scripts/bench_predict.py --part pretrained --tune-model resnet-50 \\
        --tune-dtype float16 --target cuda --tune-tasks 2 --trials 256 --pretrained-trials 64 \\
        --pretrained trials.opm --arms xgb-pretrained \\
        --plain-from data/benchmarks/predict_pretrained_resnet-50_fp16_h100.json --out DIR

Stopped by Ctrl-C or SIGTERM (a time limit), an arm keeps the trials it measured, and the JSON is written
from them (its run marked ``"stopped": "interrupted"``).

``--part search`` (any machine) simulates the pretrained tuner's search on recorded candidates: on the
tasks of ``--exclude``'s models (which ``--pretrained`` was trained without), each arm picks
``--search-batch`` candidates at a time among a task's records and sees their latencies, up to
``--search-budget``; writes the share of tasks whose best record was found after each pick and the best
found over it (``DIR/predict_search.json``):

    PYTHONPATH=python python3 scripts/bench_predict.py --part search --pretrained trials.opm \\
        --exclude resnet-50,bert --search-min 24 --search-batch 4 --search-budget 12 --out DIR

``--part schedules`` (a GPU) runs ``opbench compare`` on each of ``--schedule-models`` with the ios
scheduler on measured stages (``ios-measured``), on the scheduling cost over measured operator times
(``ios``) and on predicted costs (``ios-predicted``, ``greedy-predicted``), all measured in one run,
and writes ``DIR/predict_schedules.json`` with each one's latency and search time (``--corun no``:
predicted operator latencies only, ``DIR/predict_schedules_latency_only.json``).

    PYTHONPATH=python python3 scripts/bench_predict.py --part metrics --out data/benchmarks
    PYTHONPATH=python python3 scripts/bench_predict.py --part schedules --out DIR

``--part records`` (any machine) evaluates the trials cost model on a records folder (``--records``, the
shipped ``data/dataset``): held-out models whose tasks no training model shares, by dtype, and a
learning curve, beside MetaSchedule's own losses and MLP cost model on the same splits. Writes
``DIR/predict_records.json`` (each held-out task's figures in ``DIR/predict_records_held_out.json.gz``).

    PYTHONPATH=python python3 scripts/bench_predict.py --part records --out data/benchmarks

``--part ceiling`` (any machine) predicts each model operator that another model's run measured too (same
task, batch and dtype) by those other measurements: the MAPE and share within +-10 % that a predictor knowing
each operator's true time would reach against the runs' noise, the latency predictor's ceiling one model out.

    PYTHONPATH=python python3 scripts/bench_predict.py --part ceiling --out data/benchmarks

``--part precision`` (any machine) trains on the float16/bfloat16 rows (``--half-dataset``): the
latency and co-run predictors with one model held out at a time (all its batch sizes and
precisions), and the transfer from float32: a latency predictor fit on ``--dataset``'s float32 rows
only, tested on the float16 and on the bfloat16 rows. Writes ``DIR/predict_precision.json``.

    PYTHONPATH=python python3 scripts/bench_predict.py --part precision --out data/benchmarks
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from _cli import ROOT, bad_input, shown

sys.path.insert(0, str(ROOT / "python"))
DATASET = ROOT / "data" / "dataset" / "h100.sqlite.gz"
PREDICTORS = ROOT / "data" / "predictors"
#: ``--part records``: each held-out task's pairwise accuracy and top-1, next to ``predict_records.json``
HELD_OUT = "predict_records_held_out.json.gz"


def metrics(args: argparse.Namespace) -> dict:
    from opbench.pipeline.train import TrainJob, train

    # (what, split, features, folds, seed); 100 folds is one per model (leave one model out)
    runs = [("latency", "by_model", f, folds, 0) for f in ("graph", "graph+launch", "graph+kernel")
            for folds in (100, 5)]
    runs += [("latency", "by_model", "graph+launch", 5, seed) for seed in (1, 2)]
    runs += [("latency", "by_task", "graph+launch", 5, 0), ("latency", "within_task", "graph+launch", 5, 0),
             ("corun", "by_model", "graph", 5, 0), ("corun", "by_model", "graph", 5, 1),
             ("corun", "by_model", "graph", 5, 2), ("corun", "by_model", "graph", 100, 0),
             ("corun", "by_task", "graph", 5, 0),
             ("trials", "by_task", "graph", 5, 0), ("trials", "within_task", "graph", 5, 0)]
    out = {"dataset": shown(args.dataset), "results": []}
    for what, split, features, folds, seed in runs:
        start = time.perf_counter()
        result = train(TrainJob(str(args.dataset), what, split, folds=folds, seed=seed, features=features))
        result = {k: v for k, v in result.items() if k not in ("model_file",)}
        result["seed"] = seed
        out["results"].append(result)
        m = result["metrics"]
        print(f"{what:<8}{split:<12}{features:<13}{result['folds']:>3} folds, seed {seed}  " + "  ".join(
            f"{k} {v:.3f}" for k, v in m.items() if v is not None) + f"  ({time.perf_counter() - start:.0f} s)",
            flush=True)
    exclude = [m.strip() for m in args.schedule_models.split(",")]
    Path(args.predictors).mkdir(parents=True, exist_ok=True)
    saved = {}
    for what, features, name in [("latency", "graph+kernel", "latency_kernel"),
                                 ("latency", "graph+launch", "latency_launch"), ("corun", "graph", "corun")]:
        file = Path(args.predictors) / f"h100_{name}_without_{'_'.join(exclude)}.opm"
        train(TrainJob(str(args.dataset), what, "by_model", str(file), features=features, exclude=tuple(exclude or ())))
        saved[name] = shown(file)
    out["predictors_without"] = {"models": exclude, "files": saved}
    return out


def corun(args: argparse.Namespace) -> dict:
    """The co-run predictor on each dataset held out by model (one model out, and 5 folds with three fold
    seeds), trained on its own groups or with the other dataset's groups too (``--also``), with the rule that
    groups slower than their members inside them do not train, and without it (only the solo-sum rule)."""
    from opbench.pipeline.train import TrainJob, train
    from opbench.predict import corun as corun_module

    rule, trains = corun_module.INCONSISTENT_RATIO, corun_module.trains
    datasets = {"float32": str(args.dataset), "half": str(args.half_dataset)}
    out: dict = {"dataset": shown(args.dataset), "half_dataset": shown(args.half_dataset), "inconsistent_ratio": rule,
                 "results": []}
    for name, path in datasets.items():
        other = tuple(p for n, p in datasets.items() if n != name)
        splits = [(100, 0), (5, 0), (5, 1), (5, 2)] if name == "float32" else [(100, 0)]
        for consistency in (False, True):
            for also in ((), other):
                # without the rule: as for a group whose members were not timed inside it (the solo-sum rule alone)
                corun_module.trains = trains if consistency else (lambda g: trains({**g, "slowdowns": None}))
                try:
                    for folds, seed in splits:
                        result = train(TrainJob(path, "corun", "by_model", folds=folds, seed=seed, also=also))
                        row = {"tested": name, "also": bool(also), "consistency_rule": consistency, "folds": folds,
                               "seed": seed, "groups": result["n_test"], "n_also": result["n_also"],
                               "metrics": result["metrics"], "metrics_consistent": result["metrics_consistent"],
                               "n_inconsistent": result["n_inconsistent"], "held_out": result["held_out"]}
                        out["results"].append(row)
                        print(f"{name:<8} also {bool(also)!s:<6} rule {consistency!s:<6} {result['folds']:>3} folds "
                              f"seed {seed}  MAPE {result['metrics']['mape']:.4f}  within 10% "
                              f"{result['metrics']['within_10pct']:.3f}  consistent groups' MAPE "
                              f"{(result['metrics_consistent'] or {}).get('mape', float('nan')):.4f}", flush=True)
                finally:
                    corun_module.trains = trains
    return out


def precision(args: argparse.Namespace) -> dict:
    import numpy as np

    from opbench.dataset import row_dtype
    from opbench.pipeline.train import TrainJob, train
    from opbench.predict.latency import UNSTABLE_SPREAD, LatencyPredictor, latency_rows, sampled
    from opbench.predict.metrics import regression_metrics

    out: dict = {"dataset": shown(args.dataset), "half_dataset": shown(args.half_dataset), "results": []}
    for what, split, folds in [("latency", "by_model", 100), ("latency", "by_dtype", 2), ("corun", "by_model", 100)]:
        result = train(TrainJob(str(args.half_dataset), what, split, folds=folds,
                                features="graph+launch" if what == "latency" else "graph"))
        result = {k: v for k, v in result.items() if k not in ("model_file",)}
        out["results"].append(result)
        print(f"{what:<8}{split:<10}{result['folds']:>3} folds  MAPE {result['metrics']['mape']:.3f}", flush=True)
    fp32, device = latency_rows(str(args.dataset))
    half, _ = latency_rows(str(args.half_dataset), device)
    train_rows = [r for r in fp32 if row_dtype(r) == "float32"]
    model = LatencyPredictor.fit(train_rows, "graph+launch")
    transfer = {"device": device, "train_rows": len(train_rows)}
    for dtype in ("float16", "bfloat16"):
        rows = [r for r in half if r.get("dtype") == dtype and not sampled(r)]
        measured = np.array([float(r["latency_median_s"]) for r in rows])
        transfer[dtype] = {"n": len(rows), **regression_metrics(measured, model.predict(rows),
                                                                  [r["workload_id"] for r in rows])}
        print(f"float32 -> {dtype}: MAPE {transfer[dtype]['mape']:.3f} on {len(rows)} rows", flush=True)
    out["transfer_from_float32"] = transfer
    out["with_float32_rows"] = mixed_by_model(fp32, half)
    out["with_float32_rows_by_seed"] = {str(seed): mixed_by_model(fp32, half, seed)["metrics"] for seed in (1, 2)}
    out["unstable_spread"] = UNSTABLE_SPREAD
    return out


def mixed_by_model(fp32: list[dict], half: list[dict], seed: int = 0) -> dict:
    """Latency on half-precision rows, one model held out at a time (all its batch sizes and dtypes), the
    predictor fit on the other models' half-precision rows and their float32 rows too."""
    import numpy as np

    from opbench.predict.latency import LatencyPredictor, sampled
    from opbench.predict.metrics import regression_metrics

    measured, predicted, groups = [], [], []
    models = sorted({r["model"] for r in half if not sampled(r)})  # sampled operators always train
    for model in models:
        train_rows = [r for r in half + fp32 if r["model"] != model]
        test = [r for r in half if r["model"] == model and not sampled(r)]
        fit = LatencyPredictor.fit(train_rows, "graph+launch", seed)
        measured += [float(r["latency_median_s"]) for r in test]
        predicted += list(fit.predict(test))
        groups += [r["workload_id"] for r in test]
    metrics = regression_metrics(np.array(measured), np.array(predicted), groups)
    print(f"latency by_model with the float32 rows, seed {seed}: MAPE {metrics['mape']:.4f}", flush=True)
    return {"seed": seed, "split": "by_model", "folds": len(models), "n_test": len(measured), "metrics": metrics}


def schedules(args: argparse.Namespace) -> dict:
    exclude = [m.strip() for m in args.schedule_models.split(",")]
    suffix = "_".join(exclude)
    lat = Path(args.predictors) / f"h100_latency_kernel_without_{suffix}.opm"
    cor = Path(args.predictors) / f"h100_corun_without_{suffix}.opm"
    used = [lat, cor] if args.corun == "yes" else [lat]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python"), "PYTHONUNBUFFERED": "1"}
    out: dict = {"predictors": [shown(f) for f in used], "models": {}}
    for model in exclude:
        file = Path(args.out) / f"compare_{model}.json"
        cmd = [sys.executable, "-m", "opbench", "compare", "--modelsource", "local", "--modelname", model,
               "--target", "cuda", "--schedulers", "sequential,greedy,ios", "--ios-cost", "model,measured",
               "--cost", "measured,predicted", "--predictor", ",".join(map(str, used)), "--json", str(file)]
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        print(proc.stdout[-2500:], flush=True)
        if proc.returncode != 0:
            out["models"][model] = {"exit": proc.returncode, "tail": proc.stdout[-1500:]}
            continue
        table = json.loads(file.read_text())
        rows = {r["schedule"]: r for r in table["schedules"]}
        summary = {name: {k: rows[name].get(k) for k in ("latency_ms", "scheduling_ms", "streams", "speedup")}
                   for name in rows}
        ref, pred = rows.get("ios-measured"), rows.get("ios-predicted")
        if ref and pred:
            summary["ios_predicted_over_measured_latency"] = pred["latency_ms"] / ref["latency_ms"]
            summary["ios_search_speedup"] = ref["scheduling_ms"] / max(pred["scheduling_ms"], 1e-9)
        summary["critical_path_ms"] = table["critical_path"]["chain_ms"]
        summary["seconds"] = time.perf_counter() - start
        out["models"][model] = summary
    return out


def _curves(data: Path, arm: str, curves: dict) -> None:
    """Each task's best latency so far, trial by trial, of one arm's tuning dataset into ``curves``."""
    import sqlite3

    conn = sqlite3.connect(data)
    rows = conn.execute("SELECT task, task_weight, trial, latency_median_s FROM trials ORDER BY task, trial")
    for task, weight, _trial, lat in rows:
        c = curves.setdefault(task, {"weight": weight}).setdefault(arm, [])
        best = min([x for x in c[-1:] if x is not None] + ([lat] if lat else []), default=None)
        c.append(best)
    conn.close()


def _plain_curves(path: str, args: argparse.Namespace, curves: dict) -> None:
    """Plain xgb's curves from an earlier run's ``predict_pretrained.json`` (``--plain-from``), refused when it
    tuned another model, dtype, target or number of trials."""
    earlier = json.loads(Path(path).read_text())
    wanted = {"model": args.tune_model, "dtype": args.tune_dtype, "target": args.target}
    if any(earlier.get(k) != v for k, v in wanted.items()) or (earlier.get("trials") or {}).get("xgb") != args.trials:
        bad_input(f"--plain-from {path}: tuned {earlier.get('model')} {earlier.get('dtype')} on "
                  f"{earlier.get('target')} with {(earlier.get('trials') or {}).get('xgb')} trials, not "
                  f"{args.tune_model} {args.tune_dtype} on {args.target} with {args.trials}")
    for task, t in earlier.get("tasks", {}).items():
        curves.setdefault(task, {"weight": t["weight"]})["xgb"] = [v / 1e3 if v else None
                                                                  for v in t["plain_best_ms_by_trial"]]


def _distinct_feature_sets(folder: Path, data: Path) -> dict:
    """Per tuned task (12 hex digits of its workload's hash): the trials of an arm's tuning database and how many
    distinct per-store feature sets (what the cost model sees) they hold; the rest are twins of earlier ones
    (:func:`opbench.predict.trials.demote_twins`)."""
    import sqlite3

    from tvm.s_tir.meta_schedule.utils import shash2hex

    from opbench.predict.trials import feature_key, target_for, trial_features
    from opbench.tune.database import open_database

    conn = sqlite3.connect(data)
    (target_json,) = conn.execute("SELECT target FROM trials LIMIT 1").fetchone() or (None,)
    conn.close()
    if not target_json or not folder.is_dir():
        return {}
    target, tasks = target_for(target_json), {}
    for record in open_database(folder, create=False).get_all_tuning_records():
        tasks.setdefault(shash2hex(record.workload.mod), (record.workload.mod, []))[1].append(record.trace.as_json())
    out = {}
    for key, (mod, traces) in sorted(tasks.items()):
        features = [f for f in trial_features(mod, target, traces) if f is not None]
        out[key[:12]] = {"trials": len(traces), "distinct": len({feature_key(f) for f in features})}
    return out


def pretrained(args: argparse.Namespace) -> dict:
    """Tune the heaviest tasks of a held-out model with plain xgb and with --pretrained, side by side.

    An arm may be tuned over several calls into the same ``--out`` (``--arms``, ``--tune-time``: each call
    tunes the tasks the last one did not reach); the calls so far are kept in the JSON's ``runs``."""
    arms = set(args.arms.split(","))
    if not arms <= {"xgb", "xgb-pretrained"} and arms != {"none"}:
        bad_input(f"--arms {args.arms}: accepted are xgb, xgb-pretrained (comma-separated) or none")
    if "xgb-pretrained" in arms and not args.pretrained:
        bad_input("--arms xgb-pretrained needs --pretrained (a trials predictor trained without --tune-model)")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python"), "PYTHONUNBUFFERED": "1"}
    trials = {"xgb": args.trials, "xgb-pretrained": args.pretrained_trials or args.trials}
    earlier = Path(args.out) / "predict_pretrained.json"
    runs = json.loads(earlier.read_text()).get("runs", []) if earlier.is_file() else []
    out: dict = {"model": args.tune_model, "source": args.tune_source, "dtype": args.tune_dtype,
                 "target": args.target, "trials": trials, "tune_tasks": args.tune_tasks,
                 "predictor": shown(args.pretrained) if args.pretrained else None,
                 "runs": runs if isinstance(runs, list) else []}
    curves: dict = {}
    stopped = False
    for arm in ("xgb", "xgb-pretrained"):
        data = Path(args.out) / f"tune_{arm}.sqlite"
        if arm not in arms:  # tuned by an earlier call into the same folder, or not at all
            if data.exists():
                _curves(data, arm, curves)
            elif arm == "xgb" and args.plain_from:
                _plain_curves(args.plain_from, args, curves)
                out["plain_from"] = shown(args.plain_from)
            continue
        cmd = [sys.executable, "-m", "opbench", "collect", "--modelsource", args.tune_source, "--modelname",
               args.tune_model, "--dtype", args.tune_dtype, "--target", args.target, "--dataset", str(data),
               "--iftune", "true", "--tuner", "xgb", "--trials", str(trials[arm]), "--tune-tasks",
               str(args.tune_tasks)]
        # the experiment reads the trials only: the operator rows measured after the tuning are kept short
        cmd += ["--repeat", "2", "--min-repeat-ms", "1", "--no-check"]
        cmd += ["--tune-time", str(args.tune_time)] if args.tune_time else []
        if arm == "xgb-pretrained":
            cmd += ["--predictor", args.pretrained]
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env)  # its progress shows as it goes
        try:
            code = proc.wait()
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM (main): the trials measured so far still make curves
            proc.terminate()  # it keeps every finished trial and says so
            code = proc.wait()
            stopped = True
        out["runs"].append({"arm": arm, "exit": code, "seconds": time.perf_counter() - start,
                            "trials": trials[arm], "tune_time_s": args.tune_time,
                            **({"stopped": "interrupted"} if stopped else {})})
        _curves(data, arm, curves)
        if stopped:
            break
    # how many trials went to programs the cost model saw before; once a time limit stopped the call, the curves
    # come first (a second signal would find the features half done)
    try:
        for arm in () if stopped else ("xgb", "xgb-pretrained"):
            data = Path(args.out) / f"tune_{arm}.sqlite"
            if data.exists():
                out.setdefault("distinct_feature_sets", {})[arm] = _distinct_feature_sets(data.with_suffix(".tuning"),
                                                                                         data)
    except KeyboardInterrupt:
        stopped = True
    if stopped:
        out["distinct_feature_sets_skipped"] = "interrupted: --arms none into the same --out counts them"
    tasks = {}
    for task, c in curves.items():
        plain, pre = c.get("xgb") or [], c.get("xgb-pretrained") or []
        if not plain or not pre or plain[-1] is None:
            continue
        target = plain[-1]
        reach = next((i + 1 for i, v in enumerate(pre) if v is not None and v <= target), None)
        tasks[task] = {"weight": c["weight"], "plain_best_ms": target * 1e3, "pretrained_best_ms": pre[-1] * 1e3,
                       "pretrained_trials_to_plain_best": reach, "plain_trials": len(plain),
                       "plain_best_ms_by_trial": [v * 1e3 if v else None for v in plain],
                       "pretrained_best_ms_by_trial": [v * 1e3 if v else None for v in pre]}
    out["tasks"] = tasks

    def weighted(arm: str, k: int) -> float | None:
        best = [t[f"{arm}_best_ms_by_trial"][min(k, len(t[f"{arm}_best_ms_by_trial"])) - 1] for t in tasks.values()]
        return None if None in best else sum(t["weight"] * b for t, b in zip(tasks.values(), best, strict=True))

    if tasks:
        n, m = trials["xgb"], min(len(t["pretrained_best_ms_by_trial"]) for t in tasks.values())
        plain_total = weighted("plain", n)
        out["weighted_plain_best_ms"] = plain_total
        out["weighted_plain_best_ms_by_trial"] = {k: weighted("plain", k) for k in (8, 16, 32, 64, 128, n) if k <= n}
        out["weighted_pretrained_best_ms_by_trial"] = {k: weighted("pretrained", k)
                                                       for k in sorted({8, 16, 32, 64, 128, m}) if k <= m}
        out["pretrained_trials_to_plain_total"] = next(
            (k for k in range(1, m + 1) if (weighted("pretrained", k) or float("inf")) <= plain_total), None)
    return out


def search(args: argparse.Namespace) -> dict:
    """The search simulated on the recorded candidates of the tasks of ``--exclude``'s models (left out of the
    ``--pretrained`` predictor's training): each arm of :data:`opbench.predict.trials.SEARCH_ARMS` picks
    ``--search-batch`` candidates at a time up to ``--search-budget``, on every task with at least
    ``--search-min`` records."""
    from opbench.pipeline.train import task_modules
    from opbench.predict import load_predictor
    from opbench.predict.trials import SEARCH_ARMS, simulate_search, trial_examples

    if not args.pretrained:
        bad_input("--part search needs --pretrained (a trials predictor trained without --exclude's models)")
    predictor = load_predictor(args.pretrained, "trials")
    left_out = set(args.exclude.split(","))
    if not left_out <= set(predictor.meta.get("excluded") or []):
        bad_input(f"{args.pretrained} was trained on {sorted(left_out)} (its excluded models: "
                  f"{predictor.meta.get('excluded')}); pass a predictor trained with --exclude {args.exclude}")
    tasks, device = trial_examples(args.records, task_modules)
    chosen = [t for t in tasks.values() if left_out & set(t["models"]) and len(t["xs"]) >= args.search_min]
    sizes = sorted(len(t["xs"]) for t in tasks.values() if left_out & set(t["models"]))
    print(f"{len(chosen)} tasks of {sorted(left_out)} with {args.search_min}+ records (records per task of "
          f"theirs: {sizes})", flush=True)
    if not chosen:
        bad_input(f"no task of {sorted(left_out)} has {args.search_min} records or more: lower --search-min")
    out: dict = {"records": shown(args.records), "device": device, "predictor": shown(args.pretrained),
                 "models": sorted(left_out), "tasks": len(chosen), "arms": {}}
    for arm in SEARCH_ARMS:
        runs = [simulate_search(chosen, predictor, arm, args.search_batch, args.search_budget, seed)
                for seed in range(3 if arm in ("random", "task") else 1)]
        depth = min(r["budget"] for r in runs)
        out["arms"][arm] = {"seeds": len(runs), **{key: [sum(r[key][k] for r in runs) / len(runs)
                                                          for k in range(depth)]
                                                    for key in ("best_over_task_best", "found")}}
        marks = [k for k in (8, 16, 24, 32) if k <= depth]
        print(f"{arm:<16}" + "  ".join(f"{k:>2}: x{out['arms'][arm]['best_over_task_best'][k - 1]:.3f} "
                                       f"({out['arms'][arm]['found'][k - 1]:.0%} found)" for k in marks), flush=True)
    return out


def noise_ceiling(folder: str, tasks: set[str]) -> dict:
    """How many pairs of a task's built candidates differ by less than their repeat spread ((max - min) /
    median of either one's samples): their measured order is a coin's, so a perfect model's pairwise
    accuracy is at most ``1 - share / 2`` on these records."""
    from collections import defaultdict

    import numpy as np

    from opbench.dataset import records as folder_rows

    by_task = defaultdict(list)
    for r in folder_rows.read_rows(folder):
        if r["workload_id"] in tasks and r["build_status"] == "ok" and r["latency_median_s"]:
            by_task[r["workload_id"]].append((float(r["latency_median_s"]), float(r.get("spread") or 0.0)))
    pairs = close = 0
    for rows in by_task.values():
        lat, spread = np.array(rows).T
        i, j = np.triu_indices(len(lat), 1)
        gap = np.abs(lat[i] - lat[j]) / np.minimum(lat[i], lat[j])
        pairs += len(i)
        close += int((gap < np.maximum(spread[i], spread[j])).sum())
    share = close / pairs if pairs else 0.0
    return {"pairs": pairs, "pairs_within_spread": share, "pairwise_ceiling": 1.0 - share / 2}


def ceiling(args: argparse.Namespace) -> dict:
    """How far a latency predictor held out by model can get at best: each model operator of ``--dataset``
    (and ``--half-dataset``) whose task, batch and dtype another model's run measured too, predicted by the median
    of those other measurements (the best a predictor that knows the operator's true time could do against a
    measurement of another run). Its MAPE and share within +-10 % are a ceiling for the latency predictor's
    one-model-out figures, and the pairs that disagree most show where the runs differ."""
    import statistics
    from collections import defaultdict

    import opbench

    out: dict = {}
    for name, path in (("float32", args.dataset), ("half", args.half_dataset)):
        ops = opbench.load(path)
        ops = ops[(ops["status"] == "ok") & (ops["config"] == "default") & (ops["source"] == "local")]
        by_task: dict[tuple, dict[str, float]] = defaultdict(dict)
        for row in ops.itertuples():  # a model measures a task once: its rows of that task share the figure
            by_task[(row.task, row.batch_size, row.dtype)].setdefault(row.model, float(row.latency_median_s))
        errors, worst = [], []
        for row in ops.itertuples():
            others = [v for model, v in by_task[(row.task, row.batch_size, row.dtype)].items() if model != row.model]
            if others:
                error = abs(statistics.median(others) / float(row.latency_median_s) - 1)
                errors.append(error)
                worst.append((error, row.model, row.kind, float(row.latency_median_s) * 1e6))
        worst.sort(reverse=True)
        out[name] = {"dataset": shown(path), "operators": len(ops), "with_another_run": len(errors),
                     "mape": statistics.mean(errors) if errors else None,
                     "within_10pct": sum(e <= 0.1 for e in errors) / len(errors) if errors else None,
                     "worst": [{"error": e, "model": m, "kind": k, "measured_us": t} for e, m, k, t in worst[:10]]}
        print(f"{name}: {len(errors)} of {len(ops)} operators measured by another model's run too; predicted by "
              f"those: MAPE {out[name]['mape']:.2%}, {out[name]['within_10pct']:.1%} within +-10 %", flush=True)
    return out


def records(args: argparse.Namespace) -> dict:
    """The trials cost model on a records folder (``--records``): held-out models whose tasks no training
    model shares, by dtype, and a learning curve (each fold trained on at most N records)."""
    from opbench.pipeline.train import task_modules
    from opbench.predict import trials

    start = time.perf_counter()
    tasks, device = trials.trial_examples(args.records, task_modules)
    features_s = time.perf_counter() - start
    skip = {m.strip() for m in args.exclude.split(",") if m.strip()}
    tasks = {k: t for k, t in tasks.items() if not skip & set(t["models"])}
    n = sum(len(t["xs"]) for t in tasks.values())
    print(f"{len(tasks)} tasks, {n} records on {device} (features {features_s:.0f} s)", flush=True)
    start = time.perf_counter()
    report = trials.evaluate(tasks, "by_model", args.folds, 0)
    report.pop("fold_tasks")
    held_out = Path(args.out) / HELD_OUT  # every held-out task's figures: most of the file, kept beside it, gzipped
    with gzip.open(held_out, "wt") as f:
        json.dump(report.pop("held_out"), f)
    report["held_out_file"] = HELD_OUT
    evaluate_s = time.perf_counter() - start
    m = report["metrics"]
    print(f"held-out models: pairwise {m['pairwise']:.3f} top-1 {m['top1']:.3f} top-5 {m['top5']:.3f}", flush=True)
    by_seed = []  # the same split dealt with other fold seeds, and MetaSchedule's own loss beside ours
    mlp_seeds = {int(x) for x in args.mlp_seeds.split(",") if x.strip()}
    for seed in sorted({int(x) for x in args.seeds.split(",") if x.strip()}):
        for loss in [x for x in trials.COMPARED if x != "mlp" or seed in mlp_seeds]:
            got = report["metrics"] if (seed, loss) == (0, "rank") else \
                trials.evaluate(tasks, "by_model", args.folds, seed, loss=loss)["metrics"]
            by_seed.append({"seed": seed, "loss": loss, **{k: got[k] for k in ("pairwise", "top1", "top5")}})
            print(f"  fold seed {seed}, loss {loss}: pairwise {got['pairwise']:.3f} top-1 {got['top1']:.3f} "
                  f"top-5 {got['top5']:.3f}", flush=True)
    sizes = sorted({min(int(s), n) for s in args.curve.split(",")})
    curve = trials.learning_curve(tasks, sizes, "by_model", args.folds, 0)
    for point in curve:
        print(f"  trained on <= {point['records']}: pairwise {point['pairwise']:.3f} top-1 {point['top1']:.3f} "
              f"top-5 {point['top5']:.3f}", flush=True)
    ceiling = noise_ceiling(args.records, {t["workload_id"] for t in tasks.values()})
    print(f"pairs of a task closer than their repeat spread: {ceiling['pairs_within_spread']:.1%} "
          f"(a perfect model scores at most {ceiling['pairwise_ceiling']:.3f} pairwise)", flush=True)
    return {"records": shown(args.records), "device_name": device, "excluded": sorted(skip), "tasks": len(tasks),
            "model": "MetaSchedule XGBModel, pairwise loss inside each task (opbench.predict.trials)",
            "noise": ceiling, "by_seed_and_loss": by_seed,
            "candidates": n, "models": sorted({m for t in tasks.values() for m in t["models"]}),
            "split": "by_model (a task shared by a held-out model and a training model is in neither side)",
            "folds": args.folds, "features_s": features_s, "evaluate_s": evaluate_s, **report,
            "learning_curve": curve}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", required=True, choices=["metrics", "schedules", "pretrained", "precision", "records",
                                                                 "search", "corun", "ceiling"])
    parser.add_argument("--records", default=str(ROOT / "data" / "dataset"), help="--part records: the folder")
    parser.add_argument("--exclude", default="resnet-50",
                        help="--part records: models left out with every task they use (tuned later with the "
                             "pretrained model)")
    parser.add_argument("--folds", type=int, default=5, help="--part records: folds over the models")
    parser.add_argument("--seeds", default="0,1,2", help="--part records: fold seeds, each evaluated with both "
                        "losses (the ranking loss and MetaSchedule's squared error)")
    parser.add_argument("--mlp-seeds", default="0",
                        help="--part records: fold seeds on which MetaSchedule's MLP cost model is compared too "
                             "(about 100 s each on 2 cores; default: 0)")
    parser.add_argument("--curve", default="1000,3000,10000,30000,100000000",
                        help="--part records: training sizes of the learning curve (records per fold)")
    parser.add_argument("--pretrained", default=None, help="trials predictor for --part pretrained")
    parser.add_argument("--search-batch", type=int, default=8, help="--part search: candidates picked at a time")
    parser.add_argument("--search-budget", type=int, default=32, help="--part search: candidates picked per task")
    parser.add_argument("--search-min", type=int, default=48,
                        help="--part search: tasks with at least this many records (the pool picked from)")
    parser.add_argument("--tune-model", default="googlenet")
    parser.add_argument("--target", default="llvm")
    parser.add_argument("--tune-source", default="local", help="--part pretrained: the model's source")
    parser.add_argument("--tune-dtype", default="float32", help="--part pretrained: the model's dtype")
    parser.add_argument("--trials", type=int, default=64, help="--part pretrained: trials per task (plain xgb)")
    parser.add_argument("--pretrained-trials", type=int, default=None,
                        help="--part pretrained: trials per task of the pretrained arm (default: --trials)")
    parser.add_argument("--tune-time", type=float, default=None,
                        help="--part pretrained: start no new task after this many seconds of an arm's tuning "
                             "(a later call with the same --out continues)")
    parser.add_argument("--tune-tasks", type=int, default=4)
    parser.add_argument("--plain-from", default=None,
                        help="--part pretrained: plain xgb's curves from an earlier run's predict_pretrained.json "
                             "(same model, dtype, target and --trials) when --out holds no tune_xgb.sqlite")
    parser.add_argument("--arms", default="xgb,xgb-pretrained",
                        help="--part pretrained: the arms to tune now (an arm not named is read from --out's "
                             "tune_ARM.sqlite if an earlier call tuned it there; 'none' tunes nothing and "
                             "writes the JSON from what --out holds)")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--dataset", default=str(DATASET))
    parser.add_argument("--half-dataset", default=str(ROOT / "data" / "dataset" / "h100_half.sqlite.gz"),
                        help="--part precision and corun: the float16/bfloat16 dataset")
    parser.add_argument("--predictors", default=str(PREDICTORS), help="folder of the saved predictors")
    parser.add_argument("--schedule-models", default="googlenet,inception_v3")
    parser.add_argument("--corun", choices=["yes", "no"], default="yes",
                        help="schedules: predicted stage times from the co-run predictor too (else the "
                             "scheduling cost's own stage model on predicted operator latencies)")
    args = parser.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a time limit's SIGTERM stops a part as Ctrl-C does
    parts = {"metrics": metrics, "schedules": schedules, "pretrained": pretrained, "precision": precision,
             "records": records, "search": search, "corun": corun, "ceiling": ceiling}
    result = parts[args.part](args)
    if args.part == "schedules":
        try:
            import torch

            result["device"] = torch.cuda.get_device_name(0)
        except Exception:  # noqa: BLE001 (the figure is informative)
            result["device"] = None
    name = f"predict_{args.part}{'_latency_only' if args.part == 'schedules' and args.corun == 'no' else ''}.json"
    (Path(args.out) / name).write_text(json.dumps(result, indent=1, default=str))
    print(f"wrote {Path(args.out) / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
