"""Gemma 3: Gemma 2's layout with RMS-normed q/k, interleaved sliding-window attention (5 local
layers, then 1 global), two rope bases (local 10000, global from the file) and no soft-capping."""

from __future__ import annotations

from ..blocks import GraphBuilder, Outputs, TensorLoader
from ..hparams import ROPE_NEOX, HParams, MetaReader, swa_pattern
from . import Architecture, register
from .gemma import build_gemma, gemma_attention_scale, load_gemma_tensors


@register("gemma3")
class Gemma3(Architecture):
    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        hp.rope_type = ROPE_NEOX
        hp.f_attention_scale = gemma_attention_scale(hp)
        hp.swa_layers = swa_pattern(md, hp.n_layer, 6)
        hp.rope_freq_base_swa = md.f32("rope.freq_base_swa", 10000.0)
        hp.rope_freq_scale_swa = 1.0
        hp.f_attn_logit_softcapping = 0.0
        hp.f_final_logit_softcapping = md.f32("final_logit_softcapping", 0.0) or 0.0

    def load_tensors(self, t: TensorLoader) -> None:
        load_gemma_tensors(self, t, post_norms=True, qk_norm=True)
        self._finish_tensors(t)

    def build(self, g: GraphBuilder) -> Outputs:
        return build_gemma(self, g, post_norms=True, qk_norm=True, scale_raw_embd=False)
