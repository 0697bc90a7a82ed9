"""Qwen1.5-MoE / Qwen2-MoE: Qwen2's attention (q/k/v biases, neox rope) with a mixture of experts
(softmax routing, top-k weights not renormalized) plus a shared expert scaled by a sigmoid gate."""

from __future__ import annotations

from ..dense_blocks import DenseArchitecture, DenseLayout
from ..hf import HFConvert
from ..hf_shared import qwen_moe_params
from ..hparams import ROPE_NEOX, HParams, MetaReader, ModelLoadError
from . import register


@register("qwen2moe")
class Qwen2Moe(DenseArchitecture):
    layout = DenseLayout(biases=True, shared_expert=True)

    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        hp.rope_type = ROPE_NEOX
        if not hp.n_expert:
            raise ModelLoadError(f"{md.where}: qwen2moe needs expert_count > 0")
        # as llama.cpp: without expert_feed_forward_length each expert is n_ff / n_expert_used wide
        hp.n_ff_exp = hp.n_ff_exp or hp.n_ff[0] // hp.n_expert_used


HF_CONVERT = HFConvert("qwen2moe", ("Qwen2MoeForCausalLM",), params=qwen_moe_params)
