"""The llama-like pre-norm decoder most families share (llama.cpp's ``llm_build_llama`` shape): the tensors
it declares (``load_dense_tensors``) and its graph (``build_dense``): token embeddings, per layer attention
(q, k, v, o) and a dense or mixture-of-experts feed-forward, each behind a norm, then the output head."""

from __future__ import annotations

from .._dataclass import dataclass
from ..ggml import ops
from ..ggml.tensor import Tensor
from .arch import Architecture
from .blocks import GraphBuilder, Outputs, TensorLoader

__all__ = ["DenseArchitecture", "DenseLayout", "build_dense", "load_dense_tensors"]


@dataclass(frozen=True)
class DenseLayout:
    """A llama-like family's layout, declared once and read by both its loader (``load_dense_tensors``)
    and its graph (``build_dense``): llama.cpp's per-arch tensor list and ``build_*`` flags in one place."""

    biases: bool = False  # q/k/v biases (required; attn_output.bias is optional everywhere)
    qk_norm: bool | str = False  # q/k norms: True one vector per head size, "heads" one per head, "full"
    post_norms: bool = (
        False  # norms after attention and FFN (post_attention_norm, post_ffw_norm), none before
    )
    norm: str = "rms"  # "layer": LayerNorm (with the file's *_norm.bias where present, also on q/k)
    norm_biases: bool = False  # the LayerNorms' biases are required (attn_norm, ffn_norm, output_norm)
    gated_ffn: bool = True  # False: a sequential up -> act -> down FFN
    ffn_act: str = "silu"
    ffn_biases: bool = False  # ffn_up.bias, ffn_down.bias
    ffn_norm: bool = True  # False: optional (StableLM files without it use the parallel residual)
    parallel: bool = False  # attention and FFN both read the one attn_norm: x += attn(n) + ffn(n)
    shared_expert: bool = False  # MoE layers add a shared expert (*_shexp, its sigmoid gate optional)
    moe_norm_w: bool = False  # MoE: the top-k weights renormalized (Mixtral)


class DenseArchitecture(Architecture):
    """A family built from its ``layout`` (override ``load_tensors`` / ``build`` to add to it)."""

    layout: DenseLayout = DenseLayout()

    def load_tensors(self, t: TensorLoader) -> None:
        load_dense_tensors(self, t)
        self._finish_tensors(t)

    def build(self, g: GraphBuilder) -> Outputs:
        return build_dense(self, g)


