"""Granite 4 hybrid (``granitehybrid``), Mamba2 and NoPE attention layers with MoE: Mamba2 layers
(``head_count_kv`` 0) and attention layers (no rope unless ``rope.scaling.finetuned``), then a mixture of
experts plus a shared expert (or a dense SwiGLU FFN), with Granite's four scalars (embeddings x
embedding_scale, attention x attention.scale, residual branches x residual_scale, logits / logit_scale)."""

from __future__ import annotations

from ...ggml import ops
from ..blocks import GraphBuilder, Outputs, Rope, TensorLoader
from ..hparams import HParams, MetaReader
from ..rs_blocks import build_mamba2, load_mamba2_hparams, load_mamba2_tensors
from . import Architecture, register


@register("granitehybrid")
class GraniteHybrid(Architecture):
    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        load_mamba2_hparams(hp, md, [n == 0 for n in hp.n_head_kv])
        hp.f_embedding_scale = md.f32("embedding_scale", 0.0)
        hp.f_attention_scale = md.f32("attention.scale", 0.0)
        hp.f_residual_scale = md.f32("residual_scale", 0.0)
        hp.f_logit_scale = md.f32("logit_scale", 0.0)
        hp.expert_weights_norm = True
        hp.rope_finetuned = bool(md.boolean("rope.scaling.finetuned", False))  # (llama.cpp's use_rope)

    def layer_rope(self, il: int, n_ctx: int = 0) -> Rope | None:
        return super().layer_rope(il, n_ctx) if getattr(self.hp, "rope_finetuned", False) else None

    def load_tensors(self, t: TensorLoader) -> None:
        hp = self.hp
        n = hp.n_embd
        t("token_embd.weight", (hp.n_vocab, n))
        t("output_norm.weight", (n,))
        t("output.weight", (hp.n_vocab, n), required=False)
        for il in range(hp.n_layer):
            t.layer(il, "attn_norm.weight", (n,))
            t.layer(il, "ffn_norm.weight", (n,))
            if hp.is_recurrent(il):
                load_mamba2_tensors(self, t, il)
            else:
                nh, nkv, d, _ = hp.heads(il)
                t.layer(il, "attn_q.weight", (nh * d, n))
                t.layer(il, "attn_k.weight", (nkv * d, n))
                t.layer(il, "attn_v.weight", (nkv * d, n))
                t.layer(il, "attn_output.weight", (n, nh * d))
            if not self.layer_moe(il):
                t.layer(il, "ffn_gate.weight", (hp.n_ff[il], n))
                t.layer(il, "ffn_up.weight", (hp.n_ff[il], n))
                t.layer(il, "ffn_down.weight", (n, hp.n_ff[il]))
                continue
            n_ff = hp.n_ff_exp or hp.n_ff[il]
            t.layer(il, "ffn_gate_inp.weight", (hp.n_expert, n))
            t.layer(il, "ffn_gate_exps.weight", (hp.n_expert, n_ff, n))
            t.layer(il, "ffn_up_exps.weight", (hp.n_expert, n_ff, n))
            t.layer(il, "ffn_down_exps.weight", (hp.n_expert, n, n_ff))
            if hp.n_ff_shexp:
                t.layer(il, "ffn_gate_shexp.weight", (hp.n_ff_shexp, n))
                t.layer(il, "ffn_up_shexp.weight", (hp.n_ff_shexp, n))
                t.layer(il, "ffn_down_shexp.weight", (n, hp.n_ff_shexp))
        self._finish_tensors(t)

    def build(self, g: GraphBuilder) -> Outputs:
        hp = self.hp
        rs = hp.f_residual_scale
        x = g.embed(self.w["token_embd.weight"], scale=hp.f_embedding_scale or None)
        for il, blk in enumerate(self.blocks):
            h = g.build_norm(x, blk["attn_norm.weight"], name="attn_norm", il=il)
            if hp.is_recurrent(il):
                h = build_mamba2(g, h, blk, il)
            else:
                h = g.attention(h, blk, il, kq_scale=hp.f_attention_scale or None)
            h, x = g.select_outputs(il, h, x)
            x = g.cb(ops.add(x, ops.scale(h, rs) if rs else h), "ffn_inp", il)
            h = g.build_norm(x, blk["ffn_norm.weight"], name="ffn_norm", il=il)
            if self.layer_moe(il):
                moe = g.build_moe_ffn(h, blk, il, True)
                h = (
                    g.cb(ops.add(moe, g.build_ffn(h, blk, il, suffix="_shexp")), "ffn_out", il)
                    if hp.n_ff_shexp
                    else moe
                )
            else:
                h = g.build_ffn(h, blk, il)
            x = g.cb(ops.add(x, ops.scale(h, rs) if rs else h), "l_out", il)
        return g.output(x, self.w["output_norm.weight"], self.output_weight(), logit_scale=hp.f_logit_scale)
