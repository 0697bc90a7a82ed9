"""Gemma 4 (text): Gemma 3's interleaved sliding-window layout with per-layer head sizes (global layers
have larger heads, and may have their own KV head count), proportional rope on the global layers (a
quarter of the head rotated: ``rope_freqs.weight`` holds 1 for the rotated pairs and 1e30 for the
others), RMS-normed q/k and an unscaled RMS norm on v, attention scale 1, K reused as V on global layers
when the file has no ``attn_v`` (``attention_k_eq_v``), KV sharing (the last ``shared_kv_layers`` layers
attend over the cached K/V of the last earlier layer of their kind), per-layer embeddings (PLE), a
per-layer output scale, and a MoE variant (a dense GeGLU MLP beside GeGLU experts with their own router
norm and per-expert scales). As llama.cpp's ``gemma4-iswa.cpp``."""

from __future__ import annotations

import math

import numpy as np

from ...ggml import ops
from ...ggml.tensor import Tensor
from ...ggml.types import GGMLType
from ..blocks import GraphBuilder, Outputs, Rope, TensorLoader, Weights, rope_for_layer
from ..gemma_blocks import kv_shared_attention, per_layer_inputs, read_kv_sharing
from ..hf import HFConvert
from ..hparams import ROPE_NEOX, HParams, MetaReader, swa_pattern
from . import Architecture, register


