"""Granite (3.x dense) and Granite MoE: LLaMA's layout with four scalar multipliers: embeddings x
embedding_scale, attention scores x attention.scale (instead of 1/sqrt(head size)), each residual
branch x residual_scale, logits / logit_scale. The MoE routes by softmax over the top-k logits."""

from __future__ import annotations

from dataclasses import replace

from ..blocks import GraphBuilder, Outputs
from ..dense_blocks import DenseArchitecture, DenseLayout, build_dense
from ..hf_shared import LLAMA_HF
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


def _granite_params(ctx, kv) -> None:
    """GraniteModel.set_gguf_parameters: the *_multiplier hparams as *_scale keys."""
    hp = ctx.hparams
    if v := hp.get("attention_multiplier"):
        kv.add_attention_scale(v)
    if v := hp.get("embedding_multiplier"):
        kv.add_embedding_scale(v)
    if v := hp.get("residual_multiplier"):
        kv.add_residual_scale(v)
    if v := hp.get("logits_scaling"):
        kv.add_logit_scale(v)


# GraniteModel is LlamaModel without head_dim (ignored) and with its scales
HF_CONVERT = replace(
    LLAMA_HF,
    arch="granite",
    hf_archs=("GraniteForCausalLM",),
    params=_granite_params,
    drop_hparams=("head_dim",),
)
