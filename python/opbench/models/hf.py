"""The ``transformers`` source: Hugging Face models built from a config with random weights.

Fully offline: configs are written here, weights are seeded random, nothing comes from a hub.
``--seqlen`` sets the sequence length (default 128). ``*-small`` names are two-layer models of
hidden size 128, quick to compile and measure.
"""

from __future__ import annotations

from typing import Any

from ..errors import OpBenchError
from .base import InputSpec, ModelSource, Workload

_SMALL = {"layers": 2, "hidden": 128, "heads": 2, "ffn": 512}
_BASE = {"layers": 12, "hidden": 768, "heads": 12, "ffn": 3072}

_MODELS = {
    "bert": ("bert", _BASE),
    "bert-small": ("bert", _SMALL),
    "roberta": ("roberta", _BASE),
    "roberta-small": ("roberta", _SMALL),
    "gpt2": ("gpt2", _BASE),
    "gpt2-small": ("gpt2", _SMALL),
}


def _build(family: str, size: dict[str, int]) -> Any:
    try:
        import transformers as tf
    except ImportError:
        raise OpBenchError("the transformers source needs: pip install transformers") from None
    if family == "gpt2":
        # use_cache=False: a DynamicCache output breaks torch.export (docs/architecture.md, "TVM facts")
        cfg = tf.GPT2Config(n_layer=size["layers"], n_embd=size["hidden"], n_head=size["heads"],
                            n_inner=size["ffn"], use_cache=False)
        return _eager(tf.GPT2Model, cfg)
    cls_cfg, cls_model = (
        (tf.BertConfig, tf.BertModel) if family == "bert" else (tf.RobertaConfig, tf.RobertaModel)
    )
    cfg = cls_cfg(num_hidden_layers=size["layers"], hidden_size=size["hidden"],
                  num_attention_heads=size["heads"], intermediate_size=size["ffn"])
    return _eager(cls_model, cfg)


def _eager(cls: Any, cfg: Any) -> Any:
    """Instantiate with eager attention (plain matmul + softmax, which TVM imports)."""
    cfg._attn_implementation = "eager"
    return cls(cfg).eval()


class TransformersSource(ModelSource):
    """BERT, RoBERTa and GPT-2 from configs (``--modelsource transformers``).

    Options
    -------
    seqlen : int
        Sequence length (default 128).
    seed : int
        Seed of the random weights (default 0).
    dtype : str
        ``float32`` (default), ``float16`` or ``bfloat16``: imported in float32, then the Relax module
        and the PyTorch module are cast (the inputs stay token ids).
    """

    name = "transformers"
    aliases = ("hf", "huggingface")

    def models(self) -> list[str]:
        return sorted(_MODELS)

    def check_name(self, name: str) -> None:
        if name.strip().lower() not in _MODELS:
            raise self.unknown(name)

    def load(self, name: str, batch_size: int = 1, **options: Any) -> Workload:
        from ..ir.precision import cast_module
        from ._torch import export_to_relax, import_torch, torch_dtype

        torch = import_torch()
        key = name.strip().lower()
        if key not in _MODELS:
            raise self.unknown(name)
        seqlen = int(options.get("seqlen") or 128)
        if seqlen < 1:
            raise OpBenchError(f"bad sequence length '{seqlen}' (accepted: a positive integer)")
        seed = int(options.get("seed") or 0)
        family, size = _MODELS[key]
        torch.manual_seed(seed)
        model = _build(family, size)
        if seqlen > model.config.max_position_embeddings - 2:
            raise OpBenchError(
                f"sequence length {seqlen} too long for {key} "
                f"(accepted: 1..{model.config.max_position_embeddings - 2})"
            )

        class LastHidden(torch.nn.Module):
            def __init__(self, inner: Any) -> None:
                super().__init__()
                self.inner = inner

            def forward(self, input_ids: Any) -> Any:
                return self.inner(input_ids=input_ids, return_dict=True).last_hidden_state

        wrapped = LastHidden(model).eval()
        shape = (batch_size, seqlen)
        ids = torch.randint(0, 100, shape, generator=torch.Generator().manual_seed(seed))
        dtype = options.get("dtype") or "float32"
        mod = cast_module(export_to_relax(wrapped, (ids,)), dtype)  # imported in float32, then cast
        wrapped = wrapped.to(torch_dtype(dtype))
        return Workload(
            name=key,
            source=self.name,
            mod=mod,
            inputs=[InputSpec("input_ids", shape, "int64")],
            batch_size=batch_size,
            provenance={"family": family, **size, "seqlen": seqlen, "seed": seed,
                        "weights": "random"},
            torch_module=wrapped,
            options={"seqlen": seqlen, "seed": seed},
        )

    def estimate_bytes(self, name: str, batch_size: int, **options: Any) -> int:
        key = name.strip().lower()
        if key not in _MODELS:
            return 0
        size = _MODELS[key][1]
        seqlen = min(int(options.get("seqlen") or 128), 1024)  # longer ones are refused by load() itself
        act = 4 * batch_size * seqlen * (size["ffn"] + 4 * size["hidden"] + size["heads"] * seqlen)
        return 8 * size["layers"] * act + 4 * 16 * size["layers"] * size["hidden"] ** 2 + (200 << 20)
