"""The Gemma decoder gemma, gemma2, gemma3 and EmbeddingGemma share: its tensors (``load_gemma_tensors``),
its graph (``build_gemma``: scaled embeddings, [post-normed] attention and GeGLU residuals) and the query
scale (``gemma_attention_scale``); and what Gemma 4 and Gemma 3n share: K/V sharing across layers
(``read_kv_sharing``, ``kv_shared_attention``) and the per-layer embedding inputs (``per_layer_inputs``)."""

from __future__ import annotations

import math

import numpy as np

from .._dataclass import dataclass
from ..ggml import ops
from ..ggml.tensor import Tensor
from ..ggml.types import GGMLType
from .arch import Architecture
from .blocks import GraphBuilder, Outputs, TensorLoader, Weights
from .hparams import HParams, MetaReader

__all__ = [
    "GemmaArchitecture",
    "GemmaLayout",
    "build_gemma",
    "gemma_attention_scale",
    "kv_shared_attention",
    "load_gemma_tensors",
    "per_layer_inputs",
    "read_kv_sharing",
]


@dataclass(frozen=True)
class GemmaLayout:
    """A Gemma family's layout, read by both ``load_gemma_tensors`` and ``build_gemma``."""

    post_norms: bool = False  # post_attention_norm / post_ffw_norm after attention and FFN (Gemma 2 on)
    qk_norm: bool = False  # per-head q/k RMS norms (Gemma 3)
    scale_raw_embd: bool = True  # False: embeddings given as input (images) are not scaled (Gemma 3)


class GemmaArchitecture(Architecture):
    """A family loaded and built from its ``layout``."""

    layout: GemmaLayout = GemmaLayout()

    def load_tensors(self, t: TensorLoader) -> None:
        load_gemma_tensors(self, t)
        self._finish_tensors(t)

    def build(self, g: GraphBuilder) -> Outputs:
        return build_gemma(self, g)


def load_gemma_tensors(arch: GemmaArchitecture, t: TensorLoader) -> None:
    """Embeddings, output, per layer attention (+ q/k norms), GeGLU FFN, their norms (+ post-norms)."""
    hp = arch.hp
    qk_norm, post_norms = arch.layout.qk_norm, arch.layout.post_norms
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


def build_gemma(arch: GemmaArchitecture, g: GraphBuilder) -> Outputs:
    """x = embd * sqrt(n_embd); per layer: [post-normed] attention and GeGLU FFN residuals.
    ``scale_raw_embd=False``: embeddings given as input (image embeddings) are not scaled, only
    token embeddings (Gemma 3's ``if (ubatch.token)``)."""
    hp, lay = arch.hp, arch.layout
    qk_norm, post_norms, scale_raw_embd = lay.qk_norm, lay.post_norms, lay.scale_raw_embd
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


def gemma_attention_scale(hp: HParams, width_scaled_27b: bool = False) -> float:
    """1/sqrt(head size); with ``width_scaled_27b`` (Gemma 2 and 3) the 27B models (46 or 62 layers)
    scale queries by 1/sqrt(n_embd / n_head) instead."""
    if width_scaled_27b and hp.n_layer in (46, 62):
        return 1.0 / math.sqrt(hp.n_embd / hp.n_head[0])
    return 1.0 / math.sqrt(hp.n_embd_head_k)


def read_kv_sharing(hp: HParams, md: MetaReader) -> None:
    """``attention.shared_kv_layers``: the last n layers reuse earlier layers' K/V (``HParams.kv_layer``)."""
    n_shared = md.u32("attention.shared_kv_layers", 0) or 0
    if n_shared >= hp.n_layer:
        raise md._err(f"attention.shared_kv_layers = {n_shared} must be below block_count ({hp.n_layer})")
    hp.n_layer_kv_from_start = hp.n_layer - n_shared if n_shared else -1
    for il in range(hp.n_layer):  # every sharing layer needs an earlier layer of its kind
        src = hp.kv_layer(il)
        if src != il and hp.heads(src)[1:] != hp.heads(il)[1:]:
            raise md._err(f"layer {il} reuses the K/V of layer {src}, whose KV heads differ")


def per_layer_inputs(arch: Architecture, g: GraphBuilder, x: Tensor) -> Tensor:
    """PLE inputs F32[T, n_layer, n_embd_per_layer]: the token's rows of ``per_layer_token_embd`` (x
    sqrt(n_pl); row 0, the padding token, for raw embeddings) plus the normed projection of the scaled
    embeddings (/ sqrt(n_embd)), times 1/sqrt(2)."""
    hp, inp = arch.hp, g.inp
    T, L, P = inp.n_tokens, hp.n_layer, hp.n_embd_per_layer
    ids = inp.tokens
    if ids is None:
        ids = ops.weight("ple_pad_ids", GGMLType.I32, (T,), np.zeros(T, dtype=np.int32))
    e = ops.get_rows(arch.w["per_layer_token_embd.weight"], ids)
    e = g.cb(ops.reshape(ops.scale(e, math.sqrt(P)), (T, L, P)), "inp_per_layer_selected")
    p = ops.scale(g.mm(arch.w["per_layer_model_proj.weight"], x), 1.0 / math.sqrt(hp.n_embd))
    p = g.build_norm(ops.reshape(p, (T, L, P)), arch.w["per_layer_proj_norm.weight"], name="per_layer_proj")
    return g.cb(ops.scale(ops.add(p, e), 1.0 / math.sqrt(2.0)), "inp_per_layer")


def kv_shared_attention(arch: Architecture, g: GraphBuilder, h: Tensor, blk: Weights, il: int) -> Tensor:
    """Gemma 4 / Gemma 3n attention: Q (normed, roped) always; K and V (K normed and roped, V RMS-normed without a weight) only on a
    layer that stores its own: a sharing layer attends over its source layer's cache."""
    hp, inp = arch.hp, g.inp
    T = inp.n_tokens
    nh, nkv, dk, dv = hp.heads(il)
    rope = arch.layer_rope(il, inp.n_ctx)
    q = ops.reshape(g.mm(blk["attn_q.weight"], h), (T, nh, dk))
    q = g.build_norm(q, blk["attn_q_norm.weight"], name="Qcur_normed", il=il)
    q = g.cb(rope.apply(q, inp.pos), "Qcur_pos", il)
    k = v = None
    if hp.kv_layer(il) == il:
        k = g.cb(g.mm(blk["attn_k.weight"], h), "Kcur", il)
        wv = blk.get("attn_v.weight")
        v = g.cb(g.mm(wv, h), "Vcur", il) if wv is not None else k
        k = g.build_norm(ops.reshape(k, (T, nkv, dk)), blk["attn_k_norm.weight"], name="Kcur_normed", il=il)
        v = g.cb(ops.rms_norm(ops.reshape(v, (T, nkv, dv)), hp.norm_rms_eps), "Vcur_normed", il)
        k = g.cb(rope.apply(k, inp.pos), "Kcur_pos", il)
    out = g.build_attn(q, k, v, il, kq_scale=hp.f_attention_scale)
    return g.mm(blk["attn_output.weight"], out)
