"""Gemma 3n (text) as llama.cpp's ``conversion/gemma.py`` (Gemma3NModel) converts it.

Six layers: window layers (window 4 < the prompts) and global ones, KV sharing reaching both kinds
(layers 3, 4 reuse layer 1's window cache, layer 5 layer 2's global one), four AltUp streams, LAuReL
rank 32, per-layer embeddings, gaussian top-k sparsity on the first four layers' FFN gates (dense on the
last two), final soft-capping. The AltUp coefficient matrices (4 wide) are stored in F32 whatever the
file type (rows of 4 cannot be Q8_0 blocks).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import transformers

from llamapy.ggml.types import GGMLType
from tests.model import hf_tiny
from tests.model.hf_tiny import FILE_TYPES, Family

_LAYER_TYPES = ["sliding_attention"] * 2 + ["full_attention"] + ["sliding_attention"] * 2 + ["full_attention"]
_SPARSITY = [0.95] * 4 + [0.0] * 2

_TOP = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "model.embed_tokens_per_layer.weight": "per_layer_token_embd.weight",
    "model.per_layer_model_projection.weight": "per_layer_model_proj.weight",
    "model.per_layer_projection_norm.weight": "per_layer_proj_norm.weight",
}
_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "per_layer_input_gate.weight": "inp_gate.weight",
    "per_layer_projection.weight": "proj.weight",
    "post_per_layer_input_norm.weight": "post_norm.weight",
    "altup.correct_output_scale": "altup_correct_scale.weight",
    "altup.correction_coefs.weight": "altup_correct_coef.weight",
    "altup.prediction_coefs.weight": "altup_predict_coef.weight",
    "altup.modality_router.weight": "altup_router.weight",
    "altup.router_norm.weight": "altup_router_norm.weight",
    "laurel.linear_left.weight": "laurel_l.weight",
    "laurel.linear_right.weight": "laurel_r.weight",
    "laurel.post_laurel_norm.weight": "laurel_post_norm.weight",
}


def convert(family: Family, cfg: Any, sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    stacks: dict[str, dict[int, np.ndarray]] = {"altup_proj.weight": {}, "altup_unembd_proj.weight": {}}
    for name, w in sd.items():
        w = np.asarray(w, dtype=np.float32)
        if name in _TOP:
            out[_TOP[name]] = w
        elif name.startswith(("model.altup_projections.", "model.altup_unembed_projections.")):
            key = "altup_proj.weight" if "altup_projections" in name else "altup_unembd_proj.weight"
            stacks[key][int(name.split(".")[2])] = w
        elif name.startswith("model.layers."):
            il, rest = name[len("model.layers.") :].split(".", 1)
            out[f"blk.{il}.{_LAYER[rest]}"] = np.ascontiguousarray(w)
        elif name == "lm_head.weight":
            if not cfg.tie_word_embeddings:
                out["output.weight"] = w
        else:
            raise KeyError(f"no GGUF name for HF tensor {name!r}")
    for key, mats in stacks.items():  # Gemma3NModel._stack_matrices: [n_altup - 1, n_embd, n_embd]
        out[key] = np.stack([mats[i] for i in sorted(mats)])
    return out


def metadata(family: Family, cfg: Any, ftype: GGMLType) -> dict[str, Any]:
    a = family.arch
    normal = torch.distributions.normal.Normal(0.0, 1.0)
    sparsity = [
        float(normal.icdf(torch.tensor(s, dtype=torch.float32))) for s in cfg.activation_sparsity_pattern
    ]
    rp = cfg.rope_parameters
    return {
        "general.name": f"tiny-{family.name}",
        "general.file_type": FILE_TYPES[ftype],
        f"{a}.vocab_size": cfg.vocab_size,
        f"{a}.context_length": cfg.max_position_embeddings,
        f"{a}.embedding_length": cfg.hidden_size,
        f"{a}.block_count": cfg.num_hidden_layers,
        f"{a}.feed_forward_length": list(cfg.intermediate_size),
        f"{a}.attention.head_count": cfg.num_attention_heads,
        f"{a}.attention.head_count_kv": cfg.num_key_value_heads,
        f"{a}.attention.key_length": cfg.head_dim,
        f"{a}.attention.value_length": cfg.head_dim,
        f"{a}.attention.layer_norm_rms_epsilon": float(cfg.rms_norm_eps),
        f"{a}.attention.sliding_window": cfg.sliding_window,
        f"{a}.attention.sliding_window_pattern": [t == "sliding_attention" for t in cfg.layer_types],
        f"{a}.attention.shared_kv_layers": cfg.num_kv_shared_layers,
        f"{a}.rope.freq_base": float(rp["full_attention"]["rope_theta"]),
        f"{a}.rope.freq_base_swa": float(rp["sliding_attention"]["rope_theta"]),
        f"{a}.final_logit_softcapping": float(cfg.final_logit_softcapping),
        f"{a}.embedding_length_per_layer_input": cfg.hidden_size_per_layer_input,
        f"{a}.altup.active_idx": cfg.altup_active_idx,
        f"{a}.altup.num_inputs": cfg.altup_num_inputs,
        f"{a}.activation_sparsity_scale": sparsity,  # icdf(0) = -inf: a dense layer
    }


class _Gemma3nForCausalLM(transformers.Gemma3nForCausalLM):
    """transformers' model with its ``hidden_states`` in the layout the shared tests read (HF's usual one):
    the scaled embeddings, each layer's output but the last (here all AltUp streams, [1, A, T, D], as
    llamapy's ``l_out-il``), then the final norm's output. The logits are untouched."""

    def forward(self, *args: Any, **kw: Any) -> Any:
        out = super().forward(*args, **kw)
        hs = out.hidden_states
        if hs is not None:  # HF gives the stacked streams [A, 1, T, D] before each layer and after the last
            layers = [h.permute(1, 0, 2, 3) for h in hs[1:-1]]
            out.hidden_states = (hs[0][0], *layers, self._final_norm)
        return out


def hf_model(cfg: Any) -> torch.nn.Module:
    model = _Gemma3nForCausalLM(cfg)
    # the final norm's output (the shared tests' last hidden state), caught on its way to the head
    model.model.norm.register_forward_hook(lambda mod, args, out: setattr(model, "_final_norm", out))
    return model


hf_tiny.register(
    Family(
        "gemma3n",
        "gemma3n",
        "Gemma3nTextConfig",
        dict(
            num_hidden_layers=6,
            head_dim=16,
            layer_types=_LAYER_TYPES,
            num_kv_shared_layers=3,
            sliding_window=4,
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
            },
            hidden_activation="gelu_pytorch_tanh",
            tie_word_embeddings=True,
            hidden_size_per_layer_input=32,
            vocab_size_per_layer_input=hf_tiny.N_VOCAB,
            laurel_rank=32,
            altup_num_inputs=4,
            altup_active_idx=0,
            activation_sparsity_pattern=_SPARSITY,
            final_logit_softcapping=10.0,
        ),
        hf_model=hf_model,
        convert_fn=convert,
        metadata_fn=metadata,
        f32_names=(
            "altup.correction_coefs.weight",
            "altup.prediction_coefs.weight",
            "altup_correct_coef.weight",
            "altup_predict_coef.weight",
        ),
    )
)
