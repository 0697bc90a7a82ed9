"""OLMoE: OLMo's pre-norm decoder with q/k RMS-normed over the whole projection, neox rope, and a
mixture of SwiGLU experts (softmax routing, top-k weights not renormalized)."""

from __future__ import annotations

from ..blocks import GraphBuilder, Outputs, TensorLoader
from ..dense_blocks import build_dense, load_dense_tensors
from ..hparams import ROPE_NEOX, HParams, MetaReader
from . import Architecture, register


@register("olmoe")
class Olmoe(Architecture):
    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        hp.rope_type = ROPE_NEOX

    def load_tensors(self, t: TensorLoader) -> None:
        load_dense_tensors(self, t, qk_norm="full")
        self._finish_tensors(t)

    def build(self, g: GraphBuilder) -> Outputs:
        return build_dense(self, g, qk_norm="full")
