"""Qwen3-Next (``qwen3next``), Gated DeltaNet and gated attention with MoE: Qwen3.5's hybrid layout (Gated
DeltaNet three layers of four, gated full attention the fourth) with a mixture of experts plus a
sigmoid-gated shared expert in every layer, beta and alpha from one ``ssm_ba`` projection, value heads
grouped by key head (not tiled), and plain neox rope on the partial rotary dims."""

from __future__ import annotations

from ...ggml import ops
from ..blocks import GraphBuilder, Outputs, TensorLoader
from ..hf import HFConvert
from ..hf_shared import qwen_linear_params, qwen_linear_tensor, qwen_mtp_blocks
from ..hparams import HParams, MetaReader, ModelLoadError
from ..moe_blocks import load_ffn_tensors, skip_nextn_tensors
from ..rs_blocks import build_gated_attention, build_gated_delta_net, load_qwen35_hparams
from . import Architecture, register


@register("qwen3next")
class Qwen3Next(Architecture):
    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        load_qwen35_hparams(hp, md)
        hp.rope_sections = ()
        if not hp.n_expert:
            raise ModelLoadError(f"{md.where}: qwen3next needs expert_count > 0")
        hp.n_ff_exp = hp.n_ff_exp or hp.n_ff[0] // hp.n_expert_used

    def load_tensors(self, t: TensorLoader) -> None:
        hp = self.hp
        n_embd = hp.n_embd
        t("token_embd.weight", (hp.n_vocab, n_embd))
        t("output_norm.weight", (n_embd,))
        t("output.weight", (hp.n_vocab, n_embd), required=False)
        key_dim, value_dim = hp.ssm_d_state * hp.ssm_n_group, hp.ssm_d_inner
        for il in range(hp.n_layer):
            t.layer(il, "attn_norm.weight", (n_embd,))
            t.layer(il, "post_attention_norm.weight", (n_embd,))
            if hp.is_recurrent(il):
                t.layer(il, "attn_qkv.weight", (2 * key_dim + value_dim, n_embd))
                t.layer(il, "attn_gate.weight", (value_dim, n_embd))
                t.layer(il, "ssm_ba.weight", (2 * hp.ssm_dt_rank, n_embd))
                t.layer(il, "ssm_conv1d.weight", (2 * key_dim + value_dim, hp.ssm_d_conv))
                t.layer(il, "ssm_dt.bias", (hp.ssm_dt_rank,))
                t.layer(il, "ssm_a", (hp.ssm_dt_rank,))
                t.layer(il, "ssm_norm.weight", (value_dim // hp.ssm_dt_rank,))
                t.layer(il, "ssm_out.weight", (n_embd, value_dim))
            else:
                nh, nkv, d, _ = hp.heads(il)
                t.layer(il, "attn_q.weight", (2 * nh * d, n_embd))
                t.layer(il, "attn_k.weight", (nkv * d, n_embd))
                t.layer(il, "attn_v.weight", (nkv * d, n_embd))
                t.layer(il, "attn_output.weight", (n_embd, nh * d))
                t.layer(il, "attn_q_norm.weight", (d,))
                t.layer(il, "attn_k_norm.weight", (d,))
            load_ffn_tensors(self, t, il)
        skip_nextn_tensors(self, t)  # llama.cpp's converter keeps the MTP layer by default
        self._finish_tensors(t)

    def build(self, g: GraphBuilder) -> Outputs:
        x = g.embed(self.w["token_embd.weight"])
        for il, blk in enumerate(self.blocks):
            h = g.build_norm(x, blk["attn_norm.weight"], name="attn_norm", il=il)
            if self.hp.is_recurrent(il):
                h = build_gated_delta_net(g, h, blk, il, grouped=True)
            else:
                h = build_gated_attention(g, h, blk, il)
            h, x = g.select_outputs(il, h, x)
            x = g.cb(ops.add(x, h), "attn_residual", il)
            h = g.build_norm(x, blk["post_attention_norm.weight"], name="attn_post_norm", il=il)
            moe = g.build_moe_ffn(h, blk, il, True)
            h = g.cb(ops.add(moe, g.build_shared_expert(h, blk, il)), "ffn_out", il)
            x = g.cb(ops.add(x, h), "l_out", il)
        return g.output(x, self.w["output_norm.weight"], self.output_weight())


HF_CONVERT = HFConvert(
    "qwen3next",
    ("Qwen3NextForCausalLM",),
    params=qwen_linear_params,
    tensor=qwen_linear_tensor,
    extra_blocks=qwen_mtp_blocks,
)
