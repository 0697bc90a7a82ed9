"""The Gemma decoder gemma, gemma2, gemma3 and EmbeddingGemma share: its tensors (``load_gemma_tensors``),
its graph (``build_gemma``: scaled embeddings, [post-normed] attention and GeGLU residuals) and the query
scale (``gemma_attention_scale``)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .blocks import GraphBuilder, Outputs, TensorLoader
from .hparams import HParams

if TYPE_CHECKING:
    from .arch import Architecture

__all__ = ["build_gemma", "gemma_attention_scale", "load_gemma_tensors"]


def load_gemma_tensors(arch: Architecture, t: TensorLoader, post_norms: bool, qk_norm: bool = False) -> None:
    hp = arch.hp
    n_embd = hp.n_embd
    t("token_embd.weight", (hp.n_vocab, n_embd))
    t("output_norm.weight", (n_embd,))
    t("output.weight", (hp.n_vocab, n_embd), required=False)
    for il in range(hp.n_layer):
        heads = hp.heads(il)
        t.layer(il, "attn_norm.weight", (n_embd,))
        t.layer(il, "attn_q.weight", (heads.n_head * heads.n_embd_head_k, n_embd))
        t.layer(il, "attn_k.weight", (hp.n_embd_k_gqa(il), n_embd))
        t.layer(il, "attn_v.weight", (hp.n_embd_v_gqa(il), n_embd))
        t.layer(il, "attn_output.weight", (n_embd, heads.n_head * heads.n_embd_head_v))
        if qk_norm:
            t.layer(il, "attn_q_norm.weight", (heads.n_embd_head_k,))
            t.layer(il, "attn_k_norm.weight", (heads.n_embd_head_k,))
        t.layer(il, "ffn_norm.weight", (n_embd,))
        t.layer(il, "ffn_gate.weight", (hp.n_ff[il], n_embd))
        t.layer(il, "ffn_up.weight", (hp.n_ff[il], n_embd))
        t.layer(il, "ffn_down.weight", (n_embd, hp.n_ff[il]))
        if post_norms:
            t.layer(il, "post_attention_norm.weight", (n_embd,))
            t.layer(il, "post_ffw_norm.weight", (n_embd,))


def build_gemma(
    arch: Architecture, g: GraphBuilder, post_norms: bool, qk_norm: bool = False, scale_raw_embd: bool = True
) -> Outputs:
    """x = embd * sqrt(n_embd); per layer: [post-normed] attention and GeGLU FFN residuals.
    ``scale_raw_embd=False``: embeddings given as input (image embeddings) are not scaled, only
    token embeddings (Gemma 3's ``if (ubatch.token)``)."""
    hp = arch.hp
    q_scale, softcap = hp.f_attention_scale, hp.f_attn_logit_softcapping
    scale = math.sqrt(hp.n_embd) if scale_raw_embd or g.inp.tokens is not None else None
    x = g.embed(arch.w["token_embd.weight"], scale=scale)
    for il, blk in enumerate(arch.blocks):
        h = g.build_norm(x, blk["attn_norm.weight"], name="attn_norm", il=il)
        h = g.attention(h, blk, il, qk_norm=qk_norm, q_scale=q_scale, kq_scale=1.0, softcap=softcap)
        if post_norms:
            h = g.build_norm(h, blk["post_attention_norm.weight"], name="attn_post_norm", il=il)
        h, x = g.select_outputs(il, h, x)
        x = g.cb(x + h, "sa_out", il)
        h = g.build_norm(x, blk["ffn_norm.weight"], name="ffn_norm", il=il)
        h = g.build_ffn(h, blk, il, act="gelu")
        if post_norms:
            h = g.build_norm(h, blk["post_ffw_norm.weight"], name="ffn_post_norm", il=il)
        x = g.cb(x + h, "l_out", il)
    return g.output(
        x, arch.w["output_norm.weight"], arch.output_weight(), softcap=hp.f_final_logit_softcapping
    )


def gemma_attention_scale(hp: HParams) -> float:
    # the 27B models scale queries by 1/sqrt(n_embd / n_head), the others by 1/sqrt(head size)
    if hp.arch in ("gemma2", "gemma3") and hp.n_layer in (46, 62):
        return 1.0 / math.sqrt(hp.n_embd / hp.n_head[0])
    return 1.0 / math.sqrt(hp.n_embd_head_k)
