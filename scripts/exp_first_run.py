"""What a model's first run costs in a new process, where it goes, and whether it leaves the host free.

A later build of ``capturer(kernels="fused")`` spends seconds running each loaded region once (the
``regions_time_run_s`` phase: 2.4-2.5 s on nasnet and mobilenet_v3_large, 0.15 s on densenet121). Both are
built of depthwise and separable convolutions, which Inductor leaves to cuDNN and runs channels-last. This
script measures, for each model and memory format, in a new process each:

* ``first_s`` and ``second_s``: the eager model's first and second forward (synchronised), and the operators of
  most self CPU time in the first (``torch.profiler``, CPU activity only);
* ``overlap``: a fixed pure-Python workload alone, then while another thread runs a fresh copy's first forward.
  If the first run releases the GIL, the two take about the longer of them together, and a build could load its
  regions' code while their convolutions are prepared.

Writes ``OUT/exp_first_run.json`` after every process.

    PYTHONUNBUFFERED=1 PYTHONPATH=python python3 scripts/exp_first_run.py --out out --models nasnet,mobilenet_v3_large
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from _cli import ROOT, checked_models, experiment_doc, model_device_args

sys.path.insert(0, str(ROOT / "python"))

FORMATS = ("contiguous", "channels_last")


def _model(name: str, batch: int, dtype: str, fmt: str, device: str):
    import torch

    from opbench.models import get_source

    torch.manual_seed(0)
    model, x = get_source("local").torch_model(name, batch, dtype=dtype)
    model, x = model.to(device).eval(), x.to(device)
    if fmt == "channels_last":
        model, x = model.to(memory_format=torch.channels_last), x.to(memory_format=torch.channels_last)
    return model, x


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _forward(model, x, device: str) -> float:
    import torch

    t = time.perf_counter()
    with torch.no_grad():
        model(x)
    _sync(device)
    return time.perf_counter() - t


def _busy(n: int) -> int:
    """Pure-Python work that holds the GIL throughout."""
    total = 0
    for i in range(n):
        total += i * i % 7
    return total


def first_run(name: str, batch: int, dtype: str, fmt: str, device: str) -> dict:
    """The first and second forward of ``name`` in this new process, the first's operators by self CPU time."""
    import torch

    model, x = _model(name, batch, dtype, fmt, device)
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    torch.ones(1, device=device).add_(1)  # the context and the allocator, not the model's first run
    _sync(device)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        first = _forward(model, x, device)
    second = _forward(model, x, device)
    ops = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:12]
    return {"first_s": first, "second_s": second, "convs": len(convs),
            "grouped_convs": sum(1 for m in convs if m.groups > 1),
            "conv_configs": len({(m.in_channels, m.out_channels, m.kernel_size, m.stride, m.groups) for m in convs}),
            "top_ops": [{"op": e.key, "calls": e.count, "self_cpu_s": e.self_cpu_time_total / 1e6} for e in ops]}


def overlap(name: str, batch: int, dtype: str, fmt: str, device: str, work: int) -> dict:
    """``_busy(work)`` alone, then beside a thread that runs a fresh copy's first forward."""
    import torch

    model, x = _model(name, batch, dtype, fmt, device)
    torch.ones(1, device=device).add_(1)
    _sync(device)
    t = time.perf_counter()
    _busy(work)
    alone = time.perf_counter() - t
    got: dict[str, float] = {}
    thread = threading.Thread(target=lambda: got.setdefault("forward_s", _forward(model, x, device)))
    t = time.perf_counter()
    thread.start()
    _busy(work)
    busy = time.perf_counter() - t
    thread.join()
    return {"python_alone_s": alone, "python_beside_s": busy, "together_s": time.perf_counter() - t, **got}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    model_device_args(parser, "nasnet,mobilenet_v3_large,densenet121")
    parser.add_argument("--work", type=int, default=20_000_000, help="iterations of the pure-Python workload")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # name:fmt:what, in a new process
    args = parser.parse_args()
    models = checked_models(args)
    if args.one:
        name, fmt, what = args.one.split(":")
        res = first_run(name, args.batch, args.dtype, fmt, args.device) if what == "first" else \
            overlap(name, args.batch, args.dtype, fmt, args.device, args.work)
        print(json.dumps(res))
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = experiment_doc("exp_first_run.py", args.device)
    for name in models:
        for fmt in FORMATS:
            for what in ("first", "overlap") if fmt == "channels_last" else ("first",):
                cmd = [sys.executable, __file__, "--out", str(out), "--one", f"{name}:{fmt}:{what}",
                       "--batch", str(args.batch), "--dtype", args.dtype, "--device", args.device,
                       "--work", str(args.work)]
                row = {"model": name, "batch": args.batch, "dtype": args.dtype, "format": fmt, "what": what}
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
                try:
                    row.update(json.loads(proc.stdout.strip().splitlines()[-1]))
                except (IndexError, ValueError):
                    row["error"] = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
                doc["results"].append(row)
                print(json.dumps(row)[:400], flush=True)
                (out / "exp_first_run.json").write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
