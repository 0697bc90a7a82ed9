"""Falcon: ``falcon`` is 7B-shaped (multi-query, one LayerNorm feeding attention and MLP in
parallel), ``falcon-40b`` the new decoder architecture (2 KV heads, ln_attn and ln_mlp). HF's fused
qkv of the latter is grouped per KV head; the file's is [q; k; v] (FalconModel.modify_tensors). The
MLP uses the tanh GELU, which llama.cpp's ggml_gelu computes (HF's default is the erf one)."""

from __future__ import annotations

from typing import Any

import numpy as np

from llamapy.ggml.types import GGMLType
from tests.model import hf_tiny
from tests.model.hf_tiny import Family

_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "input_layernorm.bias": "attn_norm.bias",
    "ln_attn.weight": "attn_norm_2.weight",  # (gguf-py's tensor map: ln_mlp is ATTN_NORM for the 40B)
    "ln_attn.bias": "attn_norm_2.bias",
    "ln_mlp.weight": "attn_norm.weight",
    "ln_mlp.bias": "attn_norm.bias",
    "self_attention.query_key_value.weight": "attn_qkv.weight",
    "self_attention.dense.weight": "attn_output.weight",
    "mlp.dense_h_to_4h.weight": "ffn_up.weight",
    "mlp.dense_4h_to_h.weight": "ffn_down.weight",
}
_TOP = {
    "transformer.word_embeddings.weight": "token_embd.weight",
    "transformer.ln_f.weight": "output_norm.weight",
    "transformer.ln_f.bias": "output_norm.bias",
}


def _convert(family: Family, cfg: Any, sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    H, D = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
    out: dict[str, np.ndarray] = {}
    for name, w in sd.items():
        w = np.asarray(w, np.float32)
        if name in _TOP:
            out[_TOP[name]] = w
        elif name.startswith("transformer.h."):
            il, rest = name[len("transformer.h.") :].split(".", 1)
            if rest == "self_attention.query_key_value.weight" and cfg.new_decoder_architecture:
                g = cfg.num_kv_heads
                qkv = w.reshape(g, H // g + 2, D, -1)
                w = np.concatenate(
                    [
                        qkv[:, :-2].reshape(H * D, -1),
                        qkv[:, -2].reshape(g * D, -1),
                        qkv[:, -1].reshape(g * D, -1),
                    ]
                )
            out[f"blk.{il}.{_LAYER[rest]}"] = np.ascontiguousarray(w)
        elif name != "lm_head.weight":  # tied
            raise KeyError(f"no GGUF name for HF tensor {name!r}")
    return out


def _metadata(family: Family, cfg: Any, ftype: GGMLType) -> dict[str, Any]:
    a = "falcon"
    n_kv = (
        cfg.num_kv_heads
        if cfg.new_decoder_architecture
        else (1 if cfg.multi_query else cfg.num_attention_heads)
    )
    return {
        "general.name": f"tiny-{family.name}",
        "general.file_type": hf_tiny.FILE_TYPES[ftype],
        f"{a}.vocab_size": cfg.vocab_size,
        f"{a}.context_length": hf_tiny.N_CTX,
        f"{a}.embedding_length": cfg.hidden_size,
        f"{a}.block_count": cfg.num_hidden_layers,
        f"{a}.feed_forward_length": 4 * cfg.hidden_size,
        f"{a}.attention.head_count": cfg.num_attention_heads,
        f"{a}.attention.head_count_kv": n_kv,
        f"{a}.attention.layer_norm_epsilon": float(cfg.layer_norm_epsilon),
        f"{a}.rope.freq_base": float(cfg.rope_parameters["rope_theta"]),
    }


_BASE = dict(
    vocab_size=hf_tiny.N_VOCAB,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    activation="gelu_pytorch_tanh",
    tie_word_embeddings=True,
    pad_token_id=None,
    bos_token_id=None,
    eos_token_id=None,
)
for _name, _kw in (
    ("falcon", dict(new_decoder_architecture=False, multi_query=True, parallel_attn=True)),
    ("falcon-40b", dict(new_decoder_architecture=True, num_kv_heads=2)),
):
    hf_tiny.register(
        Family(
            _name,
            "falcon",
            "FalconConfig",
            dict(_BASE, **_kw),
            convert_fn=_convert,
            metadata_fn=_metadata,
            common_config=False,
        )
    )
