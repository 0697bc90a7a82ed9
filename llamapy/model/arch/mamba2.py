"""Mamba2 (``mamba2``), a state-space model without attention: every layer a Mamba2 mixer (causal conv,
selective scan with groups, gated group RMSNorm) after an RMS norm, no attention and no feed-forward;
``ssm.*`` keys as llama.cpp's."""

from __future__ import annotations

from ...ggml import ops
from ..blocks import GraphBuilder, Outputs, TensorLoader
from ..hparams import HParams, MetaReader
from ..rs_blocks import build_mamba2, load_mamba2_hparams, load_mamba2_tensors
from . import Architecture, register


@register("mamba2")
class Mamba2(Architecture):
    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        load_mamba2_hparams(hp, md, [True] * hp.n_layer)

    def load_tensors(self, t: TensorLoader) -> None:
        hp = self.hp
        t("token_embd.weight", (hp.n_vocab, hp.n_embd))
        t("output_norm.weight", (hp.n_embd,))
        t("output.weight", (hp.n_vocab, hp.n_embd), required=False)
        for il in range(hp.n_layer):
            t.layer(il, "attn_norm.weight", (hp.n_embd,))
            load_mamba2_tensors(self, t, il)
        self._finish_tensors(t)

    def build(self, g: GraphBuilder) -> Outputs:
        x = g.embed(self.w["token_embd.weight"])
        for il, blk in enumerate(self.blocks):
            h = g.build_norm(x, blk["attn_norm.weight"], name="attn_norm", il=il)
            h = build_mamba2(g, h, blk, il)
            h, x = g.select_outputs(il, h, x)
            x = g.cb(ops.add(x, h), "l_out", il)
        return g.output(x, self.w["output_norm.weight"], self.output_weight())
