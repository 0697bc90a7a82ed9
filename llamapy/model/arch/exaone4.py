"""EXAONE 4.0, OLMo 2's post-norm residuals (each sub-block's output RMS-normed before the add, no
pre-norms) with per-head q/k RMS norms, neox rope (optional llama3 ``rope_freqs``); with a sliding
window (``attention.sliding_window`` and a per-layer ``sliding_window_pattern``, 3 local : 1 global
by default) the window layers use rope and the global ones none (NoPE)."""

from __future__ import annotations

from ..blocks import GraphBuilder, Outputs, Rope, TensorLoader
from ..dense_blocks import load_dense_tensors
from ..hparams import ROPE_NEOX, HParams, MetaReader, swa_pattern
from . import Architecture, register


@register("exaone4")
class Exaone4(Architecture):
    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        hp.rope_type = ROPE_NEOX
        hp.n_swa = md.u32("attention.sliding_window", 4096 if hp.n_layer == 64 else 0)  # the 32B: 4096
        hp.swa_layers = swa_pattern(md, hp.n_layer, 4) if hp.n_swa else [False] * hp.n_layer

    def layer_rope(self, il: int, n_ctx: int = 0) -> Rope | None:
        if self.hp.n_swa and not self.hp.is_swa(il):
            return None  # the global layers of a windowed model
        return super().layer_rope(il, n_ctx)

    def load_tensors(self, t: TensorLoader) -> None:
        load_dense_tensors(self, t, qk_norm=True, post_norms=True)
        self._finish_tensors(t)

    def build(self, g: GraphBuilder) -> Outputs:
        x = g.embed(self.w["token_embd.weight"])
        for il, blk in enumerate(self.blocks):
            h = g.attention(x, blk, il, qk_norm=True)
            h, x = g.select_outputs(il, h, x)
            h = g.build_norm(h, blk["post_attention_norm.weight"], name="attn_post_norm", il=il)
            x = g.cb(x + h, "ffn_inp", il)
            h = g.build_ffn(x, blk, il)
            h = g.build_norm(h, blk["post_ffw_norm.weight"], name="ffn_post_norm", il=il)
            x = g.cb(x + h, "l_out", il)
        return g.output(x, self.w["output_norm.weight"], self.output_weight())
