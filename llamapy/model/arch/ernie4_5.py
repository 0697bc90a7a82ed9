"""ERNIE 4.5 (dense and MoE), LLaMA's pre-norm decoder with interleaved (normal-mode) rope and
optional q/k/v biases; in ``ernie4_5-moe`` files, from ``leading_dense_block_count`` on, every
``interleave_moe_layer_step``-th layer is a mixture of experts (softmax routing, experts chosen on
the probabilities plus ``exp_probs_b``, weights renormalized) with an optional shared expert."""

from __future__ import annotations

from dataclasses import replace

from ..blocks import TensorLoader
from ..dense_blocks import DenseArchitecture, DenseLayout, load_dense_tensors
from ..hparams import HParams, MetaReader, ModelLoadError
from . import register


@register("ernie4_5", "ernie4_5-moe")
class Ernie45(DenseArchitecture):
    layout = DenseLayout(moe_norm_w=True)  # shared_expert: where the file has one (load_tensors)

    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        if hp.arch != "ernie4_5-moe":
            hp.n_expert = 0
            return
        if not hp.n_expert or not hp.n_ff_exp:
            raise ModelLoadError(
                f"{md.where}: ernie4_5-moe needs expert_count and expert_feed_forward_length"
            )
        hp.n_layer_dense_lead = md.u32("leading_dense_block_count", required=True)
        hp.n_moe_layer_step = md.u32("interleave_moe_layer_step", required=True)
        if not hp.n_moe_layer_step:
            raise ModelLoadError(f"{md.where}: interleave_moe_layer_step must be > 0")
        hp.expert_weights_norm = True

    def layer_moe(self, il: int) -> bool:
        hp = self.hp
        return hp.n_expert > 0 and il >= hp.n_layer_dense_lead and (il + 1) % hp.n_moe_layer_step == 0

    def load_tensors(self, t: TensorLoader) -> None:
        hp = self.hp
        self.layout = replace(self.layout, shared_expert=hp.n_ff_shexp > 0)
        load_dense_tensors(self, t)
        for il in range(hp.n_layer):
            if self.layer_moe(il):
                t.layer(il, "exp_probs_b.bias", (hp.n_expert,), required=False)
        self._finish_tensors(t)
