"""ModernBERT as llama.cpp's converter writes it (ModernBertModel): ``modern-bert`` (ModernBertModel,
mean pooling) and ``modern-bert-rank`` (ModernBertForSequenceClassification with mean pooling, as
gte-reranker-modernbert: head dense + GELU + norm, then the classifier). 4 layers with a window of 8
(global layers 0 and 3); the texts are longer than the half window, so the local layers' window
shows. GELU is the tanh approximation on both sides (llama.cpp's ``ggml_geglu``/``ggml_gelu``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import transformers

from llamapy.ggml.types import GGMLType
from tests.model import hf_tiny
from tests.model.families.bert import encoder_metadata
from tests.model.hf_tiny import Family

_LAYER = {
    "attn_norm.weight": "attn_norm.weight",
    "attn.Wqkv.weight": "attn_qkv.weight",
    "attn.Wo.weight": "attn_output.weight",
    "mlp_norm.weight": "ffn_norm.weight",
    "mlp.Wi.weight": "ffn_up.weight",
    "mlp.Wo.weight": "ffn_down.weight",
}
_TOP = {
    "embeddings.tok_embeddings.weight": "token_embd.weight",
    "embeddings.norm.weight": "token_embd_norm.weight",
    "final_norm.weight": "output_norm.weight",
    "head.dense.weight": "cls.weight",
    "head.norm.weight": "cls.norm.weight",
    "classifier.weight": "cls.output.weight",
    "classifier.bias": "cls.output.bias",
}


def _convert(family: Family, cfg: Any, sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for name, w in sd.items():
        name = name.removeprefix("model.")
        w = np.ascontiguousarray(np.asarray(w, dtype=np.float32))
        if name in _TOP:
            out[_TOP[name]] = w
        elif name.startswith("layers."):
            il, rest = name[len("layers.") :].split(".", 1)
            out[f"blk.{il}.{_LAYER[rest]}"] = w
        else:
            raise KeyError(f"no GGUF name for HF tensor {name!r}")
    return out


def _metadata(family: Family, cfg: Any, ftype: GGMLType) -> dict[str, Any]:
    rank = family.name.endswith("-rank")
    md = encoder_metadata(family, cfg, ftype, 4 if rank else 1, cfg.max_position_embeddings)
    a = family.arch
    rp = cfg.rope_parameters
    md[f"{a}.attention.layer_norm_epsilon"] = float(cfg.norm_eps)
    md[f"{a}.attention.sliding_window"] = cfg.local_attention
    md[f"{a}.attention.sliding_window_pattern"] = 3
    md[f"{a}.rope.freq_base"] = float(rp["full_attention"]["rope_theta"])
    md[f"{a}.rope.freq_base_swa"] = float(rp["sliding_attention"]["rope_theta"])
    return md


def _rank(cfg: Any) -> torch.nn.Module:
    cfg.num_labels = 1
    return transformers.ModernBertForSequenceClassification(cfg)


_CFG = dict(
    vocab_size=hf_tiny.N_VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=4,
    num_attention_heads=4,
    local_attention=8,
    max_position_embeddings=hf_tiny.N_CTX,
    hidden_activation="gelu_pytorch_tanh",
    classifier_activation="gelu_pytorch_tanh",
    classifier_pooling="mean",
    pad_token_id=0,
    bos_token_id=None,
    eos_token_id=None,
    cls_token_id=None,
    sep_token_id=None,
)

for _name, _model in (("modern-bert", transformers.ModernBertModel), ("modern-bert-rank", _rank)):
    hf_tiny.register(
        Family(
            _name,
            "modern-bert",
            "ModernBertConfig",
            _CFG,
            kind="encoder",
            hf_model=_model,
            convert_fn=_convert,
            metadata_fn=_metadata,
            common_config=False,
        )
    )
