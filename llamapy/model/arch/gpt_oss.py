"""gpt-oss (llama.cpp's ``openai-moe``, ``src/models/openai-moe-iswa.cpp``): pre-norm decoder with
biases on Q/K/V/O, a learned sink logit per head in the attention softmax, sliding-window and full
layers alternating (even layers windowed), YaRN neox rope, and a mixture of experts with a biased
router, top-k then softmax over the selected logits, per-expert biases and the clamped SwiGLU
(``swiglu_oai``: alpha 1.702, limit 7). Real files store the experts as MXFP4."""

from __future__ import annotations

import math

from ..blocks import GraphBuilder, Outputs, TensorLoader
from ..hparams import ROPE_NEOX, HParams, MetaReader, ModelLoadError, swa_pattern
from . import Architecture, register


@register("gpt-oss")
class GptOss(Architecture):
    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        hp.rope_type = ROPE_NEOX
        if not hp.n_expert:
            raise ModelLoadError(f"{md.where}: gpt-oss needs expert_count > 0")
        hp.n_ff_exp = md.u32("expert_feed_forward_length", required=True)
        if not hp.n_swa:
            raise ModelLoadError(f"{md.where}: gpt-oss needs {md._key('attention.sliding_window')} > 0")
        hp.swa_layers = swa_pattern(md, hp.n_layer, 2)  # llama.cpp: set_swa_pattern(2), even layers local

    def load_tensors(self, t: TensorLoader) -> None:
        hp = self.hp
        n_embd, n_vocab, E, n_ff = hp.n_embd, hp.n_vocab, hp.n_expert, hp.n_ff_exp
        t("token_embd.weight", (n_vocab, n_embd))
        t("output_norm.weight", (n_embd,))
        t("output.weight", (n_vocab, n_embd), required=False)
        for il in range(hp.n_layer):
            nh, _, dk, dv = hp.heads(il)
            nq, nk, nv = nh * dk, hp.n_embd_k_gqa(il), hp.n_embd_v_gqa(il)
            t.layer(il, "attn_norm.weight", (n_embd,))
            t.layer(il, "post_attention_norm.weight", (n_embd,))
            for name, n in (("attn_q", nq), ("attn_k", nk), ("attn_v", nv)):
                t.layer(il, f"{name}.weight", (n, n_embd))
                t.layer(il, f"{name}.bias", (n,))
            t.layer(il, "attn_output.weight", (n_embd, nh * dv))
            t.layer(il, "attn_output.bias", (n_embd,))
            t.layer(il, "attn_sinks.weight", (nh,))
            t.layer(il, "ffn_gate_inp.weight", (E, n_embd))
            t.layer(il, "ffn_gate_inp.bias", (E,))
            for name, shape in (
                ("ffn_gate_exps", (E, n_ff, n_embd)),
                ("ffn_up_exps", (E, n_ff, n_embd)),
                ("ffn_down_exps", (E, n_embd, n_ff)),
            ):
                t.layer(il, f"{name}.weight", shape)
                t.layer(il, f"{name}.bias", shape[:2])
        self._finish_tensors(t)

    def build(self, g: GraphBuilder) -> Outputs:
        hp = self.hp
        x = g.embed(self.w["token_embd.weight"])
        for il, blk in enumerate(self.blocks):
            n = g.build_norm(x, blk["attn_norm.weight"], name="attn_norm", il=il)
            kq_scale = 1.0 / math.sqrt(hp.heads(il).n_embd_head_k)  # llama.cpp: 1/sqrt(n_rot)
            h = g.attention(n, blk, il, kq_scale=kq_scale, sinks=blk["attn_sinks.weight"])
            h, x = g.select_outputs(il, h, x)
            x = g.cb(x + h, "ffn_inp", il)
            h = g.build_norm(x, blk["post_attention_norm.weight"], name="attn_post_norm", il=il)
            h = g.build_moe_ffn(h, blk, il, False, gating="softmax_weight", act="swiglu_oai")
            x = g.cb(x + h, "l_out", il)
        return g.output(x, self.w["output_norm.weight"], self.output_weight())
