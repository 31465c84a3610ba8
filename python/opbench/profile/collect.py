"""The collection job: extract a model's operators, compile them once, check them against the
Relax VM, time every operator and the whole model, and write each row as soon as it is measured."""

from __future__ import annotations

import dataclasses
import logging
import sys
import time
from typing import Any

from ..dataset import Dataset, model_key, now
from ..errors import OpBenchError
from ..ir import OpGraph, extract_operators
from ..models import Workload
from ..runtime import OperatorKernels, build_module, flatten_outputs, relative_error, target_key
from .env import environment_tags
from .timer import Timing, TimingConfig, time_evaluator

log = logging.getLogger("opbench")


@dataclasses.dataclass
class CollectOptions:
    """Options of :func:`collect`."""

    timing: TimingConfig = dataclasses.field(default_factory=TimingConfig)
    force: bool = False
    check: bool = True
    tolerance: float = 1e-5
    progress: bool = True
    config: str = "default"
    seed: int = 0
    measure_vm: bool = True


@dataclasses.dataclass
class CollectResult:
    """What a collection did; ``rows`` are the operator rows of this model now in the dataset."""

    workload: Workload
    graph: OpGraph
    rows: list[dict[str, Any]]
    model_row: dict[str, Any]
    measured: int
    skipped: int
    failed: int
    compile_s: float
    measure_s: float
    dataset_path: str
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


def _progress(iterable: Any, enabled: bool, desc: str, total: int) -> Any:
    if not enabled:
        return iterable
    from tqdm import tqdm

    return tqdm(iterable, desc=desc, total=total, unit="op", file=sys.stderr, leave=False,
                dynamic_ncols=True)


def operator_row(node: Any, graph: OpGraph, task_uses: int) -> dict[str, Any]:
    """The feature columns of an operator row."""
    return {
        "op_index": node.index, "func": node.func, "task": node.task, "task_uses": task_uses,
        "kind": node.kind, "ops": node.ops, "attrs": node.attrs,
        "input_shapes": node.input_shapes, "input_dtypes": node.input_dtypes,
        "output_shapes": node.output_shapes, "output_dtypes": node.output_dtypes,
        "preds": graph.preds(node.index), "flops": node.flops, "bytes": node.bytes,
        "arithmetic_intensity": node.arithmetic_intensity,
    }


def _throughput(row: dict[str, Any], timing: Timing) -> None:
    median = timing.median
    row["gflops"] = row["flops"] / median / 1e9 if median > 0 else None
    row["gbytes_per_s"] = row["bytes"] / median / 1e9 if median > 0 else None


