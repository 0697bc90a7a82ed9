"""Llama 4 (text), LLaMA's layout where every 4th layer has no rope (NoPE) and attends globally,
with attention temperature tuning on its queries (``1 + 0.1 log(1 + floor((pos + 1) / 8192))``);
the rope layers RMS-normalize q and k without weights after the rope (``Llama4TextL2Norm``; not
on the 128-expert model) and use chunked attention: a token sees only the keys of its own chunk of
``attention.sliding_window`` positions (the KV cache's ``swa_type="chunked"`` window). Every
``interleave_moe_layer_step``-th layer is a mixture of experts: one expert per token chosen on the
router logits, its input scaled by the sigmoid of its logit, plus a shared expert."""

from __future__ import annotations

from ...ggml import ops
from ...ggml.tensor import Tensor
from ..blocks import GraphBuilder, Outputs, Rope, Weights
from ..dense_blocks import DenseArchitecture, DenseLayout
from ..hparams import HParams, MetaReader, ModelLoadError
from . import register

N_NO_ROPE_LAYER_STEP = 4


@register("llama4")
class Llama4(DenseArchitecture):
    layout = DenseLayout(shared_expert=True)  # its graph is its own (build); the tensors are these

    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        if not hp.n_expert or not hp.n_ff_exp:
            raise ModelLoadError(f"{md.where}: llama4 needs expert_count and expert_feed_forward_length")
        hp.n_moe_layer_step = md.u32("interleave_moe_layer_step", 1) or 1
        hp.n_ff_shexp = hp.n_ff_exp
        hp.n_attn_chunk = md.u32("attention.sliding_window", 8192)  # 0: no chunks and no NoPE layers
        if (
            hp.n_attn_chunk
        ):  # llama.cpp's LLAMA_SWA_TYPE_CHUNKED on the rope layers (the NoPE ones are global)
            hp.swa_type = "chunked"
            hp.n_swa = hp.n_attn_chunk
            hp.swa_layers = [(il + 1) % N_NO_ROPE_LAYER_STEP != 0 for il in range(hp.n_layer)]
        hp.f_attn_temp_scale = md.f32("attention.temperature_scale", 0.1)
        hp.n_attn_temp_floor_scale = md.u32("attention.temperature_length", 8192) or 8192
        hp.f_attn_temp_offset = 1.0

    @property
    def kq_norm(self) -> bool:
        return self.hp.n_expert != 128  # as llama.cpp: the 128-expert model (Maverick) has none

    def layer_rope(self, il: int, n_ctx: int = 0) -> Rope | None:
        if self.hp.n_attn_chunk and (il + 1) % N_NO_ROPE_LAYER_STEP == 0:
            return None
        return super().layer_rope(il, n_ctx)

    def layer_moe(self, il: int) -> bool:
        return (il + 1) % self.hp.n_moe_layer_step == 0

    def build(self, g: GraphBuilder) -> Outputs:
        hp = self.hp
        temp = g.inp_attn_temp(hp.f_attn_temp_scale, hp.n_attn_temp_floor_scale, hp.f_attn_temp_offset)
        x = g.embed(self.w["token_embd.weight"])
        for il, blk in enumerate(self.blocks):
            h = g.build_norm(x, blk["attn_norm.weight"], name="attn_norm", il=il)
            h = self.build_attention(g, h, blk, il, temp)
            h, x = g.select_outputs(il, h, x)
            x = g.cb(x + h, "ffn_inp", il)
            h = g.build_norm(x, blk["ffn_norm.weight"], name="ffn_norm", il=il)
            if self.layer_moe(il):
                moe = g.build_moe_ffn(h, blk, il, False, gating="sigmoid", weight_before_ffn=True)
                h = g.cb(moe + g.build_shared_expert(h, blk, il), "ffn_out", il)
            else:
                h = g.build_ffn(h, blk, il)
            x = g.cb(x + h, "l_out", il)
        return g.output(x, self.w["output_norm.weight"], self.output_weight())

    def build_attention(self, g: GraphBuilder, h: Tensor, blk: Weights, il: int, temp: Tensor) -> Tensor:
        hp = self.hp
        q, k, v = g.qkv(h, blk, il)
        rope = self.layer_rope(il, g.inp.n_ctx)
        if rope is not None:
            q, k = rope.apply(q, g.inp.pos), rope.apply(k, g.inp.pos)
            if self.kq_norm:  # Llama4TextL2Norm: an RMS norm without weights, after the rope
                q = g.cb(ops.rms_norm(q, hp.norm_rms_eps), "Qcur_normed", il)
                k = g.cb(ops.rms_norm(k, hp.norm_rms_eps), "Kcur_normed", il)
        elif hp.f_attn_temp_scale:
            q = g.cb(ops.mul(q, temp), "Qcur_attn_temp_scaled", il)
        q, k, v = g.cb(q, "Qcur", il), g.cb(k, "Kcur", il), g.cb(v, "Vcur", il)
        out = g.build_attn(q, k, v, il, 1.0 / hp.heads(il).n_embd_head_k ** 0.5)
        return g.cb(g.mm(blk["attn_output.weight"], out), "attn_out", il)
