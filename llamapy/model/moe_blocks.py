"""Mixture-of-experts pieces several families share (GLM-4.5, DeepSeek V2/V3, Nemotron-H MoE, Qwen3.5):
the routing hparams (``read_moe_routing``: shared experts, leading dense layers, gating, expert groups and
the next-token-prediction layers), the skipped MTP tensors (``skip_nextn_tensors``), and one MoE layer's
tensors and graph (``load_moe_layer`` / ``build_moe_layer``: routed + shared experts); ``load_ffn_tensors``:
Qwen3.5 / Qwen3-Next's dense or MoE (+ gated shared expert) feed-forward tensors."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..ggml.tensor import Tensor
from .blocks import GraphBuilder, TensorLoader, Weights
from .hparams import HParams, MetaReader

if TYPE_CHECKING:
    from .arch import Architecture

__all__ = [
    "GATING_SIGMOID",
    "GATING_SOFTMAX",
    "build_moe_layer",
    "load_ffn_tensors",
    "load_moe_layer",
    "read_moe_routing",
    "skip_nextn_tensors",
]


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


def load_ffn_tensors(arch: Architecture, t: TensorLoader, il: int) -> None:
    hp = arch.hp
    n_embd = hp.n_embd
    if not arch.layer_moe(il):
        t.layer(il, "ffn_gate.weight", (hp.n_ff[il], n_embd))
        t.layer(il, "ffn_up.weight", (hp.n_ff[il], n_embd))
        t.layer(il, "ffn_down.weight", (n_embd, hp.n_ff[il]))
        return
    n_ff, n_sh = hp.n_ff_exp or hp.n_ff[il], hp.n_ff_shexp or hp.n_ff_exp or hp.n_ff[il]
    t.layer(il, "ffn_gate_inp.weight", (hp.n_expert, n_embd))
    t.layer(il, "ffn_gate_exps.weight", (hp.n_expert, n_ff, n_embd))
    t.layer(il, "ffn_up_exps.weight", (hp.n_expert, n_ff, n_embd))
    t.layer(il, "ffn_down_exps.weight", (hp.n_expert, n_embd, n_ff))
    t.layer(il, "ffn_gate_inp_shexp.weight", (n_embd,), required=False)
    t.layer(il, "ffn_gate_shexp.weight", (n_sh, n_embd))
    t.layer(il, "ffn_up_shexp.weight", (n_sh, n_embd))
    t.layer(il, "ffn_down_shexp.weight", (n_embd, n_sh))
