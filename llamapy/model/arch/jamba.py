"""Jamba (``jamba``), Mamba (1) and attention layers with MoE: Mamba (1) layers with RMS-normed dt/B/C
(``head_count_kv`` 0) and attention layers without rope, each followed by a mixture of experts (softmax
top-k, weights not renormalized) in the layers that have a router (``ffn_gate_inp``), a dense SwiGLU FFN in
the others."""

from __future__ import annotations

from ...ggml import ops
from ..blocks import GraphBuilder, Outputs, Rope, TensorLoader
from ..hparams import HParams, MetaReader
from ..rs_blocks import build_mamba1
from . import Architecture, register


@register("jamba")
class Jamba(Architecture):
    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        hp.ssm_d_conv = md.u32("ssm.conv_kernel", required=True)
        hp.ssm_d_inner = md.u32("ssm.inner_size", required=True)
        hp.ssm_d_state = md.u32("ssm.state_size", required=True)
        hp.ssm_dt_rank = md.u32("ssm.time_step_rank", required=True)
        if hp.ssm_d_conv < 2 or not hp.ssm_d_inner or not hp.ssm_d_state or not hp.ssm_dt_rank:
            raise md._err(
                "ssm.conv_kernel must be at least 2 and ssm.inner_size/state_size/time_step_rank positive"
            )
        hp.recurrent_layers = [n == 0 for n in hp.n_head_kv]
        hp.n_embd_r = (hp.ssm_d_conv - 1) * hp.ssm_d_inner
        hp.n_embd_s = hp.ssm_d_state * hp.ssm_d_inner

    def layer_rope(self, il: int, n_ctx: int = 0) -> Rope | None:
        return None

    def layer_moe(self, il: int) -> bool:
        return "ffn_gate_inp.weight" in self.blocks[il] if self.blocks else False

    def load_tensors(self, t: TensorLoader) -> None:
        hp = self.hp
        n, di, ds, r = hp.n_embd, hp.ssm_d_inner, hp.ssm_d_state, hp.ssm_dt_rank
        t("token_embd.weight", (hp.n_vocab, n))
        t("output_norm.weight", (n,))
        t("output.weight", (hp.n_vocab, n), required=False)
        for il in range(hp.n_layer):
            t.layer(il, "attn_norm.weight", (n,))
            t.layer(il, "ffn_norm.weight", (n,))
            if hp.is_recurrent(il):
                t.layer(il, "ssm_in.weight", (2 * di, n))
                t.layer(il, "ssm_conv1d.weight", (di, hp.ssm_d_conv))
                t.layer(il, "ssm_conv1d.bias", (di,), required=False)
                t.layer(il, "ssm_x.weight", (r + 2 * ds, di))
                t.layer(il, "ssm_dt.weight", (di, r))
                t.layer(il, "ssm_dt.bias", (di,))
                t.layer(il, "ssm_a", (di, ds))
                t.layer(il, "ssm_d", (di,))
                for name, size in (("ssm_dt_norm", r), ("ssm_b_norm", ds), ("ssm_c_norm", ds)):
                    t.layer(il, f"{name}.weight", (size,), required=False)
                t.layer(il, "ssm_out.weight", (n, di))
            else:
                nh, nkv, d, _ = hp.heads(il)
                t.layer(il, "attn_q.weight", (nh * d, n))
                t.layer(il, "attn_k.weight", (nkv * d, n))
                t.layer(il, "attn_v.weight", (nkv * d, n))
                t.layer(il, "attn_output.weight", (n, nh * d))
            if (
                hp.n_expert
                and t.layer(il, "ffn_gate_inp.weight", (hp.n_expert, n), required=False) is not None
            ):
                n_ff = hp.n_ff_exp or hp.n_ff[il]
                t.layer(il, "ffn_gate_exps.weight", (hp.n_expert, n_ff, n))
                t.layer(il, "ffn_up_exps.weight", (hp.n_expert, n_ff, n))
                t.layer(il, "ffn_down_exps.weight", (hp.n_expert, n, n_ff))
            else:
                t.layer(il, "ffn_gate.weight", (hp.n_ff[il], n))
                t.layer(il, "ffn_up.weight", (hp.n_ff[il], n))
                t.layer(il, "ffn_down.weight", (n, hp.n_ff[il]))
        self._finish_tensors(t)

    def build(self, g: GraphBuilder) -> Outputs:
        x = g.embed(self.w["token_embd.weight"])
        for il, blk in enumerate(self.blocks):
            h = g.build_norm(x, blk["attn_norm.weight"], name="attn_norm", il=il)
            h = build_mamba1(g, h, blk, il) if self.hp.is_recurrent(il) else g.attention(h, blk, il)
            h, x = g.select_outputs(il, h, x)
            x = g.cb(ops.add(x, h), "ffn_inp", il)
            h = g.build_norm(x, blk["ffn_norm.weight"], name="ffn_norm", il=il)
            h = g.build_moe_ffn(h, blk, il, False) if self.layer_moe(il) else g.build_ffn(h, blk, il)
            x = g.cb(ops.add(x, h), "l_out", il)
        return g.output(x, self.w["output_norm.weight"], self.output_weight())