@register("gemma4")
class Gemma4(Architecture):
    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        hp.rope_type = ROPE_NEOX
        hp.f_attention_scale = 1.0
        hp.n_swa = md.u32("attention.sliding_window", 512) or 0
        hp.non_causal_type = "swa_only"  # an image's bidirectional attention: sliding-window layers only
        hp.swa_layers = swa_pattern(md, hp.n_layer, 6)
        hp.rope_freq_base_swa = md.f32("rope.freq_base_swa", 10000.0)
        hp.rope_freq_scale_swa = 1.0
        hp.n_embd_head_k_swa = md.u32("attention.key_length_swa", hp.n_embd_head_k)
        hp.n_embd_head_v_swa = md.u32("attention.value_length_swa", hp.n_embd_head_v)
        hp.n_rot_swa = md.u32("rope.dimension_count_swa", hp.n_embd_head_k_swa)
        if hp.n_rot_swa > hp.n_embd_head_k_swa or hp.n_rot_swa % 2:
            raise md._err(
                f"rope.dimension_count_swa {hp.n_rot_swa} must be even and at most the sliding-window "
                f"head size {hp.n_embd_head_k_swa}"
            )
        for il in range(hp.n_layer):
            h = hp.heads(il)
            if h.n_embd_head_k != h.n_embd_head_v:
                raise md._err(f"layer {il}: K head size {h.n_embd_head_k} != V head size {h.n_embd_head_v}")
        read_kv_sharing(hp, md)
        hp.n_embd_per_layer = md.u32("embedding_length_per_layer_input", 0) or 0

    # -- tensors ----------------------------------------------------------------------------------
    def load_tensors(self, t: TensorLoader) -> None:
        hp = self.hp
        n_embd, n_pl = hp.n_embd, hp.n_embd_per_layer
        t("token_embd.weight", (hp.n_vocab, n_embd))
        t("output_norm.weight", (n_embd,))
        t("output.weight", (hp.n_vocab, n_embd), required=False)
        t("rope_freqs.weight", (hp.n_rot // 2,), required=False)
        if n_pl:
            t("per_layer_token_embd.weight", (hp.n_vocab, hp.n_layer * n_pl))
            t("per_layer_model_proj.weight", (hp.n_layer * n_pl, n_embd))
            t("per_layer_proj_norm.weight", (n_pl,))
        for il in range(hp.n_layer):
            nh, nkv, dk, _ = hp.heads(il)
            for name in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"):
                t.layer(il, f"{name}.weight", (n_embd,))
            t.layer(il, "attn_q.weight", (nh * dk, n_embd))
            t.layer(il, "attn_q_norm.weight", (dk,))
            t.layer(il, "attn_output.weight", (n_embd, nh * dk))
            own = hp.kv_layer(il) == il  # a layer that reuses K/V has no K/V projections
            t.layer(il, "attn_k.weight", (nkv * dk, n_embd), required=own)
            t.layer(il, "attn_v.weight", (nkv * dk, n_embd), required=False)  # absent: V = K
            t.layer(il, "attn_k_norm.weight", (dk,), required=own)
            n_ff = hp.n_ff[il]
            t.layer(il, "ffn_gate.weight", (n_ff, n_embd))
            t.layer(il, "ffn_up.weight", (n_ff, n_embd))
            t.layer(il, "ffn_down.weight", (n_embd, n_ff))
            t.layer(il, "layer_output_scale.weight", (1,), required=False)
            if hp.n_expert:
                E, n_ff_exp = hp.n_expert, hp.n_ff_exp
                t.layer(il, "ffn_gate_inp.weight", (E, n_embd))
                t.layer(il, "ffn_gate_inp.scale", (n_embd,))
                t.layer(il, "ffn_gate_up_exps.weight", (E, 2 * n_ff_exp, n_embd))
                t.layer(il, "ffn_down_exps.weight", (E, n_embd, n_ff_exp))
                t.layer(il, "ffn_down_exps.scale", (E,), required=False)
                for name in ("post_ffw_norm_1", "pre_ffw_norm_2", "post_ffw_norm_2"):
                    t.layer(il, f"{name}.weight", (n_embd,))
            if n_pl:
                t.layer(il, "inp_gate.weight", (n_pl, n_embd))
                t.layer(il, "proj.weight", (n_embd, n_pl))
                t.layer(il, "post_norm.weight", (n_embd,))
        self._finish_tensors(t)

    # -- per-layer choices -------------------------------------------------------------------------
    def layer_rope(self, il: int, n_ctx: int = 0) -> Rope | None:
        """Local layers: plain neox rope over ``n_rot_swa`` dims; global layers: proportional rope (all
        head dims, the unrotated pairs' frequency divided by 1e30 through ``rope_freqs.weight``)."""
        swa = self.hp.is_swa(il)
        rope = rope_for_layer(self.hp, il, freq_factors=None if swa else self.w.get("rope_freqs.weight"))
        rope.n_dims = self.hp.n_rot_swa if swa else self.hp.n_rot
        return rope

    def layer_moe(self, il: int) -> bool:
        return "ffn_gate_inp.weight" in self.blocks[il]

    # -- graph --------------------------------------------------------------------------------------
    def build(self, g: GraphBuilder) -> Outputs:
        hp, inp = self.hp, g.inp
        # raw embeddings (images) are not scaled
        x = g.embed(
            self.w["token_embd.weight"], scale=math.sqrt(hp.n_embd) if inp.tokens is not None else None
        )
        ple = per_layer_inputs(self, g, x) if hp.n_embd_per_layer else None
        for il, blk in enumerate(self.blocks):
            h = g.build_norm(x, blk["attn_norm.weight"], name="attn_norm", il=il)
            h = kv_shared_attention(self, g, h, blk, il)
            h, x = g.select_outputs(il, h, x)
            h = g.build_norm(h, blk["post_attention_norm.weight"], name="attn_post_norm", il=il)
            x = g.cb(ops.add(x, h), "attn_out", il)
            if self.layer_moe(il):
                m = g.build_norm(x, blk["ffn_norm.weight"], name="ffn_norm_1", il=il)
                m = g.build_ffn(m, blk, il, act="gelu")
                m = g.build_norm(m, blk["post_ffw_norm_1.weight"], name="ffn_mlp", il=il)
                e = g.build_norm(x, blk["pre_ffw_norm_2.weight"], name="ffn_norm_2", il=il)
                e = moe_ffn(g, x, e, blk, il)
                e = g.build_norm(e, blk["post_ffw_norm_2.weight"], name="ffn_moe", il=il)
                h = g.cb(ops.add(m, e), "ffn_moe_combined", il)
            else:
                h = g.build_norm(x, blk["ffn_norm.weight"], name="ffn_norm", il=il)
                h = g.build_ffn(h, blk, il, act="gelu")
            h = g.build_norm(h, blk["post_ffw_norm.weight"], name="ffn_post_norm", il=il)
            x = ops.add(x, h)
            if ple is not None:
                x = per_layer_embedding(g, x, ple, blk, il)
            out_scale = blk.get("layer_output_scale.weight")
            if out_scale is not None:
                x = g.cb(ops.mul(x, out_scale), "out_scaled", il)
            x = g.cb(x, "l_out", il)
        return g.output(
            x, self.w["output_norm.weight"], self.output_weight(), softcap=hp.f_final_logit_softcapping
        )


def per_layer_slice(g: GraphBuilder, ple: Tensor, il: int) -> Tensor:
    """Layer ``il``'s PLE input F32[T or n_outputs, n_pl] (the output rows only at the last layer)."""
    T, L, P = ple.shape
    cur = ops.cont(ops.view(ple, (T, P), (ple.strides[0], ple.strides[2]), il * ple.strides[1]))
    if il == g.hp.n_layer - 1 and g.inp.out_ids is not None:
        cur = ops.get_rows(cur, g.inp.out_ids)
    return cur


def per_layer_embedding(g: GraphBuilder, x: Tensor, ple: Tensor, blk: Weights, il: int) -> Tensor:
    """x + post_norm(proj(gelu(inp_gate(x)) * ple[il]))."""
    cb = g.cb
    h = ops.gelu(g.mm(blk["inp_gate.weight"], cb(x, "pe_in", il)))
    h = g.mm(blk["proj.weight"], ops.mul(h, per_layer_slice(g, ple, il)))
    h = g.build_norm(h, blk["post_norm.weight"], name="per_layer_embd_out", il=il)
    return ops.add(x, h)


def moe_ffn(g: GraphBuilder, x: Tensor, h: Tensor, blk: Weights, il: int) -> Tensor:
    """Gemma 4's experts: the router reads the unweighted RMS norm of the residual x (/ sqrt(n_embd), x
    ``ffn_gate_inp.scale``); softmax, top-k, renormalized, times the per-expert scale; GeGLU experts on
    ``h`` with fused [gate | up] weights."""
    hp = g.hp
    T, E, k = h.shape[0], hp.n_expert, hp.n_expert_used
    r = ops.scale(ops.rms_norm(x, hp.norm_rms_eps), 1.0 / math.sqrt(hp.n_embd))
    r = ops.mul(r, blk["ffn_gate_inp.scale"])
    logits = g.cb(g.mm(blk["ffn_gate_inp.weight"], r), "ffn_moe_logits", il)  # [T, E]
    probs = g.cb(ops.soft_max(logits), "ffn_moe_probs", il)
    ids = g.cb(ops.top_k(probs, k), "ffn_moe_topk", il)  # I32[T, k]
    # gather p[t, ids[t, j]] as a product with one-hot "experts" (get_rows is 2-D only)
    eye = ops.weight("moe_onehot", GGMLType.F32, (E, 1, E), np.eye(E, dtype=np.float32))

    def gather(p: Tensor) -> Tensor:
        return ops.mul_mat_id(eye, ops.reshape(p, (T, 1, E)), ids)  # [T, k, 1]

    scale = blk.get("ffn_down_exps.scale")
    w = gather(probs if scale is None else ops.mul(probs, scale))
    w = ops.div(w, ops.reshape(ops.sum_rows(ops.reshape(gather(probs), (T, k))), (T, 1, 1)))
    w = g.cb(w, "ffn_moe_weights", il)
    gu = ops.mul_mat_id(blk["ffn_gate_up_exps.weight"], ops.reshape(h, (T, 1, h.shape[-1])), ids)
    n = gu.shape[-1] // 2
    gate = ops.cont(ops.view(gu, (T, k, n), gu.strides, 0))
    up = ops.cont(ops.view(gu, (T, k, n), gu.strides, 4 * n))
    act = g.cb(ops.geglu(gate, up), "ffn_moe_geglu", il)
    y = g.cb(ops.mul_mat_id(blk["ffn_down_exps.weight"], act, ids), "ffn_moe_down", il)
    y = ops.mul(y, w)  # [T, k, n_embd]
    out = ops.sum_rows(ops.cont(ops.permute(y, (0, 2, 1))))
    return g.cb(ops.reshape(out, (T, hp.n_embd)), "ffn_moe_out", il)


# ---------------------------------------------------------------------------------------------
# llamapy convert: llama.cpp's Gemma4Model (Gemma3Model's keys and tensors, norms stored as they are)

# TextModel.filter_tensors: the multimodal towers of a Gemma4ForConditionalGeneration checkpoint
_MM_PARTS = (
    "visual.",
    "vision.",
    "audio.",
    "vision_",
    "audio_",
    "projector.",
    "patch_embed",
    "patch_embedding",
)


def _hf_global(ctx, key: str):
    """``global_head_dim`` / ``num_global_key_value_heads``, else the first full-attention layer's entry of
    ``per_layer_config``."""
    hp = ctx.hparams
    v = hp.get({"head_dim": "global_head_dim", "num_key_value_heads": "num_global_key_value_heads"}[key])
    if v is None and hp.get("per_layer_config") is not None:
        types = hp.get("layer_types", [])
        for il, lc in hp["per_layer_config"].items():
            if int(il) < len(types) and types[int(il)] == "full_attention" and key in lc:
                return lc[key]
    return v


def _hf_params(ctx, kv) -> None:
    """Gemma4Model.set_gguf_parameters: KV sharing, per-layer inputs, the window pattern, the global and
    sliding-window head sizes, per-layer FFN widths (double-wide on the sharing layers) and KV heads, rope
    dims (the global head whole: proportional rope through rope_freqs)."""
    from ..hf_shared import gemma3_params

    gemma3_params(ctx, kv)
    hp = ctx.hparams
    n_shared = hp["num_kv_shared_layers"]
    kv.add_shared_kv_layers(n_shared)
    kv.add_embedding_length_per_layer_input(hp.get("hidden_size_per_layer_input") or 0)
    swa = [t == "sliding_attention" for t in hp["layer_types"]]
    kv.add_sliding_window_pattern(swa)
    d_full = _hf_global(ctx, "head_dim")
    if d_full is None:
        raise KeyError("global_head_dim")
    d_swa = hp["head_dim"]
    kv.add_key_length(d_full)
    kv.add_value_length(d_full)
    kv.add_key_length_swa(d_swa)
    kv.add_value_length_swa(d_swa)
    if (n := ctx.find_hparam(["expert_intermediate_size", "moe_intermediate_size"])) is not None:
        kv.add_expert_feed_forward_length(n)
    if hp.get("use_double_wide_mlp", False):
        n_ff, first = hp["intermediate_size"], ctx.block_count - n_shared
        kv.add_feed_forward_length([n_ff if il < first else 2 * n_ff for il in range(ctx.block_count)])
    kv_full, kv_swa = _hf_global(ctx, "num_key_value_heads"), hp.get("num_key_value_heads")
    if kv_full is not None and kv_swa is not None:
        kv.add_head_count_kv([kv_swa if s else kv_full for s in swa])
    kv.add_rope_dimension_count(int(d_full))
    kv.add_rope_dimension_count_swa(int(d_swa * ctx.rope_parameters.get("partial_rotary_factor", 1.0)))


def _hf_rope_freqs(ctx):
    """Gemma4Model.generate_extra_tensors: proportional rope on the global layers as frequency factors (1
    for the rotated pairs, 1e30 for the others)."""
    rp = ctx.hparams["rope_parameters"]["full_attention"]
    if rp["rope_type"] != "proportional":
        raise ValueError(f"full_attention rope_type {rp['rope_type']!r} (proportional expected)")
    d_full = _hf_global(ctx, "head_dim")
    if d_full is None:
        raise KeyError("global_head_dim")
    n_rot = int(d_full * rp["partial_rotary_factor"] / 2)
    yield "rope_freqs.weight", np.array([1.0] * n_rot + [1e30] * (int(d_full / 2) - n_rot), dtype=np.float32)


def _hf_tensor(ctx, name, data, bid):
    """filter_tensors + modify_tensors: the towers dropped, ``language_model.`` removed, scalars and
    experts named ``.weight``, the router's scales as ``ffn_gate_inp.scale`` / ``ffn_down_exps.scale``, the
    embedding rows past the tokenizer's dropped (Gemma3Model)."""
    if name.startswith(("vit.", "conformer.", "merger.", "resampler.")) or any(p in name for p in _MM_PARTS):
        return []
    name = name.replace("language_model.", "")
    if name.endswith(("per_dim_scale", "layer_scalar")):
        name += ".weight"
    if ".experts." in name and not name.endswith(".weight"):
        name += ".weight"
    if name.endswith("router.scale"):
        return [(f"blk.{bid}.ffn_gate_inp.scale", data)]
    if ".per_expert_scale" in name:
        return [(f"blk.{bid}.ffn_down_exps.scale", data)]
    if "embed_tokens.weight" in name:
        data = data[: ctx.n_vocab_real()]
    return [(name, data)]


def _hf_vocab(ctx, kv) -> None:
    from ...convert.vocab import set_vocab_gemma4

    set_vocab_gemma4(kv, ctx.dir)


HF_CONVERT = HFConvert(
    "gemma4",
    ("Gemma4ForCausalLM", "Gemma4ForConditionalGeneration"),
    vocab=_hf_vocab,
    params=_hf_params,
    tensor=_hf_tensor,
    extra_tensors=_hf_rope_freqs,
)
