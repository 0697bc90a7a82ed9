"""Falcon (7B/40B/180B), fused qkv (MQA or GQA, no biases), neox rope, a parallel block
(``x += attn(n1) + ffn(n2)``) with LayerNorms; with the 40B's new decoder architecture ``n1`` is
``attn_norm_2`` (HF's ``ln_attn``) and ``n2`` ``attn_norm`` (``ln_mlp``), as convert_hf_to_gguf.py names
them and llama.cpp reads them; else both are the one ``attn_norm``. Sequential GELU FFN."""

from __future__ import annotations

from ..blocks import GraphBuilder, Outputs, TensorLoader
from ..hparams import ROPE_NEOX, HParams, MetaReader
from . import Architecture, register


@register("falcon")
class Falcon(Architecture):
    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        hp.rope_type = ROPE_NEOX
        hp.n_expert = 0

    def load_tensors(self, t: TensorLoader) -> None:
        hp = self.hp
        n_embd = hp.n_embd
        t("token_embd.weight", (hp.n_vocab, n_embd))
        t("output_norm.weight", (n_embd,))
        t("output_norm.bias", (n_embd,))
        t("output.weight", (hp.n_vocab, n_embd), required=False)
        for il in range(hp.n_layer):
            heads = hp.heads(il)
            nq = heads.n_head * heads.n_embd_head_k
            t.layer(il, "attn_norm.weight", (n_embd,))
            t.layer(il, "attn_norm.bias", (n_embd,))
            if t.layer(il, "attn_norm_2.weight", (n_embd,), required=False) is not None:
                t.layer(il, "attn_norm_2.bias", (n_embd,))
            t.layer(il, "attn_qkv.weight", (nq + hp.n_embd_k_gqa(il) + hp.n_embd_v_gqa(il), n_embd))
            t.layer(il, "attn_output.weight", (n_embd, heads.n_head * heads.n_embd_head_v))
            t.layer(il, "ffn_up.weight", (hp.n_ff[il], n_embd))
            t.layer(il, "ffn_down.weight", (n_embd, hp.n_ff[il]))
        self._finish_tensors(t)

    def build(self, g: GraphBuilder) -> Outputs:
        x = g.embed(self.w["token_embd.weight"])
        for il, blk in enumerate(self.blocks):
            n = g.build_norm(x, blk["attn_norm.weight"], blk["attn_norm.bias"], "layer", "attn_norm", il)
            n2 = n  # the FFN's input: attn_norm (ln_mlp in the 40B layout)
            if "attn_norm_2.weight" in blk:  # the attention's own norm (ln_attn)
                n = g.build_norm(
                    x, blk["attn_norm_2.weight"], blk["attn_norm_2.bias"], "layer", "attn_norm_2", il
                )
            h = g.attention(n, blk, il)
            h, x, n2 = g.select_outputs(il, h, x, n2)
            f = g.build_ffn(n2, blk, il, act="gelu", gated=False)
            x = g.cb(x + h + f, "l_out", il)
        w = self.w
        return g.output(
            x, w["output_norm.weight"], self.output_weight(), b_norm=w["output_norm.bias"], norm_kind="layer"
        )
