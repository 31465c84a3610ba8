"""The model-source plug-in interface and the :class:`Workload` it produces."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import numpy as np

from ..errors import OpBenchError
from ..utils import digest, join_names, numpy_dtype

#: the precisions a model can be measured in (its weights, activations and floating-point inputs)
DTYPES = ("float32", "float16", "bfloat16")
#: the built-in model sources :meth:`ModelSource.create` makes (a user may register more)
SourceKind = Literal["local", "simple", "remoteonnx", "transformers"]
_DTYPE_NAMES = {"fp32": "float32", "float": "float32", "fp16": "float16", "half": "float16", "bf16": "bfloat16"}


def check_dtype(value: Any) -> str:
    """``value`` as one of :data:`DTYPES` (``fp32``, ``fp16``, ``half``, ``bf16`` accepted too), else a
    one-line error naming the choices."""
    text = str(value).strip().lower()
    text = _DTYPE_NAMES.get(text, text)
    if text not in DTYPES:
        raise OpBenchError(f"unknown dtype '{value}' (accepted: {', '.join(DTYPES)}; or fp32, fp16, bf16)")
    return text


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """One input of a workload: its name, static shape and dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"

    def random(self, rng: np.random.Generator) -> np.ndarray:
        """Random data for this input (token ids for integer inputs)."""
        if self.dtype.startswith("int"):
            return rng.integers(0, 100, size=self.shape).astype(self.dtype)
        return rng.standard_normal(self.shape).astype("float32").astype(numpy_dtype(self.dtype))


@dataclasses.dataclass
class Workload:
    """A model lowered to Relax, ready for operator extraction.

    Attributes
    ----------
    name, source:
        The model name and the source that produced it (``local``, ``simple``, ...).
    mod:
        A Relax ``IRModule`` whose ``main`` takes the inputs; weights are embedded as constants.
    inputs:
        The input specs, in the order ``main`` takes them.
    batch_size:
        The batch size the module was built for.
    provenance:
        Free-form facts about where the model came from (file checksum, config, seed...).
    torch_module:
        The PyTorch module, when the source built one (reference outputs, torch backend).
    options:
        Every option that changes the graph or its weights, defaults filled in (image size,
        sequence length, seed, a synthetic model's parameters, an ONNX file's SHA-256). With the
        source, name, batch size and inputs they make the workload's fingerprint.
    dtype:
        The precision of the weights and activations (:data:`DTYPES`; an ONNX model's own is
        ``float32`` here). Part of the fingerprint when it is not ``float32`` (so float32 keys are
        those of earlier versions).
    """

    name: str
    source: str
    mod: Any
    inputs: list[InputSpec]
    batch_size: int = 1
    provenance: dict[str, Any] = dataclasses.field(default_factory=dict)
    torch_module: Any = None
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    dtype: str = "float32"

    def fingerprint(self) -> dict[str, Any]:
        """What makes this workload what it is (see :attr:`options` and :attr:`dtype`); equal for equal graphs."""
        found = {
            "source": self.source, "model": self.name, "batch_size": self.batch_size,
            "inputs": [[s.name, list(s.shape), s.dtype] for s in self.inputs],
            "options": {k: self.options[k] for k in sorted(self.options)},
        }
        if self.dtype != "float32":
            found["dtype"] = self.dtype
        return found

    def readable(self) -> dict[str, Any]:
        """:meth:`fingerprint` for the dataset's readable ``workload`` column (see :func:`readable_fingerprint`)."""
        return readable_fingerprint(self.fingerprint())

    @property
    def workload_id(self) -> str:
        """Digest of :meth:`fingerprint` (the dataset's workload key)."""
        return digest(self.fingerprint())

    def example_inputs(self, seed: int = 0) -> list[np.ndarray]:
        """Seeded random inputs matching :attr:`inputs`."""
        rng = np.random.default_rng(seed)
        return [spec.random(rng) for spec in self.inputs]

    def torch_inputs(self, seed: int = 0, device: str = "cpu") -> list[Any]:
        """:meth:`example_inputs` as PyTorch tensors on ``device`` (bfloat16 ones too, which NumPy lacks)."""
        import torch

        out = []
        for x in self.example_inputs(seed):
            if x.dtype.name == "bfloat16":
                out.append(torch.from_numpy(x.astype(np.float32)).to(device=device, dtype=torch.bfloat16))
            else:
                out.append(torch.from_numpy(x).to(device))
        return out


READABLE_INPUTS = 16


def readable_fingerprint(fingerprint: dict[str, Any]) -> dict[str, Any]:
    """A fingerprint as the dataset shows it: a workload with more than :data:`READABLE_INPUTS`
    inputs lists how many there are and their digest instead of every one (the key, the workload
    id, still digests them all)."""
    inputs = fingerprint.get("inputs") or []
    if len(inputs) <= READABLE_INPUTS:
        return fingerprint
    return {**fingerprint, "inputs": {"count": len(inputs), "digest": digest(inputs)}}


class ModelSource:
    """Base class of a model source: a named family of models that can be loaded as Workloads.

    Subclasses set :attr:`name` and implement :meth:`models` and :meth:`load`.
    """

    name: str = ""
    aliases: tuple[str, ...] = ()
    #: the dtypes ``load(..., dtype=...)`` can build (a source that keeps a model's own says float32 only)
    dtypes: tuple[str, ...] = DTYPES

    @staticmethod
    def create(kind: SourceKind | str) -> ModelSource:
        """A registered source by name or alias: the built-in :data:`SourceKind`, or one a user registered."""
        from . import get_source

        return get_source(kind)

    def models(self) -> list[str]:
        """The model names this source accepts (for error messages and ``opbench models``)."""
        raise NotImplementedError

    def load(self, name: str, batch_size: int = 1, **options: Any) -> Workload:
        """Build the workload for ``name``."""
        raise NotImplementedError

    def estimate_bytes(self, name: str, batch_size: int, **options: Any) -> int:
        """A rough upper estimate of the host memory that loading ``name`` takes (0: unknown).

        :func:`~opbench.models.load_workload` refuses a model that would not fit before allocating it.
        """
        return 0

    def check_name(self, name: str) -> None:
        """Refuse an unknown model name (or bad options in it) before any work: one line naming what is
        accepted. A source whose names are open (files, URLs) accepts any here."""

    def unknown(self, name: str) -> OpBenchError:
        """The error for an unknown model name."""
        return OpBenchError(
            f"unknown model '{name}' for source '{self.name}' (accepted: {join_names(self.models())})"
        )


def check_batch_size(batch_size: Any) -> int:
    """Validate a batch size: a positive integer."""
    try:
        value = int(batch_size)
    except (TypeError, ValueError):
        raise OpBenchError(f"bad batch size '{batch_size}' (accepted: a positive integer)") from None
    if value < 1 or str(batch_size).strip() not in (str(value), f"+{value}"):
        raise OpBenchError(f"bad batch size '{batch_size}' (accepted: a positive integer)")
    return value
