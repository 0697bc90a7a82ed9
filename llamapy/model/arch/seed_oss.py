"""Seed-OSS, LLaMA's pre-norm decoder with q/k/v biases (an optional output bias) and neox rope; its
files name the FFN's pre-norm ``post_attention_norm``."""

from __future__ import annotations

from ..blocks import GraphBuilder, Outputs, TensorLoader
from ..dense_blocks import DenseArchitecture, DenseLayout, load_dense_tensors
from ..hparams import ROPE_NEOX, HParams, MetaReader
from . import register


@register("seed_oss")
class SeedOss(DenseArchitecture):
    layout = DenseLayout(ffn_norm=False)  # post_attention_norm is its FFN's pre-norm

    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        hp.rope_type = ROPE_NEOX
        hp.n_expert = 0

    def load_tensors(self, t: TensorLoader) -> None:
        load_dense_tensors(self, t)
        for il in range(self.hp.n_layer):
            t.layer(il, "post_attention_norm.weight", (self.hp.n_embd,))
        self._finish_tensors(t)

    def build(self, g: GraphBuilder) -> Outputs:
        hp = self.hp
        kq_scale = hp.f_attention_scale or None
        x = g.embed(self.w["token_embd.weight"])
        for il, blk in enumerate(self.blocks):
            h = g.build_norm(x, blk["attn_norm.weight"], name="attn_norm", il=il)
            h = g.attention(h, blk, il, kq_scale=kq_scale)
            h, x = g.select_outputs(il, h, x)
            x = g.cb(x + h, "ffn_inp", il)
            h = g.build_norm(x, blk["post_attention_norm.weight"], name="attn_post_norm", il=il)
            x = g.cb(x + g.build_ffn(h, blk, il), "l_out", il)
        return g.output(x, self.w["output_norm.weight"], self.output_weight())
