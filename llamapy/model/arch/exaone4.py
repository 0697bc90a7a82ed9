"""EXAONE 4.0, OLMo 2's post-norm residuals (each sub-block's output RMS-normed before the add, no
pre-norms) with per-head q/k RMS norms, neox rope (optional llama3 ``rope_freqs``); with a sliding
window (``attention.sliding_window`` and a per-layer ``sliding_window_pattern``, 3 local : 1 global
by default) the window layers use rope and the global ones none (NoPE)."""

from __future__ import annotations

from ..blocks import Rope
from ..dense_blocks import DenseArchitecture, DenseLayout
from ..hparams import ROPE_NEOX, HParams, MetaReader, swa_pattern
from . import register


@register("exaone4")
class Exaone4(DenseArchitecture):
    layout = DenseLayout(qk_norm=True, post_norms=True)

    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        hp.rope_type = ROPE_NEOX
        hp.n_swa = md.u32("attention.sliding_window", 4096 if hp.n_layer == 64 else 0)  # the 32B: 4096
        hp.swa_layers = swa_pattern(md, hp.n_layer, 4) if hp.n_swa else [False] * hp.n_layer

    def layer_rope(self, il: int, n_ctx: int = 0) -> Rope | None:
        if self.hp.n_swa and not self.hp.is_swa(il):
            return None  # the global layers of a windowed model
        return super().layer_rope(il, n_ctx)
