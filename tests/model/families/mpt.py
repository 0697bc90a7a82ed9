"""MPT: ALiBi (max bias 8, 4 heads), LayerNorms with biases, fused Wqkv, GELU MLP (HF's exact erf GELU;
llama.cpp's and llamapy's the tanh form: ~1e-4 relative here), output tied to the embeddings. The
prompts are longer than the 12-token first step of the incremental test, so the ALiBi bias is read
from the KV cache's mask."""

from __future__ import annotations

from typing import Any

import numpy as np

from llamapy.ggml.types import GGMLType
from tests.model import hf_tiny
from tests.model.hf_tiny import Family

_NAMES = {
    "norm_1.weight": "attn_norm.weight",
    "norm_1.bias": "attn_norm.bias",
    "attn.Wqkv.weight": "attn_qkv.weight",
    "attn.out_proj.weight": "attn_output.weight",
    "norm_2.weight": "ffn_norm.weight",
    "norm_2.bias": "ffn_norm.bias",
    "ffn.up_proj.weight": "ffn_up.weight",
    "ffn.down_proj.weight": "ffn_down.weight",
}


def _convert(family: Family, cfg: Any, sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for k, v in sd.items():
        v = np.ascontiguousarray(v, dtype=np.float32)
        if k == "transformer.wte.weight":
            out["token_embd.weight"] = v
        elif k == "transformer.norm_f.weight":
            out["output_norm.weight"] = v
        elif k == "transformer.norm_f.bias":
            out["output_norm.bias"] = v
        elif k == "lm_head.weight":
            continue  # tied
        elif k.startswith("transformer.blocks."):
            il, rest = k[len("transformer.blocks.") :].split(".", 1)
            out[f"blk.{il}.{_NAMES[rest]}"] = v
        else:
            raise KeyError(f"no GGUF name for HF tensor {k!r} (mpt)")
    return out


def _metadata(family: Family, cfg: Any, ftype: GGMLType) -> dict[str, Any]:
    a = family.arch
    return {
        "general.name": f"tiny-{family.name}",
        "general.file_type": hf_tiny.FILE_TYPES[ftype],
        f"{a}.vocab_size": cfg.vocab_size,
        f"{a}.context_length": cfg.max_seq_len,
        f"{a}.embedding_length": cfg.d_model,
        f"{a}.block_count": cfg.n_layers,
        f"{a}.feed_forward_length": cfg.d_model * cfg.expansion_ratio,
        f"{a}.attention.head_count": cfg.n_heads,
        f"{a}.attention.layer_norm_epsilon": float(cfg.layer_norm_epsilon),
        f"{a}.attention.max_alibi_bias": float(cfg.attn_config.alibi_bias_max),
    }


hf_tiny.register(
    Family(
        "mpt",
        "mpt",
        "MptConfig",
        dict(
            d_model=64,
            n_heads=4,
            n_layers=2,
            expansion_ratio=4,  # (HF's MptMLP is 4 x d_model whatever the ratio)
            max_seq_len=hf_tiny.N_CTX,
            vocab_size=hf_tiny.N_VOCAB,
            attn_config={"alibi": True, "alibi_bias_max": 8},
            no_bias=True,
            tie_word_embeddings=True,
        ),
        convert_fn=_convert,
        metadata_fn=_metadata,
        common_config=False,
    )
)
