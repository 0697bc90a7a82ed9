"""Nemotron-H with experts (``nemotron_h_moe``, Nemotron 3 Nano and Super), Mamba2, attention and MoE layers:
Nemotron-H's layout (one mixer per layer after an RMS norm, with a residual), whose feed-forward layers are
a mixture of squared-ReLU experts without a gate plus one squared-ReLU shared expert, as llama.cpp's
``src/models/nemotron-h.cpp`` builds them.

Routing (transformers' ``NemotronHTopkRouter``, llama.cpp's sigmoid gating): sigmoid scores of the router;
the experts chosen on the scores plus the layer's ``exp_probs_b`` (the correction bias), within the best
``expert_group_used_count`` of ``expert_group_count`` groups when there are several; weighted by the
unbiased scores, renormalized (``expert_weights_norm``) and scaled (``expert_weights_scale``, the routed
scaling factor). With ``moe_latent_size`` (Super), the router reads the full hidden state while the experts
work in the latent width, between ``ffn_latent_down`` and ``ffn_latent_up``; the shared expert reads the full
hidden state. llama.cpp's converter writes the feed-forward layers' ``feed_forward_length`` as the expert
width, the shared expert's as ``expert_shared_feed_forward_length``, and an MTP head (Super) as a trailing
block counted in ``nextn_predict_layers``: accepted, not loaded, not run.

The HF -> GGUF map (``convert_hf_to_gguf.py``'s ``NemotronHModel`` with ``num_experts_per_tok`` in the
config), for a layer ``il`` of type ``moe`` in ``layers_block_type`` (``E`` in ``hybrid_override_pattern``):
``mixer.gate.weight`` -> ``ffn_gate_inp``, ``mixer.gate.e_score_correction_bias`` -> ``exp_probs_b.bias``,
``mixer.experts.{up,down}_proj`` (stacked per expert) -> ``ffn_{up,down}_exps``,
``mixer.shared_experts.{up,down}_proj`` -> ``ffn_{up,down}_shexp``, ``mixer.fc1_latent_proj`` /
``fc2_latent_proj`` -> ``ffn_latent_down`` / ``ffn_latent_up``; hparams ``n_routed_experts`` ->
``expert_count``, ``num_experts_per_tok`` -> ``expert_used_count``, ``moe_intermediate_size`` ->
``expert_feed_forward_length`` (and the layer's ``feed_forward_length``),
``moe_shared_expert_intermediate_size`` -> ``expert_shared_feed_forward_length``, ``n_shared_experts`` ->
``expert_shared_count``, ``norm_topk_prob`` -> ``expert_weights_norm``, ``routed_scaling_factor`` ->
``expert_weights_scale``, ``n_group`` -> ``expert_group_count``, ``moe_latent_size`` -> ``moe_latent_size``.
Mamba2 and attention layers are as ``nemotron_h``'s."""

from __future__ import annotations

from ...ggml.tensor import Tensor
from ..blocks import GraphBuilder, TensorLoader, Weights
from ..hparams import HParams, MetaReader, ModelLoadError
from ..moe_blocks import GATING_SIGMOID, read_moe_routing, skip_nextn_tensors
from ..nemotron_blocks import NemotronHLayers, relu_sqr_ffn
from . import register


@register("nemotron_h_moe")
class NemotronHMoE(NemotronHLayers):
    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        read_moe_routing(hp, md, GATING_SIGMOID)  # (drops the MTP block from the per-layer lists)
        hp.expert_gating_func = GATING_SIGMOID  # llama.cpp's graph: sigmoid, whatever the file says
        if hp.n_layer_dense_lead:
            raise md._err("nemotron_h_moe has no leading dense layers (leading_dense_block_count must be 0)")
        hp.n_embd_moe_latent = md.u32("moe_latent_size", 0)
        if not hp.n_ff_shexp:
            raise md._err(f"metadata key {md._key('expert_shared_feed_forward_length')!r} is missing or 0")
        for il in range(hp.n_layer):
            if hp.n_ff[il] and hp.n_head_kv[il]:
                raise md._err(f"layer {il} has both KV heads and a feed-forward size (one mixer per layer)")
            if hp.n_ff[il] and not (hp.n_ff_exp or hp.n_ff[il] // hp.n_expert_used):
                raise md._err(f"layer {il}: no expert width (expert_feed_forward_length)")
        super().adjust_hparams(hp, md)

    def layer_moe(self, il: int) -> bool:
        hp = self.hp
        return hp.n_ff[il] > 0 and not hp.is_recurrent(il)

    def load_tensors(self, t: TensorLoader) -> None:
        skip_nextn_tensors(self, t)
        super().load_tensors(t)

    def load_ffn_tensors(self, t: TensorLoader, il: int) -> None:
        hp = self.hp
        n, n_exp = hp.n_embd, hp.n_expert
        n_moe = hp.n_embd_moe_latent or n
        n_ff = hp.n_ff_exp or hp.n_ff[il] // hp.n_expert_used
        t.layer(il, "ffn_gate_inp.weight", (n_exp, n))
        t.layer(il, "exp_probs_b.bias", (n_exp,))
        down = t.layer(il, "ffn_latent_down.weight", (n_moe, n), required=False)
        up = t.layer(il, "ffn_latent_up.weight", (n, n_moe), required=False)
        if (down is None) != (up is None) or (hp.n_embd_moe_latent and down is None):
            raise ModelLoadError(
                f"layer {il}: moe_latent_size needs both ffn_latent_down.weight and ffn_latent_up.weight"
            )
        t.layer(il, "ffn_up_exps.weight", (n_exp, n_ff, n_moe))
        t.layer(il, "ffn_down_exps.weight", (n_exp, n_moe, n_ff))
        t.layer(il, "ffn_up_shexp.weight", (hp.n_ff_shexp, n))
        t.layer(il, "ffn_down_shexp.weight", (n, hp.n_ff_shexp))

    def build_ffn_layer(self, g: GraphBuilder, h: Tensor, blk: Weights, il: int) -> Tensor:
        hp = self.hp
        latent_down, latent_up = blk.get("ffn_latent_down.weight"), blk.get("ffn_latent_up.weight")
        x = h if latent_down is None else g.cb(g.mm(latent_down, h), "ffn_latent_down", il)
        moe = g.build_moe_ffn(
            h,
            blk,
            il,
            hp.expert_weights_norm,
            gating="sigmoid",
            act="relu_sqr",
            w_scale=hp.expert_weights_scale,
            inp_exps=x,
        )
        if latent_up is not None:
            moe = g.cb(g.mm(latent_up, moe), "ffn_latent_up", il)
        shexp = g.cb(relu_sqr_ffn(g, h, blk, il, suffix="_shexp"), "ffn_shexp", il)
        return g.cb(moe + shexp, "ffn_out", il)
