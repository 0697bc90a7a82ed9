"""BERT-family encoders converted as llama.cpp's convert_hf_to_gguf.py (BertModel, XLMRobertaModel):
``bert`` (BertModel, mean pooling) and ``xlmr-rank`` (XLMRobertaForSequenceClassification: a
bge-reranker-style ``cls`` / ``cls.output`` head, pooling type rank; the converter drops the first
``pad + 1`` rows of the position table, as RoBERTa's positions start after the padding id).

GELU is the tanh approximation on both sides (llama.cpp's ``ggml_gelu`` for ``LLM_FFN_GELU``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import transformers

from llamapy.ggml.types import GGMLType
from tests.model import hf_tiny
from tests.model.hf_tiny import Family

_LAYER = {
    "attention.self.query.weight": "attn_q.weight",
    "attention.self.query.bias": "attn_q.bias",
    "attention.self.key.weight": "attn_k.weight",
    "attention.self.key.bias": "attn_k.bias",
    "attention.self.value.weight": "attn_v.weight",
    "attention.self.value.bias": "attn_v.bias",
    "attention.output.dense.weight": "attn_output.weight",
    "attention.output.dense.bias": "attn_output.bias",
    "attention.output.LayerNorm.weight": "attn_output_norm.weight",
    "attention.output.LayerNorm.bias": "attn_output_norm.bias",
    "intermediate.dense.weight": "ffn_up.weight",
    "intermediate.dense.bias": "ffn_up.bias",
    "output.dense.weight": "ffn_down.weight",
    "output.dense.bias": "ffn_down.bias",
    "output.LayerNorm.weight": "layer_output_norm.weight",
    "output.LayerNorm.bias": "layer_output_norm.bias",
}
_TOP = {
    "embeddings.word_embeddings.weight": "token_embd.weight",
    "embeddings.token_type_embeddings.weight": "token_types.weight",
    "embeddings.position_embeddings.weight": "position_embd.weight",
    "embeddings.LayerNorm.weight": "token_embd_norm.weight",
    "embeddings.LayerNorm.bias": "token_embd_norm.bias",
    "classifier.dense.weight": "cls.weight",
    "classifier.dense.bias": "cls.bias",
    "classifier.out_proj.weight": "cls.output.weight",
    "classifier.out_proj.bias": "cls.output.bias",
}


def position_offset(cfg: Any) -> int:
    """Rows of the position table before position 0 (RoBERTa: pad + 1; BERT: none)."""
    return 0 if cfg.model_type == "bert" else int(cfg.pad_token_id) + 1


def convert_bert(family: Family, cfg: Any, sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for name, w in sd.items():
        w = np.asarray(w, dtype=np.float32)
        for pre in ("bert.", "roberta."):
            name = name.removeprefix(pre)
        if name in ("embeddings.position_ids", "embeddings.token_type_ids") or name.startswith("pooler."):
            continue  # llama.cpp drops BERT's pooler
        if name == "embeddings.position_embeddings.weight":
            w = w[position_offset(cfg) :]
        if name in _TOP:
            out[_TOP[name]] = np.ascontiguousarray(w)
        elif name.startswith("encoder.layer."):
            il, rest = name[len("encoder.layer.") :].split(".", 1)
            out[f"blk.{il}.{_LAYER[rest]}"] = np.ascontiguousarray(w)
        else:
            raise KeyError(f"no GGUF name for HF tensor {name!r}")
    return out


def encoder_metadata(family: Family, cfg: Any, ftype: GGMLType, pooling: int, n_ctx: int) -> dict[str, Any]:
    """The keys convert_hf_to_gguf.py writes for an encoder (TextModel + BertModel)."""
    a = family.arch
    md: dict[str, Any] = {
        "general.name": f"tiny-{family.name}",
        "general.file_type": hf_tiny.FILE_TYPES[ftype],
        f"{a}.vocab_size": cfg.vocab_size,
        f"{a}.context_length": n_ctx,
        f"{a}.embedding_length": cfg.hidden_size,
        f"{a}.block_count": cfg.num_hidden_layers,
        f"{a}.feed_forward_length": cfg.intermediate_size,
        f"{a}.attention.head_count": cfg.num_attention_heads,
        f"{a}.attention.layer_norm_epsilon": float(getattr(cfg, "layer_norm_eps", 1e-12)),
        f"{a}.attention.causal": False,
        f"{a}.pooling_type": pooling,
        "tokenizer.ggml.token_type_count": int(getattr(cfg, "type_vocab_size", 0) or 0),
    }
    if pooling == 4:
        md[f"{a}.classifier.output_labels"] = [f"LABEL_{i}" for i in range(cfg.num_labels)]
    return md


def _bert_metadata(family: Family, cfg: Any, ftype: GGMLType) -> dict[str, Any]:
    rank = family.name.endswith("-rank")
    return encoder_metadata(
        family, cfg, ftype, 4 if rank else 1, cfg.max_position_embeddings - position_offset(cfg)
    )


_BERT_CFG = dict(
    vocab_size=hf_tiny.N_VOCAB,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=128,
    max_position_embeddings=hf_tiny.N_CTX,
    type_vocab_size=2,
    layer_norm_eps=1e-12,
    hidden_act="gelu_pytorch_tanh",
    attention_probs_dropout_prob=0.0,
    hidden_dropout_prob=0.0,
    pad_token_id=0,
)

hf_tiny.register(
    Family(
        "bert",
        "bert",
        "BertConfig",
        _BERT_CFG,
        kind="encoder",
        hf_model=lambda cfg: transformers.BertModel(cfg, add_pooling_layer=False),
        convert_fn=convert_bert,
        metadata_fn=_bert_metadata,
        common_config=False,
    )
)


def _xlmr_rank(cfg: Any) -> torch.nn.Module:
    cfg.num_labels = 1
    return transformers.XLMRobertaForSequenceClassification(cfg)


hf_tiny.register(
    Family(
        "xlmr-rank",
        "bert",
        "XLMRobertaConfig",
        {**_BERT_CFG, "pad_token_id": 1, "type_vocab_size": 1, "max_position_embeddings": hf_tiny.N_CTX + 2},
        kind="encoder",
        hf_model=_xlmr_rank,
        convert_fn=convert_bert,
        metadata_fn=_bert_metadata,
        common_config=False,
    )
)
