"""The llama-like pre-norm decoder most families share (llama.cpp's ``llm_build_llama`` shape): the tensors
it declares (``load_dense_tensors``) and its graph (``build_dense``): token embeddings, per layer attention
(q, k, v, o) and a dense or mixture-of-experts feed-forward, each behind a norm, then the output head."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..ggml import ops
from ..ggml.tensor import Tensor
from .blocks import GraphBuilder, Outputs, TensorLoader

if TYPE_CHECKING:
    from .arch import Architecture

__all__ = ["build_dense", "load_dense_tensors"]


def load_dense_tensors(
    arch: Architecture,
    t: TensorLoader,
    biases: bool = False,
    qk_norm: bool | str = False,
    post_norms: bool = False,
    shared_expert: bool = False,
    norm_biases: bool = False,
    gated_ffn: bool = True,
    ffn_biases: bool = False,
    ffn_norm: bool = True,
) -> None:
    """Token embeddings, output, and per layer: attention (q, k, v, o), RMS norms, a gated FFN.
    ``qk_norm``: per-head q/k norms (True), one weight per head ("heads"), or over the whole projection
    ("full"); ``post_norms``: norms after the attention and the FFN (post_attention_norm, post_ffw_norm)
    instead of before; ``shared_expert``: MoE layers also have a shared expert (``*_shexp``, its sigmoid
    gate optional); ``norm_biases``: LayerNorms with biases (``*_norm.bias``); ``gated_ffn=False``: a
    sequential up/down FFN; ``ffn_biases``: biases on it; ``ffn_norm=False``: the FFN norm is optional
    (StableLM's parallel residual has none)."""
    hp = arch.hp
    n_embd, n_vocab = hp.n_embd, hp.n_vocab
    t("token_embd.weight", (n_vocab, n_embd))
    t("output_norm.weight", (n_embd,))
    if norm_biases:
        t("output_norm.bias", (n_embd,))
    t("output.weight", (n_vocab, n_embd), required=False)
    t("rope_freqs.weight", (hp.n_rot // 2,), required=False)
    for il in range(hp.n_layer):
        heads = hp.heads(il)
        nq, nk, nv = heads.n_head * heads.n_embd_head_k, hp.n_embd_k_gqa(il), hp.n_embd_v_gqa(il)
        t.layer(il, "post_attention_norm.weight" if post_norms else "attn_norm.weight", (n_embd,))
        if norm_biases:
            t.layer(il, "attn_norm.bias", (n_embd,))
        t.layer(il, "attn_q.weight", (nq, n_embd))
        t.layer(il, "attn_k.weight", (nk, n_embd))
        t.layer(il, "attn_v.weight", (nv, n_embd))
        t.layer(il, "attn_output.weight", (n_embd, heads.n_head * heads.n_embd_head_v))
        for name, n in (("attn_q.bias", nq), ("attn_k.bias", nk), ("attn_v.bias", nv)):
            t.layer(il, name, (n,), required=biases)
        t.layer(il, "attn_output.bias", (n_embd,), required=False)
        if qk_norm == "heads":
            t.layer(il, "attn_q_norm.weight", (heads.n_head, heads.n_embd_head_k))
            t.layer(il, "attn_k_norm.weight", (heads.n_head_kv, heads.n_embd_head_k))
        elif qk_norm:
            full = qk_norm == "full"
            t.layer(il, "attn_q_norm.weight", (nq if full else heads.n_embd_head_k,))
            t.layer(il, "attn_k_norm.weight", (nk if full else heads.n_embd_head_k,))
        if t.layer(il, "post_ffw_norm.weight" if post_norms else "ffn_norm.weight", (n_embd,), ffn_norm):
            if norm_biases:
                t.layer(il, "ffn_norm.bias", (n_embd,))
        if not arch.layer_moe(il):
            if gated_ffn:
                t.layer(il, "ffn_gate.weight", (hp.n_ff[il], n_embd))
            t.layer(il, "ffn_up.weight", (hp.n_ff[il], n_embd))
            t.layer(il, "ffn_down.weight", (n_embd, hp.n_ff[il]))
            if ffn_biases:
                t.layer(il, "ffn_up.bias", (hp.n_ff[il],))
                t.layer(il, "ffn_down.bias", (n_embd,))
        else:
            n_ff = hp.n_ff_exp or hp.n_ff[il]
            t.layer(il, "ffn_gate_inp.weight", (hp.n_expert, n_embd))
            t.layer(il, "ffn_gate_exps.weight", (hp.n_expert, n_ff, n_embd))
            t.layer(il, "ffn_up_exps.weight", (hp.n_expert, n_ff, n_embd))
            t.layer(il, "ffn_down_exps.weight", (hp.n_expert, n_embd, n_ff))
            if shared_expert:
                n_sh = hp.n_ff_shexp or hp.n_ff[il]
                t.layer(il, "ffn_gate_inp_shexp.weight", (n_embd,), required=False)
                t.layer(il, "ffn_gate_shexp.weight", (n_sh, n_embd))
                t.layer(il, "ffn_up_shexp.weight", (n_sh, n_embd))
                t.layer(il, "ffn_down_shexp.weight", (n_embd, n_sh))


def build_dense(
    arch: Architecture,
    g: GraphBuilder,
    qk_norm: bool = False,
    moe_norm_w: bool = False,
    *,
    embd_scale: float | None = None,
    kq_scale: float | None = None,
    residual_scale: float | None = None,
    logit_scale: float = 0.0,
    shared_expert: bool = False,
    norm: str = "rms",
    ffn_act: str = "silu",
    gated_ffn: bool = True,
    parallel: bool = False,
    attn_temp: Tensor | None = None,
) -> Outputs:
    """Pre-norm decoder: x += attn(norm(x)); x += ffn(norm(x)); logits. The scalars (Granite's):
    embeddings x embd_scale, attention scores x kq_scale (default 1/sqrt(head size)), each residual
    branch x residual_scale, logits / logit_scale. ``shared_expert``: MoE layers add a shared expert;
    ``norm``: "rms" or "layer" (LayerNorm, with the file's ``*_norm.bias`` where present, also on q/k);
    ``ffn_act`` / ``gated_ffn``: the dense FFN's activation and whether it is gated; ``parallel``: the
    attention and the FFN both read the one attn_norm (x += attn(n) + ffn(n), Command-R's layout);
    ``attn_temp``: Q x this per-token temperature (``GraphBuilder.inp_attn_temp``, Mistral 3)."""
    x = g.embed(arch.w["token_embd.weight"], scale=embd_scale)
    for il, blk in enumerate(arch.blocks):
        n = g.build_norm(x, blk["attn_norm.weight"], blk.get("attn_norm.bias"), norm, "attn_norm", il)
        h = g.attention(
            n, blk, il, qk_norm=qk_norm, kq_scale=kq_scale, qk_norm_kind=norm, attn_temp=attn_temp
        )
        h, x, n = g.select_outputs(il, h, x, n) if parallel else (*g.select_outputs(il, h, x), n)
        if residual_scale:
            h = ops.scale(h, residual_scale)
        x = g.cb(x + h, "ffn_inp", il)
        if parallel:
            h = n
        else:
            h = g.build_norm(x, blk["ffn_norm.weight"], blk.get("ffn_norm.bias"), norm, "ffn_norm", il)
        if arch.layer_moe(il):
            moe = g.build_moe_ffn(h, blk, il, moe_norm_w)
            h = g.cb(moe + g.build_shared_expert(h, blk, il), "ffn_out", il) if shared_expert else moe
        else:
            h = g.build_ffn(h, blk, il, act=ffn_act, gated=gated_ffn)
        if residual_scale:
            h = ops.scale(h, residual_scale)
        x = g.cb(x + h, "l_out", il)
    w = arch.w
    return g.output(
        x,
        w["output_norm.weight"],
        arch.output_weight(),
        logit_scale=logit_scale,
        b_norm=w.get("output_norm.bias"),
        norm_kind=norm,
    )
