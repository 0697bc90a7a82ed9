"""Qwen3.5 (``qwen35``, dense) and Qwen3.5-MoE (``qwen35moe``), Gated DeltaNet and gated attention: three of
four layers are Gated DeltaNet (causal conv, gated delta rule over a recurrent state), every fourth is
gated full attention (q and an output gate from one projection, per-head q/k RMS norms, interleaved
multi-section rope on a quarter of the head). Norms multiply by the stored (1 + w) as llama.cpp's converter
writes them."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...ggml import ops
from ...ggml.tensor import Tensor
from ..blocks import GraphBuilder, Outputs, Rope, TensorLoader, Weights, rope_for_layer
from ..hparams import ROPE_NEOX, HParams, MetaReader, ModelLoadError
from ..rs_blocks import build_gated_delta_net, read_ssm_hparams, recurrent_every
from . import Architecture, register
from .glm4moe import skip_nextn_tensors


@dataclass
class SectionRope(Rope):
    """Rope over sections of the rotary dims (ggml's ``rope_multi``; text: one position for all)."""

    sections: tuple[int, ...] = ()
    section_mode: int = ops.ROPE_IMROPE

    def apply(self, x: Tensor, pos: Tensor) -> Tensor:
        if not self.sections:
            return super().apply(x, pos)
        return ops.rope(
            x, pos, self.n_dims, mode=self.section_mode, freq_base=self.freq_base, freq_scale=self.freq_scale,
            n_ctx_orig=self.n_ctx_orig, ext_factor=self.ext_factor, attn_factor=self.attn_factor,
            beta_fast=self.beta_fast, beta_slow=self.beta_slow, sections=self.sections,
        )  # fmt: skip


def load_qwen35_hparams(hp: HParams, md: MetaReader) -> None:
    hp.rope_type = ROPE_NEOX
    hp.n_layer_nextn = md.u32("nextn_predict_layers", 0)  # MTP blocks after the trunk: not run
    if hp.n_layer_nextn:
        if hp.n_layer_nextn >= hp.n_layer:
            raise md._err(f"nextn_predict_layers {hp.n_layer_nextn} must be < block_count {hp.n_layer}")
        n = hp.n_layer = hp.n_layer - hp.n_layer_nextn
        hp.n_head, hp.n_head_kv, hp.n_ff, hp.swa_layers = (
            hp.n_head[:n],
            hp.n_head_kv[:n],
            hp.n_ff[:n],
            hp.swa_layers[:n],
        )
    read_ssm_hparams(hp, md)
    if hp.ssm_d_inner // hp.ssm_dt_rank != hp.ssm_d_state:
        raise ModelLoadError(
            f"{md.where}: {md.arch} needs value heads of ssm.state_size ({hp.ssm_d_state}) values, got "
            f"ssm.inner_size / ssm.time_step_rank = {hp.ssm_d_inner // hp.ssm_dt_rank}"
        )
    hp.recurrent_layers = recurrent_every(md, hp.n_layer, hp.n_layer_nextn)
    secs = md.raw("rope.dimension_sections")
    hp.rope_sections = tuple(int(s) for s in secs) if secs is not None else ()
    conv_ch = hp.ssm_d_inner + 2 * hp.ssm_n_group * hp.ssm_d_state
    hp.n_embd_r = (hp.ssm_d_conv - 1) * conv_ch
    hp.n_embd_s = hp.ssm_d_state * hp.ssm_d_inner
    hp.expert_weights_norm = True


def load_linear_attn_tensors(arch: Architecture, t: TensorLoader, il: int) -> None:
    hp = arch.hp
    n_embd = hp.n_embd
    key_dim = hp.ssm_d_state * hp.ssm_n_group
    value_dim = hp.ssm_d_inner
    conv_dim = 2 * key_dim + value_dim
    t.layer(il, "attn_qkv.weight", (conv_dim, n_embd))
    t.layer(il, "attn_gate.weight", (value_dim, n_embd))
    t.layer(il, "ssm_conv1d.weight", (conv_dim, hp.ssm_d_conv))
    t.layer(il, "ssm_dt.bias", (hp.ssm_dt_rank,))
    t.layer(il, "ssm_a", (hp.ssm_dt_rank,))
    t.layer(il, "ssm_beta.weight", (hp.ssm_dt_rank, n_embd))
    t.layer(il, "ssm_alpha.weight", (hp.ssm_dt_rank, n_embd))
    t.layer(il, "ssm_norm.weight", (value_dim // hp.ssm_dt_rank,))
    t.layer(il, "ssm_out.weight", (n_embd, value_dim))


def load_ffn_tensors(arch: Architecture, t: TensorLoader, il: int) -> None:
    hp = arch.hp
    n_embd = hp.n_embd
    if not arch.layer_moe(il):
        t.layer(il, "ffn_gate.weight", (hp.n_ff[il], n_embd))
        t.layer(il, "ffn_up.weight", (hp.n_ff[il], n_embd))
        t.layer(il, "ffn_down.weight", (n_embd, hp.n_ff[il]))
        return
    n_ff, n_sh = hp.n_ff_exp or hp.n_ff[il], hp.n_ff_shexp or hp.n_ff_exp or hp.n_ff[il]
    t.layer(il, "ffn_gate_inp.weight", (hp.n_expert, n_embd))
    t.layer(il, "ffn_gate_exps.weight", (hp.n_expert, n_ff, n_embd))
    t.layer(il, "ffn_up_exps.weight", (hp.n_expert, n_ff, n_embd))
    t.layer(il, "ffn_down_exps.weight", (hp.n_expert, n_embd, n_ff))
    t.layer(il, "ffn_gate_inp_shexp.weight", (n_embd,), required=False)
    t.layer(il, "ffn_gate_shexp.weight", (n_sh, n_embd))
    t.layer(il, "ffn_up_shexp.weight", (n_sh, n_embd))
    t.layer(il, "ffn_down_shexp.weight", (n_embd, n_sh))


def build_gated_attention(g: GraphBuilder, h: Tensor, blk: Weights, il: int) -> Tensor:
    """Full attention whose q projection also gives a per-head output gate: ``[q_h | gate_h]`` per head."""
    T = g.inp.n_tokens
    nh, nkv, d, _ = g.hp.heads(il)
    qg = ops.reshape(g.cb(g.mm(blk["attn_q.weight"], h), "Qcur_full", il), (T, nh, 2 * d))
    q = ops.cont(ops.view(qg, (T, nh, d), qg.strides, 0))
    gate = ops.reshape(ops.cont(ops.view(qg, (T, nh, d), qg.strides, 4 * d)), (T, nh * d))
    q = g.build_norm(q, blk["attn_q_norm.weight"], name="Qcur_normed", il=il)
    k = ops.reshape(g.mm(blk["attn_k.weight"], h), (T, nkv, d))
    k = g.build_norm(k, blk["attn_k_norm.weight"], name="Kcur_normed", il=il)
    v = ops.reshape(g.mm(blk["attn_v.weight"], h), (T, nkv, d))
    rope = g.arch.layer_rope(il, g.inp.n_ctx)
    q, k = g.cb(rope.apply(q, g.inp.pos), "Qcur", il), g.cb(rope.apply(k, g.inp.pos), "Kcur", il)
    out = g.build_attn(q, k, g.cb(v, "Vcur", il), il, 1.0 / math.sqrt(d))
    out = g.cb(ops.mul(out, g.cb(ops.sigmoid(gate), "gate_sigmoid", il)), "attn_gated", il)
    return g.cb(g.mm(blk["attn_output.weight"], out), "attn_output", il)


@register("qwen35", "qwen35moe")
class Qwen35(Architecture):
    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        load_qwen35_hparams(hp, md)
        if hp.arch == "qwen35moe" and not hp.n_expert:
            raise ModelLoadError(f"{md.where}: qwen35moe needs expert_count > 0")

    def layer_rope(self, il: int, n_ctx: int = 0) -> Rope | None:
        r = rope_for_layer(self.hp, il)
        return SectionRope(
            **{k: getattr(r, k) for k in r.__dataclass_fields__}, sections=self.hp.rope_sections
        )

    def load_tensors(self, t: TensorLoader) -> None:
        hp = self.hp
        t("token_embd.weight", (hp.n_vocab, hp.n_embd))
        t("output_norm.weight", (hp.n_embd,))
        t("output.weight", (hp.n_vocab, hp.n_embd), required=False)
        for il in range(hp.n_layer):
            t.layer(il, "attn_norm.weight", (hp.n_embd,))
            t.layer(il, "post_attention_norm.weight", (hp.n_embd,))
            if hp.is_recurrent(il):
                load_linear_attn_tensors(self, t, il)
            else:
                nh, nkv, d, _ = hp.heads(il)
                t.layer(il, "attn_q.weight", (2 * nh * d, hp.n_embd))
                t.layer(il, "attn_k.weight", (nkv * d, hp.n_embd))
                t.layer(il, "attn_v.weight", (nkv * d, hp.n_embd))
                t.layer(il, "attn_output.weight", (hp.n_embd, nh * d))
                t.layer(il, "attn_q_norm.weight", (d,))
                t.layer(il, "attn_k_norm.weight", (d,))
            load_ffn_tensors(self, t, il)
        skip_nextn_tensors(self, t)
        self._finish_tensors(t)

    def build(self, g: GraphBuilder) -> Outputs:
        return build_hybrid_decoder(self, g)


def build_hybrid_decoder(arch: Architecture, g: GraphBuilder) -> Outputs:
    """x += mixer(norm(x)) (gated delta net or gated attention); x += ffn(post_attention_norm(x))."""
    x = g.embed(arch.w["token_embd.weight"])
    for il, blk in enumerate(arch.blocks):
        h = g.build_norm(x, blk["attn_norm.weight"], name="attn_norm", il=il)
        if arch.hp.is_recurrent(il):
            h = build_gated_delta_net(g, h, blk, il)
        else:
            h = build_gated_attention(g, h, blk, il)
        h, x = g.select_outputs(il, h, x)
        x = g.cb(ops.add(x, h), "attn_residual", il)
        h = g.build_norm(x, blk["post_attention_norm.weight"], name="attn_post_norm", il=il)
        if arch.layer_moe(il):
            h = g.cb(
                ops.add(g.build_moe_ffn(h, blk, il, True), g.build_shared_expert(h, blk, il)), "ffn_out", il
            )
        else:
            h = g.build_ffn(h, blk, il)
        x = g.cb(ops.add(x, h), "l_out", il)
    return g.output(x, arch.w["output_norm.weight"], arch.output_weight())