def collect(workload: Workload, target: Any, dataset: Dataset, options: CollectOptions | None = None,
            command: str = "", profiler: Any = None) -> CollectResult:
    """Measure every operator of ``workload`` on ``target`` and write the rows to ``dataset``.

    Parameters
    ----------
    profiler:
        Optional device profiler (see :mod:`opbench.profile.cuda`) with ``tags()``, ``time()``,
        ``resources()`` and ``corun()``; the default times with TVM's ``time_evaluator``.
    """
    options = options or CollectOptions()
    tkey = target_key(target)
    key = model_key(workload.source, workload.name, workload.batch_size, tkey, options.config)
    tags = environment_tags(tkey)
    if profiler is not None:
        tags.update(profiler.tags())
    run_id = dataset.start_run(command, tags)
    status = "failed"
    try:
        lowered, graph = extract_operators(workload.mod, target)
        log.info("%s: %d operators, %d unique tasks", workload.name, len(graph), len(graph.tasks()))
        built = build_module(lowered, target)
        log.info("compiled in %.1f s", built.compile_seconds)
        kernels = OperatorKernels(graph, built)
        try:
            inputs = kernels.to_device(workload.example_inputs(options.seed))
            outputs, values = kernels.replay(inputs)
        except Exception as err:
            if "out of memory" in str(err).lower():
                raise OpBenchError(f"out of device memory running {workload.name} at batch size "
                                   f"{workload.batch_size}; try a smaller --batchsize") from None
            raise
        vm = built.vm()
        error = None
        if options.check:
            error = relative_error(outputs, flatten_outputs(vm["main"](*inputs)))
            if error > options.tolerance:
                log.warning("per-operator replay differs from the Relax VM: relative error %.3g", error)
        resources = profiler.resources(kernels) if profiler is not None else {}
        tasks = graph.tasks()
        timed: dict[str, tuple[Timing | None, str | None]] = {}
        measured = skipped = failed = 0
        start = time.perf_counter()
        base = {**key, **tags, "run_id": run_id, "l2_flush": int(options.timing.flush_l2)}
        for node in _progress(graph, options.progress, workload.name, len(graph)):
            if not options.force and dataset.has("operators", {**key, "op_index": node.index}):
                skipped += 1
                continue
            if node.task not in timed:
                try:
                    args = kernels.args_for(node.index, inputs, values)
                    outs = kernels.allocate_outputs(node.index)
                    if profiler is not None:
                        timing = profiler.time(kernels, node.index, args, outs, options.timing)
                    else:
                        timing = time_evaluator(built.library, node.func, built.device,
                                                [*args, *outs], options.timing)
                    timed[node.task] = (timing, None)
                except Exception as err:  # a kernel that fails is recorded, the run goes on
                    timed[node.task] = (None, f"{type(err).__name__}: {str(err).strip()[:500]}")
            timing, err_text = timed[node.task]
            row = {**base, **operator_row(node, graph, tasks[node.task].count),
                   **resources.get(node.index, {}), "measured_at": now()}
            if timing is not None:
                row.update(timing.columns(), status="ok", error=None)
                _throughput(row, timing)
                measured += 1
            else:
                row.update(status="failed", error=err_text)
                failed += 1
            dataset.put("operators", row)
        measure_s = time.perf_counter() - start
        rows = dataset.rows("operators", key)
        corun_summary = {}
        if profiler is not None and getattr(profiler, "corun_limit", 0):
            corun_summary = _collect_coruns(graph, kernels, inputs, values, profiler, dataset, options,
                                            key, {**tags, "run_id": run_id})
        vm_timing = None
        if options.measure_vm:
            vm_timing = time_evaluator(vm, "main", built.device, inputs, options.timing)
        if profiler is not None:
            tags.update(profiler.end_tags())
        model_row = {
            **key, **tags, "run_id": run_id, "num_ops": len(graph), "unique_tasks": len(tasks),
            "sum_op_latency_s": sum(r["latency_median_s"] or 0.0 for r in rows),
            "vm_latency_median_s": vm_timing.median if vm_timing else None,
            "vm_latency_std_s": vm_timing.std if vm_timing else None,
            "replay_rel_error": error, "compile_s": built.compile_seconds, "measure_s": measure_s,
            "provenance": workload.provenance, "status": "ok" if not failed else "partial",
            "measured_at": now(),
        }
        dataset.put("models", model_row)
        extra: dict[str, Any] = {"kernels": kernels, "built": built, "inputs": inputs, "values": values,
                                 "summary": corun_summary, "resources": resources}
        status = "ok"
        return CollectResult(workload, graph, rows, model_row, measured, skipped, failed,
                             built.compile_seconds, measure_s, str(dataset.path), extra)
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        dataset.finish_run(run_id, status)


def _collect_coruns(graph: OpGraph, kernels: OperatorKernels, inputs: Any, values: Any, profiler: Any,
                    dataset: Dataset, options: CollectOptions, key: dict[str, Any],
                    base: dict[str, Any]) -> dict[str, Any]:
    """Measure co-run groups from the model's antichains and write one row per group."""
    from .antichain import corun_groups

    groups = corun_groups(graph, profiler.corun_k, profiler.corun_limit)
    start = time.perf_counter()
    measured = skipped = failed = 0
    for group in _progress(groups, options.progress, "co-run", len(groups)):
        gkey = "-".join(str(i) for i in group)
        if not options.force and dataset.has("corun", {**key, "group_key": gkey}):
            skipped += 1
            continue
        row = {**key, **base, "group_key": gkey, "group_size": len(group), "op_indices": list(group),
               "kinds": [graph[i].kind for i in group],
               "features": [{k: v for k, v in graph[i].to_dict().items() if k not in ("args",)} for i in group],
               "measured_at": now()}
        try:
            row.update(profiler.corun(kernels, group, inputs, values, options.timing))
            measured += 1
        except Exception as err:  # a group that fails is recorded, the run goes on
            row.update(status="failed", error=f"{type(err).__name__}: {str(err).strip()[:500]}")
            failed += 1
        dataset.put("corun", row)
    return {"corun_groups": len(groups), "corun_measured": measured, "corun_skipped": skipped,
            "corun_failed": failed, "corun_s": time.perf_counter() - start}


__all__ = ["CollectOptions", "CollectResult", "collect"]
