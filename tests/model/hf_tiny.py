"""Tiny random-weight Hugging Face models of each family, converted to GGUF the way llama.cpp's
``convert_hf_to_gguf.py`` does and written with our own ``GGUFWriter`` (test-only: imports torch and
transformers; the package never does).

- ``FAMILIES``: one tiny config per family (hidden 64, 4 heads / 2 KV heads, vocab 256).
- ``build_hf(family)``: the transformers model (eager attention, float32) with random weights large
  enough that every part of the network moves the logits.
- ``effective_state_dict(sd, ftype)``: the HF weights as the file stores them (F16 rounding, Q8_0
  quantize + dequantize), so that the oracle runs with exactly the weights llamapy reads.
- ``convert(family, config, sd)``: GGUF tensor names/layout and metadata; ``write_gguf`` writes them.

A family whose conversion does not fit the shared mapping lives in its own module under
``tests/model/families/`` (found and imported at the end of this file): it calls ``register`` with a
``Family`` that carries its own hooks (``hf_model``, ``convert_fn``, ``metadata_fn``, ``f32_names``), and
sets ``kind`` when its oracle is not causal-LM logits (``test_arch_hf`` runs the ``"causal-lm"`` ones).
"""

from __future__ import annotations

import importlib
import math
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers

from llamapy.ggml import quants
from llamapy.ggml.types import GGMLType
from llamapy.gguf import GGUFValueType
from llamapy.gguf.writer import GGUFWriter

N_VOCAB = 256
N_CTX = 256

# general.file_type of llama.cpp (LLAMA_FTYPE_*)
FILE_TYPES = {GGMLType.F32: 0, GGMLType.F16: 1, GGMLType.Q8_0: 7}


def _common(**kw: Any) -> dict[str, Any]:
    d: dict[str, Any] = dict(
        vocab_size=N_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=N_CTX,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
    )
    d.update(kw)
    return d