def load_dense_tensors(arch: DenseArchitecture, t: TensorLoader) -> None:
    """The tensors of ``arch.layout``: token embeddings, output, and per layer attention (q, k, v, o),
    its norm, and a dense (gated or sequential) or MoE feed-forward with its norm."""
    lay = arch.layout
    hp = arch.hp
    n_embd, n_vocab = hp.n_embd, hp.n_vocab
    t("token_embd.weight", (n_vocab, n_embd))
    t("output_norm.weight", (n_embd,))
    if lay.norm_biases:
        t("output_norm.bias", (n_embd,))
    t("output.weight", (n_vocab, n_embd), required=False)
    t("rope_freqs.weight", (hp.n_rot // 2,), required=False)
    for il in range(hp.n_layer):
        heads = hp.heads(il)
        nq, nk, nv = heads.n_head * heads.n_embd_head_k, hp.n_embd_k_gqa(il), hp.n_embd_v_gqa(il)
        t.layer(il, "post_attention_norm.weight" if lay.post_norms else "attn_norm.weight", (n_embd,))
        if lay.norm_biases:
            t.layer(il, "attn_norm.bias", (n_embd,))
        t.layer(il, "attn_q.weight", (nq, n_embd))
        t.layer(il, "attn_k.weight", (nk, n_embd))
        t.layer(il, "attn_v.weight", (nv, n_embd))
        t.layer(il, "attn_output.weight", (n_embd, heads.n_head * heads.n_embd_head_v))
        for name, n in (("attn_q.bias", nq), ("attn_k.bias", nk), ("attn_v.bias", nv)):
            t.layer(il, name, (n,), required=lay.biases)
        t.layer(il, "attn_output.bias", (n_embd,), required=False)
        if lay.qk_norm == "heads":
            t.layer(il, "attn_q_norm.weight", (heads.n_head, heads.n_embd_head_k))
            t.layer(il, "attn_k_norm.weight", (heads.n_head_kv, heads.n_embd_head_k))
        elif lay.qk_norm:
            full = lay.qk_norm == "full"
            t.layer(il, "attn_q_norm.weight", (nq if full else heads.n_embd_head_k,))
            t.layer(il, "attn_k_norm.weight", (nk if full else heads.n_embd_head_k,))
        if t.layer(
            il, "post_ffw_norm.weight" if lay.post_norms else "ffn_norm.weight", (n_embd,), lay.ffn_norm
        ):
            if lay.norm_biases:
                t.layer(il, "ffn_norm.bias", (n_embd,))
        if not arch.layer_moe(il):
            if lay.gated_ffn:
                t.layer(il, "ffn_gate.weight", (hp.n_ff[il], n_embd))
            t.layer(il, "ffn_up.weight", (hp.n_ff[il], n_embd))
            t.layer(il, "ffn_down.weight", (n_embd, hp.n_ff[il]))
            if lay.ffn_biases:
                t.layer(il, "ffn_up.bias", (hp.n_ff[il],))
                t.layer(il, "ffn_down.bias", (n_embd,))
        else:
            n_ff = hp.n_ff_exp or hp.n_ff[il]
            t.layer(il, "ffn_gate_inp.weight", (hp.n_expert, n_embd))
            t.layer(il, "ffn_gate_exps.weight", (hp.n_expert, n_ff, n_embd))
            t.layer(il, "ffn_up_exps.weight", (hp.n_expert, n_ff, n_embd))
            t.layer(il, "ffn_down_exps.weight", (hp.n_expert, n_embd, n_ff))
            if lay.shared_expert:
                n_sh = hp.n_ff_shexp or hp.n_ff[il]
                t.layer(il, "ffn_gate_inp_shexp.weight", (n_embd,), required=False)
                t.layer(il, "ffn_gate_shexp.weight", (n_sh, n_embd))
                t.layer(il, "ffn_up_shexp.weight", (n_sh, n_embd))
                t.layer(il, "ffn_down_shexp.weight", (n_embd, n_sh))


def build_dense(
    arch: DenseArchitecture,
    g: GraphBuilder,
    *,
    embd_scale: float | None = None,
    kq_scale: float | None = None,
    residual_scale: float | None = None,
    logit_scale: float = 0.0,
    attn_temp: Tensor | None = None,
) -> Outputs:
    """The graph of ``arch.layout``: x += attn(norm(x)); x += ffn(norm(x)) (with ``post_norms``:
    x += norm(attn(x)); x += norm(ffn(x))); logits. The per-file scalars (Granite's): embeddings x
    embd_scale, attention scores x kq_scale (default 1/sqrt(head size)), each residual branch x
    residual_scale, logits / logit_scale; ``attn_temp``: Q x this per-token temperature
    (``GraphBuilder.inp_attn_temp``, Mistral 3)."""
    lay = arch.layout
    norm, parallel, post = lay.norm, lay.parallel, lay.post_norms
    x = g.embed(arch.w["token_embd.weight"], scale=embd_scale)
    for il, blk in enumerate(arch.blocks):
        n = (
            x
            if post
            else g.build_norm(x, blk["attn_norm.weight"], blk.get("attn_norm.bias"), norm, "attn_norm", il)
        )
        h = g.attention(
            n, blk, il, qk_norm=lay.qk_norm, kq_scale=kq_scale, qk_norm_kind=norm, attn_temp=attn_temp
        )
        h, x, n = g.select_outputs(il, h, x, n) if parallel else (*g.select_outputs(il, h, x), n)
        if post:
            h = g.build_norm(h, blk["post_attention_norm.weight"], None, norm, "attn_post_norm", il)
        if residual_scale:
            h = ops.scale(h, residual_scale)
        x = g.cb(x + h, "ffn_inp", il)
        if parallel:
            h = n
        elif post:
            h = x
        else:
            h = g.build_norm(x, blk["ffn_norm.weight"], blk.get("ffn_norm.bias"), norm, "ffn_norm", il)
        if arch.layer_moe(il):
            moe = g.build_moe_ffn(h, blk, il, lay.moe_norm_w)
            h = g.cb(moe + g.build_shared_expert(h, blk, il), "ffn_out", il) if lay.shared_expert else moe
        else:
            h = g.build_ffn(h, blk, il, act=lay.ffn_act, gated=lay.gated_ffn)
        if post:
            h = g.build_norm(h, blk["post_ffw_norm.weight"], None, norm, "ffn_post_norm", il)
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
