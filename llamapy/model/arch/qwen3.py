"""Qwen3 (RMS-normed q and k per head, neox rope) and Qwen3-MoE (softmax routing, normalized top-k)."""

from __future__ import annotations

from ..blocks import GraphBuilder, Outputs, TensorLoader
from ..hf import HFConvert
from ..hparams import ROPE_NEOX, HParams, MetaReader
from . import Architecture, register
from .llama import build_dense, load_dense_tensors


@register("qwen3", "qwen3moe")
class Qwen3(Architecture):
    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        hp.rope_type = ROPE_NEOX
        hp.expert_weights_norm = hp.arch == "qwen3moe"

    def load_tensors(self, t: TensorLoader) -> None:
        load_dense_tensors(self, t, qk_norm=True)
        self._finish_tensors(t)

    def build(self, g: GraphBuilder) -> Outputs:
        return build_dense(self, g, qk_norm=True, moe_norm_w=self.hp.expert_weights_norm)


def qwen_moe_params(ctx, kv) -> None:
    """Qwen2MoeModel.set_gguf_parameters: the expert FFN sizes."""
    if (n := ctx.hparams.get("moe_intermediate_size")) is not None:
        kv.add_expert_feed_forward_length(n)
    if (n := ctx.hparams.get("shared_expert_intermediate_size")) is not None:
        kv.add_expert_shared_feed_forward_length(n)


HF_CONVERT = (
    HFConvert("qwen3", ("Qwen3ForCausalLM",), vocab="spm|gpt2"),
    HFConvert("qwen3moe", ("Qwen3MoeForCausalLM",), vocab="gpt2", params=qwen_moe_params),
)
