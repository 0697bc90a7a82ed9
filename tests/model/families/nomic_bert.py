"""nomic-bert as llama.cpp's converter writes nomic-embed-text: the reference is transformers'
NomicBertModel, whose separate q/k/v projections the converter here fuses into ``attn_qkv`` (the
original checkpoints' ``Wqkv``); rotary base from the config, mean pooling."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch
import transformers
from torch import nn

from llamapy.ggml.types import GGMLType
from tests.model import hf_tiny
from tests.model.families.bert import encoder_metadata
from tests.model.hf_tiny import Family

_LAYER = {
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "attn_output_norm.weight",
    "post_attention_layernorm.bias": "attn_output_norm.bias",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "post_mlp_layernorm.weight": "layer_output_norm.weight",
    "post_mlp_layernorm.bias": "layer_output_norm.bias",
}
_TOP = {
    "embeddings.word_embeddings.weight": "token_embd.weight",
    "embeddings.token_type_embeddings.weight": "token_types.weight",
    "embeddings.LayerNorm.weight": "token_embd_norm.weight",
    "embeddings.LayerNorm.bias": "token_embd_norm.bias",
}


def _convert(family: Family, cfg: Any, sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for name, w in sd.items():
        w = np.ascontiguousarray(np.asarray(w, dtype=np.float32))
        if name in _TOP:
            out[_TOP[name]] = w
        elif name.startswith("layers."):
            il, rest = name[len("layers.") :].split(".", 1)
            if rest in ("self_attn.q_proj.weight", "self_attn.k_proj.weight"):
                continue
            if rest == "self_attn.v_proj.weight":
                qkv = [sd[f"layers.{il}.self_attn.{p}_proj.weight"] for p in "qkv"]
                out[f"blk.{il}.attn_qkv.weight"] = np.ascontiguousarray(np.concatenate(qkv), dtype=np.float32)
                continue
            out[f"blk.{il}.{_LAYER[rest]}"] = w
        elif "rotary" not in name:
            raise KeyError(f"no GGUF name for HF tensor {name!r}")
    return out


def _metadata(family: Family, cfg: Any, ftype: GGMLType) -> dict[str, Any]:
    md = encoder_metadata(family, cfg, ftype, 1, cfg.max_position_embeddings)
    md[f"{family.arch}.rope.freq_base"] = float(cfg.rope_parameters["rope_theta"])
    return md


hf_tiny.register(
    Family(
        "nomic-bert",
        "nomic-bert",
        "NomicBertConfig",
        dict(
            vocab_size=hf_tiny.N_VOCAB,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            head_dim=16,
            max_position_embeddings=hf_tiny.N_CTX,
            rope_parameters={"rope_theta": 1000.0, "rope_type": "default"},
        ),
        kind="encoder",
        hf_model=transformers.NomicBertModel,
        convert_fn=_convert,
        metadata_fn=_metadata,
        common_config=False,
    )
)


# -- nomic-bert-moe ------------------------------------------------------------------------------
# transformers has no class for it: NomicBertModel with its MLPs replaced as nomic-embed-text-v2-moe's
# layers compute them in llama.cpp's graph: a GELU MLP with biases, and on odd layers (every 2nd) a
# mixture of 4 GELU experts, softmax routing, the top-2 probabilities as weights (not renormalized).
N_EXPERT, N_USED = 4, 2


class _SeqMLP(nn.Module):
    def __init__(self, e: int, f: int) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(e, f), nn.Linear(f, e)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.gelu(self.up(x), approximate="tanh"))


class _MoE(nn.Module):
    def __init__(self, e: int, f: int) -> None:
        super().__init__()
        self.router = nn.Linear(e, N_EXPERT, bias=False)
        self.experts_up = nn.Parameter(torch.zeros(N_EXPERT, f, e))
        self.experts_down = nn.Parameter(torch.zeros(N_EXPERT, e, f))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(self.router(x), dim=-1)
        w, ids = torch.topk(probs, N_USED, dim=-1)
        out = torch.zeros_like(x)
        for j in range(N_USED):
            up = self.experts_up[ids[..., j]]  # [B, T, f, e]
            h = torch.nn.functional.gelu((up @ x[..., None])[..., 0], approximate="tanh")
            down = self.experts_down[ids[..., j]]  # [B, T, e, f]
            out = out + w[..., j : j + 1] * (down @ h[..., None])[..., 0]
        return out


def _moe_model(cfg: Any) -> nn.Module:
    m = transformers.NomicBertModel(cfg)
    for il, layer in enumerate(m.layers):
        e, f = cfg.hidden_size, cfg.intermediate_size
        layer.mlp = _MoE(e, f) if il % 2 == 1 else _SeqMLP(e, f)
    return m


_MOE_NAMES = {
    "mlp.up.weight": "ffn_up.weight",
    "mlp.up.bias": "ffn_up.bias",
    "mlp.down.weight": "ffn_down.weight",
    "mlp.down.bias": "ffn_down.bias",
    "mlp.router.weight": "ffn_gate_inp.weight",
    "mlp.experts_up": "ffn_up_exps.weight",
    "mlp.experts_down": "ffn_down_exps.weight",
}


def _convert_moe(family: Family, cfg: Any, sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    moe = {k: v for k, v in sd.items() if k.split(".", 2)[-1] in _MOE_NAMES}
    out = _convert(family, cfg, {k: v for k, v in sd.items() if k not in moe})
    for k, v in moe.items():
        il, rest = k[len("layers.") :].split(".", 1)
        out[f"blk.{il}.{_MOE_NAMES[rest]}"] = np.ascontiguousarray(v, dtype=np.float32)
    return out


def _metadata_moe(family: Family, cfg: Any, ftype: GGMLType) -> dict[str, Any]:
    md = _metadata(family, cfg, ftype)
    a = family.arch
    md[f"{a}.expert_count"] = N_EXPERT
    md[f"{a}.expert_used_count"] = N_USED
    md[f"{a}.moe_every_n_layers"] = 2
    return md


hf_tiny.register(
    dataclasses.replace(
        hf_tiny.FAMILIES["nomic-bert"],
        name="nomic-bert-moe",
        arch="nomic-bert-moe",
        config_kw={**hf_tiny.FAMILIES["nomic-bert"].config_kw, "num_hidden_layers": 4},
        hf_model=_moe_model,
        convert_fn=_convert_moe,
        metadata_fn=_metadata_moe,
        f32_names=("mlp.router.weight",),
    )
)
