"""StableLM (2): LayerNorm with biases, partial neox rope (``rope.dimension_count`` < head size),
optional q/k/v biases and per-head q/k LayerNorms (one weight per head), SwiGLU; files without
``ffn_norm`` use the parallel residual (x += attn(n) + ffn(n) from the one attn_norm)."""

from __future__ import annotations

from dataclasses import replace

from ..blocks import TensorLoader
from ..dense_blocks import DenseArchitecture, DenseLayout
from ..hparams import ROPE_NEOX, HParams, MetaReader
from . import register


@register("stablelm")
class StableLM(DenseArchitecture):
    layout = DenseLayout(norm="layer", norm_biases=True, ffn_norm=False)

    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        hp.rope_type = ROPE_NEOX

    def load_tensors(self, t: TensorLoader) -> None:
        # what the file has: per-head q/k LayerNorms (StableLM 2 12B), and no ffn_norm: the parallel residual
        names = t.loader.tensor_index
        qk_norm = "heads" if "blk.0.attn_q_norm.weight" in names else False
        self.layout = replace(self.layout, qk_norm=qk_norm, parallel="blk.0.ffn_norm.weight" not in names)
        super().load_tensors(t)
