"""Nemotron-H (``nemotron_h``), Mamba2, attention and MLP layers: each layer is one mixer after an RMS norm,
with a residual: a Mamba2 mixer (layers with neither KV heads nor a feed-forward size), attention without
rope (``head_count_kv`` > 0), or a squared-ReLU MLP (``feed_forward_length`` > 0), as llama.cpp reads the
per-layer arrays."""

from __future__ import annotations

from ...ggml import ops
from ..blocks import GraphBuilder, Outputs, Rope, TensorLoader
from ..hparams import HParams, MetaReader
from ..rs_blocks import build_mamba2
from . import Architecture, register
from .mamba2 import load_mamba2_hparams, load_mamba2_tensors


@register("nemotron_h")
class NemotronH(Architecture):
    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        rec = [kv == 0 and ff == 0 for kv, ff in zip(hp.n_head_kv, hp.n_ff, strict=True)]
        load_mamba2_hparams(hp, md, rec)

    def layer_rope(self, il: int, n_ctx: int = 0) -> Rope | None:
        return None

    def layer_moe(self, il: int) -> bool:
        return False

    def load_tensors(self, t: TensorLoader) -> None:
        hp = self.hp
        n = hp.n_embd
        t("token_embd.weight", (hp.n_vocab, n))
        t("output_norm.weight", (n,))
        t("output.weight", (hp.n_vocab, n), required=False)
        for il in range(hp.n_layer):
            t.layer(il, "attn_norm.weight", (n,))
            if hp.is_recurrent(il):
                load_mamba2_tensors(self, t, il)
            elif hp.n_head_kv[il]:
                nh, nkv, d, _ = hp.heads(il)
                t.layer(il, "attn_q.weight", (nh * d, n))
                t.layer(il, "attn_k.weight", (nkv * d, n))
                t.layer(il, "attn_v.weight", (nkv * d, n))
                t.layer(il, "attn_output.weight", (n, nh * d))
            else:
                t.layer(il, "ffn_up.weight", (hp.n_ff[il], n))
                t.layer(il, "ffn_down.weight", (n, hp.n_ff[il]))
        self._finish_tensors(t)

    def build(self, g: GraphBuilder) -> Outputs:
        hp = self.hp
        x = g.embed(self.w["token_embd.weight"])
        for il, blk in enumerate(self.blocks):
            h = g.build_norm(x, blk["attn_norm.weight"], name="attn_norm", il=il)
            if hp.is_recurrent(il):
                h = build_mamba2(g, h, blk, il)
            elif hp.n_head_kv[il]:
                h = g.attention(h, blk, il)
            else:  # squared ReLU
                up = ops.relu(g.cb(g.mm(blk["ffn_up.weight"], h), "ffn_up", il))
                h = g.cb(g.mm(blk["ffn_down.weight"], ops.mul(up, up)), "ffn_out", il)
            h, x = g.select_outputs(il, h, x)
            x = g.cb(ops.add(x, h), "l_out", il)
        return g.output(x, self.w["output_norm.weight"], self.output_weight())
