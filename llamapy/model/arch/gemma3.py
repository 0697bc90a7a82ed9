"""Gemma 3: Gemma 2's layout with RMS-normed q/k, interleaved sliding-window attention (5 local
layers, then 1 global), two rope bases (local 10000, global from the file) and no soft-capping."""

from __future__ import annotations

from ..gemma_blocks import GemmaArchitecture, GemmaLayout, gemma_attention_scale
from ..hf import HFConvert
from ..hf_shared import gemma3_params, gemma3_vocab
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


def _gemma3_tensor(ctx, name, data, bid):
    """Gemma3Model.modify_tensors: token_embd rows past the tokenizer's are dropped."""
    if "embed_tokens.weight" in name:
        data = data[: ctx.n_vocab_real()]
    return [(name, data)]


HF_CONVERT = HFConvert(
    "gemma3",
    ("Gemma3ForCausalLM",),
    vocab=gemma3_vocab,
    norm_shift=1.0,
    params=gemma3_params,
    tensor=_gemma3_tensor,
)
