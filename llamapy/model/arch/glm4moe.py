"""GLM-4.5 / GLM-4.5-Air (llama.cpp's ``glm4moe``), pre-norm decoder with q/k/v biases, optional
per-head q/k RMS norms, partial neox rotary; the first ``leading_dense_block_count`` layers dense,
the others a sigmoid-routed mixture of experts (selection on scores + ``exp_probs_b``, weights
renormalized and scaled) plus shared experts. The trailing next-token-prediction (MTP) layers are
skipped: their tensors are accepted, not loaded, and the graph runs the trunk only.

Also the MoE pieces DeepSeek V2/V3 share with it: ``read_moe_routing`` (hparams) and
``load_moe_layer`` / ``build_moe_layer`` (routed + shared experts)."""

from __future__ import annotations

from ...ggml.tensor import Tensor
from ..blocks import GraphBuilder, Outputs, TensorLoader, Weights
from ..hparams import ROPE_NEOX, HParams, MetaReader, ModelLoadError
from . import Architecture, register

GATING_SOFTMAX, GATING_SIGMOID = 1, 2  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE


def read_moe_routing(hp: HParams, md: MetaReader, default_gating: int) -> None:
    """Shared experts, leading dense layers, weights norm and scale, gating, expert groups and the
    next-token-prediction layers (dropped from ``hp.n_layer`` and the per-layer lists)."""
    hp.n_expert_shared = md.u32("expert_shared_count", 0)
    hp.n_layer_dense_lead = md.u32("leading_dense_block_count", 0)
    hp.expert_weights_scale = md.f32("expert_weights_scale", 0.0)
    hp.expert_weights_norm = bool(md.boolean("expert_weights_norm", False))
    hp.expert_gating_func = md.u32("expert_gating_func", 0) or default_gating
    if hp.expert_gating_func not in (GATING_SOFTMAX, GATING_SIGMOID):
        raise md._err(f"expert_gating_func {hp.expert_gating_func} is not supported (1 softmax, 2 sigmoid)")
    hp.n_expert_groups = md.u32("expert_group_count", 0)
    hp.n_group_used = md.u32("expert_group_used_count", 0)
    if hp.n_expert_groups > 1 and (
        hp.n_expert % hp.n_expert_groups or not 0 < hp.n_group_used <= hp.n_expert_groups
    ):
        raise md._err(
            f"expert_group_count {hp.n_expert_groups} / expert_group_used_count {hp.n_group_used} do "
            f"not fit expert_count {hp.n_expert}"
        )
    if not hp.n_expert or hp.n_layer_dense_lead > hp.n_layer:
        raise md._err(f"needs expert_count > 0 and leading_dense_block_count <= {hp.n_layer}")
    hp.n_layer_nextn = md.u32("nextn_predict_layers", 0)
    if hp.n_layer_nextn:
        if hp.n_layer_nextn >= hp.n_layer:
            raise md._err(f"nextn_predict_layers {hp.n_layer_nextn} must be < block_count {hp.n_layer}")
        n = hp.n_layer = hp.n_layer - hp.n_layer_nextn
        hp.n_head, hp.n_head_kv, hp.n_ff = hp.n_head[:n], hp.n_head_kv[:n], hp.n_ff[:n]
        hp.swa_layers = hp.swa_layers[:n]


def skip_nextn_tensors(arch: Architecture, t: TensorLoader) -> None:
    """Accept (without loading) the tensors of the next-token-prediction layers after the trunk."""
    hp = arch.hp
    for il in range(hp.n_layer, hp.n_layer + hp.n_layer_nextn):
        prefix = f"blk.{il}."
        for name in [n for n in t.loader.tensor_index if n.startswith(prefix)]:
            t.loader.check(name, None)


