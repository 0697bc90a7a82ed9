"""Phi-3: fused qkv and up+gate projections, neox rope with LongRoPE factors (short below the
original context, long above it)."""

from __future__ import annotations

import math

from ..blocks import GraphBuilder, Outputs, Rope, TensorLoader, rope_for_layer
from ..hparams import ROPE_NEOX, HParams, MetaReader
from . import Architecture, register


@register("phi3")
class Phi3(Architecture):
    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        hp.rope_type = ROPE_NEOX
        hp.n_swa = 0  # llama.cpp disables Phi-3's sliding window (the files do not describe it fully)
        hp.swa_layers = [False] * hp.n_layer

    def load_tensors(self, t: TensorLoader) -> None:
        hp = self.hp
        n_embd = hp.n_embd
        t("token_embd.weight", (hp.n_vocab, n_embd))
        t("output_norm.weight", (n_embd,))
        t("output.weight", (hp.n_vocab, n_embd), required=False)
        t("output.bias", (hp.n_vocab,), required=False)
        t("rope_factors_long.weight", (hp.n_rot // 2,), required=False)
        t("rope_factors_short.weight", (hp.n_rot // 2,), required=False)
        for il in range(hp.n_layer):
            heads = hp.heads(il)
            nq, nk, nv = heads.n_head * heads.n_embd_head_k, hp.n_embd_k_gqa(il), hp.n_embd_v_gqa(il)
            t.layer(il, "attn_norm.weight", (n_embd,))
            if t.layer(il, "attn_qkv.weight", (nq + nk + nv, n_embd), required=False) is None:
                t.layer(il, "attn_q.weight", (nq, n_embd))
                t.layer(il, "attn_k.weight", (nk, n_embd))
                t.layer(il, "attn_v.weight", (nv, n_embd))
            t.layer(il, "attn_output.weight", (n_embd, heads.n_head * heads.n_embd_head_v))
            t.layer(il, "ffn_norm.weight", (n_embd,))
            t.layer(il, "ffn_up.weight", (2 * hp.n_ff[il], n_embd))
            t.layer(il, "ffn_down.weight", (n_embd, hp.n_ff[il]))
        self._finish_tensors(t)

    def layer_rope(self, il: int, n_ctx: int = 0) -> Rope | None:
        hp = self.hp
        n_ctx = n_ctx or hp.n_ctx_train
        factors = self.w.get(
            "rope_factors_long.weight" if n_ctx > hp.n_ctx_orig_yarn else "rope_factors_short.weight"
        )
        return rope_for_layer(hp, il, freq_factors=factors)

    def build(self, g: GraphBuilder) -> Outputs:
        hp = self.hp
        x = g.embed(self.w["token_embd.weight"])
        for il, blk in enumerate(self.blocks):
            h = g.build_norm(x, blk["attn_norm.weight"], name="attn_norm", il=il)
            q_scale = 1.0 / math.sqrt(hp.heads(il).n_embd_head_k)
            h = g.attention(h, blk, il, q_scale=q_scale, kq_scale=1.0)
            h, x = g.select_outputs(il, h, x)
            x = g.cb(x + h, "ffn_inp", il)
            h = g.build_norm(x, blk["ffn_norm.weight"], name="ffn_norm", il=il)
            x = g.cb(x + g.build_ffn(h, blk, il, act="silu"), "l_out", il)
        return g.output(x, self.w["output_norm.weight"], self.output_weight(), self.w.get("output.bias"))
