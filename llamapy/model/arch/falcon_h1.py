"""Falcon-H1 (``falcon-h1``), Mamba2 and attention in parallel: every layer runs a Mamba2 mixer and attention
(neox rope) side by side on one RMS norm and adds both to the residual, then a SwiGLU FFN. The many muP
multipliers of the checkpoint are folded into the weights by the converter, as llama.cpp's."""

from __future__ import annotations

from ...ggml import ops
from ..blocks import GraphBuilder, Outputs, TensorLoader
from ..hparams import ROPE_NEOX, HParams, MetaReader
from ..rs_blocks import build_mamba2, load_mamba2_hparams, load_mamba2_tensors
from . import Architecture, register


@register("falcon-h1")
class FalconH1(Architecture):
    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        hp.rope_type = ROPE_NEOX
        load_mamba2_hparams(hp, md, [True] * hp.n_layer)
        hp.recurrent_with_attn = True

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
            # convert_hf_to_gguf.py maps pre_ff_layernorm.weight whole: real files name it blk.N.ffn_norm
            if t.layer(il, "ffn_norm", (n,), required=False) is None:
                t.layer(il, "ffn_norm.weight", (n,))
            load_mamba2_tensors(self, t, il)
            nh, nkv, d, _ = hp.heads(il)
            t.layer(il, "attn_q.weight", (nh * d, n))
            t.layer(il, "attn_k.weight", (nkv * d, n))
            t.layer(il, "attn_v.weight", (nkv * d, n))
            t.layer(il, "attn_output.weight", (n, nh * d))
            t.layer(il, "ffn_gate.weight", (hp.n_ff[il], n))
            t.layer(il, "ffn_up.weight", (hp.n_ff[il], n))
            t.layer(il, "ffn_down.weight", (n, hp.n_ff[il]))
        self._finish_tensors(t)

    def build(self, g: GraphBuilder) -> Outputs:
        x = g.embed(self.w["token_embd.weight"])
        for il, blk in enumerate(self.blocks):
            h = g.build_norm(x, blk["attn_norm.weight"], name="attn_norm", il=il)
            ssm = g.cb(build_mamba2(g, h, blk, il), "ssm_out", il)
            attn = g.attention(h, blk, il)
            h, x = g.select_outputs(il, ops.add(attn, ssm), x)
            x = g.cb(ops.add(x, h), "ffn_inp", il)
            h = g.build_ffn(
                g.build_norm(x, blk.get("ffn_norm", blk.get("ffn_norm.weight")), name="ffn_norm", il=il),
                blk,
                il,
            )
            x = g.cb(ops.add(x, h), "l_out", il)
        return g.output(x, self.w["output_norm.weight"], self.output_weight())
