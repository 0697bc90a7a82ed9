"""``llamapy convert`` declarations several families share (see ``llamapy/model/hf.py``): LLaMA's
(``LLAMA_HF``: granite, mistral3 and smollm3 derive theirs from it), Gemma's ``gemma_params`` (Gemma 2
extends them) and the Qwen MoE expert sizes (``qwen_moe_params``: qwen2moe, qwen3moe)."""

from __future__ import annotations

from .hf import HFConvert

__all__ = ["LLAMA_HF", "gemma_params", "qwen_moe_params"]


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
