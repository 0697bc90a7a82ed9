"""Nemotron-H: Mamba2, attention (no rope) and squared-ReLU MLP layers, one mixer each, converted as
llama.cpp's ``NemotronHModel``: per-layer ``head_count_kv`` (> 0: attention) and ``feed_forward_length``
(> 0: MLP), both 0 for the Mamba2 layers, whose tensors are as ``Mamba2Model``'s."""

from __future__ import annotations

from typing import Any

import numpy as np

from llamapy.ggml.types import GGMLType
from tests.model import hf_tiny
from tests.model.families import mamba2
from tests.model.hf_tiny import Family

_MIXER = {
    "q_proj.weight": "attn_q.weight",
    "k_proj.weight": "attn_k.weight",
    "v_proj.weight": "attn_v.weight",
    "o_proj.weight": "attn_output.weight",
    "up_proj.weight": "ffn_up.weight",
    "down_proj.weight": "ffn_down.weight",
}
_TOP = {"model.embeddings.weight": "token_embd.weight", "model.norm_f.weight": "output_norm.weight",
        "lm_head.weight": "output.weight"}  # fmt: skip


def convert(family: Family, cfg: Any, sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    ssm: dict[str, np.ndarray] = {}
    for name, w in sd.items():
        w = np.asarray(w, dtype=np.float32)
        if name in _TOP:
            out[_TOP[name]] = w
            continue
        il, rest = name[len("model.layers.") :].split(".", 1)
        kind = cfg.layers_block_type[int(il)]
        if rest == "norm.weight":
            out[f"blk.{il}.attn_norm.weight"] = w
        elif kind == "linear_attention":
            ssm[f"backbone.layers.{il}.{rest}"] = w
        else:
            out[f"blk.{il}.{_MIXER[rest[len('mixer.') :]]}"] = np.ascontiguousarray(w)
    out.update(mamba2.convert(family, cfg, ssm))
    return out


def metadata(family: Family, cfg: Any, ftype: GGMLType) -> dict[str, Any]:
    a = family.arch
    types = cfg.layers_block_type
    return {
        "general.name": f"tiny-{family.name}",
        "general.file_type": hf_tiny.FILE_TYPES[ftype],
        f"{a}.vocab_size": cfg.vocab_size,
        f"{a}.context_length": cfg.max_position_embeddings,
        f"{a}.embedding_length": cfg.hidden_size,
        f"{a}.block_count": len(types),
        f"{a}.attention.head_count": cfg.num_attention_heads,
        f"{a}.attention.head_count_kv": np.array(
            [cfg.num_key_value_heads if t == "full_attention" else 0 for t in types], dtype=np.uint32
        ),
        f"{a}.feed_forward_length": np.array(
            [cfg.intermediate_size if t == "mlp" else 0 for t in types], np.uint32
        ),
        f"{a}.attention.key_length": cfg.head_dim,
        f"{a}.attention.value_length": cfg.head_dim,
        f"{a}.attention.layer_norm_rms_epsilon": float(cfg.layer_norm_epsilon),
        # NemotronHModel writes it too (add_layer_norm_eps), and llama.cpp's loader requires it
        f"{a}.attention.layer_norm_epsilon": float(cfg.layer_norm_epsilon),
        f"{a}.ssm.conv_kernel": cfg.conv_kernel,
        f"{a}.ssm.inner_size": cfg.mamba_num_heads * cfg.mamba_head_dim,
        f"{a}.ssm.state_size": cfg.ssm_state_size,
        f"{a}.ssm.time_step_rank": cfg.mamba_num_heads,
        f"{a}.ssm.group_count": cfg.n_groups,
    }


hf_tiny.register(
    Family(
        "nemotron_h",
        "nemotron_h",
        "NemotronHConfig",
        dict(
            vocab_size=hf_tiny.N_VOCAB,
            hidden_size=64,
            layers_block_type=["linear_attention", "full_attention", "mlp", "linear_attention", "mlp"],
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            intermediate_size=128,
            ssm_state_size=16,
            mamba_num_heads=8,
            mamba_head_dim=16,
            n_groups=2,
            conv_kernel=4,
            expand=2,
            layer_norm_epsilon=1e-6,
            max_position_embeddings=hf_tiny.N_CTX,
            tie_word_embeddings=False,
            pad_token_id=None,
            bos_token_id=None,
            eos_token_id=None,
        ),
        convert_fn=convert,
        metadata_fn=metadata,
        f32_names=("conv1d.weight", "ssm_a", "ssm_d"),
        common_config=False,
    )
)
