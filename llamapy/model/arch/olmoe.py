"""OLMoE: OLMo's pre-norm decoder with q/k RMS-normed over the whole projection, neox rope, and a
mixture of SwiGLU experts (softmax routing, top-k weights not renormalized)."""

from __future__ import annotations

from ..dense_blocks import DenseArchitecture, DenseLayout
from ..hparams import ROPE_NEOX, HParams, MetaReader
from . import register


@register("olmoe")
class Olmoe(DenseArchitecture):
    layout = DenseLayout(qk_norm="full")

    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        hp.rope_type = ROPE_NEOX
