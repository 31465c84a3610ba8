"""IOS's workflow: define a network, optimise it with the ios scheduler, print the stage latencies, run it.

    PYTHONPATH=python python examples/ios_optimize.py
"""

from __future__ import annotations

import torch

from opbench.cli.format import format_comparison
from opbench.parallel import capturer
from opbench.pipeline.compare import evaluate
from opbench.profile.schedule import stage_table
from opbench.runtime.backend import TorchBackend
from opbench.runtime.graphs import CapturedModel


class Block(torch.nn.Module):
    """IOS's sample block: four convolutions of one input, two of them in a chain, then a concat."""

    def __init__(self, c: int = 64) -> None:
        super().__init__()
        self.a = torch.nn.Conv2d(c, c, 3, padding=1)
        self.b = torch.nn.Conv2d(c, c, 3, padding=1)
        self.c = torch.nn.Conv2d(c, c, 3, padding=1)
        self.d = torch.nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x):
        return torch.cat([self.a(x), self.b(x), self.d(self.c(x))], dim=1)


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = torch.nn.Sequential(Block(), torch.nn.Conv2d(192, 64, 1), Block()).to(device).eval()
    x = torch.randn(1, 64, 28, 28, device=device)

    # 1. optimise: the ios dynamic programme beside sequential and the model as it is
    backend = TorchBackend(model, [x], trace="fx")
    _, rows = evaluate(backend, ["sequential", "ios"], baseline=CapturedModel(model, [x]))
    print(format_comparison(rows))
    ios = next(r["plan"] for r in rows if r["schedule"] == "ios")

    # 2. the stage latencies, as IOS prints them (a barrier after each stage)
    for stage in stage_table(backend, ios):
        groups = " | ".join(" ".join(kind for kind in g) for g in stage["operators"])
        print(f"stage {stage['stage']}: {stage['strategy']:<10} {stage['latency_ms']:.4f} ms  {groups}")

    # 3. run it: the saved schedule is reused without a search (refused for another graph)
    ios.save("/tmp/ios_block_schedule.json")
    run = capturer([x], model, schedule="/tmp/ios_block_schedule.json")
    with torch.no_grad():
        torch.testing.assert_close(run(x), model(x))
    kept = next(r["schedule"] for r in run.table if r["kept"])
    print(f"outputs equal the model's; kept: {kept}")


if __name__ == "__main__":
    main()
