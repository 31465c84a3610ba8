"""Opara's example: googlenet eager, captured as it is in one CUDA Graph, and captured with a
parallel schedule by ``capturer``; the outputs are equal and the times side by side.

    PYTHONPATH=python python examples/opara_googlenet.py
"""

from __future__ import annotations

import statistics
import time

import torch

import opbench
from opbench.models import load_workload
from opbench.runtime.graphs import CapturedModel


def median_ms(fn, repeat: int = 10, number: int = 20) -> float:
    if torch.cuda.is_available():
        from opbench.profile.timer import cuda_event_samples

        return statistics.median(cuda_event_samples(fn, repeat, number)) * 1e3
    from opbench.profile.timer import wall_samples

    return statistics.median(wall_samples(fn, 3, 1, warmup=1)) * 1e3


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    w = load_workload("local", "googlenet", 1)
    model = w.torch_module.to(device).eval()
    x = torch.from_numpy(w.example_inputs()[0]).to(device)

    start = time.perf_counter()
    run = opbench.capturer([x], model)
    build = time.perf_counter() - start
    own = CapturedModel(model, [x])

    with torch.no_grad():
        expected = model(x)
        eager = median_ms(lambda: model(x))
    torch.testing.assert_close(run(x), expected, rtol=1e-4, atol=1e-4)
    graph, ours = median_ms(lambda: own(x)), median_ms(lambda: run(x))
    kept = next(r["schedule"] for r in run.table if r["kept"])
    print(f"googlenet on {device}: eager {eager:.3f} ms, {own.label} {graph:.3f} ms, "
          f"capturer ({kept}) {ours:.3f} ms = {graph / ours:.2f}x; built in {build:.2f} s; outputs equal")


if __name__ == "__main__":
    main()
