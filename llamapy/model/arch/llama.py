"""LLaMA 1/2/3 (incl. llama3 rope frequency factors), Mistral, SmolLM, TinyLlama."""

from __future__ import annotations

from ...ggml import ops
from ..blocks import GraphBuilder, Outputs, TensorLoader
from . import Architecture, register


def load_dense_tensors(
    arch: Architecture,
    t: TensorLoader,
    biases: bool = False,
    qk_norm: bool | str = False,
    post_norms: bool = False,
) -> None:
    """Token embeddings, output, and per layer: attention (q, k, v, o), RMS norms, a gated FFN.
    ``qk_norm``: per-head q/k norms (True) or over the whole projection ("full"); ``post_norms``:
    norms after the attention and the FFN (post_attention_norm, post_ffw_norm) instead of before."""
    hp = arch.hp
    n_embd, n_vocab = hp.n_embd, hp.n_vocab
    t("token_embd.weight", (n_vocab, n_embd))
    t("output_norm.weight", (n_embd,))
    t("output.weight", (n_vocab, n_embd), required=False)
    t("rope_freqs.weight", (hp.n_rot // 2,), required=False)
    for il in range(hp.n_layer):
        heads = hp.heads(il)
        nq, nk, nv = heads.n_head * heads.n_embd_head_k, hp.n_embd_k_gqa(il), hp.n_embd_v_gqa(il)
        t.layer(il, "post_attention_norm.weight" if post_norms else "attn_norm.weight", (n_embd,))
        t.layer(il, "attn_q.weight", (nq, n_embd))
        t.layer(il, "attn_k.weight", (nk, n_embd))
        t.layer(il, "attn_v.weight", (nv, n_embd))
        t.layer(il, "attn_output.weight", (n_embd, heads.n_head * heads.n_embd_head_v))
        for name, n in (("attn_q.bias", nq), ("attn_k.bias", nk), ("attn_v.bias", nv)):
            t.layer(il, name, (n,), required=biases)
        t.layer(il, "attn_output.bias", (n_embd,), required=False)
        if qk_norm:
            full = qk_norm == "full"
            t.layer(il, "attn_q_norm.weight", (nq if full else heads.n_embd_head_k,))
            t.layer(il, "attn_k_norm.weight", (nk if full else heads.n_embd_head_k,))
        t.layer(il, "post_ffw_norm.weight" if post_norms else "ffn_norm.weight", (n_embd,))
        if not arch.layer_moe(il):
            t.layer(il, "ffn_gate.weight", (hp.n_ff[il], n_embd))
            t.layer(il, "ffn_up.weight", (hp.n_ff[il], n_embd))
            t.layer(il, "ffn_down.weight", (n_embd, hp.n_ff[il]))
        else:
            n_ff = hp.n_ff_exp or hp.n_ff[il]
            t.layer(il, "ffn_gate_inp.weight", (hp.n_expert, n_embd))
            t.layer(il, "ffn_gate_exps.weight", (hp.n_expert, n_ff, n_embd))
            t.layer(il, "ffn_up_exps.weight", (hp.n_expert, n_ff, n_embd))
            t.layer(il, "ffn_down_exps.weight", (hp.n_expert, n_embd, n_ff))


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
) -> Outputs:
    """Pre-norm decoder: x += attn(rms_norm(x)); x += ffn(rms_norm(x)); logits. The scalars (Granite's):
    embeddings x embd_scale, attention scores x kq_scale (default 1/sqrt(head size)), each residual
    branch x residual_scale, logits / logit_scale."""
    x = g.embed(arch.w["token_embd.weight"], scale=embd_scale)
    for il, blk in enumerate(arch.blocks):
        h = g.build_norm(x, blk["attn_norm.weight"], name="attn_norm", il=il)
        h = g.attention(h, blk, il, qk_norm=qk_norm, kq_scale=kq_scale)
        h, x = g.select_outputs(il, h, x)
        if residual_scale:
            h = ops.scale(h, residual_scale)
        x = g.cb(x + h, "ffn_inp", il)
        h = g.build_norm(x, blk["ffn_norm.weight"], name="ffn_norm", il=il)
        h = g.build_moe_ffn(h, blk, il, moe_norm_w) if arch.layer_moe(il) else g.build_ffn(h, blk, il)
        if residual_scale:
            h = ops.scale(h, residual_scale)
        x = g.cb(x + h, "l_out", il)
    return g.output(x, arch.w["output_norm.weight"], arch.output_weight(), logit_scale=logit_scale)


@register("llama", "mistral")
class Llama(Architecture):
    """RMSNorm, rotary attention (normal mode) with grouped KV heads, SwiGLU feed-forward."""

    def load_tensors(self, t: TensorLoader) -> None:
        load_dense_tensors(self, t)
        self._finish_tensors(t)

    def build(self, g: GraphBuilder) -> Outputs:
        return build_dense(self, g)
