"""The ``simple`` source: small synthetic graphs built directly in Relax (no torch needed).

Models
------
matmul
    ``x @ W`` with ``x`` of shape (batch, 1024, 1024) and ``W`` (1024, 1024).
matmul_matmul_add
    ``x @ W1 + x @ W2``: two independent matmuls joined by an add.
ios_block
    The IOS paper's sample block: three 3x3 convolutions of one input, the third followed by a
    second 3x3 convolution, concatenated on channels.
branchy[:branches=B,depth=D,channels=C,size=S]
    A stem convolution, then B independent chains of D (3x3 convolution + ReLU), concatenated and
    reduced by a 1x1 convolution. Defaults: branches=4, depth=3, channels=64, size=28.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import OpBenchError
from ..utils import parse_kv_options
from .base import InputSpec, ModelSource, Workload


class _Builder:
    """A tiny helper over ``relax.BlockBuilder`` with seeded constant weights."""

    def __init__(self, seed: int) -> None:
        from tvm import relax

        self.relax = relax
        self.bb = relax.BlockBuilder()
        self.rng = np.random.default_rng(seed)

    def weight(self, *shape: int, fan_in: int) -> Any:
        data = self.rng.standard_normal(shape).astype("float32") / np.sqrt(fan_in)
        return self.relax.const(data)

    def conv(self, x: Any, cin: int, cout: int, k: int, relu: bool = True) -> Any:
        op = self.relax.op
        y = self.bb.emit(op.nn.conv2d(x, self.weight(cout, cin, k, k, fan_in=cin * k * k),
                                      padding=(k // 2, k // 2)))
        return self.bb.emit(op.nn.relu(y)) if relu else y

    def module(self, spec: InputSpec, body: Callable[[Any], Any]) -> Any:
        relax = self.relax
        x = relax.Var(spec.name, relax.TensorType(spec.shape, spec.dtype))
        with self.bb.function("main", [x]):
            with self.bb.dataflow():
                out = self.bb.emit_output(body(x))
            self.bb.emit_func_output(out)
        return self.bb.get()


def _matmul(b: _Builder, batch: int, opts: dict[str, str]) -> tuple[Any, InputSpec]:
    n = int(opts.get("n", 1024))
    spec = InputSpec("x", (batch, n, n))
    op = b.relax.op
    return b.module(spec, lambda x: b.bb.emit(op.matmul(x, b.weight(n, n, fan_in=n)))), spec


def _matmul_matmul_add(b: _Builder, batch: int, opts: dict[str, str]) -> tuple[Any, InputSpec]:
    n = int(opts.get("n", 1024))
    spec = InputSpec("x", (batch, n, n))
    op = b.relax.op

    def body(x: Any) -> Any:
        y1 = b.bb.emit(op.matmul(x, b.weight(n, n, fan_in=n)))
        y2 = b.bb.emit(op.matmul(x, b.weight(n, n, fan_in=n)))
        return b.bb.emit(op.add(y1, y2))

    return b.module(spec, body), spec


def _ios_block(b: _Builder, batch: int, opts: dict[str, str]) -> tuple[Any, InputSpec]:
    c, size = int(opts.get("channels", 64)), int(opts.get("size", 28))
    spec = InputSpec("x", (batch, c, size, size))

    def body(x: Any) -> Any:
        a = b.conv(x, c, c, 3)
        bb = b.conv(x, c, c, 3)
        d = b.conv(b.conv(x, c, c, 3), c, c, 3)
        return b.bb.emit(b.relax.op.concat([a, bb, d], axis=1))

    return b.module(spec, body), spec


def _branchy(b: _Builder, batch: int, opts: dict[str, str]) -> tuple[Any, InputSpec]:
    branches, depth = int(opts.get("branches", 4)), int(opts.get("depth", 3))
    c, size = int(opts.get("channels", 64)), int(opts.get("size", 28))
    if branches < 1 or depth < 1 or c < 1 or size < 1:
        raise OpBenchError("branchy options must be positive integers")
    spec = InputSpec("x", (batch, 3, size, size))

    def body(x: Any) -> Any:
        stem = b.conv(x, 3, c, 3)
        outs = []
        for _ in range(branches):
            y = stem
            for _ in range(depth):
                y = b.conv(y, c, c, 3)
            outs.append(y)
        cat = b.bb.emit(b.relax.op.concat(outs, axis=1)) if branches > 1 else outs[0]
        return b.conv(cat, branches * c, c, 1, relu=False)

    return b.module(spec, body), spec


_MODELS: dict[str, tuple[Callable[..., tuple[Any, InputSpec]], tuple[str, ...]]] = {
    "matmul": (_matmul, ("n",)),
    "matmul_matmul_add": (_matmul_matmul_add, ("n",)),
    "ios_block": (_ios_block, ("channels", "size")),
    "branchy": (_branchy, ("branches", "depth", "channels", "size")),
}


class SimpleSource(ModelSource):
    """Synthetic Relax graphs; ``--modelname NAME[:key=value,...]``."""

    name = "simple"
    aliases = ("synthetic",)

    def models(self) -> list[str]:
        return sorted(_MODELS)

    def load(self, name: str, batch_size: int = 1, **options: Any) -> Workload:
        base, _, opt_text = name.partition(":")
        base = base.strip().lower()
        if base not in _MODELS:
            raise self.unknown(name)
        builder, allowed = _MODELS[base]
        try:
            opts = parse_kv_options(opt_text)
            bad = sorted(set(opts) - set(allowed))
            if bad:
                raise ValueError(
                    f"unknown option '{bad[0]}' (accepted: {', '.join(allowed) or 'none'})"
                )
            for key, value in opts.items():
                int(value)
                if int(value) < 1:
                    raise ValueError(f"option {key}={value} must be a positive integer")
        except ValueError as err:
            raise OpBenchError(f"bad options for simple model '{base}': {err}") from None
        seed = int(options.get("seed") or 0)
        mod, spec = builder(_Builder(seed), batch_size, opts)
        return Workload(
            name=name.strip(),
            source=self.name,
            mod=mod,
            inputs=[spec],
            batch_size=batch_size,
            provenance={"builder": base, "options": opts, "seed": seed},
        )
