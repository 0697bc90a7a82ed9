"""Granite 4 hybrid (``granitehybrid``), Mamba2 and NoPE attention layers with MoE: Mamba2 layers
(``head_count_kv`` 0) and attention layers (no rope unless ``rope.scaling.finetuned``), then a mixture of
experts plus a shared expert (or a dense SwiGLU FFN), with Granite's four scalars (embeddings x
embedding_scale, attention x attention.scale, residual branches x residual_scale, logits / logit_scale)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ...ggml import ops
from ..blocks import GraphBuilder, Outputs, Rope, TensorLoader
from ..hf_shared import LLAMA_HF, granite_moe_tensor, granite_params
from ..hparams import HParams, MetaReader
from ..rs_blocks import build_mamba2, load_mamba2_hparams, load_mamba2_tensors
from . import Architecture, register


@register("granitehybrid")
class GraniteHybrid(Architecture):
    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        load_mamba2_hparams(hp, md, [n == 0 for n in hp.n_head_kv])
        hp.f_embedding_scale = md.f32("embedding_scale", 0.0)
        hp.f_attention_scale = md.f32("attention.scale", 0.0)
        hp.f_residual_scale = md.f32("residual_scale", 0.0)
        hp.f_logit_scale = md.f32("logit_scale", 0.0)
        hp.expert_weights_norm = True
        hp.rope_finetuned = bool(md.boolean("rope.scaling.finetuned", False))  # (llama.cpp's use_rope)

    def layer_rope(self, il: int, n_ctx: int = 0) -> Rope | None:
        return super().layer_rope(il, n_ctx) if getattr(self.hp, "rope_finetuned", False) else None

    def load_tensors(self, t: TensorLoader) -> None:
        hp = self.hp
        n = hp.n_embd
        t("token_embd.weight", (hp.n_vocab, n))
        t("output_norm.weight", (n,))
        t("output.weight", (hp.n_vocab, n), required=False)
        for il in range(hp.n_layer):
            t.layer(il, "attn_norm.weight", (n,))
            t.layer(il, "ffn_norm.weight", (n,))
            if hp.is_recurrent(il):
                load_mamba2_tensors(self, t, il)
            else:
                nh, nkv, d, _ = hp.heads(il)
                t.layer(il, "attn_q.weight", (nh * d, n))
                t.layer(il, "attn_k.weight", (nkv * d, n))
                t.layer(il, "attn_v.weight", (nkv * d, n))
                t.layer(il, "attn_output.weight", (n, nh * d))
            if not self.layer_moe(il):
                t.layer(il, "ffn_gate.weight", (hp.n_ff[il], n))
                t.layer(il, "ffn_up.weight", (hp.n_ff[il], n))
                t.layer(il, "ffn_down.weight", (n, hp.n_ff[il]))
                continue
            n_ff = hp.n_ff_exp or hp.n_ff[il]
            t.layer(il, "ffn_gate_inp.weight", (hp.n_expert, n))
            t.layer(il, "ffn_gate_exps.weight", (hp.n_expert, n_ff, n))
            t.layer(il, "ffn_up_exps.weight", (hp.n_expert, n_ff, n))
            t.layer(il, "ffn_down_exps.weight", (hp.n_expert, n, n_ff))
            if hp.n_ff_shexp:
                t.layer(il, "ffn_gate_shexp.weight", (hp.n_ff_shexp, n))
                t.layer(il, "ffn_up_shexp.weight", (hp.n_ff_shexp, n))
                t.layer(il, "ffn_down_shexp.weight", (n, hp.n_ff_shexp))
        self._finish_tensors(t)

    def build(self, g: GraphBuilder) -> Outputs:
        hp = self.hp
        rs = hp.f_residual_scale
        x = g.embed(self.w["token_embd.weight"], scale=hp.f_embedding_scale or None)
        for il, blk in enumerate(self.blocks):
            h = g.build_norm(x, blk["attn_norm.weight"], name="attn_norm", il=il)
            if hp.is_recurrent(il):
                h = build_mamba2(g, h, blk, il)
            else:
                h = g.attention(h, blk, il, kq_scale=hp.f_attention_scale or None)
            h, x = g.select_outputs(il, h, x)
            x = g.cb(ops.add(x, ops.scale(h, rs) if rs else h), "ffn_inp", il)
            h = g.build_norm(x, blk["ffn_norm.weight"], name="ffn_norm", il=il)
            if self.layer_moe(il):
                moe = g.build_moe_ffn(h, blk, il, True)
                h = (
                    g.cb(ops.add(moe, g.build_ffn(h, blk, il, suffix="_shexp")), "ffn_out", il)
                    if hp.n_ff_shexp
                    else moe
                )
            else:
                h = g.build_ffn(h, blk, il)
            x = g.cb(ops.add(x, ops.scale(h, rs) if rs else h), "l_out", il)
        return g.output(x, self.w["output_norm.weight"], self.output_weight(), logit_scale=hp.f_logit_scale)


# ---------------------------------------------------------------------------------------------
# llamapy convert: llama.cpp's GraniteHybridModel (Mamba2Model + GraniteMoeModel)


def _find(hp: dict, keys: list[str]):
    """GraniteHybridModel.find_hparam: the keys, then the same with the ``mamba_`` prefix."""
    for k in [*keys, *(f"mamba_{k}" for k in keys)]:
        if k in hp:
            return hp[k]
    raise KeyError(f"could not find any of: {keys}")


def _attn_layers(ctx) -> list[int]:
    hp = ctx.hparams
    if layer_types := hp.get("layer_types"):
        # transformers 5 saves "full_attention" (llama.cpp reads only the Hub's "attention")
        return [i for i, typ in enumerate(layer_types) if typ in ("attention", "full_attention")]
    if layers := hp.get("attn_layer_indices"):
        return list(layers)
    period, offset = hp["attn_layer_period"], hp["attn_layer_offset"]
    return [i for i in range(ctx.block_count) if i % period == offset]


def _mamba_dims(ctx) -> tuple[int, int]:
    """(n_group, d_inner) as GraniteHybridModel.__init__ reads them."""
    hp = ctx.hparams
    d_model = _find(hp, ["mamba_head_dim", "hidden_size", "d_model"])
    return _find(hp, ["n_groups", "num_groups"]), _find(hp, ["expand", "num_heads"]) * d_model


def _hybrid_vocab(ctx, kv) -> None:
    """Mamba2Model.set_vocab: vocab_size rounded up to a multiple of 8 (1 without SSM layers)."""
    pad = 8 if len(_attn_layers(ctx)) < ctx.block_count else 1
    ctx.hparams["vocab_size"] = -(ctx.hparams["vocab_size"] // -pad) * pad
    ctx.set_vocab("spm|gpt2")


def _hybrid_params(ctx, kv) -> None:
    granite_params(ctx, kv)
    hp = ctx.hparams
    n_group, d_inner = _mamba_dims(ctx)
    kv.add_ssm_conv_kernel(_find(hp, ["conv_kernel", "d_conv"]))
    kv.add_ssm_state_size(_find(hp, ["state_size", "d_state", "state_dim", "ssm_state_size"]))
    kv.add_ssm_group_count(n_group)
    kv.add_ssm_inner_size(d_inner)
    kv.add_ssm_time_step_rank(_find(hp, ["n_heads", "num_heads"]))
    attn = _attn_layers(ctx)
    n_kv = _find(hp, ["num_key_value_heads", "n_head_kv"])
    if rope_dim := hp.get("attn_rotary_emb"):
        kv.add_rope_dimension_count(rope_dim)
    kv.add_head_count_kv([n_kv if i in attn else 0 for i in range(ctx.block_count)])
    use_rope = "BambaForCausalLM" in hp["architectures"] or len(attn) == ctx.block_count
    kv.add_rope_scaling_finetuned(use_rope)
    if not use_rope:
        kv.add_context_length(2**20)


def _hybrid_tensor(ctx, name, data, bid):
    """GraniteHybridModel.modify_tensors: Granite MoE's fused FFNs, Mamba2's SSM tensors (A = -exp(A_log),
    A and D as columns, the conv kernel squeezed, the gated norm per group), LLaMA's attention."""
    if name.endswith("block_sparse_moe.input_linear.weight") or "shared_mlp" in name:
        return granite_moe_tensor(ctx, name, data, bid)
    if bid is None or bid in _attn_layers(ctx):
        return [(name, data)]
    if name.endswith(".dt_bias"):
        name = name.removesuffix(".dt_bias") + ".dt_proj.bias"
    if name.endswith(".A_log"):
        data = (-np.exp(data.astype(np.float64))).astype(np.float32)  # torch's float32 exp: rounded exactly
    if name.endswith((".A_log", ".D")):
        data = data.reshape(*data.shape, 1)
    elif name.endswith("conv1d.weight"):
        data = data.squeeze()
    elif name.endswith("mamba.norm.weight"):
        n_group, d_inner = _mamba_dims(ctx)
        data = data.reshape(n_group, d_inner // n_group)
    return [(name, data)]


HF_CONVERT = replace(
    LLAMA_HF,
    arch="granitehybrid",
    hf_archs=("GraniteMoeHybridForCausalLM", "BambaForCausalLM"),
    vocab=_hybrid_vocab,
    params=_hybrid_params,
    tensor=_hybrid_tensor,
    drop_hparams=("head_dim",),
)
