"""Phi-3: fused qkv and up+gate projections, neox rope with LongRoPE factors (short below the
original context, long above it)."""

from __future__ import annotations

import math

from ..blocks import GraphBuilder, Outputs, Rope, TensorLoader, longrope_for_layer
from ..hf import HFConvert
from ..hparams import ROPE_NEOX, HParams, MetaReader
from . import Architecture, register


@register("phi3")
class Phi3(Architecture):
    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        hp.rope_type = ROPE_NEOX
        hp.n_swa = 0  # llama.cpp disables Phi-3's sliding window (the files do not describe it fully)
        hp.swa_layers = [False] * hp.n_layer

    def load_tensors(self, t: TensorLoader) -> None:
        hp = self.hp
        n_embd = hp.n_embd
        t("token_embd.weight", (hp.n_vocab, n_embd))
        t("output_norm.weight", (n_embd,))
        t("output.weight", (hp.n_vocab, n_embd), required=False)
        t("output.bias", (hp.n_vocab,), required=False)
        t("rope_factors_long.weight", (hp.n_rot // 2,), required=False)
        t("rope_factors_short.weight", (hp.n_rot // 2,), required=False)
        for il in range(hp.n_layer):
            heads = hp.heads(il)
            nq, nk, nv = heads.n_head * heads.n_embd_head_k, hp.n_embd_k_gqa(il), hp.n_embd_v_gqa(il)
            t.layer(il, "attn_norm.weight", (n_embd,))
            if t.layer(il, "attn_qkv.weight", (nq + nk + nv, n_embd), required=False) is None:
                t.layer(il, "attn_q.weight", (nq, n_embd))
                t.layer(il, "attn_k.weight", (nk, n_embd))
                t.layer(il, "attn_v.weight", (nv, n_embd))
            t.layer(il, "attn_output.weight", (n_embd, heads.n_head * heads.n_embd_head_v))
            t.layer(il, "ffn_norm.weight", (n_embd,))
            t.layer(il, "ffn_up.weight", (2 * hp.n_ff[il], n_embd))
            t.layer(il, "ffn_down.weight", (n_embd, hp.n_ff[il]))
        self._finish_tensors(t)

    def layer_rope(self, il: int, n_ctx: int = 0) -> Rope | None:
        return longrope_for_layer(self, il, n_ctx)

    def build(self, g: GraphBuilder) -> Outputs:
        hp = self.hp
        x = g.embed(self.w["token_embd.weight"])
        for il, blk in enumerate(self.blocks):
            h = g.build_norm(x, blk["attn_norm.weight"], name="attn_norm", il=il)
            q_scale = 1.0 / math.sqrt(hp.heads(il).n_embd_head_k)
            h = g.attention(h, blk, il, q_scale=q_scale, kq_scale=1.0)
            h, x = g.select_outputs(il, h, x)
            x = g.cb(x + h, "ffn_inp", il)
            h = g.build_norm(x, blk["ffn_norm.weight"], name="ffn_norm", il=il)
            x = g.cb(x + g.build_ffn(h, blk, il, act="silu"), "l_out", il)
        return g.output(x, self.w["output_norm.weight"], self.output_weight(), self.w.get("output.bias"))


def _phi3_vocab(ctx, kv) -> None:
    """Phi3MiniModel.set_vocab: Phi-4's GPT2Tokenizer, else its SentencePiece variant."""
    ctx.set_vocab("gpt2" if ctx.tokenizer_config().get("tokenizer_class") == "GPT2Tokenizer" else "phi3")


def _phi3_rope_dims(ctx) -> int:
    n_embd = ctx.find_hparam(["hidden_size", "n_embd"])
    n_head = ctx.find_hparam(["num_attention_heads", "n_head"])
    return int(ctx.rope_parameters.get("partial_rotary_factor", 1.0) * n_embd) // n_head


def _phi3_params(ctx, kv) -> None:
    """Phi3MiniModel.set_gguf_parameters (sliding_window 0 when unset: Phi-4)."""
    f, rp = ctx.find_hparam, ctx.rope_parameters
    kv.add_context_length(f(["n_positions", "max_position_embeddings"]))
    kv.add_rope_scaling_orig_ctx_len(rp["original_max_position_embeddings"])
    kv.add_embedding_length(f(["hidden_size", "n_embd"]))
    kv.add_feed_forward_length(f(["intermediate_size"]))
    kv.add_block_count(ctx.block_count)
    kv.add_head_count(f(["num_attention_heads", "n_head"]))
    kv.add_head_count_kv(f(["num_key_value_heads", "n_head_kv"]))
    kv.add_layer_norm_rms_eps(f(["rms_norm_eps"]))
    kv.add_rope_dimension_count(_phi3_rope_dims(ctx))
    kv.add_rope_freq_base(rp.get("full_attention", rp)["rope_theta"])
    kv.add_file_type(ctx.file_type)
    kv.add_sliding_window(ctx.hparams.get("sliding_window") or 0)


def _phi3_rope_factors(ctx):
    """Phi3MiniModel.generate_extra_tensors: LongRoPE's factors and attention factor."""
    import numpy as np

    rp = ctx.rope_parameters
    long_f, short_f = rp.get("long_factor"), rp.get("short_factor")
    if not long_f:
        return
    orig = rp["original_max_position_embeddings"]
    scale = ctx.find_hparam(["n_positions", "max_position_embeddings"]) / orig
    kind = rp.get("rope_type", "").lower()
    if kind in ("su", "longrope"):
        attn = math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1.0 else 1.0
    elif kind == "yarn":
        attn = 0.1 * math.log(scale) + 1.0 if scale > 1.0 else 1.0
    else:
        raise ValueError(f"rope scaling type {kind!r} is not supported")
    ctx.kv_early.append(("add_rope_scaling_attn_factors", attn))
    if short_f is None or len(long_f) != len(short_f) or len(long_f) != _phi3_rope_dims(ctx) / 2:
        raise ValueError(
            f"the rope long and short factors must have {_phi3_rope_dims(ctx) // 2} entries each"
        )
    yield "rope_factors_long.weight", np.array(long_f, dtype=np.float32)
    yield "rope_factors_short.weight", np.array(short_f, dtype=np.float32)


HF_CONVERT = HFConvert(
    "phi3",
    ("Phi3ForCausalLM",),
    vocab=_phi3_vocab,
    generic_params=False,
    params=_phi3_params,
    extra_tensors=_phi3_rope_factors,
)
