"""Multi-branch networks that torchvision does not ship: NASNet-A style cells and RandWire.

Both are the kind of graphs inter-operator parallelism is about (many independent branches).
Built lazily so importing :mod:`opbench.models` does not need torch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._torch import import_torch


def build_nasnet(num_classes: int = 1000, channels: int = 32, cells: int = 2) -> Any:
    """A NASNet-A style network: stem, then (cells normal, reduction) x2, cells normal, classifier.

    Normal and reduction cells follow the NASNet-A genotype (Zoph et al. 2018): five blocks, each
    adding two operations (separable convolutions, pooling, identity) applied to the two previous
    cell outputs or earlier blocks; the cell output concatenates the five blocks.
    """
    torch = import_torch()
    nn = torch.nn

    class ReLUConvBN(nn.Sequential):
        def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
            super().__init__(
                nn.ReLU(), nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    class SepConv(nn.Sequential):
        def __init__(self, c: int, k: int, stride: int) -> None:
            super().__init__(
                nn.ReLU(),
                nn.Conv2d(c, c, k, stride, k // 2, groups=c, bias=False),
                nn.Conv2d(c, c, 1, bias=False),
                nn.BatchNorm2d(c),
            )

    def make_op(kind: str, c: int, stride: int) -> Any:
        if kind.startswith("sep"):
            return SepConv(c, int(kind[3]), stride)
        if kind == "avg3":
            return nn.AvgPool2d(3, stride, 1, count_include_pad=False)
        if kind == "max3":
            return nn.MaxPool2d(3, stride, 1)
        return nn.Identity() if stride == 1 else ReLUConvBN(c, c, stride)

    # (op_a, input_a, op_b, input_b); inputs 0 = previous-previous cell, 1 = previous, 2+ = blocks
    normal = [
        ("sep3", 1, "id", 1),
        ("sep3", 0, "sep5", 1),
        ("avg3", 1, "id", 0),
        ("avg3", 0, "avg3", 0),
        ("sep5", 0, "sep3", 0),
    ]
    reduction = [
        ("sep7", 0, "sep5", 1),
        ("max3", 1, "sep7", 0),
        ("avg3", 1, "sep5", 0),
        ("max3", 1, "sep3", 2),
        ("avg3", 2, "id", 3),
    ]

    class Cell(nn.Module):
        def __init__(self, c_pp: int, c_p: int, c: int, is_reduction: bool, reduce_prev: bool):
            super().__init__()
            self.pre0 = ReLUConvBN(c_pp, c, 2 if reduce_prev else 1)
            self.pre1 = ReLUConvBN(c_p, c, 1)
            self.genotype = reduction if is_reduction else normal
            ops = []
            for op_a, in_a, op_b, in_b in self.genotype:
                for kind, idx in ((op_a, in_a), (op_b, in_b)):
                    stride = 2 if is_reduction and idx < 2 else 1
                    ops.append(make_op(kind, c, stride))
            self.ops = nn.ModuleList(ops)

        def forward(self, s0: Any, s1: Any) -> Any:
            states = [self.pre0(s0), self.pre1(s1)]
            for i, (_, in_a, _, in_b) in enumerate(self.genotype):
                states.append(self.ops[2 * i](states[in_a]) + self.ops[2 * i + 1](states[in_b]))
            return torch.cat(states[2:], dim=1)

    class NASNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            c = channels
            self.stem = nn.Sequential(
                nn.Conv2d(3, c, 3, 2, 1, bias=False),
                nn.BatchNorm2d(c),
                nn.ReLU(),
                nn.Conv2d(c, c, 3, 2, 1, bias=False),
                nn.BatchNorm2d(c),
            )
            c_pp, c_p, cur = c, c, c
            layers, reduce_prev = [], False
            for stage in range(3):
                for i in range(cells + (1 if stage < 2 else 0)):
                    is_red = stage < 2 and i == cells
                    if is_red:
                        cur *= 2
                    layers.append(Cell(c_pp, c_p, cur, is_red, reduce_prev))
                    reduce_prev = is_red
                    c_pp, c_p = c_p, 5 * cur
            self.cells = nn.ModuleList(layers)
            self.head = nn.Sequential(nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
            self.fc = nn.Linear(c_p, num_classes)

        def forward(self, x: Any) -> Any:
            s0 = s1 = self.stem(x)
            for cell in self.cells:
                s0, s1 = s1, cell(s0, s1)
            return self.fc(self.head(s1))

    return NASNet()


def watts_strogatz_dag(n: int, k: int, p: float, seed: int) -> list[list[int]]:
    """Predecessor lists of a Watts-Strogatz graph WS(n, k, p), oriented from low to high index.

    A ring lattice where each node links to its k/2 neighbours on each side; each edge is rewired
    to a random node with probability p (no self loops or duplicates), as in RandWire (Xie et al.
    2019).
    """
    rng = np.random.default_rng(seed)
    edges: set[tuple[int, int]] = set()
    for i in range(n):
        for j in range(1, k // 2 + 1):
            edges.add((min(i, (i + j) % n), max(i, (i + j) % n)))
    for edge in sorted(edges):
        if rng.random() < p:
            u = edge[0]
            choices = [w for w in range(n) if w != u and (min(u, w), max(u, w)) not in edges]
            if choices:
                w = int(rng.choice(choices))
                edges.discard(edge)
                edges.add((min(u, w), max(u, w)))
    preds: list[list[int]] = [[] for _ in range(n)]
    for u, v in sorted(edges):
        preds[v].append(u)
    return preds


def build_randwire(
    num_classes: int = 1000, channels: int = 32, nodes: int = 16, seed: int = 0
) -> Any:
    """A RandWire-WS(k=4, p=0.75) network (small regime): two stem convolutions, three random
    stages, a 1x1 convolution and a classifier. Each node sums its inputs, then ReLU,
    separable 3x3 convolution and batch norm; the stage output averages the nodes without
    successors."""
    torch = import_torch()
    nn = torch.nn

    class Node(nn.Sequential):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__(
                nn.ReLU(),
                nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False),
                nn.Conv2d(cin, cout, 1, bias=False),
                nn.BatchNorm2d(cout),
            )

    class Stage(nn.Module):
        def __init__(self, cin: int, cout: int, stage_seed: int) -> None:
            super().__init__()
            self.preds = watts_strogatz_dag(nodes, 4, 0.75, stage_seed)
            self.outputs = [
                v for v in range(nodes) if not any(v in p for p in self.preds[v + 1 :])
            ]
            self.nodes = nn.ModuleList(
                Node(cin, cout, 2) if not self.preds[v] else Node(cout, cout, 1)
                for v in range(nodes)
            )

        def forward(self, x: Any) -> Any:
            outs: list[Any] = []
            for v, node in enumerate(self.nodes):
                preds = self.preds[v]
                if not preds:
                    outs.append(node(x))
                else:
                    agg = outs[preds[0]]
                    for u in preds[1:]:
                        agg = agg + outs[u]
                    outs.append(node(agg))
            out = outs[self.outputs[0]]
            for v in self.outputs[1:]:
                out = out + outs[v]
            return out / len(self.outputs)

    class RandWire(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            c = channels
            self.stem = nn.Sequential(
                nn.Conv2d(3, c // 2, 3, 2, 1, bias=False),
                nn.BatchNorm2d(c // 2),
                nn.ReLU(),
                nn.Conv2d(c // 2, c, 3, 2, 1, bias=False),
                nn.BatchNorm2d(c),
            )
            self.stages = nn.Sequential(
                Stage(c, c, seed), Stage(c, 2 * c, seed + 1), Stage(2 * c, 4 * c, seed + 2)
            )
            self.head = nn.Sequential(
                nn.ReLU(),
                nn.Conv2d(4 * c, 1280, 1, bias=False),
                nn.BatchNorm2d(1280),
                nn.ReLU(),
                nn.AdaptiveAvgPool2d(1),
                nn.Flatten(),
            )
            self.fc = nn.Linear(1280, num_classes)

        def forward(self, x: Any) -> Any:
            return self.fc(self.head(self.stages(self.stem(x))))

    return RandWire()