@dataclass(frozen=True)
class Family:
    """One test family: the transformers config class and keyword arguments, and the GGUF arch."""

    name: str
    arch: str  # general.architecture written to the file
    config_cls: str  # transformers config class name
    config_kw: dict[str, Any] = field(default_factory=dict)
    # what the oracle compares: "causal-lm" (logits, test_arch_hf / test_hf_oracle), or the family
    # module's own (e.g. "encoder": pooled and per-token embeddings)
    kind: str = "causal-lm"
    # hooks of a family module (None: the shared path below)
    hf_model: Callable[[Any], torch.nn.Module] | None = None  # config -> the transformers model
    convert_fn: Callable[[Family, Any, dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None
    metadata_fn: Callable[[Family, Any, GGMLType], dict[str, Any]] | None = None  # replaces metadata()
    f32_names: tuple[str, ...] = ()  # name suffixes (HF or GGUF) stored in F32 whatever the file type
    common_config: bool = True  # start from _common()'s defaults

    def config(self) -> Any:
        kw = _common(**self.config_kw) if self.common_config else dict(self.config_kw)
        cfg = getattr(transformers, self.config_cls)(**kw)
        cfg._attn_implementation = "eager"
        return cfg


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in [
        Family(
            "llama",
            "llama",
            "LlamaConfig",
            dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        ),
        Family(
            "llama3",
            "llama",
            "LlamaConfig",
            dict(
                num_hidden_layers=3,
                max_position_embeddings=N_CTX,
                rope_parameters={
                    "rope_type": "llama3",
                    "rope_theta": 500000.0,
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64,
                },
            ),
        ),
        # Mistral 7B v0.1's window (4096) is longer than any test prompt; llama.cpp's converter maps
        # MistralForCausalLM to the llama arch and does not write it.
        Family("mistral", "llama", "MistralConfig", dict(sliding_window=4096, head_dim=16)),
        # files written with general.architecture "mistral" (llama's layout and graph)
        Family("mistral-arch", "mistral", "MistralConfig", dict(sliding_window=4096, head_dim=16)),
        Family("qwen2", "qwen2", "Qwen2Config", dict(tie_word_embeddings=True)),
        Family("qwen3", "qwen3", "Qwen3Config", dict(head_dim=32)),
        Family(
            "qwen3moe",
            "qwen3moe",
            "Qwen3MoeConfig",
            dict(
                head_dim=16,
                num_experts=4,
                num_experts_per_tok=2,
                moe_intermediate_size=32,
                norm_topk_prob=True,
            ),
        ),
        Family(
            "gemma",
            "gemma",
            "GemmaConfig",
            dict(head_dim=16, hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True),
        ),
        Family(
            "gemma2",
            "gemma2",
            "Gemma2Config",
            dict(
                num_hidden_layers=3,
                head_dim=16,
                query_pre_attn_scalar=16,
                sliding_window=4,
                attn_logit_softcapping=10.0,
                final_logit_softcapping=15.0,
                tie_word_embeddings=True,
            ),
        ),
        Family(
            "gemma3",
            "gemma3",
            "Gemma3TextConfig",
            dict(
                num_hidden_layers=6,
                head_dim=16,
                query_pre_attn_scalar=16,
                sliding_window=4,
                tie_word_embeddings=True,
            ),
        ),
        # Gemma 3 4B+: linear rope scaling on the global layers only
        Family(
            "gemma3-linear",
            "gemma3",
            "Gemma3TextConfig",
            dict(
                num_hidden_layers=6,
                head_dim=16,
                query_pre_attn_scalar=16,
                sliding_window=4,
                tie_word_embeddings=True,
                rope_parameters={
                    "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                },
            ),
        ),
        Family("phi3", "phi3", "Phi3Config", dict(sliding_window=None)),
        # Phi-3 128k: LongRoPE, short factors up to the original context, long ones beyond
        Family(
            "phi3-longrope",
            "phi3",
            "Phi3Config",
            dict(
                sliding_window=None,
                max_position_embeddings=4 * N_CTX,
                original_max_position_embeddings=N_CTX,
                rope_parameters={
                    "rope_type": "longrope",
                    "rope_theta": 10000.0,
                    "original_max_position_embeddings": N_CTX,
                    "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.0, 3.5],
                    "long_factor": [1.0, 1.5, 2.5, 4.0, 6.0, 9.0, 12.0, 16.0],
                },
            ),
        ),
        # NoPE on every 4th layer (3 here: l_out-3 is compared, the last layer through the logits)
        Family("smollm3", "smollm3", "SmolLM3Config", dict(num_hidden_layers=5)),
        Family("olmo2", "olmo2", "Olmo2Config"),
        # the four multipliers away from 1 (attention 0.5, not 1/sqrt(16)), so each one shows
        Family(
            "granite",
            "granite",
            "GraniteConfig",
            dict(
                embedding_multiplier=3.0,
                attention_multiplier=0.5,
                residual_multiplier=0.6,
                logits_scaling=4.0,
            ),
        ),
        Family(
            "granitemoe",
            "granitemoe",
            "GraniteMoeConfig",
            dict(
                intermediate_size=32,
                num_local_experts=4,
                num_experts_per_tok=2,
                embedding_multiplier=3.0,
                attention_multiplier=0.5,
                residual_multiplier=0.6,
                logits_scaling=4.0,
            ),
        ),
        # the shared expert (sigmoid-gated) beside top-2 of 4 experts, weights not renormalized
        Family(
            "qwen2moe",
            "qwen2moe",
            "Qwen2MoeConfig",
            dict(
                num_experts=4,
                num_experts_per_tok=2,
                moe_intermediate_size=32,
                shared_expert_intermediate_size=64,
                norm_topk_prob=False,
            ),
        ),
        # llama.cpp's converter writes OLMoE's RMS epsilon as 1e-5 whatever the config says; its
        # loader expects no GQA (attn_k_norm is n_embd wide), as the real models
        Family(
            "olmoe",
            "olmoe",
            "OlmoeConfig",
            dict(
                intermediate_size=32,
                num_experts=4,
                num_experts_per_tok=2,
                rms_norm_eps=1e-5,
                num_key_value_heads=4,
            ),
        ),
        # LayerNorms with biases, biases on every projection, a GELU (tanh) MLP, tied output
        Family("starcoder2", "starcoder2", "Starcoder2Config", dict(sliding_window=None, norm_epsilon=1e-5)),
        # partial rotary (a quarter of the head), q/k/v biases, per-head q/k LayerNorms
        Family(
            "stablelm",
            "stablelm",
            "StableLmConfig",
            dict(
                use_qkv_bias=True,
                qk_layernorm=True,
                layer_norm_eps=1e-5,
                rope_parameters={
                    "rope_type": "default",
                    "rope_theta": 10000.0,
                    "partial_rotary_factor": 0.25,
                },
            ),
        ),
        # StableLM's parallel residual: no FFN norm, x += attn(n) + ffn(n)
        Family(
            "stablelm-parallel",
            "stablelm",
            "StableLmConfig",
            dict(
                use_parallel_residual=True,
                layer_norm_eps=1e-5,
                rope_parameters={
                    "rope_type": "default",
                    "rope_theta": 10000.0,
                    "partial_rotary_factor": 0.25,
                },
            ),
        ),
        # parallel attention + FFN from one LayerNorm, interleaved rope, logits x logit_scale (tied)
        # (llama.cpp always ties Cohere's output to the embeddings)
        Family(
            "command-r",
            "command-r",
            "CohereConfig",
            dict(logit_scale=0.5, layer_norm_eps=1e-5, tie_word_embeddings=True),
        ),
        # 3 sliding-window layers (window 4 < the prompts) then a global one without rope
        Family(
            "cohere2",
            "cohere2",
            "Cohere2Config",
            dict(
                num_hidden_layers=4,
                sliding_window=4,
                logit_scale=0.5,
                layer_norm_eps=1e-5,
                tie_word_embeddings=True,
            ),
        ),
        # learned positions, fused QKV (HF's Conv1D weights transposed), GELU MLP, biases, tied output
        Family(
            "gpt2",
            "gpt2",
            "GPT2Config",
            dict(
                num_key_value_heads=4,
                intermediate_size=256,
                layer_norm_epsilon=1e-5,
                tie_word_embeddings=True,
            ),
        ),
    ]
}


# ---------------------------------------------------------------------------------------------
# the HF model


def _randomize(model: torch.nn.Module, family: Family, seed: int) -> None:
    """Weights of unit-ish scale: matrices ~ N(0, 1/fan_in) (q, k: 4/fan_in), norms around 1 (gemma's stored as w,
    used as 1 + w), biases small, embeddings N(0, 1) (N(0, 1/16) when tied to the output)."""
    g = torch.Generator().manual_seed(seed)
    # Gemma 3n / 4 norms multiply by w itself, the older Gemmas by 1 + w
    gemma = family.arch.startswith("gemma") and family.arch not in ("gemma3n", "gemma4")
    tied = bool(model.config.tie_word_embeddings)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                noise = torch.randn(p.shape, generator=g) * 0.1
                if "norm" in name.lower() and not name.endswith("bias"):  # (BERT's LayerNorm too)
                    p.copy_(noise if gemma else 1.0 + noise)
                else:  # biases
                    p.copy_(noise * 2)
            elif "embed_tokens" in name or name.endswith("wte.weight"):  # tied: smaller, logits O(1..10)
                p.copy_(torch.randn(p.shape, generator=g) * (0.25 if tied else 1.0))
            else:  # q and k larger: peaked attention, soft-capping that bites
                gain = 2.0 if name.endswith(("q_proj.weight", "k_proj.weight")) else 1.0
                p.copy_(torch.randn(p.shape, generator=g) * (gain / math.sqrt(p.shape[-1])))


def build_hf(family: Family, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    if family.hf_model is not None:
        model = family.hf_model(family.config()).to(torch.float32)
    else:
        model = transformers.AutoModelForCausalLM.from_config(
            family.config(), attn_implementation="eager", dtype=torch.float32
        )
    _randomize(model, family, seed)
    model.eval()
    return model


def hf_logits(model: torch.nn.Module, tokens: list[int]) -> np.ndarray:
    with torch.no_grad():
        out = model(input_ids=torch.tensor([tokens], dtype=torch.long), use_cache=False)
    return out.logits[0].float().numpy()


def load_state_dict(model: torch.nn.Module, sd: dict[str, np.ndarray]) -> None:
    model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()}, strict=False)


# ---------------------------------------------------------------------------------------------
# which tensors are stored in the file's type (as llama.cpp: matrices; norms, biases, router in F32)


def _is_router(name: str) -> bool:
    return name.endswith(
        (
            "mlp.gate.weight",
            "ffn_gate_inp.weight",
            "block_sparse_moe.router.weight",
            "mlp.shared_expert_gate.weight",  # qwen2moe's shared-expert gate
            "ffn_gate_inp_shexp.weight",
        )
    )


def stored_type(name: str, arr: np.ndarray, ftype: GGMLType) -> GGMLType:
    if arr.ndim < 2 or _is_router(name) or name.endswith("_norm.weight"):  # stablelm's per-head norms
        return GGMLType.F32
    if any(name.endswith(s) for f in FAMILIES.values() for s in f.f32_names):
        return GGMLType.F32
    return ftype


def roundtrip(x: np.ndarray, t: GGMLType) -> np.ndarray:
    """``x`` as stored in type ``t`` and read back (quantized row-wise along the last axis)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if t == GGMLType.F32:
        return x
    if t == GGMLType.F16:
        return x.astype(np.float16).astype(np.float32)
    return quants.dequantize(quants.quantize(x, t), t).reshape(x.shape)


def hf_state_dict(model: torch.nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().float().numpy().copy() for k, v in model.state_dict().items()}


def effective_state_dict(sd: dict[str, np.ndarray], ftype: GGMLType) -> dict[str, np.ndarray]:
    """The HF weights as a file of type ``ftype`` stores them. Every conversion step (row permutation,
    concatenation, stacking, +1 on F32 norms) commutes with row-wise rounding, so rounding here equals
    rounding the converted tensors (``test_hf_oracle`` checks that on the written file); GPT-2's Conv1D
    weights, which the file stores transposed, are rounded along their columns."""
    return {
        k: roundtrip(v.T, stored_type(k, v, ftype)).T
        if _is_conv1d(k)
        else roundtrip(v, stored_type(k, v, ftype))
        for k, v in sd.items()
    }


_GPT2_LAYER = {
    "ln_1.weight": "attn_norm.weight",
    "ln_1.bias": "attn_norm.bias",
    "attn.c_attn.weight": "attn_qkv.weight",
    "attn.c_attn.bias": "attn_qkv.bias",
    "attn.c_proj.weight": "attn_output.weight",
    "attn.c_proj.bias": "attn_output.bias",
    "ln_2.weight": "ffn_norm.weight",
    "ln_2.bias": "ffn_norm.bias",
    "mlp.c_fc.weight": "ffn_up.weight",
    "mlp.c_fc.bias": "ffn_up.bias",
    "mlp.c_proj.weight": "ffn_down.weight",
    "mlp.c_proj.bias": "ffn_down.bias",
}
_GPT2_TOP = {
    "transformer.wte.weight": "token_embd.weight",
    "transformer.wpe.weight": "position_embd.weight",
    "transformer.ln_f.weight": "output_norm.weight",
    "transformer.ln_f.bias": "output_norm.bias",
}


def _is_conv1d(name: str) -> bool:
    """GPT-2's Conv1D weights ([in, out]; the file stores them transposed, so the file's rows are
    their columns: round along that axis)."""
    return name.startswith("transformer.h.") and name.endswith(
        ("c_attn.weight", "c_proj.weight", "c_fc.weight")
    )


def _convert_gpt2(sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for name, w in sd.items():
        w = np.asarray(w, dtype=np.float32)
        if name in _GPT2_TOP:
            out[_GPT2_TOP[name]] = w
        elif name.startswith("transformer.h."):
            il, rest = name[len("transformer.h.") :].split(".", 1)
            out[f"blk.{il}.{_GPT2_LAYER[rest]}"] = np.ascontiguousarray(w.T if _is_conv1d(name) else w)
        elif name != "lm_head.weight":  # tied
            raise KeyError(f"no GGUF name for HF tensor {name!r}")
    return out


# ---------------------------------------------------------------------------------------------
# HF -> GGUF (convert_hf_to_gguf.py)


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute: HF's rotate-half q/k rows -> ggml's interleaved (normal) rope."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


_LAYER_MAP = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.qkv_proj.weight": "attn_qkv.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "mlp.gate_up_proj.weight": "ffn_up.weight",  # phi3: fused [gate; up]
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.experts.down_proj": "ffn_down_exps.weight",
    "block_sparse_moe.router.weight": "ffn_gate_inp.weight",  # granitemoe
    "block_sparse_moe.experts.down_proj": "ffn_down_exps.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "input_layernorm.bias": "attn_norm.bias",
    "self_attn.o_proj.bias": "attn_output.bias",
    "mlp.c_fc.weight": "ffn_up.weight",  # starcoder2
    "mlp.c_fc.bias": "ffn_up.bias",
    "mlp.c_proj.weight": "ffn_down.weight",
    "mlp.c_proj.bias": "ffn_down.bias",
    "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",  # qwen2moe
    "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
}


def _layer_name(arch: str, rest: str) -> str:
    if rest == "post_attention_layernorm.bias":
        return "ffn_norm.bias"
    if rest == "post_attention_layernorm.weight":
        # gemma2/3 have four norms per layer and olmo2 post-norms; the others call their pre-FFN norm
        # post_attention
        return "post_attention_norm.weight" if arch in ("gemma2", "gemma3", "olmo2") else "ffn_norm.weight"
    if rest not in _LAYER_MAP:
        raise KeyError(f"no GGUF name for HF tensor {rest!r} ({arch})")
    return _LAYER_MAP[rest]


def llama3_rope_factors(cfg: Any) -> np.ndarray:
    """``rope_freqs.weight`` as convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors writes it."""
    rp = cfg.rope_parameters
    base = rp["rope_theta"]
    dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor, lo, hi = rp.get("factor", 8.0), rp.get("low_freq_factor", 1.0), rp.get("high_freq_factor", 4.0)
    old = rp.get("original_max_position_embeddings", 8192)
    lo_wl, hi_wl = old / lo, old / hi
    out = []
    for f in freqs:
        wl = 2 * math.pi / f
        if wl < hi_wl:
            out.append(1.0)
        elif wl > lo_wl:
            out.append(factor)
        else:
            smooth = (old / wl - lo) / (hi - lo)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


# archs converted by LlamaModel (or a subclass: SmolLM3Model, GraniteModel, GraniteMoeModel), which
# permutes q/k rows for ggml's normal rope
_PERMUTED = ("llama", "mistral", "smollm3", "granite", "granitemoe")


def convert(family: Family, cfg: Any, sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """GGUF-named float32 tensors (NumPy order) from an HF state dict."""
    if family.convert_fn is not None:
        return family.convert_fn(family, cfg, sd)
    arch = family.arch
    if arch == "gpt2":
        return _convert_gpt2(sd)
    nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
    tied = bool(getattr(cfg, "tie_word_embeddings", False))
    out: dict[str, np.ndarray] = {}
    for name, w in sd.items():
        w = np.asarray(w, dtype=np.float32)
        if name == "model.embed_tokens.weight":
            out["token_embd.weight"] = w
        elif name == "lm_head.weight":
            if not tied:
                out["output.weight"] = w
        elif name == "model.norm.weight":
            out["output_norm.weight"] = w
        elif name == "model.norm.bias":
            out["output_norm.bias"] = w
        elif name.startswith("model.layers."):
            il, rest = name[len("model.layers.") :].split(".", 1)
            if ".norms." in rest:  # stablelm: per-head q/k LayerNorms stacked [n_head, head_dim]
                qk, h = rest.split(".norms.")[0], int(rest.split(".norms.")[1].split(".")[0])
                gname = f"blk.{il}.attn_{qk.split('.')[-1][0]}_norm.weight"
                if h == 0:
                    n = sum(1 for k in sd if k.startswith(f"model.layers.{il}.{qk}.norms."))
                    out[gname] = np.stack(
                        [np.asarray(sd[f"model.layers.{il}.{qk}.norms.{i}.weight"]) for i in range(n)]
                    ).astype(np.float32)
                continue
            if rest.endswith("experts.gate_up_proj"):  # [E, 2 n_ff, n_embd]: gate first
                n_ff = w.shape[1] // 2
                out[f"blk.{il}.ffn_gate_exps.weight"] = np.ascontiguousarray(w[:, :n_ff])
                out[f"blk.{il}.ffn_up_exps.weight"] = np.ascontiguousarray(w[:, n_ff:])
                continue
            gname = _layer_name(arch, rest)
            if arch in _PERMUTED and rest == "self_attn.q_proj.weight":
                w = _permute(w, nh)
            elif arch in _PERMUTED and rest == "self_attn.k_proj.weight":
                w = _permute(w, nkv)
            out[f"blk.{il}.{gname}"] = np.ascontiguousarray(w)
        elif "rotary_emb" in name:
            continue
        else:
            raise KeyError(f"no GGUF name for HF tensor {name!r}")
    if arch.startswith("gemma"):  # Gemma's RMSNorm multiplies by (1 + w); the file stores 1 + w
        for k in out:
            if k.endswith("norm.weight"):
                out[k] = out[k] + np.float32(1.0)
    rp = getattr(cfg, "rope_parameters", None) or {}
    if arch == "llama" and rp.get("rope_type") == "llama3":
        out["rope_freqs.weight"] = llama3_rope_factors(cfg)
    if arch == "phi3" and rp.get("rope_type") == "longrope":
        out["rope_factors_long.weight"] = np.array(rp["long_factor"], dtype=np.float32)
        out["rope_factors_short.weight"] = np.array(rp["short_factor"], dtype=np.float32)
    return out


def metadata(family: Family, cfg: Any, ftype: GGMLType) -> dict[str, Any]:
    """The GGUF keys convert_hf_to_gguf.py writes for this config (those the loader reads)."""
    if family.metadata_fn is not None:
        return family.metadata_fn(family, cfg, ftype)
    a = family.arch
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    rp = getattr(cfg, "rope_parameters", None) or {}
    if "full_attention" in rp:  # gemma3: per layer type; the file's base is the global layers'
        rp = rp["full_attention"]
    md: dict[str, Any] = {
        "general.name": f"tiny-{family.name}",
        "general.file_type": FILE_TYPES[ftype],
        f"{a}.vocab_size": cfg.vocab_size,
        f"{a}.context_length": cfg.max_position_embeddings,
        f"{a}.embedding_length": cfg.hidden_size,
        f"{a}.block_count": cfg.num_hidden_layers,
        f"{a}.feed_forward_length": cfg.intermediate_size,
        f"{a}.attention.head_count": cfg.num_attention_heads,
        f"{a}.attention.head_count_kv": cfg.num_key_value_heads,
        f"{a}.attention.key_length": head_dim,
        f"{a}.attention.value_length": head_dim,
        f"{a}.attention.layer_norm_rms_epsilon": float(cfg.rms_norm_eps),
        f"{a}.rope.freq_base": float(rp.get("rope_theta", 10000.0)),
        f"{a}.rope.dimension_count": int(head_dim * rp.get("partial_rotary_factor", 1.0)),
    }
    eps = next(
        (
            getattr(cfg, k)
            for k in ("norm_epsilon", "layer_norm_eps", "layer_norm_epsilon")
            if hasattr(cfg, k)
        ),
        None,
    )
    if eps is not None:  # LayerNorm families
        md[f"{a}.attention.layer_norm_epsilon"] = float(eps)
    if a in ("qwen3moe", "qwen2moe", "olmoe"):
        md[f"{a}.expert_count"] = cfg.num_experts
        md[f"{a}.expert_used_count"] = cfg.num_experts_per_tok
    if a in ("qwen3moe", "qwen2moe"):
        md[f"{a}.expert_feed_forward_length"] = cfg.moe_intermediate_size
    if a == "qwen2moe":
        md[f"{a}.expert_shared_feed_forward_length"] = cfg.shared_expert_intermediate_size
    if a in ("granite", "granitemoe"):  # GraniteModel.set_gguf_parameters: *_multiplier -> *_scale
        md[f"{a}.attention.scale"] = float(cfg.attention_multiplier)
        md[f"{a}.embedding_scale"] = float(cfg.embedding_multiplier)
        md[f"{a}.residual_scale"] = float(cfg.residual_multiplier)
        md[f"{a}.logit_scale"] = float(cfg.logits_scaling)
    if a == "granitemoe":
        md[f"{a}.expert_count"] = cfg.num_local_experts
        md[f"{a}.expert_used_count"] = cfg.num_experts_per_tok
    if a in ("command-r", "cohere2"):
        md[f"{a}.logit_scale"] = float(cfg.logit_scale)
    if a in ("gemma2", "gemma3", "cohere2"):
        md[f"{a}.attention.sliding_window"] = cfg.sliding_window
    if a == "gemma2":
        md[f"{a}.attn_logit_softcapping"] = float(cfg.attn_logit_softcapping)
        md[f"{a}.final_logit_softcapping"] = float(cfg.final_logit_softcapping)
    if a == "gemma3":
        glob = (cfg.rope_parameters or {}).get("full_attention", {})
        if glob.get("rope_type") == "linear":
            md[f"{a}.rope.scaling.type"] = "linear"
            md[f"{a}.rope.scaling.factor"] = float(glob["factor"])
    if a == "phi3":
        md[f"{a}.rope.scaling.original_context_length"] = cfg.original_max_position_embeddings
        md[f"{a}.attention.sliding_window"] = cfg.sliding_window or 0
        if rp.get("rope_type") == "longrope":
            scale = cfg.max_position_embeddings / cfg.original_max_position_embeddings
            orig = cfg.original_max_position_embeddings
            md[f"{a}.rope.scaling.attn_factor"] = (
                math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1 else 1.0
            )
    return md


def write_gguf(
    path: str | Path, arch: str, md: dict[str, Any], tensors: dict[str, np.ndarray], ftype: GGMLType
) -> Path:
    w = GGUFWriter(path, arch=arch)
    w.add_metadata(md, int_type=GGUFValueType.UINT32)
    for name, arr in tensors.items():
        w.add_tensor(
            name, np.ascontiguousarray(arr, dtype=np.float32), ggml_type=stored_type(name, arr, ftype)
        )
    w.write()
    w.close()
    return Path(path)


@dataclass
class TinyModel:
    """One family's HF model (with the file's effective weights per type) and its GGUF files."""

    family: Family
    hf: torch.nn.Module
    state: dict[str, np.ndarray]  # the random float32 weights
    tmpdir: Path
    files: dict[GGMLType, Path] = field(default_factory=dict)
    tensors: dict[GGMLType, dict[str, np.ndarray]] = field(default_factory=dict)  # converted, effective

    def write(self, ftype: GGMLType) -> Path:
        """The family's GGUF file of type ``ftype`` (written once)."""
        if ftype not in self.files:
            eff = effective_state_dict(self.state, ftype)
            cfg = self.hf.config
            self.tensors[ftype] = convert(self.family, cfg, eff)
            path = self.tmpdir / f"tiny-{self.family.name}-{ftype.name.lower()}.gguf"
            self.files[ftype] = write_gguf(
                path, self.family.arch, metadata(self.family, cfg, ftype), self.tensors[ftype], ftype
            )
        return self.files[ftype]

    def logits(self, tokens: list[int], ftype: GGMLType, q8_activations: bool = False) -> np.ndarray:
        """HF logits with the weights as stored in a file of type ``ftype``; with ``q8_activations``
        every linear layer's input is rounded to Q8_0 first, as llama.cpp's q8_0 dot product does."""
        load_state_dict(self.hf, effective_state_dict(self.state, ftype))
        hooks = _round_linear_inputs(self.hf) if q8_activations else []
        try:
            return hf_logits(self.hf, tokens)
        finally:
            for h in hooks:
                h.remove()


