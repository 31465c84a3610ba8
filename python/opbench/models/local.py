"""The ``local`` zoo: torchvision CNNs and multi-branch networks with seeded random weights.

Nothing is downloaded. Batch-norm statistics are re-estimated on one random batch so that the
outputs depend on the input (see :func:`~opbench.models._torch.calibrate_batchnorm`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .base import InputSpec, ModelSource, Workload


def _tv(name: str, **kwargs: Any) -> Callable[[], Any]:
    def build() -> Any:
        import torchvision

        return getattr(torchvision.models, name)(weights=None, **kwargs)

    return build


def _nasnet() -> Any:
    from ._nets import build_nasnet

    return build_nasnet()


def _randwire() -> Any:
    from ._nets import build_randwire

    return build_randwire()


# canonical name -> (builder, default image size)
_ZOO: dict[str, tuple[Callable[[], Any], int]] = {
    "resnet-18": (_tv("resnet18"), 224),
    "resnet-34": (_tv("resnet34"), 224),
    "resnet-50": (_tv("resnet50"), 224),
    "mobilenet": (_tv("mobilenet_v2"), 224),
    "squeezenet_v1.0": (_tv("squeezenet1_0"), 224),
    "squeezenet_v1.1": (_tv("squeezenet1_1"), 224),
    "inception_v3": (_tv("inception_v3", aux_logits=False, init_weights=True), 299),
    "googlenet": (_tv("googlenet", aux_logits=False, init_weights=True), 224),
    "vgg-16": (_tv("vgg16"), 224),
    "densenet-121": (_tv("densenet121"), 224),
    "nasnet": (_nasnet, 224),
    "randwire": (_randwire, 224),
    "mobilenet_v3_large": (_tv("mobilenet_v3_large"), 224),
    "efficientnet_b0": (_tv("efficientnet_b0"), 224),
    "convnext_tiny": (_tv("convnext_tiny"), 224),
    "vit_b_16": (_tv("vit_b_16"), 224),
    "shufflenet_v2_x1_0": (_tv("shufflenet_v2_x1_0"), 224),
    "resnext50_32x4d": (_tv("resnext50_32x4d"), 224),
    "regnet_y_400mf": (_tv("regnet_y_400mf"), 224),
    "mnasnet1_0": (_tv("mnasnet1_0"), 224),
}

_ALIASES = {
    "resnet18": "resnet-18",
    "resnet34": "resnet-34",
    "resnet50": "resnet-50",
    "mobilenet_v2": "mobilenet",
    "mobilenetv2": "mobilenet",
    "squeezenet": "squeezenet_v1.0",
    "squeezenet1_0": "squeezenet_v1.0",
    "squeezenet1_1": "squeezenet_v1.1",
    "inception-v3": "inception_v3",
    "inceptionv3": "inception_v3",
    "vgg16": "vgg-16",
    "densenet121": "densenet-121",
    "shufflenet": "shufflenet_v2_x1_0",
    "shufflenet_v2": "shufflenet_v2_x1_0",
    "resnext50": "resnext50_32x4d",
    "mnasnet": "mnasnet1_0",
}


class LocalSource(ModelSource):
    """Built-in model zoo (OpBench's ``--modelsource local``).

    Options
    -------
    image_size : int
        Override the input resolution (default 224, 299 for inception_v3).
    seed : int
        Seed of the random weights (default 0).
    dtype : str
        ``float32`` (default), ``float16`` or ``bfloat16``: the model is calibrated and imported in
        float32, then the Relax module (:func:`opbench.ir.precision.cast_module`) and the PyTorch module
        are cast, so every operator runs in that precision.
    """

    name = "local"

    def models(self) -> list[str]:
        return sorted(_ZOO)

    def check_name(self, name: str) -> None:
        self.canonical(name)

    def canonical(self, name: str) -> str:
        key = name.strip().lower()
        key = _ALIASES.get(key, key)
        if key not in _ZOO:
            raise self.unknown(name)
        return key

    def torch_model(self, name: str, batch_size: int = 1, **options: Any) -> tuple[Any, Any]:
        """The PyTorch model (seeded weights, batch-norm statistics re-estimated, eval mode) and an
        example input, without importing it into TVM (what a PyTorch-only workflow needs)."""
        from ._torch import calibrate_batchnorm, import_torch, torch_dtype

        torch = import_torch()
        builder, default_size = _ZOO[self.canonical(name)]
        size = int(options.get("image_size") or default_size)
        seed = int(options.get("seed") or 0)
        dtype = torch_dtype(options.get("dtype") or "float32")
        torch.manual_seed(seed)
        module = builder()
        shape = (batch_size, 3, size, size)
        calibrate_batchnorm(module, shape, seed)
        return module.to(dtype), torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)

    def load(self, name: str, batch_size: int = 1, **options: Any) -> Workload:
        from ..ir.precision import cast_module
        from ._torch import export_to_relax, torch_dtype

        key = self.canonical(name)
        size = int(options.get("image_size") or _ZOO[key][1])
        seed = int(options.get("seed") or 0)
        dtype = options.get("dtype") or "float32"
        module, example = self.torch_model(key, batch_size, **{**options, "dtype": "float32"})
        shape = tuple(example.shape)
        mod = cast_module(export_to_relax(module, (example,)), dtype)  # TVM imports convolutions as float32
        module = module.to(torch_dtype(dtype))
        return Workload(
            name=key,
            source=self.name,
            mod=mod,
            inputs=[InputSpec("x", shape, dtype)],
            batch_size=batch_size,
            provenance={"builder": key, "image_size": size, "seed": seed, "weights": "random"},
            torch_module=module,
            options={"image_size": size, "seed": seed},
        )

    def estimate_bytes(self, name: str, batch_size: int, **options: Any) -> int:
        key = self.canonical(name)
        size = int(options.get("image_size") or _ZOO[key][1])
        # activations of these CNNs add up to a few dozen times the input; weights up to ~0.6 GB (vgg-16)
        return 60 * 4 * batch_size * 3 * size * size + (600 << 20)
