"""Qwen3.5 (``qwen35``, dense) and Qwen3.5-MoE (``qwen35moe``), Gated DeltaNet and gated attention: three of
four layers are Gated DeltaNet (causal conv, gated delta rule over a recurrent state), every fourth is
gated full attention (q and an output gate from one projection, per-head q/k RMS norms, interleaved
multi-section rope on a quarter of the head). Norms multiply by the stored (1 + w) as llama.cpp's converter
writes them."""

from __future__ import annotations

from ...ggml import ops
from ..blocks import GraphBuilder, Outputs, Rope, SectionRope, TensorLoader, rope_for_layer
from ..hf import HFConvert
from ..hf_shared import qwen_linear_params, qwen_linear_tensor, qwen_mtp_blocks
from ..hparams import HParams, MetaReader, ModelLoadError
from ..moe_blocks import load_ffn_tensors, skip_nextn_tensors
from ..rs_blocks import build_gated_attention, build_gated_delta_net, load_qwen35_hparams
from . import Architecture, register


def load_linear_attn_tensors(arch: Architecture, t: TensorLoader, il: int) -> None:
    hp = arch.hp
    n_embd = hp.n_embd
    key_dim = hp.ssm_d_state * hp.ssm_n_group
    value_dim = hp.ssm_d_inner
    conv_dim = 2 * key_dim + value_dim
    t.layer(il, "attn_qkv.weight", (conv_dim, n_embd))
    t.layer(il, "attn_gate.weight", (value_dim, n_embd))
    t.layer(il, "ssm_conv1d.weight", (conv_dim, hp.ssm_d_conv))
    t.layer(il, "ssm_dt.bias", (hp.ssm_dt_rank,))
    t.layer(il, "ssm_a", (hp.ssm_dt_rank,))
    t.layer(il, "ssm_beta.weight", (hp.ssm_dt_rank, n_embd))
    t.layer(il, "ssm_alpha.weight", (hp.ssm_dt_rank, n_embd))
    t.layer(il, "ssm_norm.weight", (value_dim // hp.ssm_dt_rank,))
    t.layer(il, "ssm_out.weight", (n_embd, value_dim))


@register("qwen35", "qwen35moe")
class Qwen35(Architecture):
    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        load_qwen35_hparams(hp, md)
        if hp.arch == "qwen35moe" and not hp.n_expert:
            raise ModelLoadError(f"{md.where}: qwen35moe needs expert_count > 0")

    def layer_rope(self, il: int, n_ctx: int = 0) -> Rope | None:
        r = rope_for_layer(self.hp, il)
        return SectionRope(
            **{k: getattr(r, k) for k in r.__dataclass_fields__}, sections=self.hp.rope_sections
        )

    def load_tensors(self, t: TensorLoader) -> None:
        hp = self.hp
        t("token_embd.weight", (hp.n_vocab, hp.n_embd))
        t("output_norm.weight", (hp.n_embd,))
        t("output.weight", (hp.n_vocab, hp.n_embd), required=False)
        for il in range(hp.n_layer):
            t.layer(il, "attn_norm.weight", (hp.n_embd,))
            t.layer(il, "post_attention_norm.weight", (hp.n_embd,))
            if hp.is_recurrent(il):
                load_linear_attn_tensors(self, t, il)
            else:
                nh, nkv, d, _ = hp.heads(il)
                t.layer(il, "attn_q.weight", (2 * nh * d, hp.n_embd))
                t.layer(il, "attn_k.weight", (nkv * d, hp.n_embd))
                t.layer(il, "attn_v.weight", (nkv * d, hp.n_embd))
                t.layer(il, "attn_output.weight", (hp.n_embd, nh * d))
                t.layer(il, "attn_q_norm.weight", (d,))
                t.layer(il, "attn_k_norm.weight", (d,))
            load_ffn_tensors(self, t, il)
        skip_nextn_tensors(self, t)
        self._finish_tensors(t)

    def build(self, g: GraphBuilder) -> Outputs:
        return build_hybrid_decoder(self, g)


def build_hybrid_decoder(arch: Architecture, g: GraphBuilder) -> Outputs:
    """x += mixer(norm(x)) (gated delta net or gated attention); x += ffn(post_attention_norm(x))."""
    x = g.embed(arch.w["token_embd.weight"])
    for il, blk in enumerate(arch.blocks):
        h = g.build_norm(x, blk["attn_norm.weight"], name="attn_norm", il=il)
        if arch.hp.is_recurrent(il):
            h = build_gated_delta_net(g, h, blk, il)
        else:
            h = build_gated_attention(g, h, blk, il)
        h, x = g.select_outputs(il, h, x)
        x = g.cb(ops.add(x, h), "attn_residual", il)
        h = g.build_norm(x, blk["post_attention_norm.weight"], name="attn_post_norm", il=il)
        if arch.layer_moe(il):
            h = g.cb(
                ops.add(g.build_moe_ffn(h, blk, il, True), g.build_shared_expert(h, blk, il)), "ffn_out", il
            )
        else:
            h = g.build_ffn(h, blk, il)
        x = g.cb(ops.add(x, h), "l_out", il)
    return g.output(x, arch.w["output_norm.weight"], arch.output_weight())


def _hf_tensor(ctx, name, data, bid):
    """TextModel.filter_tensors for the Hub's ``Qwen3_5(Moe)ForConditionalGeneration`` files: the vision
    tower (``model.visual.``) dropped, ``model.language_model.`` read as ``model.``; then Qwen3-Next's."""
    if "visual." in name:
        return []
    return qwen_linear_tensor(ctx, name.replace("language_model.", ""), data, bid)


HF_CONVERT = (
    HFConvert(
        "qwen35",
        ("Qwen3_5ForConditionalGeneration", "Qwen3_5ForCausalLM"),
        params=qwen_linear_params,
        tensor=_hf_tensor,
        extra_blocks=qwen_mtp_blocks,
    ),
    HFConvert(
        "qwen35moe",
        ("Qwen3_5MoeForConditionalGeneration", "Qwen3_5MoeForCausalLM"),
        params=qwen_linear_params,
        tensor=_hf_tensor,
        extra_blocks=qwen_mtp_blocks,
    ),
)
