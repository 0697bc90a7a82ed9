"""Gemma 2: Gemma plus post-norms, attention and final logit soft-capping, and sliding-window attention
on every other layer."""

from __future__ import annotations

from ..gemma_blocks import GemmaArchitecture, GemmaLayout, gemma_attention_scale
from ..hf import HFConvert
from ..hf_shared import gemma_params
from ..hparams import ROPE_NEOX, HParams, MetaReader, swa_pattern
from . import register


@register("gemma2")
class Gemma2(GemmaArchitecture):
    layout = GemmaLayout(post_norms=True)

    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        hp.rope_type = ROPE_NEOX
        hp.f_attention_scale = gemma_attention_scale(hp, width_scaled_27b=True)
        hp.n_swa = md.u32("attention.sliding_window", 4096) or 0
        hp.swa_layers = swa_pattern(md, hp.n_layer, 2)
        hp.f_attn_logit_softcapping = md.f32("attn_logit_softcapping", 50.0) or 0.0
        hp.f_final_logit_softcapping = md.f32("final_logit_softcapping", 30.0) or 0.0


def _gemma2_params(ctx, kv) -> None:
    gemma_params(ctx, kv)
    kv.add_attn_logit_softcapping(ctx.hparams["attn_logit_softcapping"])
    kv.add_final_logit_softcapping(ctx.hparams["final_logit_softcapping"])
    kv.add_sliding_window(ctx.hparams["sliding_window"])


def _gemma2_vocab(ctx, kv) -> None:
    ctx.set_vocab("spm")
    kv.add_add_space_prefix(False)


HF_CONVERT = HFConvert(
    "gemma2",
    ("Gemma2ForCausalLM",),
    vocab=_gemma2_vocab,
    norm_shift=1.0,
    generic_params=False,
    params=_gemma2_params,
    skip=("lm_head.weight",),
)
