"""Side-by-side benchmark of inter-operator parallelism (one run on the GPU machine).

For each model, in ONE process and on the same inputs: PyTorch eager, PyTorch sequential CUDA
Graph, torch.compile(mode="reduce-overhead"), TVM Relax VM (dlight default kernels, or tuned ones
from ``--database DIR``), and ours with
every scheduler on each backend (tvm kernels; torch ATen kernels; torch with batch norm folded).
TF32 is off (fp32 throughout) unless ``--precision default``. Every GPU time is the median of
``--repeat`` samples, each CUDA events around ``--number`` back-to-back runs. Results go to
``OUT/bench_parallel.json`` after every model (with environment tags) and a table is printed.

    PYTHONUNBUFFERED=1 PYTHONPATH=python python3 scripts/bench_parallel.py --models googlenet:1,inception_v3:1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

DEFAULT = "googlenet:1,inception_v3:1,squeezenet_v1.0:1,resnet-18:1,nasnet:1,randwire:1,googlenet:8,googlenet:32"


def cuda_time(fn, repeat: int, number: int) -> float:
    from opbench.profile.timer import cuda_event_samples

    return statistics.median(cuda_event_samples(fn, repeat, number))


def rel_err(out, ref) -> float:
    out = out[0] if isinstance(out, list | tuple) else out
    if not hasattr(out, "detach"):
        import torch

        out = torch.from_numpy(out.numpy())
    out = out.detach().float().cpu()
    ref = ref.detach().float().cpu()
    return float((out - ref).abs().max() / ref.abs().max())


def torch_baselines(module, x, res: dict, repeat: int, number: int, compile: bool = True):
    """PyTorch eager, the module captured as-is in one CUDA Graph, and torch.compile
    (mode="reduce-overhead") into ``res`` (ms, errors against eager, compile seconds); returns the
    eager output."""
    import torch

    from opbench.runtime.graphs import CapturedModel

    with torch.no_grad():
        ref = module(x).clone()
        res["pytorch_eager_ms"] = cuda_time(lambda: module(x), repeat, number) * 1e3
        own = CapturedModel(module, [x])
        res["pytorch_cuda_graph_ms"] = cuda_time(own.run_once, repeat, number) * 1e3
        res["pytorch_cuda_graph_err"] = rel_err(own.run_once(), ref)
        if compile:
            t = time.perf_counter()
            compiled = torch.compile(module, mode="reduce-overhead")
            for _ in range(3):
                compiled(x)
            res["torch_compile_s"] = time.perf_counter() - t
            res["torch_compile_ms"] = cuda_time(lambda: compiled(x), repeat, number) * 1e3
            res["torch_compile_err"] = rel_err(compiled(x).clone(), ref)
    return ref


def bench_model(name: str, batch: int, args) -> dict:
    import torch

    from opbench.models import load_workload
    from opbench.pipeline.compare import evaluate_with_bound, table_rows
    from opbench.pipeline.compile import compile_workload
    from opbench.profile.cuda import CudaProfiler
    from opbench.profile.timer import TimingConfig, time_evaluator
    from opbench.runtime import flatten_outputs, resolve_target
    from opbench.runtime.backend import KernelBackend, TorchBackend, TVMBackend
    from opbench.runtime.graphs import CapturedModel
    from opbench.schedule import IOS, get_scheduler

    res: dict = {"model": name, "batch": batch}
    w = load_workload("local", name, batch)
    module = w.torch_module.cuda().eval()
    x = torch.from_numpy(w.example_inputs()[0]).cuda()
    ref = torch_baselines(module, x, res, args.repeat, args.number, compile=not args.no_compile)
    print(f"  {name}:{batch} pytorch done", flush=True)

    schedulers = ["sequential", "greedy", "nimble", "opara", IOS(time_limit_s=args.ios_limit)]
    scheds_time = {}
    target = resolve_target("cuda")
    t = time.perf_counter()
    # tuned kernels where the database has records (default schedules elsewhere)
    compiled = compile_workload(w, target, args.database)
    if args.database:
        res["tvm_config"] = compiled.config
    res["tvm_compile_s"] = time.perf_counter() - t
    built, kernels = compiled.built, compiled.kernels
    vm = built.vm()
    inputs = kernels.to_device(w.example_inputs())
    res["tvm_vm_err"] = rel_err(flatten_outputs(vm["main"](*inputs))[0], ref)
    vm_config = TimingConfig(repeat=args.repeat, number=args.number, min_repeat_ms=0)
    res["tvm_vm_ms"] = time_evaluator(vm, "main", built.device, inputs, vm_config).median * 1e3
    resources = CudaProfiler().resources(kernels)
    makers = {"tvm": lambda: TVMBackend(kernels, w.example_inputs(), resources),
              "torch": lambda: TorchBackend(module, [x]),
              "torch+foldbn": lambda: TorchBackend(module, [x], fold_bn=True),
              # regions of the traced graph, each compiled by Inductor (as capturer(kernels="fused"))
              "fused": lambda: KernelBackend.create("fused", module, [x])}
    backends = {label: makers[label]() for label in args.backends.split(",")}
    host_ref = [ref.detach().float().cpu().numpy()]
    for label, backend in backends.items():
        t = time.perf_counter()
        # bound: the longest chain of these kernels, timed alone; no schedule can be faster
        # torch backends: the model's own CUDA Graph is a row of the table too ("model, CUDA Graph")
        baseline = CapturedModel(module, [x]) if label != "tvm" else None
        kept, rows, bound = evaluate_with_bound(backend, schedulers, host_ref, args.repeat, args.number,
                                                baseline=baseline)
        res[f"ours_{label}"] = {"ops": len(backend.graph), "kept": kept.name,
                                "rows": table_rows(rows), "critical_path": bound,
                                "seconds": time.perf_counter() - t}
        print(f"  {name}:{batch} {label} done ({time.perf_counter() - t:.0f} s)", flush=True)
    for sname in ("sequential", "greedy", "nimble", "opara"):  # scheduling time alone, largest graph
        t = time.perf_counter()
        get_scheduler(sname).schedule(max((b.graph for b in backends.values()), key=len))
        scheds_time[sname] = (time.perf_counter() - t) * 1e3
    res["scheduling_ms_torch_graph"] = scheds_time
    return res


def keep_going(doc: dict, label: dict, path: Path, table, run, *args) -> None:
    """``run(*args)``'s result (or its error: one model's failure is a result too) into
    ``doc["results"]`` with its wall time; ``doc`` saved to ``path`` and the row printed at once."""
    t = time.perf_counter()
    try:
        res = run(*args)
    except Exception as err:
        traceback.print_exc()
        res = {**label, "error": f"{type(err).__name__}: {err}"}
    res["wall_s"] = time.perf_counter() - t
    doc["results"].append(res)
    path.write_text(json.dumps(doc, indent=1, default=str))
    print(table([res]).splitlines()[-1], flush=True)


def environment() -> dict:
    import torch
    import tvm

    from opbench.profile.cuda import CudaProfiler

    tags = CudaProfiler().tags()
    return {**tags, "torch": torch.__version__, "tvm": tvm.__version__, "date": time.strftime("%Y-%m-%d")}


def _kept(result: dict, label: str) -> tuple[float, float, float, str]:
    """(sequential ms, kept schedule ms, critical-path chain ms, kept name) of one backend; NaN if not run."""
    nan = float("nan")
    if f"ours_{label}" not in result:
        return nan, nan, nan, "-"
    ours = result[f"ours_{label}"]
    kept = next(x for x in ours["rows"] if x["kept"])
    chain = ours.get("critical_path", {}).get("chain_ms", nan)
    sequential = next(x for x in ours["rows"] if x["schedule"] == "sequential")
    return sequential["latency_ms"], kept["latency_ms"], chain, kept["schedule"]


def table(results: list) -> str:
    """One line per model. ``VM/tvmCP`` is the most any schedule of the TVM kernels could reach over the VM."""
    head = (f"{'model':<18}{'eager':>8}{'seqGraph':>9}{'compile':>9}{'tvmVM':>8}{'tvmSeq':>8}{'tvmBest':>8}"
            f"{'tvmCP':>8}{'trSeq':>8}{'trBest':>8}{'trCP':>8}{'foldBest':>9}"
            f"  best/seqGraph  tvmBest/VM  VM/tvmCP  kept")
    lines = [head]
    for r in results:
        if "error" in r:
            lines.append(f"{r['model']}:{r['batch']} FAILED {r['error'][:80]}")
            continue
        tvm_seq, tvm_best, tvm_cp, tvm_k = _kept(r, "tvm")
        tr_seq, tr_best, tr_cp, tr_k = _kept(r, "torch")
        f_seq, f_best, _, f_k = _kept(r, "torch+foldbn")
        ours = min(tr_best, f_best) if f_best == f_best else tr_best
        lines.append(
            f"{r['model'] + ':' + str(r['batch']):<18}{r['pytorch_eager_ms']:>8.3f}{r['pytorch_cuda_graph_ms']:>9.3f}"
            f"{r.get('torch_compile_ms', float('nan')):>9.3f}{r['tvm_vm_ms']:>8.3f}{tvm_seq:>8.3f}{tvm_best:>8.3f}"
            f"{tvm_cp:>8.3f}{tr_seq:>8.3f}{tr_best:>8.3f}{tr_cp:>8.3f}{f_best:>9.3f}"
            f"  {r['pytorch_cuda_graph_ms'] / ours:>12.2f}x  {r['tvm_vm_ms'] / tvm_best:>9.2f}x"
            f"  {r['tvm_vm_ms'] / tvm_cp:>7.2f}x  tvm:{tvm_k} torch:{tr_k} fold:{f_k}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default=DEFAULT)
    parser.add_argument("--out", default=None, help="output folder (default: $OUT, else out)")
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--number", type=int, default=20)
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--database", default=None,
                        help="MetaSchedule tuning database: TVM kernels tuned where it has records")
    parser.add_argument("--ios-limit", type=float, default=20.0)
    parser.add_argument("--name", default="bench_parallel.json")
    parser.add_argument("--precision", default="fp32", choices=("fp32", "default"),
                        help="fp32: no TF32 anywhere; default: PyTorch's defaults (TF32 in cuDNN convolutions)")
    parser.add_argument("--backends", default="tvm,torch,torch+foldbn",
                        help="comma-separated kernel backends: tvm, torch, torch+foldbn, fused (Inductor-compiled "
                             "regions; scripts/bench_fused.py compares them with torch.compile in full)")
    args = parser.parse_args()
    unknown = set(args.backends.split(",")) - {"tvm", "torch", "torch+foldbn", "fused"}
    if unknown:
        parser.error(f"unknown backend(s) {', '.join(sorted(unknown))} (accepted: tvm, torch, torch+foldbn, fused)")
    out = Path(args.out or os.environ.get("OUT", "out"))
    out.mkdir(parents=True, exist_ok=True)
    import torch

    # fp32 means fp32: no TF32 in cuDNN convolutions or matmuls, for every variant alike; default
    # keeps PyTorch's own settings (TF32 in cuDNN convolutions, full-precision matmuls)
    torch.backends.cudnn.allow_tf32 = args.precision == "default"
    torch.backends.cuda.matmul.allow_tf32 = False
    doc = {"environment": environment(), "settings": vars(args), "results": []}
    for item in args.models.split(","):
        name, _, batch = item.partition(":")
        keep_going(doc, {"model": name, "batch": int(batch or 1)}, out / args.name, table,
                   bench_model, name, int(batch or 1), args)
    print(table(doc["results"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
