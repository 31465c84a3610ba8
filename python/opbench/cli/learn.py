"""The ``train``, ``predict`` and ``report`` commands (predictors and the HTML report)."""

from __future__ import annotations

import argparse
import json
import logging
from typing import Any

from ..errors import OpBenchError
from .args import (
    DEFAULT_DATASET,
    Deprecated,
    Formatter,
    add_common,
    add_json_flag,
    add_model_flags,
    add_predictor_flag,
    dataset_path,
    load_model,
)
from .format import check_output_path, human, shape_text, write_json

log = logging.getLogger(__name__)


def _device_name_flag(p: Any) -> None:
    p.add_argument("--device-name", default=None, dest="device_name",
                   help="the device (GPU or CPU name) whose rows to use, when the dataset has several")
    p.add_argument("--device", dest="device_name", action=Deprecated, new="--device-name", metavar="NAME",
                   help="deprecated: use --device-name (--device N picks a GPU in the commands that use one)")


def add_parsers(sub: Any) -> None:
    """Register the commands on the ``opbench`` sub-parser."""
    from ..predict import SPLITS, WHATS
    from ..predict.features import FEATURE_SETS

    formatter, default_dataset = Formatter, DEFAULT_DATASET
    p = sub.add_parser("train", help="train a predictor on a dataset and print held-out metrics",
                       formatter_class=formatter,
                       description="Train an XGBoost predictor: 'latency' (an operator's latency from its features), "
                                   "'corun' (a co-run group's time and slowdowns) or 'trials' (a candidate schedule's "
                                   "speed relative to its task's best, for ranking). Metrics are cross-validated on "
                                   "held-out groups (the split), then the saved model is fit on every row; with "
                                   "--out, the latency predictor's held-out predictions are stored beside it "
                                   "(FILE.heldout.json), for the report.")
    p.add_argument("--dataset", default=None, help=f"dataset (.sqlite, .sqlite.gz read only, or a records folder "
                                                   f"such as data/dataset for --what trials; default: "
                                                   f"$OPBENCH_DATASET or {default_dataset})")
    p.add_argument("--what", required=True, choices=WHATS, help="what to predict")
    p.add_argument("--split", default="by_model", choices=SPLITS, help="held-out groups")
    p.add_argument("--out", default=None, help="write the trained predictor to this file")
    p.add_argument("--folds", type=int, default=5,
                   help="cross-validation folds (at least 2; at most one per held-out group, so a large "
                        "number with --split by_model holds out one model at a time)")
    _device_name_flag(p)
    p.add_argument("--features", default=None, choices=FEATURE_SETS,
                   help="latency features: graph and graph+launch (the default schedule's thread blocks and "
                        "threads) need no compilation, graph+kernel does; default: graph+launch for GPU rows, "
                        "graph for CPU rows")
    p.add_argument("--config", default="default",
                   help="kernel configuration of the latency rows: default, or db:<digest> of tuned kernels")
    p.add_argument("--seed", type=int, default=0, help="seed of the folds and of XGBoost")
    p.add_argument("--exclude", default="", metavar="MODEL[,MODEL]",
                   help="leave these models' rows out entirely, and every sampled task they use (to use the "
                        "predictor on them afterwards)")
    p.add_argument("--also", action="append", default=[], metavar="DATASET",
                   help="--what corun: another dataset of the same device whose co-run groups train too (in every "
                        "fold that does not hold their model out; never tested), e.g. the float16/bfloat16 rows "
                        "beside the float32 ones; repeatable")
    add_json_flag(add_common(p), "the metrics")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("predict", help="predict every operator's latency of a model, without measuring",
                       formatter_class=formatter,
                       description="Predict the latency of every operator of a model, and of the whole model (their "
                                   "sum), with a trained latency predictor: the model is extracted, not compiled.")
    add_model_flags(p)
    g = p.add_argument_group("predictor")
    add_predictor_flag(g, "a latency predictor ('opbench train --what latency')", deprecated="--model")
    add_json_flag(add_common(p), "the table")
    p.set_defaults(func=cmd_predict)

    p = sub.add_parser("report", help="write an HTML report with figures of a dataset", formatter_class=formatter,
                       description="Write DIR/index.html (self-contained) and PNG figures from the rows a dataset "
                                   "stores (nothing is measured or trained): latency by operator kind, roofline, "
                                   "co-run speedups, predicted vs measured (the held-out predictions 'opbench train' "
                                   "stored), tuning curves, a stream timeline and the top operators. Needs matplotlib "
                                   "(pip install opbench[report]). A records folder as --dataset (data/dataset) gets "
                                   "its own figures: each record's latency over its task's best and the repeat "
                                   "spread, by precision, and the trials cost model's learning curve (--evaluation).")
    p.add_argument("--dataset", default=None, help=f"dataset (default: $OPBENCH_DATASET or {default_dataset})")
    p.add_argument("--out", required=True, help="output folder")
    _device_name_flag(p)
    p.add_argument("--schedule", default=None, metavar="FILE",
                   help="a saved schedule to draw as a timeline (default: IOS on the model with most co-runs)")
    p.add_argument("--schedule-model", default=None, metavar="NAME",
                   help="the dataset model whose operator times the timeline uses")
    p.add_argument("--trace", default=None, metavar="FILE.json",
                   help="a measured trace ('opbench compare --trace') to draw as the timeline instead of a "
                        "simulation")
    p.add_argument("--evaluation", default=None, metavar="FILE.json",
                   help="with a records folder as --dataset (data/dataset): a stored evaluation of the trials cost "
                        "model ('scripts/bench_predict.py --part records' writes predict_records.json) whose "
                        "learning curve the report draws")
    add_predictor_flag(p, "the latency predictor whose held-out predictions (FILE.heldout.json, stored by "
                          "'opbench train --out FILE') the report draws; default: <dataset stem>.*.heldout.json "
                          "beside the dataset")
    add_json_flag(add_common(p), "the report's counts and tables")
    p.set_defaults(func=cmd_report)


