"""LFM2 (``lfm2``) and LFM2-MoE (``lfm2moe``), short convolutions beside attention: gated short convolutions
(``shortconv``: ``c * conv(b * x)`` over a conv state of ``shortconv.l_cache - 1`` inputs) in the layers
with ``head_count_kv`` 0, grouped-query attention with per-head q/k RMS norms and neox rope in the others,
SwiGLU feed-forward; the final norm is stored as ``token_embd_norm`` (llama.cpp's name for it). LFM2-MoE:
after ``leading_dense_block_count`` dense layers, a mixture of experts with sigmoid routing, a selection
bias (``exp_probs_b.bias``) and normalized top-k weights."""

from __future__ import annotations

from ...ggml import ops
from ..blocks import GraphBuilder, Outputs, TensorLoader
from ..hf import HFConvert
from ..hparams import ROPE_NEOX, HParams, MetaReader, ModelLoadError
from ..rs_blocks import build_shortconv
from . import Architecture, register


@register("lfm2", "lfm2moe")
class Lfm2(Architecture):
    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        hp.rope_type = ROPE_NEOX
        l_cache = md.u32("shortconv.l_cache", required=True)
        if l_cache < 2:
            raise md._err(f"shortconv.l_cache = {l_cache} must be at least 2")
        hp.ssm_d_conv = l_cache
        hp.recurrent_layers = [n == 0 for n in hp.n_head_kv]
        hp.n_embd_r = (l_cache - 1) * hp.n_embd
        hp.n_embd_s = 0
        if hp.arch == "lfm2moe":
            hp.n_layer_dense_lead = md.u32("leading_dense_block_count", 0)
            if not hp.n_expert or hp.n_layer_dense_lead > hp.n_layer:
                raise ModelLoadError(
                    f"{md.where}: lfm2moe needs expert_count > 0 and at most block_count leading dense layers"
                )

    def layer_moe(self, il: int) -> bool:
        return self.hp.n_expert > 0 and il >= self.hp.n_layer_dense_lead

    def load_tensors(self, t: TensorLoader) -> None:
        hp = self.hp
        n = hp.n_embd
        t("token_embd.weight", (hp.n_vocab, n))
        t("token_embd_norm.weight", (n,))
        t("output.weight", (hp.n_vocab, n), required=False)
        for il in range(hp.n_layer):
            t.layer(il, "attn_norm.weight", (n,))
            t.layer(il, "ffn_norm.weight", (n,))
            if hp.is_recurrent(il):
                t.layer(il, "shortconv.conv.weight", (n, hp.ssm_d_conv))
                t.layer(il, "shortconv.in_proj.weight", (3 * n, n))
                t.layer(il, "shortconv.out_proj.weight", (n, n))
            else:
                nh, nkv, d, _ = hp.heads(il)
                t.layer(il, "attn_q.weight", (nh * d, n))
                t.layer(il, "attn_k.weight", (nkv * d, n))
                t.layer(il, "attn_v.weight", (nkv * d, n))
                t.layer(il, "attn_output.weight", (n, nh * d))
                t.layer(il, "attn_q_norm.weight", (d,))
                t.layer(il, "attn_k_norm.weight", (d,))
            if self.layer_moe(il):
                n_ff = hp.n_ff_exp or hp.n_ff[il]
                t.layer(il, "ffn_gate_inp.weight", (hp.n_expert, n))
                t.layer(il, "exp_probs_b.bias", (hp.n_expert,), required=False)
                t.layer(il, "ffn_gate_exps.weight", (hp.n_expert, n_ff, n))
                t.layer(il, "ffn_up_exps.weight", (hp.n_expert, n_ff, n))
                t.layer(il, "ffn_down_exps.weight", (hp.n_expert, n, n_ff))
                continue
            t.layer(il, "ffn_gate.weight", (hp.n_ff[il], n))
            t.layer(il, "ffn_up.weight", (hp.n_ff[il], n))
            t.layer(il, "ffn_down.weight", (n, hp.n_ff[il]))
        self._finish_tensors(t)

    def build(self, g: GraphBuilder) -> Outputs:
        x = g.embed(self.w["token_embd.weight"])
        for il, blk in enumerate(self.blocks):
            h = g.build_norm(x, blk["attn_norm.weight"], name="attn_norm", il=il)
            if self.hp.is_recurrent(il):
                h = build_shortconv(g, h, blk, il)
            else:
                h = g.attention(h, blk, il, qk_norm=True)
            h, x = g.select_outputs(il, h, x)
            x = g.cb(ops.add(x, h), "ffn_inp", il)
            h = g.build_norm(x, blk["ffn_norm.weight"], name="ffn_norm", il=il)
            if self.layer_moe(il):
                h = g.build_moe_ffn(h, blk, il, True, gating="sigmoid")
            else:
                h = g.build_ffn(h, blk, il)
            x = g.cb(ops.add(x, h), "l_out", il)
        return g.output(x, self.w["token_embd_norm.weight"], self.output_weight())


def _lfm2_hparams(hp: dict) -> dict:
    """LFM2Model.set_gguf_parameters: head_count_kv per layer, 0 for the conv layers."""
    kv = hp["num_key_value_heads"]
    return {**hp, "num_key_value_heads": [kv if t != "conv" else 0 for t in hp["layer_types"]]}


def _lfm2_params(ctx, kv) -> None:
    hp = ctx.hparams
    kv.add_vocab_size(hp["vocab_size"])
    kv.add_shortconv_l_cache(hp["conv_L_cache"])
    kv.add_layer_norm_rms_eps(hp["norm_eps"])
    ff = ctx.find_hparam(["block_ff_dim", "intermediate_size"])
    if hp["block_auto_adjust_ff_dim"]:
        ff = int(2 * ff / 3)
        if (mult := hp["block_ffn_dim_multiplier"]) is not None:
            ff = int(mult * ff)
        m = hp["block_multiple_of"]
        ff = m * ((ff + m - 1) // m)
    kv.add_feed_forward_length(ff)


def _lfm2_tensor(ctx, name, data, bid):
    if "conv.conv" in name:  # the conv op takes [C, L]
        data = data.reshape(data.shape[0], *data.shape[2:]) if data.ndim == 3 and data.shape[1] == 1 else data
    return [(name, data)]


HF_CONVERT = HFConvert(
    "lfm2",
    ("Lfm2ForCausalLM", "LFM2ForCausalLM"),
    params=_lfm2_params,
    tensor=_lfm2_tensor,
    adjust_hparams=_lfm2_hparams,
)
