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
kernels[:n=N,sample=S]
    N independent operators sampled from the configurations CNNs use (draw S), to train latency
    predictors on more kernels than a few models hold (see :mod:`opbench.models.kernels`).
    Defaults: n=200, sample=1.
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

    def spec(self, name: str, shape: tuple[int, ...]) -> InputSpec:
        return InputSpec(name, shape)

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
    spec = b.spec("x", (batch, n, n))
    op = b.relax.op
    return b.module(spec, lambda x: b.bb.emit(op.matmul(x, b.weight(n, n, fan_in=n)))), spec


def _matmul_matmul_add(b: _Builder, batch: int, opts: dict[str, str]) -> tuple[Any, InputSpec]:
    n = int(opts.get("n", 1024))
    spec = b.spec("x", (batch, n, n))
    op = b.relax.op

    def body(x: Any) -> Any:
        y1 = b.bb.emit(op.matmul(x, b.weight(n, n, fan_in=n)))
        y2 = b.bb.emit(op.matmul(x, b.weight(n, n, fan_in=n)))
        return b.bb.emit(op.add(y1, y2))

    return b.module(spec, body), spec


def _ios_block(b: _Builder, batch: int, opts: dict[str, str]) -> tuple[Any, InputSpec]:
    c, size = int(opts.get("channels", 64)), int(opts.get("size", 28))
    spec = b.spec("x", (batch, c, size, size))

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
    spec = b.spec("x", (batch, 3, size, size))

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


def _kernels(b: _Builder, batch: int, opts: dict[str, str]) -> tuple[Any, list[InputSpec]]:
    from .kernels import sampled_kernels

    return sampled_kernels(batch, int(opts.get("n", 200)), int(opts.get("sample", 1)))


# name -> (builder, options with their defaults)
_MODELS: dict[str, tuple[Callable[..., tuple[Any, InputSpec]], dict[str, int]]] = {
    "matmul": (_matmul, {"n": 1024}),
    "matmul_matmul_add": (_matmul_matmul_add, {"n": 1024}),
    "ios_block": (_ios_block, {"channels": 64, "size": 28}),
    "branchy": (_branchy, {"branches": 4, "depth": 3, "channels": 64, "size": 28}),
    "kernels": (_kernels, {"n": 200, "sample": 1}),
}


class SimpleSource(ModelSource):
    """Synthetic Relax graphs; ``--modelname NAME[:key=value,...]``."""

    name = "simple"
    aliases = ("synthetic",)

    def models(self) -> list[str]:
        return sorted(_MODELS)

    def check_name(self, name: str) -> None:
        base, _, opt_text = name.partition(":")
        base = base.strip().lower()
        if base not in _MODELS:
            raise self.unknown(name)
        self.options(base, opt_text)

    def load(self, name: str, batch_size: int = 1, **options: Any) -> Workload:
        self.check_name(name)
        base, _, opt_text = name.partition(":")
        base = base.strip().lower()
        opts = self.options(base, opt_text)
        from ..ir.precision import cast_module

        seed = int(options.get("seed") or 0)
        dtype = options.get("dtype") or "float32"
        mod, spec = _MODELS[base][0](_Builder(seed), batch_size, opts)
        mod = cast_module(mod, dtype)  # built in float32 and cast, as the other sources are
        specs = [InputSpec(s.name, s.shape, dtype if s.dtype == "float32" else s.dtype)
                 for s in (spec if isinstance(spec, list) else [spec])]
        return Workload(
            name=base,
            source=self.name,
            mod=mod,
            inputs=specs,
            batch_size=batch_size,
            provenance={"builder": base, "options": opts, "seed": seed},
            options={**opts, "seed": seed},
        )

    def options(self, base: str, text: str) -> dict[str, int]:
        """The model's options from ``key=value,...``, every default filled in (so ``branchy`` and
        ``branchy:branches=4`` are the same workload)."""
        defaults = _MODELS[base][1]
        try:
            given = parse_kv_options(text)
            bad = sorted(set(given) - set(defaults))
            if bad:
                raise ValueError(f"unknown option '{bad[0]}' (accepted: {', '.join(defaults) or 'none'})")
            opts = dict(defaults)
            for key, value in given.items():
                if not value.isdigit() or int(value) < 1:
                    raise ValueError(f"option {key}={value} must be a positive integer")
                opts[key] = int(value)
        except ValueError as err:
            raise OpBenchError(f"bad options for simple model '{base}': {err}") from None
        return opts

    def estimate_bytes(self, name: str, batch_size: int, **options: Any) -> int:
        base, _, text = name.partition(":")
        base = base.strip().lower()
        if base not in _MODELS:
            return 0
        o = self.options(base, text)
        if base == "kernels":  # every operator's tensors: at most a few feature maps and a weight
            return 4 * o["n"] * 4 * 2_500_000 * batch_size // 4
        if "n" in o:  # weights n*n, activations batch*n*n, a few of each
            return 4 * 4 * o["n"] * o["n"] * (batch_size + 1)
        width = o["channels"] * o.get("branches", 3)
        return 4 * 4 * batch_size * width * o["size"] ** 2 * (o.get("depth", 2) + 2) + 4 * 9 * width * width * 4
