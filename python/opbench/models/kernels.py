"""Sampled operators: the ``simple`` model ``kernels:n=N,sample=S``.

N independent operators, each drawn at random (sample S seeds the draw) from the configurations
CNNs use, the way nn-Meter samples kernels to train its latency predictors:

* convolutions (about 55 %): feature maps 7-147 wide, 3-2048 channels, kernels 1x1 to 7x7 and
  1x7/7x1, stride 1 or 2, same or no padding, dense or depthwise; followed by nothing, a bias,
  a folded batch norm (subtract, divide, multiply, add, as torch models import), with or without
  ReLU or ReLU6 (clip), or a residual add and ReLU;
* pooling (15 %): max or average (padding counted or not, alone or added to another tensor),
  2x2/3x3 windows, and global average (adaptive pool or mean);
* dense layers (8 %), element-wise adds and ReLUs (10 %), channel concatenations alone or with a
  batch norm and ReLU (8 %), softmax (4 %).

Every operator reads its own model inputs (activations and weights), so the graph is N
one-operator chains and each operator's inputs have exactly the sampled shapes. The output is the
tuple of all results.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import InputSpec

_SIZES = [7, 8, 14, 17, 28, 35, 56, 73, 112, 147]
_CHANNELS = [3, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 288, 384, 512, 768, 1024, 2048]
_KERNELS = [(1, 1), (1, 1), (3, 3), (3, 3), (3, 3), (5, 5), (7, 7), (1, 7), (7, 1), (1, 3), (3, 1)]
_MAX_ACTIVATION = 2_500_000  # elements of one feature map
_MAX_WEIGHT = 2_400_000  # elements of one weight


class _Sampler:
    def __init__(self, seed: int, batch: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.batch = batch
        self.specs: list[InputSpec] = []
        self.params: list[Any] = []

    def choice(self, items: list[Any]) -> Any:
        return items[int(self.rng.integers(len(items)))]

    def tensor(self, *shape: int) -> Any:
        from tvm import relax

        spec = InputSpec(f"t{len(self.specs)}", tuple(int(s) for s in shape))
        var = relax.Var(spec.name, relax.TensorType(spec.shape, spec.dtype))
        self.specs.append(spec)
        self.params.append(var)
        return var

    def feature_map(self) -> tuple[int, int]:
        size = self.choice(_SIZES)
        fitting = [c for c in _CHANNELS if self.batch * c * size * size <= _MAX_ACTIVATION] or [3]
        return self.choice(fitting), size

    def conv(self, bb: Any) -> Any:
        from tvm.relax import op

        cin, size = self.feature_map()
        kh, kw = self.choice(_KERNELS)
        stride = 2 if self.rng.random() < 0.25 and size > 8 else 1
        depthwise = cin > 3 and self.rng.random() < 0.15
        if depthwise:
            cout, groups = cin, cin
        else:
            out_size = size // stride
            fitting = [c for c in _CHANNELS[1:] if c * cin * kh * kw <= _MAX_WEIGHT
                       and self.batch * c * out_size * out_size <= _MAX_ACTIVATION] or [16]
            cout, groups = self.choice(fitting), 1
        same = self.rng.random() < 0.85
        padding = (kh // 2, kw // 2, kh // 2, kw // 2) if same else (0, 0, 0, 0)
        x = self.tensor(self.batch, cin, size, size)
        w = self.tensor(cout, cin // groups, kh, kw)
        y = bb.emit(op.nn.conv2d(x, w, strides=(stride, stride), padding=padding, groups=groups))
        epilogue = self.choice(["none", "bias", "bias_relu", "bn", "bn_relu", "bn_relu", "bn_clip", "residual_relu"])
        return self.epilogue(bb, y, cout, epilogue)

    def epilogue(self, bb: Any, y: Any, channels: int, kind: str) -> Any:
        from tvm.relax import op

        if kind.startswith("bias"):
            y = bb.emit(op.add(y, self.tensor(1, channels, 1, 1)))
        elif kind.startswith("bn"):
            for fn in (op.subtract, op.divide, op.multiply, op.add):
                y = bb.emit(fn(y, self.tensor(1, channels, 1, 1)))
        elif kind == "residual_relu":
            y = bb.emit(op.add(y, self.tensor(*[int(d) for d in y.ty.shape.values])))
        if kind.endswith("relu"):
            y = bb.emit(op.nn.relu(y))
        elif kind.endswith("clip"):
            y = bb.emit(op.clip(y, 0.0, 6.0))
        return y

    def pool(self, bb: Any) -> Any:
        from tvm.relax import op

        c, size = self.feature_map()
        x = self.tensor(self.batch, c, size, size)
        kind = self.choice(["max", "max", "avg", "avg", "avg_add", "global", "mean"])
        if kind == "global":
            return bb.emit(op.nn.adaptive_avg_pool2d(x, output_size=(1, 1)))
        if kind == "mean":
            return bb.emit(op.mean(x, axis=[2, 3], keepdims=True))
        k = self.choice([2, 3, 3])
        stride = self.choice([1, 2, 2])
        pad = self.choice([0, 1]) if k == 3 else 0
        if kind == "max":
            return bb.emit(op.nn.max_pool2d(x, pool_size=(k, k), strides=(stride, stride), padding=(pad,) * 4))
        if kind == "avg_add":  # NASNet's cells: a same-size average pool added to another branch
            k, stride, pad = 3, 1, 1
        y = bb.emit(op.nn.avg_pool2d(x, pool_size=(k, k), strides=(stride, stride), padding=(pad,) * 4,
                                     count_include_pad=bool(self.rng.random() < 0.5)))
        return bb.emit(op.add(y, self.tensor(self.batch, c, size, size))) if kind == "avg_add" else y

    def dense(self, bb: Any) -> Any:
        from tvm.relax import op

        k = self.choice([256, 512, 768, 1024, 2048, 4096])
        n = self.choice([10, 100, 1000, 1024, 2048, 4096])
        y = bb.emit(op.matmul(self.tensor(self.batch, k), self.tensor(k, n)))
        return bb.emit(op.add(y, self.tensor(n))) if self.rng.random() < 0.7 else y

    def elementwise(self, bb: Any) -> Any:
        from tvm.relax import op

        c, size = self.feature_map()
        x = self.tensor(self.batch, c, size, size)
        kind = self.choice(["add", "relu", "add_relu"])
        y = bb.emit(op.add(x, self.tensor(self.batch, c, size, size))) if kind.startswith("add") else x
        return bb.emit(op.nn.relu(y)) if kind.endswith("relu") else y

    def concat(self, bb: Any) -> Any:
        from tvm.relax import op

        _, size = self.feature_map()
        parts, channels = [], 0
        for _ in range(int(self.rng.integers(2, 5))):
            fitting = [c for c in _CHANNELS if self.batch * c * size * size <= _MAX_ACTIVATION // 4] or [3]
            parts.append(self.tensor(self.batch, self.choice(fitting), size, size))
            channels += int(parts[-1].ty.shape.values[1])
        y = bb.emit(op.concat(parts, axis=1))  # DenseNet's concatenations carry a batch norm and ReLU
        return self.epilogue(bb, y, channels, self.choice(["none", "bn_relu"]))

    def softmax(self, bb: Any) -> Any:
        from tvm.relax import op

        return bb.emit(op.nn.softmax(self.tensor(self.batch, self.choice([10, 100, 1000, 4096]))))


_KINDS = [("conv", 0.55), ("pool", 0.15), ("dense", 0.08), ("elementwise", 0.10), ("concat", 0.08),
          ("softmax", 0.04)]


def sampled_kernels(batch: int, n: int, sample: int) -> tuple[Any, list[InputSpec]]:
    """The Relax module of ``n`` sampled operators (draw ``sample``) and its input specs."""
    from tvm import relax

    sampler = _Sampler(sample, batch)
    bb = relax.BlockBuilder()
    names, weights = zip(*_KINDS, strict=True)
    outputs = []
    with bb.function("main"):
        with bb.dataflow():
            for _ in range(n):
                kind = names[int(sampler.rng.choice(len(names), p=np.array(weights) / sum(weights)))]
                outputs.append(getattr(sampler, kind)(bb))
            out = bb.emit_output(relax.Tuple(outputs))
        bb.emit_func_output(out, params=sampler.params)
    return bb.get(), sampler.specs


__all__ = ["sampled_kernels"]
