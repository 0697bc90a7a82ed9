"""PhiMoE (Phi-3.5-MoE): Phi-3's attention (biases on q/k/v/o, q scaled by 1/sqrt(head size) before
the product, LongRoPE's long/short factors) with LayerNorms carrying biases and a mixture of experts
in place of the FFN (llama.cpp's ``phimoe``, on its phi3 graph).

Routing is llama.cpp's, not the "sparsemixer" of the Hugging Face model: a softmax over the router
logits, the top ``n_expert_used`` experts, their weights renormalized to sum to one. The norms are
LayerNorms (mean subtracted) as in the Hugging Face model; llama.cpp's phi3 graph applies an RMS norm
plus bias here (``NORM_KIND`` switches to that)."""

from __future__ import annotations

import math

from ..blocks import GraphBuilder, Outputs, Rope, TensorLoader, longrope_for_layer
from ..dense_blocks import DenseArchitecture, DenseLayout, load_dense_tensors
from ..hparams import ROPE_NEOX, HParams, MetaReader, ModelLoadError
from . import register

NORM_KIND = "layer"  # "rms": as llama.cpp's phi3 graph (LLM_NORM_RMS with the bias)


@register("phimoe")
class PhiMoE(DenseArchitecture):
    layout = DenseLayout(norm_biases=True)  # the tensors; the graph (build) is Phi-3's with experts

    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        hp.rope_type = ROPE_NEOX  # as phi3: neox rope, no sliding window
        hp.n_swa = 0
        hp.swa_layers = [False] * hp.n_layer
        if not hp.n_expert:
            raise ModelLoadError(f"{md.where}: phimoe needs expert_count and expert_used_count")
        hp.norm_eps = hp.norm_rms_eps  # the file has only layer_norm_rms_epsilon (the LayerNorms' eps)

    def load_tensors(self, t: TensorLoader) -> None:
        hp = self.hp
        load_dense_tensors(self, t)
        t("output.bias", (hp.n_vocab,), required=False)
        t("rope_factors_long.weight", (hp.n_rot // 2,), required=False)
        t("rope_factors_short.weight", (hp.n_rot // 2,), required=False)
        self._finish_tensors(t)

    def layer_rope(self, il: int, n_ctx: int = 0) -> Rope | None:
        return longrope_for_layer(self, il, n_ctx)

    def build(self, g: GraphBuilder) -> Outputs:
        hp = self.hp
        x = g.embed(self.w["token_embd.weight"])
        for il, blk in enumerate(self.blocks):
            h = g.build_norm(
                x, blk["attn_norm.weight"], blk["attn_norm.bias"], kind=NORM_KIND, name="attn_norm", il=il
            )
            q_scale = 1.0 / math.sqrt(hp.heads(il).n_embd_head_k)
            h = g.attention(h, blk, il, q_scale=q_scale, kq_scale=1.0)
            h, x = g.select_outputs(il, h, x)
            x = g.cb(x + h, "ffn_inp", il)
            h = g.build_norm(
                x, blk["ffn_norm.weight"], blk["ffn_norm.bias"], kind=NORM_KIND, name="ffn_norm", il=il
            )
            h = g.build_moe_ffn(h, blk, il, True, gating="softmax", w_scale=hp.expert_weights_scale)
            x = g.cb(x + h, "l_out", il)
        w = self.w
        return g.output(
            x, w["output_norm.weight"], self.output_weight(), w.get("output.bias"),
            b_norm=w["output_norm.bias"], norm_kind=NORM_KIND,
        )  # fmt: skip
