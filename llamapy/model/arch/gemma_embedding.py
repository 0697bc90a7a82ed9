"""EmbeddingGemma (llama.cpp's ``src/models/gemma-embedding.cpp``): Gemma 3's layers with
bidirectional attention and no KV cache; the local layers (5 of every 6) see a symmetric window
(|i - j| <= n_swa / 2); queries scaled by 1/sqrt(head size); the output is the final RMS-normed hidden
state (no logits). Files converted with the sentence-transformers dense modules add ``dense_2`` /
``dense_3``, applied after pooling (``GraphBuilder.build_pooling``)."""

from __future__ import annotations

import math

from ..blocks import GraphBuilder, Outputs
from ..gemma_blocks import GemmaArchitecture, GemmaLayout, build_gemma
from ..hparams import ROPE_NEOX, HParams, MetaReader, swa_pattern
from . import register


@register("gemma-embedding")
class GemmaEmbedding(GemmaArchitecture):
    layout = GemmaLayout(post_norms=True, qk_norm=True)

    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        hp.rope_type = ROPE_NEOX
        hp.causal_attn = False
        hp.swa_type = "symmetric"
        hp.swa_layers = swa_pattern(md, hp.n_layer, 6)
        if not hp.n_swa:
            raise md._err(f"metadata key {md._key('attention.sliding_window')!r} is missing or zero")
        hp.rope_freq_base_swa = md.f32("rope.freq_base_swa", 10000.0)
        hp.rope_freq_scale_swa = 1.0
        hp.f_attention_scale = 1.0 / math.sqrt(hp.n_embd_head_k)
        hp.f_attn_logit_softcapping = 0.0
        hp.f_final_logit_softcapping = 0.0

    def build(self, g: GraphBuilder) -> Outputs:
        res = build_gemma(self, g)
        return Outputs(None, embd=res.embd)  # an encoder: no logits (they are never computed)
