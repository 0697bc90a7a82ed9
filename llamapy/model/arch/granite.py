"""Granite (3.x dense) and Granite MoE: LLaMA's layout with four scalar multipliers: embeddings x
embedding_scale, attention scores x attention.scale (instead of 1/sqrt(head size)), each residual
branch x residual_scale, logits / logit_scale. The MoE routes by softmax over the top-k logits."""

from __future__ import annotations

from dataclasses import replace

from ..blocks import GraphBuilder, Outputs
from ..dense_blocks import DenseArchitecture, DenseLayout, build_dense
from ..hf_shared import LLAMA_HF, granite_moe_tensor, granite_params
from ..hparams import HParams, MetaReader
from . import register


@register("granite", "granitemoe")
class Granite(DenseArchitecture):
    layout = DenseLayout(moe_norm_w=True)  # expert_weights_norm (always set)

    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        hp.f_embedding_scale = md.f32("embedding_scale", 0.0)
        hp.f_attention_scale = md.f32("attention.scale", 0.0)
        hp.f_residual_scale = md.f32("residual_scale", 0.0)
        hp.f_logit_scale = md.f32("logit_scale", required=True)
        hp.expert_weights_norm = True

    def build(self, g: GraphBuilder) -> Outputs:
        hp = self.hp
        return build_dense(
            self,
            g,
            embd_scale=hp.f_embedding_scale or None,
            kq_scale=hp.f_attention_scale or None,
            residual_scale=hp.f_residual_scale or None,
            logit_scale=hp.f_logit_scale,
        )


# GraniteModel is LlamaModel without head_dim (ignored) and with its scales; GraniteMoeModel splits the
# fused expert FFNs
HF_CONVERT = (
    replace(
        LLAMA_HF,
        arch="granite",
        hf_archs=("GraniteForCausalLM",),
        params=granite_params,
        drop_hparams=("head_dim",),
    ),
    replace(
        LLAMA_HF,
        arch="granitemoe",
        hf_archs=("GraniteMoeForCausalLM", "GraniteMoeSharedForCausalLM"),
        params=granite_params,
        tensor=granite_moe_tensor,
        drop_hparams=("head_dim",),
    ),
)