def _round_linear_inputs(model: torch.nn.Module) -> list[Any]:
    def hook(mod: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        x = np.ascontiguousarray(args[0].detach().float().numpy())
        return (torch.from_numpy(roundtrip(x, GGMLType.Q8_0)), *args[1:])

    return [
        m.register_forward_pre_hook(hook)
        for m in model.modules()
        if isinstance(m, torch.nn.Linear) and m.in_features % 32 == 0
    ]


def make_tiny(family: Family, tmpdir: Path, seed: int = 0) -> TinyModel:
    hf = build_hf(family, seed)
    return TinyModel(family, hf, hf_state_dict(hf), Path(tmpdir))


def family_models(root: Path, seed_offset: int = 0) -> Callable[[str], TinyModel]:
    """``get(name)``: the tiny model of family ``name`` (``FAMILIES``), built on first use under ``root`` and
    kept; its seed is the name's CRC-32 mod 10000 plus ``seed_offset`` (a module's own weights)."""
    cache: dict[str, TinyModel] = {}

    def get(name: str) -> TinyModel:
        if name not in cache:
            seed = zlib.crc32(name.encode()) % 10_000 + seed_offset
            cache[name] = make_tiny(FAMILIES[name], root, seed=seed)
        return cache[name]

    return get


def one_torch_thread() -> Iterator[None]:
    """torch on one thread while a module's oracle runs (its threads would fight the engine's on 2 cores),
    restored afterwards: ``_torch_threads = pytest.fixture(scope="module", autouse=True)(one_torch_thread)``."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def register(family: Family) -> Family:
    """Add a family module's case to ``FAMILIES`` (names are unique)."""
    if family.name in FAMILIES:
        raise ValueError(f"tiny family {family.name!r} is registered twice")
    FAMILIES[family.name] = family
    return family


def _load_family_modules() -> None:
    for p in sorted((Path(__file__).parent / "families").glob("[!_]*.py")):
        importlib.import_module(f"tests.model.families.{p.stem}")


_load_family_modules()


def causal_lm_families() -> list[str]:
    """Names of the families whose oracle is causal-LM logits."""
    return [n for n, f in FAMILIES.items() if f.kind == "causal-lm"]
