"""jina-bert-v2: transformers has no class for it, so the reference is written here in torch from the
HF remote code (jinaai/jina-bert-implementation, ``modeling_bert.py``): word + token-type
embeddings and their LayerNorm; per layer a post-norm self-attention whose scores get the symmetric
ALiBi bias -slope_h * |i - j| (``_get_alibi_head_slopes``: 2^(-8 (h + 1) / n_head) for a power of two
heads), then ``JinaBertGLUMLP``: ``gated_layers`` (no bias) -> gelu(first half) * second half ->
``wo`` -> LayerNorm(+ residual). The converter maps ``gated_layers`` to a fused ``ffn_up``, ``wo`` to
``ffn_down`` and ``mlp.layernorm`` to ``layer_output_norm``; mean pooling."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from torch import nn

from llamapy.ggml.types import GGMLType
from tests.model import hf_tiny
from tests.model.families.bert import _BERT_CFG, convert_bert, encoder_metadata
from tests.model.hf_tiny import Family


class _Layer(nn.Module):
    def __init__(self, cfg: Any) -> None:
        super().__init__()
        e, f = cfg.hidden_size, cfg.intermediate_size
        self.query, self.key, self.value = nn.Linear(e, e), nn.Linear(e, e), nn.Linear(e, e)
        self.dense, self.LayerNorm = nn.Linear(e, e), nn.LayerNorm(e, eps=cfg.layer_norm_eps)
        self.gated_layers = nn.Linear(e, 2 * f, bias=False)
        self.wo, self.layernorm = nn.Linear(f, e), nn.LayerNorm(e, eps=cfg.layer_norm_eps)
        self.n_head, self.n_ff = cfg.num_attention_heads, f

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        B, T, E = x.shape
        H = self.n_head

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(B, T, H, E // H).transpose(1, 2)

        q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
        s = q @ k.transpose(-1, -2) / math.sqrt(E // H) + bias
        a = (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(B, T, E)
        x = self.LayerNorm(self.dense(a) + x)
        h = self.gated_layers(x)
        h = torch.nn.functional.gelu(h[..., : self.n_ff], approximate="tanh") * h[..., self.n_ff :]
        return self.layernorm(self.wo(h) + x)


class JinaBertV2Ref(nn.Module):
    base_model_prefix = "model"  # (the model is its own base: see ``model``)

    def __init__(self, cfg: Any) -> None:
        super().__init__()
        self.config = cfg
        e = cfg.hidden_size
        self.word_embeddings = nn.Embedding(cfg.vocab_size, e)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, e)
        self.LayerNorm = nn.LayerNorm(e, eps=cfg.layer_norm_eps)
        self.layer = nn.ModuleList(_Layer(cfg) for _ in range(cfg.num_hidden_layers))

    @property
    def model(self) -> nn.Module:
        return self

    def slopes(self) -> torch.Tensor:
        n = self.config.num_attention_heads
        return torch.tensor([2.0 ** (-8.0 * (h + 1) / n) for h in range(n)])

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Any:
        T = input_ids.shape[1]
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(torch.zeros_like(input_ids))
        x = self.LayerNorm(x)
        pos = torch.arange(T)
        bias = -self.slopes()[:, None, None] * (pos[None, :, None] - pos[None, None, :]).abs()  # [H, T, T]
        bias = bias[None] + torch.where(attention_mask[:, None, None, :] > 0, 0.0, -torch.inf)
        for layer in self.layer:
            x = layer(x, bias)
        return SimpleNamespace(last_hidden_state=x)


_NAMES = {
    "query": "attention.self.query",
    "key": "attention.self.key",
    "value": "attention.self.value",
    "dense": "attention.output.dense",
    "LayerNorm": "attention.output.LayerNorm",
}


def _convert(family: Family, cfg: Any, sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    bert_sd: dict[str, np.ndarray] = {}
    out: dict[str, np.ndarray] = {}
    for name, w in sd.items():
        if name.startswith("layer."):
            il, mod, p = name[len("layer.") :].split(".")
            if mod in _NAMES:
                bert_sd[f"encoder.layer.{il}.{_NAMES[mod]}.{p}"] = w
            else:
                gname = {"gated_layers": "ffn_up", "wo": "ffn_down", "layernorm": "layer_output_norm"}[mod]
                out[f"blk.{il}.{gname}.{p}"] = np.ascontiguousarray(w, dtype=np.float32)
        else:
            bert_sd[f"embeddings.{name}"] = w
    return {**convert_bert(family, cfg, bert_sd), **out}


def _metadata(family: Family, cfg: Any, ftype: GGMLType) -> dict[str, Any]:
    return encoder_metadata(family, cfg, ftype, 1, cfg.max_position_embeddings)


hf_tiny.register(
    Family(
        "jina-bert-v2",
        "jina-bert-v2",
        "BertConfig",
        _BERT_CFG,
        kind="encoder",
        hf_model=JinaBertV2Ref,
        convert_fn=_convert,
        metadata_fn=_metadata,
        common_config=False,
    )
)
