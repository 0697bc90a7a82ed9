"""Gemma: embedding scaling, GeGLU, neox rope. The shared Gemma blocks (tensors, graph, attention scale)
live in ``llamapy/model/gemma_blocks.py``; Gemma 2 and 3 build on them in their own files."""

from __future__ import annotations

from ..gemma_blocks import GemmaArchitecture, GemmaLayout, gemma_attention_scale
from ..hf import HFConvert
from ..hf_shared import gemma_params
from ..hparams import ROPE_NEOX, HParams, MetaReader
from . import register


@register("gemma")
class Gemma(GemmaArchitecture):
    layout = GemmaLayout()

    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        hp.rope_type = ROPE_NEOX
        hp.f_attention_scale = gemma_attention_scale(hp)


def _gemma_vocab(ctx, kv) -> None:
    """GemmaModel.set_vocab: SentencePiece, CodeGemma's FIM ids, no space prefix."""
    ctx.set_vocab("spm")
    ctx.special_tokens(kv, {"prefix": 67, "suffix": 69, "middle": 68, "fsep": 70, "eot": 107})
    kv.add_add_space_prefix(False)


HF_CONVERT = HFConvert(
    "gemma",
    ("GemmaForCausalLM",),
    vocab=_gemma_vocab,
    norm_shift=1.0,
    generic_params=False,
    params=gemma_params,
    skip=("lm_head.weight",),
)
