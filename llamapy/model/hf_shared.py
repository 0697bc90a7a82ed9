"""``llamapy convert`` declarations several families share (see ``llamapy/model/hf.py``): LLaMA's
(``LLAMA_HF``: granite, mistral3 and smollm3 derive theirs from it), Gemma's ``gemma_params`` (Gemma 2
extends them) and the Qwen MoE expert sizes (``qwen_moe_params``: qwen2moe, qwen3moe), Granite's scales and fused expert FFNs (granite, granitemoe,
granitehybrid)."""

from __future__ import annotations

from .hf import HFConvert

__all__ = ["LLAMA_HF", "gemma_params", "granite_moe_tensor", "granite_params", "qwen_moe_params"]


def _llama_vocab(ctx, kv) -> None:
    """LlamaModel.set_vocab: add_prefix_space from tokenizer_config.json, SentencePiece else BPE; the
    Granite small models' vocab (49152) adds no BOS."""
    add_prefix_space = ctx.tokenizer_config().get("add_prefix_space")
    if add_prefix_space is not None:
        kv.add_add_space_prefix(add_prefix_space)
    ctx.set_vocab("spm|gpt2")
    if ctx.hparams.get("vocab_size", 32000) == 49152:
        kv.add_add_bos_token(False)


def _llama_rope_freqs(ctx):
    """LlamaModel.generate_extra_tensors: ``rope_freqs.weight`` for llama3 rope scaling."""
    import math

    import numpy as np

    rp = ctx.rope_parameters.get("full_attention", ctx.rope_parameters)
    if not rp or rp.get("rope_type", "").lower() != "llama3":
        return
    base = rp.get("rope_theta", 10000.0)
    dim = ctx.hparams.get("head_dim") or ctx.hparams["hidden_size"] // ctx.hparams["num_attention_heads"]
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor, lo, hi = rp.get("factor", 8.0), rp.get("low_freq_factor", 1.0), rp.get("high_freq_factor", 4.0)
    old = rp.get("original_max_position_embeddings", 8192)
    out = []
    for f in freqs.astype(np.float32):
        wavelen = np.float32(2 * math.pi) / f
        if wavelen < old / hi:
            out.append(1.0)
        elif wavelen > old / lo:
            out.append(factor)
        else:
            smooth = (old / wavelen - lo) / (hi - lo)
            out.append(1 / ((1 - smooth) / factor + smooth))
    yield "rope_freqs.weight", np.array(out, dtype=np.float32)


LLAMA_HF = HFConvert(
    "llama",
    ("LLaMAForCausalLM", "LlamaForCausalLM", "MistralForCausalLM"),
    vocab=_llama_vocab,
    permute_qk=True,
    vocab_size_key=True,
    rope_dim_key=True,
    extra_tensors=_llama_rope_freqs,
)


def gemma_params(ctx, kv) -> None:
    """GemmaModel.set_gguf_parameters (Gemma 2 adds its soft-capping and window)."""
    hp = ctx.hparams
    kv.add_context_length(hp["max_position_embeddings"])
    kv.add_embedding_length(hp["hidden_size"])
    kv.add_block_count(ctx.block_count)
    kv.add_feed_forward_length(hp["intermediate_size"])
    kv.add_head_count(hp["num_attention_heads"])
    kv.add_head_count_kv(hp.get("num_key_value_heads", hp["num_attention_heads"]))
    kv.add_layer_norm_rms_eps(hp["rms_norm_eps"])
    kv.add_key_length(hp["head_dim"])
    kv.add_value_length(hp["head_dim"])
    kv.add_file_type(ctx.file_type)


def qwen_moe_params(ctx, kv) -> None:
    """Qwen2MoeModel.set_gguf_parameters: the expert FFN sizes."""
    if (n := ctx.hparams.get("moe_intermediate_size")) is not None:
        kv.add_expert_feed_forward_length(n)
    if (n := ctx.hparams.get("shared_expert_intermediate_size")) is not None:
        kv.add_expert_shared_feed_forward_length(n)


def granite_params(ctx, kv) -> None:
    """GraniteModel.set_gguf_parameters: the *_multiplier hparams as *_scale keys (GraniteMoeModel adds the
    shared expert's size)."""
    hp = ctx.hparams
    if v := hp.get("attention_multiplier"):
        kv.add_attention_scale(v)
    if v := hp.get("embedding_multiplier"):
        kv.add_embedding_scale(v)
    if v := hp.get("residual_multiplier"):
        kv.add_residual_scale(v)
    if v := hp.get("logits_scaling"):
        kv.add_logit_scale(v)
    if ctx.decl.arch != "granite" and (v := hp.get("shared_intermediate_size")):
        kv.add_expert_shared_feed_forward_length(v)


def granite_moe_tensor(ctx, name, data, bid):
    """GraniteMoeModel.modify_tensors: JetMoE's fused ``input_linear`` (gate rows, then up rows) split into
    the experts' (or, without experts, the shared MLP's dense) gate and up."""
    if name.endswith("block_sparse_moe.input_linear.weight"):
        n_ff = ctx.hparams["intermediate_size"]
        if data.shape[-2] != 2 * n_ff:
            raise ValueError(f"fused expert FFN of {data.shape[-2]} rows, not 2 x intermediate_size {n_ff}")
        return [(f"blk.{bid}.ffn_gate_exps.weight", data[..., :n_ff, :]),
                (f"blk.{bid}.ffn_up_exps.weight", data[..., n_ff:, :])]  # fmt: skip
    has_experts = bool(ctx.hparams.get("num_local_experts"))
    if name.endswith("shared_mlp.input_linear.weight"):
        n_ff = ctx.hparams["shared_intermediate_size"]
        if data.shape[-2] != 2 * n_ff:
            raise ValueError(
                f"fused shared FFN of {data.shape[-2]} rows, not 2 x shared_intermediate_size {n_ff}"
            )
        sfx = "_shexp" if has_experts else ""
        return [
            (f"blk.{bid}.ffn_gate{sfx}.weight", data[:n_ff]),
            (f"blk.{bid}.ffn_up{sfx}.weight", data[n_ff:]),
        ]
    if not has_experts and name.endswith("shared_mlp.output_linear.weight"):
        return [(f"blk.{bid}.ffn_down.weight", data)]
    return [(name, data)]
