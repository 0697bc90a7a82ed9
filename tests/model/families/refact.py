"""Refact: no transformers class exists (the model ships remote code, ``GPTRefactForCausalLM``), so
the oracle is a torch re-implementation of that definition: multi-query attention (one KV head; its k
and v fused in ``attn.kv``, split by the converter as llama.cpp's ``RefactModel`` does) with ALiBi
biases built as the remote code does (a cumulative sum over the causal mask times per-head slopes
``2^(-8 (h + 1) / n_head)``: row-wise a shift of ``-slope (i - j)``), a SwiGLU MLP (``gate_up_proj``:
gate first, split likewise), no biases, untied lm_head. The norms are RMS norms as llama.cpp's refact
graph (and its converter's ``layer_norm_rms_epsilon``) has them; one published revision of the remote
code uses a bias-free LayerNorm there instead. The norm modules are named ``*_norm`` (not ``ln_*``)
so that ``hf_tiny``'s randomization treats them as norms."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from torch import nn

from llamapy.ggml.types import GGMLType
from tests.model import hf_tiny
from tests.model.hf_tiny import Family


def _slopes(n_head: int) -> torch.Tensor:
    n = 2 ** math.floor(math.log2(n_head))
    m = torch.pow(torch.tensor(2.0 ** (-8.0 / n)), torch.arange(1, 1 + n))
    if n < n_head:
        m = torch.cat(
            [m, torch.pow(torch.tensor(2.0 ** (-4.0 / n)), torch.arange(1, 1 + 2 * (n_head - n), 2))]
        )
    return m


def _alibi(T: int, n_head: int) -> torch.Tensor:
    mask = (torch.triu(torch.ones((T, T))) == 1).transpose(0, 1)
    distance = mask.cumsum(dim=-1)
    return (distance[:, :, None] * _slopes(n_head)[None, None, :]).permute(2, 0, 1)  # [H, T, T]


class _RMSNorm(nn.Module):
    def __init__(self, n: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class _Block(nn.Module):
    def __init__(self, cfg: Any) -> None:
        super().__init__()
        d, self.n_head = cfg.hidden_size, cfg.num_attention_heads
        self.head_dim = d // self.n_head
        self.attn_norm = _RMSNorm(d, cfg.rms_norm_eps)
        self.ffn_norm = _RMSNorm(d, cfg.rms_norm_eps)
        self.attn = nn.ModuleDict(
            dict(
                q=nn.Linear(d, d, bias=False),
                kv=nn.Linear(d, 2 * self.head_dim, bias=False),  # [k; v] of the one KV head
                c_proj=nn.Linear(d, d, bias=False),
            )
        )
        f = cfg.intermediate_size
        self.mlp = nn.ModuleDict(
            dict(gate_up_proj=nn.Linear(d, 2 * f, bias=False), c_proj=nn.Linear(f, d, bias=False))
        )

    def forward(self, x: torch.Tensor, alibi: torch.Tensor, causal: torch.Tensor) -> torch.Tensor:
        B, T, d = x.shape
        h = self.attn_norm(x)
        a = self.attn
        q = a["q"](h).view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # [B, H, T, D]
        k, v = (t.reshape(B, 1, T, self.head_dim) for t in a["kv"](h).split(self.head_dim, dim=-1))
        w = alibi + torch.matmul(q * self.head_dim**-0.5, k.transpose(-1, -2))
        w = torch.softmax(w.masked_fill(~causal, float("-inf")), dim=-1)
        x = x + a["c_proj"](torch.matmul(w, v).transpose(1, 2).reshape(B, T, d))
        h = self.ffn_norm(x)
        m = self.mlp
        gate, up = m["gate_up_proj"](h).chunk(2, dim=-1)
        return x + m["c_proj"](torch.nn.functional.silu(gate) * up)


class TorchRefact(nn.Module):
    def __init__(self, cfg: Any) -> None:
        super().__init__()
        self.config = cfg
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(cfg.vocab_size, cfg.hidden_size),
                h=nn.ModuleList([_Block(cfg) for _ in range(cfg.num_hidden_layers)]),
            )
        )
        self.norm_f = _RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, output_hidden_states: bool = False, **_: Any) -> Any:
        x = self.transformer["wte"](input_ids)
        T = x.shape[1]
        alibi, causal = (
            _alibi(T, self.config.num_attention_heads),
            torch.tril(torch.ones(T, T, dtype=torch.bool)),
        )
        hs = [x]
        for blk in self.transformer["h"]:
            x = blk(x, alibi, causal)
            hs.append(x)
        x = self.norm_f(x)
        hs[-1] = x  # as transformers: the last hidden state after the final norm
        return SimpleNamespace(
            logits=self.lm_head(x), hidden_states=tuple(hs) if output_hidden_states else None
        )


_NAMES = {
    "attn_norm.weight": "attn_norm.weight",
    "ffn_norm.weight": "ffn_norm.weight",
    "attn.q.weight": "attn_q.weight",
    "attn.c_proj.weight": "attn_output.weight",
    "mlp.c_proj.weight": "ffn_down.weight",
}


def _convert(family: Family, cfg: Any, sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for k, v in sd.items():
        v = np.ascontiguousarray(v, dtype=np.float32)
        if k == "transformer.wte.weight":
            out["token_embd.weight"] = v
        elif k == "norm_f.weight":
            out["output_norm.weight"] = v
        elif k == "lm_head.weight":
            out["output.weight"] = v
        else:
            il, rest = k[len("transformer.h.") :].split(".", 1)
            if rest in ("attn.kv.weight", "mlp.gate_up_proj.weight"):  # split as llama.cpp's RefactModel
                n = v.shape[0] // 2
                a, b = ("attn_k", "attn_v") if rest.startswith("attn") else ("ffn_gate", "ffn_up")
                out[f"blk.{il}.{a}.weight"] = np.ascontiguousarray(v[:n])
                out[f"blk.{il}.{b}.weight"] = np.ascontiguousarray(v[n:])
            else:
                out[f"blk.{il}.{_NAMES[rest]}"] = v
    return out


def _metadata(family: Family, cfg: Any, ftype: GGMLType) -> dict[str, Any]:
    md = hf_tiny.metadata(Family(family.name, family.arch, family.config_cls), cfg, ftype)
    for k in ("rope.freq_base", "rope.dimension_count"):  # (no rope)
        md.pop(f"{family.arch}.{k}", None)
    return md


hf_tiny.register(
    Family(
        "refact",
        "refact",
        "LlamaConfig",  # a carrier of the sizes only: the model is TorchRefact
        dict(num_key_value_heads=1, intermediate_size=96, rms_norm_eps=1e-5),
        hf_model=TorchRefact,
        convert_fn=_convert,
        metadata_fn=_metadata,
    )
)
