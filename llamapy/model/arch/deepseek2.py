"""DeepSeek V2 / V3 / R1 (llama.cpp's ``deepseek2``), multi-head latent attention (MLA) and a
mixture of experts with shared experts, the first ``leading_dense_block_count`` layers dense.

Attention: q from a low-rank projection (``attn_q_a`` -> RMS norm -> ``attn_q_b``; V2-Lite: a full
``attn_q``), split per head into a no-rope part and a rope part; one projection ``attn_kv_a_mqa``
gives a compressed KV latent (RMS-normed) and a single-head rope part of K. Two file layouts:

- MLA files (``key_length_mla`` / ``value_length_mla`` set; ``attn_k_b`` / ``attn_v_b``): the
  absorbed-weights path. q's no-rope part goes through ``attn_k_b`` into the latent space, so the
  attention is single-KV-head (MQA) over ``[k_pe | latent]`` rows, and V *is* the cached latent: the
  cache holds K only (``HParams.v_in_k``), V is a view of it; the output goes back through
  ``attn_v_b`` per head. Our K rows put the rope part first, so the K-shift rotates exactly it.
- older files (``attn_kv_b``): the latent is decompressed into per-head K and V (plain MHA cache).

YaRN as llama.cpp: the rope's own magnitude correction is cancelled and the attention scale carries
``mscale^2`` (``mscale = 1 + yarn_log_multiplier ln(1 / freq_scale)``). Routing: softmax (V2) or
sigmoid with a selection bias (V3), group-limited (``expert_group_count`` / ``_used_count``),
weights normalized and scaled. The next-token-prediction layers are skipped."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ...ggml import ops
from ...ggml.tensor import Tensor
from ...ggml.types import GGMLType
from ..blocks import GraphBuilder, Outputs, Rope, TensorLoader, Weights
from ..hf import HFConvert
from ..hparams import ROPE_NORM, HParams, MetaReader, ModelLoadError
from ..moe_blocks import GATING_SOFTMAX, build_moe_layer, load_moe_layer, read_moe_routing, skip_nextn_tensors
from . import Architecture, register


@register("deepseek2")
class Deepseek2(Architecture):
    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        hp.rope_type = ROPE_NORM
        read_moe_routing(hp, md, GATING_SOFTMAX)  # files without a gating key are V2's (softmax)
        hp.n_lora_q = md.u32("attention.q_lora_rank", 0)
        hp.n_lora_kv = md.u32("attention.kv_lora_rank", required=True)
        hp.n_embd_head_k_mla = md.u32("attention.key_length_mla", 0)
        hp.n_embd_head_v_mla = md.u32("attention.value_length_mla", 0)
        hp.rope_yarn_log_mul = md.f32("rope.scaling.yarn_log_multiplier", 0.0)
        mla = bool(hp.n_embd_head_k_mla and hp.n_embd_head_v_mla)
        if mla:  # single-KV-head attention over [k_pe | latent] rows; V = the latent, read from K
            if any(n != 1 for n in hp.n_head_kv) or hp.n_embd_head_k != hp.n_lora_kv + hp.n_rot:
                raise ModelLoadError(
                    f"{md.where}: MLA needs head_count_kv 1 and key_length = kv_lora_rank + rope dims "
                    f"({hp.n_lora_kv} + {hp.n_rot}), got {hp.n_head_kv[0]} and {hp.n_embd_head_k}"
                )
            if hp.n_embd_head_v != hp.n_lora_kv:
                raise ModelLoadError(f"{md.where}: MLA needs value_length = kv_lora_rank ({hp.n_lora_kv})")
            hp.v_in_k = True
        else:  # decompressed: the file's heads are the real ones
            hp.n_embd_head_k_mla, hp.n_embd_head_v_mla = hp.n_embd_head_k, hp.n_embd_head_v
        if not 0 < hp.n_rot < hp.n_embd_head_k_mla:
            raise ModelLoadError(
                f"{md.where}: rope.dimension_count {hp.n_rot} must be in 1..{hp.n_embd_head_k_mla - 1}"
            )
        if not hp.n_ff_exp:
            raise ModelLoadError(f"{md.where}: deepseek2 needs expert_feed_forward_length")

    @property
    def mla(self) -> bool:
        return self.hp.v_in_k

    def layer_moe(self, il: int) -> bool:
        return il >= self.hp.n_layer_dense_lead

    def layer_rope(self, il: int, n_ctx: int = 0) -> Rope | None:
        rope = super().layer_rope(il, n_ctx)
        # llama.cpp: cancel the rope's YaRN magnitude (1 + 0.1 ln(1/s)); the kq scale carries mscale^2
        return dataclasses.replace(
            rope, attn_factor=rope.attn_factor / (1.0 + 0.1 * math.log(1.0 / rope.freq_scale))
        )

    def kq_scale(self) -> float:
        hp = self.hp
        mscale = hp.rope_attn_factor * (1.0 + hp.rope_yarn_log_mul * math.log(1.0 / hp.rope_freq_scale))
        return mscale * mscale / math.sqrt(hp.n_embd_head_k_mla)

    # -- tensors ----------------------------------------------------------------------------------
    def load_tensors(self, t: TensorLoader) -> None:
        hp = self.hp
        n_embd, H, rank = hp.n_embd, hp.n_head[0], hp.n_lora_kv
        dk, dv, n_rot = hp.n_embd_head_k_mla, hp.n_embd_head_v_mla, hp.n_rot
        t("token_embd.weight", (hp.n_vocab, n_embd))
        t("output_norm.weight", (n_embd,))
        t("output.weight", (hp.n_vocab, n_embd), required=False)
        for il in range(hp.n_layer):
            t.layer(il, "attn_norm.weight", (n_embd,))
            if hp.n_lora_q:
                t.layer(il, "attn_q_a.weight", (hp.n_lora_q, n_embd))
                t.layer(il, "attn_q_a_norm.weight", (hp.n_lora_q,))
                t.layer(il, "attn_q_b.weight", (H * dk, hp.n_lora_q))
            else:
                t.layer(il, "attn_q.weight", (H * dk, n_embd))
            t.layer(il, "attn_kv_a_mqa.weight", (rank + n_rot, n_embd))
            t.layer(il, "attn_kv_a_norm.weight", (rank,))
            if self.mla:
                t.layer(il, "attn_k_b.weight", (H, rank, dk - n_rot))
                t.layer(il, "attn_v_b.weight", (H, dv, rank))
            else:
                t.layer(il, "attn_kv_b.weight", (H * (dk - n_rot + dv), rank))
            t.layer(il, "attn_output.weight", (n_embd, H * dv))
            t.layer(il, "ffn_norm.weight", (n_embd,))
            if self.layer_moe(il):
                load_moe_layer(self, t, il)
            else:
                t.layer(il, "ffn_gate.weight", (hp.n_ff[il], n_embd))
                t.layer(il, "ffn_up.weight", (hp.n_ff[il], n_embd))
                t.layer(il, "ffn_down.weight", (n_embd, hp.n_ff[il]))
        skip_nextn_tensors(self, t)
        self._finish_tensors(t)

    # -- graph ------------------------------------------------------------------------------------
    def build(self, g: GraphBuilder) -> Outputs:
        x = g.embed(self.w["token_embd.weight"])
        for il, blk in enumerate(self.blocks):
            h = g.build_norm(x, blk["attn_norm.weight"], name="attn_norm", il=il)
            h = self.build_mla(g, h, blk, il)
            h, x = g.select_outputs(il, h, x)
            x = g.cb(x + h, "ffn_inp", il)
            h = g.build_norm(x, blk["ffn_norm.weight"], name="ffn_norm", il=il)
            h = build_moe_layer(g, h, blk, il) if self.layer_moe(il) else g.build_ffn(h, blk, il)
            x = g.cb(x + h, "l_out", il)
        return g.output(x, self.w["output_norm.weight"], self.output_weight())

    def build_mla(self, g: GraphBuilder, h: Tensor, blk: Weights, il: int) -> Tensor:
        hp = self.hp
        T, H, rank, n_rot = g.inp.n_tokens, hp.n_head[il], hp.n_lora_kv, hp.n_rot
        dk, dv = hp.n_embd_head_k_mla, hp.n_embd_head_v_mla
        nope = dk - n_rot
        if hp.n_lora_q:
            q = g.cb(g.mm(blk["attn_q_a.weight"], h), "q", il)
            q = g.build_norm(q, blk["attn_q_a_norm.weight"])
            q = g.mm(blk["attn_q_b.weight"], q)
        else:
            q = g.mm(blk["attn_q.weight"], h)
        q = g.cb(ops.reshape(q, (T, H, dk)), "q", il)
        q_nope = g.cb(ops.view(q, (T, H, nope), q.strides, 0), "q_nope", il)
        q_pe = g.cb(ops.view(q, (T, H, n_rot), q.strides, 4 * nope), "q_pe", il)
        kv_pe = g.cb(g.mm(blk["attn_kv_a_mqa.weight"], h), "kv_cmpr_pe", il)  # [T, rank + n_rot]
        kv_cmpr = ops.view(kv_pe, (T, rank), kv_pe.strides, 0)
        k_pe = ops.view(kv_pe, (T, 1, n_rot), (kv_pe.strides[0], kv_pe.strides[0], 4), 4 * rank)
        rope = self.layer_rope(il, g.inp.n_ctx)
        q_pe = g.cb(rope.apply(ops.cont(q_pe), g.inp.pos), "q_pe", il)
        k_pe = g.cb(rope.apply(ops.cont(k_pe), g.inp.pos), "k_pe", il)
        kv_cmpr = g.build_norm(ops.cont(kv_cmpr), blk["attn_kv_a_norm.weight"], name="kv_cmpr", il=il)
        kq_scale = self.kq_scale()
        if not self.mla:  # decompress the latent into per-head K and V (MHA)
            kv = g.cb(ops.reshape(g.mm(blk["attn_kv_b.weight"], kv_cmpr), (T, H, nope + dv)), "kv", il)
            k_nope = ops.view(kv, (T, H, nope), kv.strides, 0)
            v = ops.cont(ops.view(kv, (T, H, dv), kv.strides, 4 * nope))
            k_pe_h = ops.add(ops.scale(q_pe, 0.0), k_pe)  # k_pe repeated over the heads (ggml_repeat)
            # rope part first (HF: last; the dot product is the same), so the K-shift rotates it
            q = g.cb(ops.concat(q_pe, ops.cont(q_nope), 2), "Qcur", il)
            k = g.cb(ops.concat(k_pe_h, ops.cont(k_nope), 2), "Kcur", il)
            out = g.build_attn(q, k, g.cb(v, "Vcur", il), il, kq_scale)  # [T, H * dv]
        else:  # absorbed: q_nope into the latent space, MQA over [k_pe | latent], V = latent
            qn = ops.cont(ops.permute(q_nope, (1, 0, 2)))  # [H, T, nope]
            q_abs = g.cb(ops.mul_mat(blk["attn_k_b.weight"], qn), "q_nope_absorbed", il)  # [H, T, rank]
            q_abs = ops.cont(ops.permute(q_abs, (1, 0, 2)))  # [T, H, rank]
            q = g.cb(ops.concat(q_pe, q_abs, 2), "Qcur", il)  # [T, H, n_rot + rank]
            k = g.cb(ops.concat(k_pe, ops.reshape(kv_cmpr, (T, 1, rank)), 2), "Kcur", il)
            lat = self.attn_k_only(g, q, k, il, kq_scale)  # [T, H, rank]
            lat = ops.cont(ops.permute(lat, (1, 0, 2)))  # [H, T, rank]
            out = ops.mul_mat(blk["attn_v_b.weight"], lat)  # [H, T, dv]
            out = ops.reshape(ops.cont(ops.permute(out, (1, 0, 2))), (T, H * dv))
            out = g.cb(out, "kqv_out", il)
        return g.cb(g.mm(blk["attn_output.weight"], out), "attn_out", il)

    def attn_k_only(self, g: GraphBuilder, q: Tensor, k: Tensor, il: int, kq_scale: float) -> Tensor:
        """Attention over the layer's K-only cache: store ``k [T, 1, n_rot + rank]``, read V as the
        latent part of the cached rows. q [T, H, n_rot + rank] -> [T, H, rank]."""
        hp = self.hp
        T, dk, n_rot = g.inp.n_tokens, k.shape[-1], hp.n_rot
        kvi = g.inp.kv[il]
        kbuf = kvi.k[il]
        if kbuf.type not in (GGMLType.F32, GGMLType.F16):
            raise ModelLoadError(
                f"deepseek2 (MLA): the K-only cache must be f16 or f32 (V is read from inside its rows), "
                f"got {kbuf.type.name.lower()}"
            )
        k_st = ops.set_rows(kbuf, ops.reshape(k, (T, dk)), kvi.idx)
        kc = ops.view(k_st, (kvi.n_kv, 1, dk))
        esize = kbuf.nbytes // (kbuf.shape[0] * kbuf.shape[1])
        vc = ops.cont(ops.view(k_st, (kvi.n_kv, 1, dk - n_rot), kc.strides, esize * n_rot))
        g.kv_views[il] = (kc, vc, kvi.mask)
        if g.inp.flash_attn:
            return g.cb(ops.flash_attn_ext(q, kc, vc, kvi.mask, kq_scale), "kqv", il)
        qh = ops.cont(ops.permute(q, (1, 0, 2)))  # [H, T, dk]
        kq = ops.soft_max(ops.mul_mat(ops.cont(ops.permute(kc, (1, 0, 2))), qh), kvi.mask, scale=kq_scale)
        vt = ops.cont(ops.permute(vc, (1, 2, 0)))  # [1, rank, n_kv]
        return g.cb(ops.cont(ops.permute(ops.mul_mat(vt, kq), (1, 0, 2))), "kqv", il)  # [T, H, rank]


# ---------------------------------------------------------------------------------------------
# llamapy convert: llama.cpp's DeepseekV2Model (MLA kept compressed: kv_b split into k_b^T and v_b)

_N_KV_HF = "_n_kv_heads_hf"  # num_key_value_heads as config.json sets it (the file says 1: MQA)


def _hf_hparams(hp: dict) -> dict:
    return {**hp, _N_KV_HF: hp.get("num_key_value_heads"), "num_key_value_heads": 1,
            "rms_norm_eps": hp.get("rms_norm_eps", 1e-6)}  # fmt: skip


def _hf_params(ctx, kv) -> None:
    """DeepseekV2Model.set_gguf_parameters, after TextModel's."""
    hp = ctx.hparams
    has_moe = hp.get("n_routed_experts") is not None
    first_dense = hp.get("first_k_dense_replace")
    kv.add_leading_dense_block_count(
        first_dense if first_dense is not None else 0 if has_moe else ctx.block_count
    )
    kv_lora_rank = hp.get("kv_lora_rank", 512)
    kv.add_vocab_size(hp["vocab_size"])
    if hp.get("q_lora_rank") is not None:
        kv.add_q_lora_rank(hp["q_lora_rank"])
    kv.add_kv_lora_rank(kv_lora_rank)
    kv.add_key_length(kv_lora_rank + hp["qk_rope_head_dim"])
    kv.add_value_length(kv_lora_rank)
    kv.add_key_length_mla(hp["qk_nope_head_dim"] + hp["qk_rope_head_dim"])
    kv.add_value_length_mla(hp["v_head_dim"])
    kv.add_expert_feed_forward_length(ctx.find_hparam(["moe_intermediate_size", "intermediate_size"]))
    if (n := hp.get("n_routed_experts")) is not None:
        kv.add_expert_count(n)
    kv.add_expert_shared_count(hp.get("n_shared_experts", 0))
    if (v := hp.get("routed_scaling_factor")) is not None:
        kv.add_expert_weights_scale(v)
    if hp.get("norm_topk_prob"):
        kv.add_expert_weights_norm(True)
    kv.add_rope_dimension_count(hp["qk_rope_head_dim"])
    if (mscale_all := ctx.rope_parameters.get("mscale_all_dim")) is not None:
        kv.add_rope_scaling_yarn_log_mul(0.1 * mscale_all)


