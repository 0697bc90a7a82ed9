"""StableLM (2): LayerNorm with biases, partial neox rope (``rope.dimension_count`` < head size),
optional q/k/v biases and per-head q/k LayerNorms (one weight per head), SwiGLU; files without
``ffn_norm`` use the parallel residual (x += attn(n) + ffn(n) from the one attn_norm)."""

from __future__ import annotations

from ..blocks import GraphBuilder, Outputs, TensorLoader
from ..dense_blocks import build_dense, load_dense_tensors
from ..hparams import ROPE_NEOX, HParams, MetaReader
from . import Architecture, register


@register("stablelm")
class StableLM(Architecture):
    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        hp.rope_type = ROPE_NEOX

    def load_tensors(self, t: TensorLoader) -> None:
        self.qk_norm = "blk.0.attn_q_norm.weight" in t.loader.tensor_index
        qk_norm = "heads" if self.qk_norm else False
        load_dense_tensors(self, t, qk_norm=qk_norm, norm_biases=True, ffn_norm=False)
        self._finish_tensors(t)

    def build(self, g: GraphBuilder) -> Outputs:
        parallel = "ffn_norm.weight" not in self.blocks[0]
        return build_dense(self, g, qk_norm=self.qk_norm, norm="layer", parallel=parallel)
