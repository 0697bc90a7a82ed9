"""PhiMoE: top-2 of 4 experts, biases on q/k/v/o and the LayerNorms, an output bias. The oracle is
HF's ``PhimoeForCausalLM`` with its router patched to llama.cpp's routing (softmax over the router
logits, top-k, the weights renormalized): HF's "sparsemixer" routes differently even in eval, and
llamapy does what llama.cpp does. Everything else (attention, norms, experts, head) is HF's own."""

from __future__ import annotations

import dataclasses
import types
from typing import Any

import numpy as np
import torch
import transformers

from llamapy.ggml.types import GGMLType
from tests.model import hf_tiny
from tests.model.families.glm4moe import convert_special
from tests.model.hf_tiny import Family


def _llamacpp_route(self: torch.nn.Module, hidden_states: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX with norm_w: softmax, top-k, renormalize."""
    logits = torch.nn.functional.linear(hidden_states, self.weight)
    probs = torch.softmax(logits.float(), dim=-1)
    w, ids = torch.topk(probs, self.top_k, dim=-1)
    return logits, (w / w.sum(-1, keepdim=True)).to(hidden_states.dtype), ids


def _hf_model(cfg: Any) -> torch.nn.Module:
    model = transformers.PhimoeForCausalLM(cfg)
    for layer in model.model.layers:
        layer.mlp.router.forward = types.MethodType(_llamacpp_route, layer.mlp.router)
    return model


def _convert(family: Family, cfg: Any, sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    rest = {k: v for k, v in sd.items() if k != "lm_head.bias"}
    out = convert_special(family, cfg, rest, {"mlp.router.weight": "ffn_gate_inp.weight"})
    out["output.bias"] = np.asarray(sd["lm_head.bias"], np.float32)
    return out


def _metadata(family: Family, cfg: Any, ftype: GGMLType) -> dict[str, Any]:
    a = family.arch
    md = hf_tiny.metadata(dataclasses.replace(family, metadata_fn=None), cfg, ftype)
    md[f"{a}.expert_count"] = cfg.num_local_experts
    md[f"{a}.expert_used_count"] = cfg.num_experts_per_tok
    md[f"{a}.rope.scaling.original_context_length"] = cfg.max_position_embeddings
    return md


hf_tiny.register(
    Family(
        "phimoe",
        "phimoe",
        "PhimoeConfig",
        dict(
            intermediate_size=32,
            num_local_experts=4,
            num_experts_per_tok=2,
            attention_bias=True,
            lm_head_bias=True,
            rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
        hf_model=_hf_model,
        convert_fn=_convert,
        metadata_fn=_metadata,
        f32_names=("mlp.router.weight",),
    )
)
