"""Gemma 3: Gemma 2's layout with RMS-normed q/k, interleaved sliding-window attention (5 local
layers, then 1 global), two rope bases (local 10000, global from the file) and no soft-capping."""

from __future__ import annotations

from ..gemma_blocks import GemmaArchitecture, GemmaLayout, gemma_attention_scale
from ..hf import HFConvert
from ..hparams import ROPE_NEOX, HParams, MetaReader, swa_pattern
from . import register


@register("gemma3")
class Gemma3(GemmaArchitecture):
    layout = GemmaLayout(post_norms=True, qk_norm=True, scale_raw_embd=False)

    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        hp.rope_type = ROPE_NEOX
        hp.f_attention_scale = gemma_attention_scale(hp, width_scaled_27b=True)
        hp.swa_layers = swa_pattern(md, hp.n_layer, 6)
        hp.rope_freq_base_swa = md.f32("rope.freq_base_swa", 10000.0)
        hp.rope_freq_scale_swa = 1.0
        hp.f_attn_logit_softcapping = 0.0
        hp.f_final_logit_softcapping = md.f32("final_logit_softcapping", 0.0) or 0.0


def _gemma3_params(ctx, kv) -> None:
    """Gemma3Model.set_gguf_parameters (after the common keys)."""
    hp = ctx.hparams
    kv.add_context_length(hp.get("max_position_embeddings", 131072))
    kv.add_head_count(hp.get("num_attention_heads", 8))
    kv.add_layer_norm_rms_eps(hp.get("rms_norm_eps", 1e-6))
    kv.add_key_length(hp.get("head_dim", 256))
    kv.add_value_length(hp.get("head_dim", 256))
    kv.add_rope_freq_base(
        ctx.rope_parameters.get("full_attention", ctx.rope_parameters).get("rope_theta", 1_000_000.0)
    )
    if final := hp.get("final_logit_softcapping"):
        kv.add_final_logit_softcapping(final)
    if hp.get("sliding_window_pattern") != 1:
        kv.add_sliding_window(hp["sliding_window"])
    kv.add_head_count_kv(hp.get("num_key_value_heads", 4))


def _gemma3_vocab(ctx, kv) -> None:
    if (ctx.dir / "tokenizer.model").is_file():
        ctx.set_vocab("spm")
        kv.add_add_space_prefix(False)
    else:
        ctx.set_vocab("gpt2")


def _gemma3_tensor(ctx, name, data, bid):
    """Gemma3Model.modify_tensors: token_embd rows past the tokenizer's are dropped."""
    if "embed_tokens.weight" in name:
        data = data[: ctx.n_vocab_real()]
    return [(name, data)]


HF_CONVERT = HFConvert(
    "gemma3",
    ("Gemma3ForCausalLM",),
    vocab=_gemma3_vocab,
    norm_shift=1.0,
    params=_gemma3_params,
    tensor=_gemma3_tensor,
)