def load_moe_layer(arch: Architecture, t: TensorLoader, il: int) -> None:
    """Router (+ selection bias), routed experts, and the shared experts (``n_expert_shared`` x the
    expert width) of MoE layer ``il``."""
    hp = arch.hp
    n_embd, n_ff = hp.n_embd, hp.n_ff_exp or hp.n_ff[il] // hp.n_expert_used
    t.layer(il, "ffn_gate_inp.weight", (hp.n_expert, n_embd))
    t.layer(il, "exp_probs_b.bias", (hp.n_expert,), required=False)
    t.layer(il, "ffn_gate_exps.weight", (hp.n_expert, n_ff, n_embd))
    t.layer(il, "ffn_up_exps.weight", (hp.n_expert, n_ff, n_embd))
    t.layer(il, "ffn_down_exps.weight", (hp.n_expert, n_embd, n_ff))
    if hp.n_expert_shared:
        n_sh = n_ff * hp.n_expert_shared
        t.layer(il, "ffn_gate_shexp.weight", (n_sh, n_embd))
        t.layer(il, "ffn_up_shexp.weight", (n_sh, n_embd))
        t.layer(il, "ffn_down_shexp.weight", (n_embd, n_sh))


def build_moe_layer(g: GraphBuilder, h: Tensor, blk: Weights, il: int) -> Tensor:
    """Routed experts (the hparams' gating, norm and scale) plus the shared experts where present."""
    hp = g.hp
    gating = "sigmoid" if hp.expert_gating_func == GATING_SIGMOID else "softmax"
    moe = g.build_moe_ffn(h, blk, il, hp.expert_weights_norm, gating=gating, w_scale=hp.expert_weights_scale)
    if "ffn_up_shexp.weight" not in blk:
        return moe
    return g.cb(moe + g.build_shared_expert(h, blk, il), "ffn_out", il)


@register("glm4moe")
class Glm4Moe(Architecture):
    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        hp.rope_type = ROPE_NEOX
        read_moe_routing(hp, md, GATING_SIGMOID)
        if not hp.n_ff_exp:
            raise ModelLoadError(f"{md.where}: glm4moe needs expert_feed_forward_length")

    def layer_moe(self, il: int) -> bool:
        return il >= self.hp.n_layer_dense_lead

    def load_tensors(self, t: TensorLoader) -> None:
        hp = self.hp
        n_embd = hp.n_embd
        t("token_embd.weight", (hp.n_vocab, n_embd))
        t("output_norm.weight", (n_embd,))
        t("output.weight", (hp.n_vocab, n_embd), required=False)
        self.qk_norm = t.loader.has("blk.0.attn_q_norm.weight")
        for il in range(hp.n_layer):
            heads = hp.heads(il)
            nq, nk, nv = heads.n_head * heads.n_embd_head_k, hp.n_embd_k_gqa(il), hp.n_embd_v_gqa(il)
            t.layer(il, "attn_norm.weight", (n_embd,))
            for name, n in (("attn_q", nq), ("attn_k", nk), ("attn_v", nv)):
                t.layer(il, f"{name}.weight", (n, n_embd))
                t.layer(il, f"{name}.bias", (n,), required=False)
            t.layer(il, "attn_output.weight", (n_embd, heads.n_head * heads.n_embd_head_v))
            if self.qk_norm:
                t.layer(il, "attn_q_norm.weight", (heads.n_embd_head_k,))
                t.layer(il, "attn_k_norm.weight", (heads.n_embd_head_k,))
            t.layer(il, "post_attention_norm.weight", (n_embd,))  # the FFN's pre-norm in these files
            if self.layer_moe(il):
                load_moe_layer(self, t, il)
            else:
                t.layer(il, "ffn_gate.weight", (hp.n_ff[il], n_embd))
                t.layer(il, "ffn_up.weight", (hp.n_ff[il], n_embd))
                t.layer(il, "ffn_down.weight", (n_embd, hp.n_ff[il]))
        skip_nextn_tensors(self, t)
        self._finish_tensors(t)

    def build(self, g: GraphBuilder) -> Outputs:
        x = g.embed(self.w["token_embd.weight"])
        for il, blk in enumerate(self.blocks):
            h = g.build_norm(x, blk["attn_norm.weight"], name="attn_norm", il=il)
            h = g.attention(h, blk, il, qk_norm=self.qk_norm)
            h, x = g.select_outputs(il, h, x)
            x = g.cb(x + h, "ffn_inp", il)
            h = g.build_norm(x, blk["post_attention_norm.weight"], name="post_attn_norm", il=il)
            h = build_moe_layer(g, h, blk, il) if self.layer_moe(il) else g.build_ffn(h, blk, il)
            x = g.cb(x + h, "l_out", il)
        return g.output(x, self.w["output_norm.weight"], self.output_weight())
