"""gpt-oss (``GptOssForCausalLM``, llama.cpp's arch ``gpt-oss``): converted as convert_hf_to_gguf.py's
GptOssModel does for float checkpoints (experts' interleaved gate|up columns split into
``ffn_gate_exps`` / ``ffn_up_exps``, sinks to ``attn_sinks.weight``, router to ``ffn_gate_inp``,
``post_attention_layernorm`` to ``post_attention_norm``), with llama.cpp's metadata (YaRN, the window).

HF stores the experts as ``[E, in, out]`` (``x @ W``); the file as ``[E, out, in]``. So that the oracle's
row-wise rounding (F16, Q8_0, MXFP4) is the file's, the model's ``state_dict`` holds the experts
transposed (a state-dict hook; HF's own forward runs unchanged on ``[E, in, out]``).

``write_mxfp4`` writes the file as real gpt-oss GGUFs are: experts in MXFP4, the rest F32.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers

from llamapy.ggml import quants
from llamapy.ggml.types import GGMLType
from llamapy.gguf import GGUFValueType
from llamapy.gguf.writer import GGUFWriter
from tests.model import hf_tiny
from tests.model.hf_tiny import Family, TinyModel

ARCH = "gpt-oss"
_EXPERT_MATS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")

# HF (hooked state dict) layer names -> GGUF, for the one-to-one tensors
_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.o_proj.bias": "attn_output.bias",
    "self_attn.sinks": "attn_sinks.weight",
    "mlp.router.weight": "ffn_gate_inp.weight",
    "mlp.router.bias": "ffn_gate_inp.bias",
    "mlp.experts.down_proj": "ffn_down_exps.weight",  # already [E, n_embd, n_ff] (hooked)
    "mlp.experts.down_proj_bias": "ffn_down_exps.bias",
}


def _transposed_experts(module: torch.nn.Module) -> None:
    """state_dict() gives the experts as [E, out, in]; load_state_dict() takes them so."""

    def save(mod: Any, sd: dict[str, Any], prefix: str, meta: Any) -> None:
        for k in ("gate_up_proj", "down_proj"):
            if prefix + k in sd:
                sd[prefix + k] = sd[prefix + k].transpose(-1, -2)

    def load(sd: dict[str, Any], prefix: str, *args: Any) -> None:
        for k in ("gate_up_proj", "down_proj"):
            if prefix + k in sd:
                sd[prefix + k] = sd[prefix + k].transpose(-1, -2).contiguous()

    module.register_state_dict_post_hook(save)
    module._register_load_state_dict_pre_hook(load)


def _hf_model(cfg: Any) -> torch.nn.Module:
    model = transformers.GptOssForCausalLM(cfg)
    for layer in model.model.layers:
        _transposed_experts(layer.mlp.experts)
    return model


def _convert(family: Family, cfg: Any, sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for name, w in sd.items():
        w = np.asarray(w, dtype=np.float32)
        if name == "model.embed_tokens.weight":
            out["token_embd.weight"] = w
        elif name == "lm_head.weight":
            out["output.weight"] = w
        elif name == "model.norm.weight":
            out["output_norm.weight"] = w
        elif name.startswith("model.layers."):
            il, rest = name[len("model.layers.") :].split(".", 1)
            if rest == "mlp.experts.gate_up_proj":  # [E, 2 n_ff, n_embd]: rows gate, up, gate, up...
                out[f"blk.{il}.ffn_gate_exps.weight"] = np.ascontiguousarray(w[:, ::2])
                out[f"blk.{il}.ffn_up_exps.weight"] = np.ascontiguousarray(w[:, 1::2])
            elif rest == "mlp.experts.gate_up_proj_bias":  # [E, 2 n_ff]
                out[f"blk.{il}.ffn_gate_exps.bias"] = np.ascontiguousarray(w[:, ::2])
                out[f"blk.{il}.ffn_up_exps.bias"] = np.ascontiguousarray(w[:, 1::2])
            elif rest in _LAYER:
                out[f"blk.{il}.{_LAYER[rest]}"] = np.ascontiguousarray(w)
            else:
                raise KeyError(f"no GGUF name for HF tensor {name!r} (gpt-oss)")
        elif "rotary_emb" not in name:
            raise KeyError(f"no GGUF name for HF tensor {name!r} (gpt-oss)")
    return out


def _metadata(family: Family, cfg: Any, ftype: GGMLType) -> dict[str, Any]:
    a = ARCH
    rp = cfg.rope_parameters
    return {
        "general.name": f"tiny-{family.name}",
        "general.file_type": hf_tiny.FILE_TYPES.get(ftype, 38),  # 38: LLAMA_FTYPE_MOSTLY_MXFP4_MOE
        f"{a}.vocab_size": cfg.vocab_size,
        f"{a}.context_length": cfg.max_position_embeddings,
        f"{a}.embedding_length": cfg.hidden_size,
        f"{a}.block_count": cfg.num_hidden_layers,
        f"{a}.feed_forward_length": cfg.intermediate_size,
        f"{a}.attention.head_count": cfg.num_attention_heads,
        f"{a}.attention.head_count_kv": cfg.num_key_value_heads,
        f"{a}.attention.key_length": cfg.head_dim,
        f"{a}.attention.value_length": cfg.head_dim,
        f"{a}.attention.layer_norm_rms_epsilon": float(cfg.rms_norm_eps),
        f"{a}.attention.sliding_window": cfg.sliding_window,
        f"{a}.rope.freq_base": float(rp["rope_theta"]),
        f"{a}.rope.scaling.type": "yarn",
        f"{a}.rope.scaling.factor": float(rp["factor"]),
        f"{a}.rope.scaling.original_context_length": int(rp["original_max_position_embeddings"]),
        f"{a}.expert_count": cfg.num_local_experts,
        f"{a}.expert_used_count": cfg.num_experts_per_tok,
        f"{a}.expert_feed_forward_length": cfg.intermediate_size,
    }


# window 4 < the prompts (layers 0 and 2 windowed, 1 full); top-2 of 4 experts; YaRN x32 over an original
# context of 64 (``truncate``: ggml floors/ceils the correction range, as HF's default does)
FAMILY = hf_tiny.register(
    Family(
        "gpt-oss",
        ARCH,
        "GptOssConfig",
        dict(
            num_hidden_layers=3,
            max_position_embeddings=2048,  # = factor x original: HF warns otherwise
            head_dim=16,
            intermediate_size=32,
            num_local_experts=4,
            num_experts_per_tok=2,
            sliding_window=4,
            rms_norm_eps=1e-5,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 150000.0,
                "factor": 32.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": True,
                "original_max_position_embeddings": 64,
            },
        ),
        hf_model=_hf_model,
        convert_fn=_convert,
        metadata_fn=_metadata,
        # llama.cpp keeps every non-".weight" tensor (biases) and the router in F32
        f32_names=("mlp.router.weight", "experts.gate_up_proj_bias", "experts.down_proj_bias", "_exps.bias"),
    )
)


def is_expert_matrix(name: str) -> bool:
    """HF (hooked) or GGUF name of an expert weight matrix (MXFP4 in real gpt-oss files)."""
    return name.endswith(_EXPERT_MATS) or name.endswith(("_exps.weight",))


def mxfp4_state_dict(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The weights as ``write_mxfp4`` stores them: experts MXFP4-rounded along their rows, the rest F32."""
    return {k: hf_tiny.roundtrip(v, GGMLType.MXFP4) if is_expert_matrix(k) else v for k, v in state.items()}


def write_mxfp4(tm: TinyModel, path: Path, state: dict[str, np.ndarray] | None = None) -> Path:
    """A file as real gpt-oss GGUFs: expert matrices MXFP4, everything else F32."""
    cfg = tm.hf.config
    tensors = _convert(tm.family, cfg, mxfp4_state_dict(tm.state if state is None else state))
    md = _metadata(tm.family, cfg, GGMLType.MXFP4)
    w = GGUFWriter(path, arch=ARCH)
    for k, v in md.items():
        if isinstance(v, float):
            w.add_key_value(k, v, GGUFValueType.FLOAT32)
        elif isinstance(v, int):
            w.add_key_value(k, v, GGUFValueType.UINT32)
        else:
            w.add_key_value(k, v)
    for name, arr in tensors.items():
        t = GGMLType.MXFP4 if is_expert_matrix(name) else GGMLType.F32
        data = quants.quantize(arr, t) if t == GGMLType.MXFP4 else np.ascontiguousarray(arr, np.float32)
        w.add_tensor(name, data, ggml_type=t, raw_shape=arr.shape if t == GGMLType.MXFP4 else None)
    w.write()
    w.close()
    return Path(path)