def _hf_tensor(ctx, name, data, bid):
    """DeepseekV2Model.modify_tensors: the MTP layers and a tied lm_head dropped, kv_b_proj split per head
    into k_b (transposed: q's no-rope part into the latent) and v_b."""
    hp = ctx.hparams
    if hp.get("tie_word_embeddings", False) and name in ("lm_head.weight", "model.lm_head.weight"):
        return []
    if bid is not None and name.startswith("model.layers.") and bid >= hp["num_hidden_layers"]:
        return []
    if name.endswith("mlp.gate.e_score_correction_bias"):  # (not in older gguf-py tensor maps)
        return [(f"blk.{bid}.exp_probs_b.bias", data)]
    if name.endswith("kv_b_proj.weight"):
        n_kv, d_v, d_nope = hp[_N_KV_HF], hp["v_head_dim"], hp["qk_nope_head_dim"]
        if data.shape[0] != n_kv * (d_v + d_nope):
            raise ValueError(
                f"kv_b_proj has {data.shape[0]} rows, not {n_kv} x (v_head_dim + qk_nope_head_dim)"
            )
        kv_b = data.reshape(n_kv, d_v + d_nope, data.shape[-1])
        k_b = np.ascontiguousarray(kv_b[:, :d_nope].transpose(0, 2, 1))
        return [
            (name.replace("kv_b_proj", "k_b_proj"), k_b),
            (name.replace("kv_b_proj", "v_b_proj"), kv_b[:, d_nope:]),
        ]
    return [(name, data)]


HF_CONVERT = HFConvert(
    "deepseek2",
    ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"),
    params=_hf_params,
    tensor=_hf_tensor,
    adjust_hparams=_hf_hparams,
)
