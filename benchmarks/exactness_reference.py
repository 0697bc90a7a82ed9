"""The exact model of ``benchmarks/exactness.py``: every tensor of the GGUF file dequantized into
transformers' Llama / Gemma 3 modules, run in float64."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


# ---------------------------------------------------------------------------------------------
# the exact model


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of convert_hf_to_gguf.py's LlamaModel.permute (ggml's interleaved rope rows -> HF's halves)."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


_LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
}


def _rope_float64(rot: Any, bases: dict[str | None, float], dim: int) -> None:
    """HF computes the rotary angles in float32 whatever the model's dtype: recompute them in float64."""
    import torch

    inv = {lt: 1.0 / (b ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)) for lt, b in bases.items()}

    def forward(x: Any, position_ids: Any, layer_type: str | None = None) -> tuple[Any, Any]:
        freqs = position_ids[..., None].double() * inv[layer_type]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    rot.forward = forward


def exact_model(path: Path) -> Any:
    """The file's weights, dequantized by llamapy, in a float64 transformers model of its architecture."""
    import torch
    import transformers

    from llamapy.ggml import quants
    from llamapy.gguf import GGUFReader

    r = GGUFReader(path)
    md = r.metadata
    arch = md["general.architecture"]

    def k(name: str, default: Any = None) -> Any:
        return md.get(f"{arch}.{name}", default)

    n_embd, n_head, n_head_kv = k("embedding_length"), k("attention.head_count"), k("attention.head_count_kv")
    head_dim = k("attention.key_length", n_embd // n_head)
    tensors = {t.name: t for t in r}
    n_vocab = tensors["token_embd.weight"].shape[0]
    tied = "output.weight" not in tensors
    common = dict(
        vocab_size=n_vocab,
        hidden_size=n_embd,
        intermediate_size=k("feed_forward_length"),
        num_hidden_layers=k("block_count"),
        num_attention_heads=n_head,
        num_key_value_heads=n_head_kv,
        head_dim=head_dim,
        max_position_embeddings=k("context_length"),
        rms_norm_eps=float(k("attention.layer_norm_rms_epsilon")),
        tie_word_embeddings=tied,
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
    )
    if arch == "llama":
        cfg = transformers.LlamaConfig(
            **common, rope_parameters={"rope_type": "default", "rope_theta": float(k("rope.freq_base"))}
        )
        cls = transformers.LlamaForCausalLM
    elif arch == "qwen2":  # llama's graph with q/k/v biases; its q/k rows are stored as HF's (NEOX rope)
        cfg = transformers.Qwen2Config(
            **common,
            use_sliding_window=False,
            rope_parameters={"rope_type": "default", "rope_theta": float(k("rope.freq_base"))},
        )
        cls = transformers.Qwen2ForCausalLM
    elif arch == "gemma3":
        n_layer = common["num_hidden_layers"]
        # llamapy's and llama.cpp's default pattern: every 6th layer global
        layer_types = ["full_attention" if il % 6 == 5 else "sliding_attention" for il in range(n_layer)]
        if md.get("gemma3.attention.sliding_window_pattern") is not None:
            raise NotImplementedError("gemma3.attention.sliding_window_pattern in the file")
        cfg = transformers.Gemma3TextConfig(
            **common,
            query_pre_attn_scalar=head_dim,
            sliding_window=k("attention.sliding_window"),
            layer_types=layer_types,
            hidden_activation="gelu_pytorch_tanh",
            final_logit_softcapping=None,
            attn_logit_softcapping=None,
            rope_parameters={
                "full_attention": {"rope_type": "default", "rope_theta": float(k("rope.freq_base"))},
                "sliding_attention": {
                    "rope_type": "default",
                    "rope_theta": float(k("rope.freq_base_swa", 1e4)),
                },
            },
        )
        cls = transformers.Gemma3ForCausalLM
    else:
        raise NotImplementedError(f"{path}: no exact model for architecture {arch!r}")
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    dt = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        model = cls(cfg)
    finally:
        torch.set_default_dtype(dt)
    sd: dict[str, Any] = {}
    for name, t in tensors.items():
        w = np.asarray(quants.dequantize(t.array(), t.ggml_type), dtype=np.float64).reshape(t.shape)
        if arch == "gemma3" and name.endswith("norm.weight"):
            w = w - 1.0  # the file stores 1 + w; HF's Gemma RMSNorm multiplies by (1 + w) (exact in f64)
        if name == "token_embd.weight":
            sd["model.embed_tokens.weight"] = w
            if tied:
                sd["lm_head.weight"] = w
        elif name == "output.weight":
            sd["lm_head.weight"] = w
        elif name == "output_norm.weight":
            sd["model.norm.weight"] = w
        elif name.startswith("blk."):
            il, rest = name[4:].split(".", 1)
            if rest == "ffn_norm.weight":
                hf = (
                    "pre_feedforward_layernorm.weight"
                    if arch == "gemma3"
                    else "post_attention_layernorm.weight"
                )
            elif rest == "post_attention_norm.weight":
                hf = "post_attention_layernorm.weight"
            else:
                hf = _LAYER[rest]
            if arch == "llama" and rest == "attn_q.weight":
                w = _unpermute(w, n_head)
            elif arch == "llama" and rest == "attn_k.weight":
                w = _unpermute(w, n_head_kv)
            sd[f"model.layers.{il}.{hf}"] = w
        else:
            raise KeyError(f"{path}: no HF name for tensor {name!r}")
    missing = set(model.state_dict()) - set(sd)
    if missing:
        raise KeyError(f"{path}: tensors missing for the HF model: {sorted(missing)[:5]}")
    with torch.no_grad():
        for n, p in model.state_dict().items():
            if n in sd:
                p.copy_(torch.from_numpy(np.ascontiguousarray(sd[n])))
    if arch == "gemma3":  # sqrt(n_embd) in float64 (HF keeps it as a float32 buffer)
        model.model.embed_tokens.embed_scale = torch.tensor(math.sqrt(n_embd), dtype=torch.float64)
        bases = {lt: cfg.rope_parameters[lt]["rope_theta"] for lt in set(layer_types)}
    else:
        bases = {None: cfg.rope_parameters["rope_theta"]}
    _rope_float64(model.model.rotary_emb, bases, head_dim)
    model.eval()
    model.gguf_path = path
    r.close()
    return model


def exact_logits(model: Any, tokens: list[int], rows: slice) -> np.ndarray:
    """Exact logits (float64) of ``tokens[rows]``: one forward of the whole sequence, no cache (the same
    arithmetic as a KV-cached decode, without 32 sequential calls)."""
    import torch

    with torch.no_grad():
        h = model.model(torch.tensor([tokens])).last_hidden_state[0, rows]
        return model.lm_head(h).numpy()