def _pct(value: Any) -> str:
    return "-" if value is None else f"{value:.1%}"


def _num(value: Any, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def cmd_train(args: argparse.Namespace) -> int:
    from ..pipeline.spec import SpecError
    from ..pipeline.train import TrainJob, train
    from ..predict.corun import INCONSISTENT_RATIO

    check_output_path(args.out, "--out")
    check_output_path(args.json, "--json")
    try:
        job = TrainJob(dataset=dataset_path(args), what=args.what, split=args.split, out=args.out, folds=args.folds,
                       seed=args.seed, device=args.device_name, features=args.features, config=args.config,
                       exclude=tuple(m.strip() for m in args.exclude.split(",") if m.strip()),
                       also=tuple(args.also))
        job.validate()
    except SpecError as err:  # the flag that sets the field
        flag = {"device": "--device-name"}.get(err.field, "--" + err.field)
        raise OpBenchError(f"{flag}: {err.message}") from None
    result = train(job)
    out = human(args)
    m = result["metrics"]
    sampled = f" ({result['n_sampled']} of them sampled operators, never held out)" if result.get("n_sampled") else ""
    print(f"\n{args.what} predictor, {args.split} split ({result['folds']} folds) on {result['device_name']}: "
          f"{result['n_test']} held-out items, {result['n_train']} training rows per fold{sampled}", file=out)
    shown = [("MAPE", _pct(m["mape"])), ("within ±10%", _pct(m["within_10pct"])), ("RMSE", _num(m["rmse"], 4)),
             ("R²", _num(m["r2"])), ("pairwise", _num(m["pairwise"])), ("top-1", _num(m["top1"])),
             ("top-5", _num(m["top5"]))]
    print("  " + "  ".join(f"{name} {value}" for name, value in shown if value != "-"), file=out)  # those that apply
    if result.get("extra_metrics"):
        print("  " + "  ".join(f"{k} {_num(v)}" for k, v in result["extra_metrics"].items()), file=out)
    if args.what == "latency":
        print(f"  {'held-out model':<18}{'batch':>6}{'dtype':>10}{'operators':>10}{'measured ms':>13}"
              f"{'predicted ms':>14}{'error':>9}", file=out)
        for h in result["held_out"]:
            print(f"  {h['model'][:18]:<18}{h.get('batch_size') or '-':>6}{h.get('dtype', 'float32'):>10}"
                  f"{h['operators']:>10}{h['measured_sum_ms']:>13.3f}{h['predicted_sum_ms']:>14.3f}{h['error']:>+9.1%}",
                  file=out)
        print("  by kind: " + "  ".join(f"{k} {_pct(v['mape'])} ({v['n']})" for k, v in result["per_kind"].items()),
              file=out)
        for name in ("dtype", "model"):
            if len(result.get(f"per_{name}") or {}) > 1:
                print(f"  by {name}: " + "  ".join(f"{k} {_pct(v['mape'])} ({v['n']})"
                                                   for k, v in result[f"per_{name}"].items()), file=out)
    elif args.what == "corun":
        if result.get("n_also"):
            print(f"  {result['n_also']} more groups from --also trained each fold that did not hold their model out",
                  file=out)
        c = result.get("metrics_consistent")
        if c and result.get("n_inconsistent"):
            print(f"  the {result['n_test'] - result['n_inconsistent']} groups whose time agrees with their members' "
                  f"times inside them: MAPE {_pct(c['mape'])}  within ±10% {_pct(c['within_10pct'])} "
                  f"({result['n_inconsistent']} groups took over {INCONSISTENT_RATIO}x their longest member's "
                  "time inside; they do not train)", file=out)
        print(f"  {'held-out model':<18}{'groups':>8}{'MAPE':>8}{'pairwise':>10}", file=out)
        for h in result["held_out"]:
            print(f"  {h['model'][:18]:<18}{h['groups']:>8}{_pct(h['mape']):>8}{_num(h['pairwise'], 3):>10}",
                  file=out)
    elif args.what == "trials":
        if result.get("untested"):
            print(f"  {result['untested']} candidates untested: their tasks are shared by models of different folds "
                  "(never trained on while one of those models is held out)", file=out)
        if len(result.get("by_dtype") or {}) > 1:
            print(f"  {'dtype':<10}{'tasks':>7}{'candidates':>12}{'pairwise':>10}{'top-1':>8}{'top-5':>8}", file=out)
            for dtype, d in result["by_dtype"].items():
                print(f"  {dtype:<10}{d['tasks']:>7}{d['candidates']:>12}{_num(d['pairwise']):>10}"
                      f"{_num(d['top1']):>8}{_num(d['top5']):>8}", file=out)
    if args.out:
        print(f"predictor written to {args.out}", file=out)
    if args.json:
        write_json(args.json, result)
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    from ..predict import load_predictor
    from ..predict.latency import predict_workload

    if not args.predictor:
        raise OpBenchError("predict needs --predictor FILE (a latency predictor made by 'opbench train --what "
                           "latency --out FILE')")
    check_output_path(args.json, "--json")
    predictor = load_predictor(args.predictor, "latency")
    target = _prediction_target(args.target)
    predictor.check_device(None, target.kind.name)
    workload = load_model(args)
    rows = [{**r, "output": shape_text(r["output_shapes"])} for r in predict_workload(workload, target, predictor)]
    out = human(args)
    print(f"\n{workload.name} ({workload.source}, batch {workload.batch_size}, {target.kind.name}): "
          f"{len(rows)} operators predicted for {predictor.device_name or 'the training device'}", file=out)
    print(f"{'#':>4}  {'operator':<44}  {'kind':<12}  {'output':<18}  {'predicted ms':>12}", file=out)
    for r in rows:
        print(f"{r['op_index']:>4}  {r['func'][:44]:<44}  {r['kind']:<12}  {r['output'][:18]:<18}  "
              f"{_ms(r['predicted_ms']):>12}{' *' if r['outside_training_range'] else ''}", file=out)
    total = sum(r["predicted_ms"] for r in rows)
    print(f"whole model (sum of operators): {_ms(total)} ms predicted", file=out)
    outside = sum(r["outside_training_range"] for r in rows)
    if outside:
        low, high = predictor.meta["latency_range_s"]
        log.warning("%d of %d predictions (marked *) lie outside the latencies this predictor was trained on "
                    "(%.4f to %.4f ms): they are extrapolations, not to be trusted", outside, len(rows), low * 1e3,
                    high * 1e3)
    if args.json:
        write_json(args.json, {"model": workload.name, "source": workload.source, "workload_id": workload.workload_id,
                               "target": target.kind.name, "device_name": predictor.device_name,
                               "predicted_sum_ms": total, "operators": rows})
    return 0


def _ms(value: float) -> str:
    """Milliseconds for a table column: fixed point where it fits, else scientific (never wider)."""
    return f"{value:.4f}" if abs(value) < 1e6 else f"{value:.3e}"


def _prediction_target(text: str) -> Any:
    """The target to extract operators for: ``cuda`` needs no GPU here (nothing is compiled)."""
    import tvm

    from ..runtime.device import gpu_index
    from ..runtime.target import resolve_target

    if str(text).strip().lower() == "cuda" and not tvm.cuda(gpu_index()).exist:
        return resolve_target({"kind": "cuda", "arch": "sm_90"}, local_device=False)
    return resolve_target(text, local_device=False) if str(text).strip().startswith("{") else resolve_target(text)


def cmd_report(args: argparse.Namespace) -> int:
    from ..report import write_report

    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise OpBenchError("the report needs matplotlib: pip install 'opbench[report]' (or pip install matplotlib)"
                           ) from None
    check_output_path(args.json, "--json")
    index = write_report(dataset_path(args), args.out, device=args.device_name, schedule=args.schedule,
                         schedule_model=args.schedule_model, predictor=args.predictor, trace=args.trace,
                         evaluation=args.evaluation)
    summary = json.loads((index.parent / "report.json").read_text())
    c = summary["counts"]
    if "records" in c:  # a records folder
        print(f"report written to {index}: {c['records']} records ({c['ok']} ran) of {c['tasks_with_records']} "
              f"tasks", file=human(args))
    else:
        print(f"report written to {index}: {c['workloads']} workloads, {c['operators']} operators, "
              f"{c['corun_groups']} co-run groups, {c['trials']} trials", file=human(args))
    if args.json:
        write_json(args.json, summary)
    return 0


__all__ = ["add_parsers"]
