"""``capturer`` against the model's own CUDA Graph, in PyTorch's default precision and in strict fp32.

For each model, in ONE process and on the same inputs, for each precision:

* PyTorch eager, and the model captured as it is in one CUDA Graph ("model, CUDA Graph");
* ``torch.compile(mode="reduce-overhead")`` (default precision only; ``--no-compile`` skips it);
* ``capturer`` in its default fast mode and with its default timing: its build time (the first call
  for this model and precision, export included) and where it went, what it kept, and its latency
  timed again beside the model's graph;
* ``capturer(mode="exhaustive")``: every scheduler's row beside the sequential run of the exported
  operators and the model's graph, and the critical path of the exported operators (their longest
  dependency chain, each operator timed alone), the bound no schedule of these kernels can beat.

Every GPU time is the median of ``--repeat`` samples, each CUDA events around ``--number`` runs.
Results go to ``OUT/bench_capturer.json`` after every model, and a table is printed.

    PYTHONUNBUFFERED=1 PYTHONPATH=python python3 scripts/bench_capturer.py --out out
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

DEFAULT = "googlenet,inception_v3,squeezenet_v1.0,resnet-18,encoder-4x256,encoder-12x768,bert"
PRECISIONS = ("default", "fp32")


def cuda_ms(fn, repeat: int, number: int) -> float:
    from opbench.profile.timer import cuda_event_samples

    return statistics.median(cuda_event_samples(fn, repeat, number)) * 1e3


def load(name: str):
    """(module on the GPU, inputs) of a zoo model, a plain transformer encoder or a Hugging Face BERT."""
    import torch

    from opbench.models import load_workload

    torch.manual_seed(0)
    if name.startswith("encoder-"):  # encoder-LAYERSxWIDTH: torch.nn.TransformerEncoder, batch 1, seq 128
        layers, width = (int(v) for v in name.split("-", 1)[1].split("x"))
        layer = torch.nn.TransformerEncoderLayer(width, width // 64, dim_feedforward=4 * width, dropout=0.0,
                                                 batch_first=True)
        model = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False).cuda().eval()
        return model, [torch.randn(1, 128, width, device="cuda")]
    source = "transformers" if name in ("bert", "bert-small", "roberta", "gpt2") else "local"
    w = load_workload(source, name, 1)
    return w.torch_module.cuda().eval(), [torch.from_numpy(x).cuda() for x in w.example_inputs()]


def first(out):
    out = out[0] if isinstance(out, list | tuple) else out
    return getattr(out, "last_hidden_state", out)


def rel_err(out, ref) -> float:
    out, ref = first(out).detach().float(), first(ref).detach().float()
    return float((out - ref).abs().max() / ref.abs().max())


def set_precision(precision: str) -> None:
    import torch

    # PyTorch's defaults: TF32 in cuDNN convolutions, full fp32 matmuls; fp32: no TF32 anywhere
    torch.backends.cudnn.allow_tf32 = precision == "default"
    torch.backends.cuda.matmul.allow_tf32 = False


def bench_one(name: str, precision: str, args) -> dict:
    import torch

    from opbench.parallel import capturer
    from opbench.pipeline.compare import critical_path
    from opbench.runtime.backend import TorchBackend
    from opbench.runtime.graphs import CapturedModel

    set_precision(precision)
    res: dict = {"model": name, "precision": precision}
    model, inputs = load(name)
    with torch.no_grad():
        ref = model(*inputs)
        res["eager_ms"] = cuda_ms(lambda: model(*inputs), args.repeat, args.number)
    own = CapturedModel(model, inputs)
    res["model_graph_ms"] = cuda_ms(own.run_once, args.repeat, args.number)
    res["model_graph_label"], res["model_graph_reason"] = own.label, own.reason

    t = time.perf_counter()
    fast = capturer(inputs, model)  # its defaults, as a user calls it
    res["fast_build_s"] = time.perf_counter() - t
    res["fast_phases"] = fast.phases
    kept = next(r for r in fast.table if r["kept"])
    res["fast_kept"] = kept["schedule"]
    res["fast_table"] = fast.table
    # timed again side by side: the callable the user gets against the model's own graph
    res["fast_ms"] = cuda_ms(lambda: fast(*inputs), args.repeat, args.number)
    res["model_graph_again_ms"] = cuda_ms(lambda: own(*inputs), args.repeat, args.number)  # inputs copied alike
    res["fast_err"] = rel_err(fast(*inputs), ref)
    print(f"  {name} {precision}: fast build {res['fast_build_s']:.2f} s, kept {res['fast_kept']}", flush=True)

    t = time.perf_counter()
    full = capturer(inputs, model, mode="exhaustive", repeat=args.repeat, number=args.number)
    res["exhaustive_build_s"] = time.perf_counter() - t
    res["exhaustive_table"] = full.table
    res["exhaustive_kept"] = next(r for r in full.table if r["kept"])["schedule"]
    backend = TorchBackend(model, inputs)
    bound = critical_path(backend, args.repeat, args.number)
    res["critical_path"] = {k: v for k, v in bound.items() if k != "alone_ms"}
    if precision == "default" and not args.no_compile:
        t = time.perf_counter()
        compiled = torch.compile(model, mode="reduce-overhead")
        with torch.no_grad():
            for _ in range(3):
                compiled(*inputs)
            res["torch_compile_s"] = time.perf_counter() - t
            res["torch_compile_ms"] = cuda_ms(lambda: compiled(*inputs), args.repeat, args.number)
    return res


def best_schedule(table: list) -> dict:
    rows = [r for r in table if r["schedule"] not in ("model, CUDA Graph", "model, eager")
            and r["measured"] and (r["sched_error"] or 0) <= 1e-5]
    return min(rows, key=lambda r: r["latency_ms"])


def table(results: list) -> str:
    head = (f"{'model':<16}{'prec':<8}{'eager':>8}{'modelCG':>9}{'compile':>9}{'seqOps':>8}{'best':>8}{'CP':>8}"
            f"{'fast':>8}{'fast/CG':>8}{'build s':>8}{'exh s':>7}  kept (fast; exhaustive)")
    lines = [head]
    for r in results:
        if "error" in r:
            lines.append(f"{r['model']:<16}{r.get('precision', ''):<8} FAILED {r['error'][:80]}")
            continue
        seq = next(x for x in r["exhaustive_table"] if x["schedule"] == "sequential")
        best = best_schedule(r["exhaustive_table"])
        eager = "" if r["model_graph_label"] == "model, CUDA Graph" else " (modelCG: no capture, eager)"
        lines.append(
            f"{r['model']:<16}{r['precision']:<8}{r['eager_ms']:>8.3f}{r['model_graph_ms']:>9.3f}"
            f"{r.get('torch_compile_ms', float('nan')):>9.3f}{seq['latency_ms']:>8.3f}{best['latency_ms']:>8.3f}"
            f"{r['critical_path']['chain_ms']:>8.3f}{r['fast_ms']:>8.3f}"
            f"{r['fast_ms'] / r['model_graph_again_ms']:>8.3f}{r['fast_build_s']:>8.2f}"
            f"{r['exhaustive_build_s']:>7.1f}  {r['fast_kept']}; {r['exhaustive_kept']} "
            f"(best {best['schedule']}){eager}")
    return "\n".join(lines)


def environment() -> dict:
    import torch

    from opbench.profile.cuda import CudaProfiler, device_figures

    return {**CudaProfiler().tags(), "device_figures": device_figures(), "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="out", help="output folder")
    parser.add_argument("--models", default=DEFAULT, help="comma-separated (zoo names, encoder-LxW, bert)")
    parser.add_argument("--precisions", default=",".join(PRECISIONS), help="default, fp32 (comma-separated)")
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--number", type=int, default=20)
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile (about 25 s per model)")
    parser.add_argument("--name", default="bench_capturer.json")
    args = parser.parse_args()
    precisions = [p for p in args.precisions.split(",") if p]
    if set(precisions) - set(PRECISIONS):
        parser.error(f"unknown precision in {args.precisions} (accepted: {', '.join(PRECISIONS)})")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"environment": environment(), "settings": vars(args), "results": []}
    from bench_parallel import keep_going  # this script's folder is on the path

    for name in args.models.split(","):
        for precision in precisions:
            keep_going(doc, {"model": name, "precision": precision}, out / args.name, table,
                       bench_one, name, precision, args)
    print(table(doc["results"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
