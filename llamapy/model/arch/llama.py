"""LLaMA 1/2/3 (incl. llama3 rope frequency factors), Mistral, Mixtral (experts), SmolLM, TinyLlama."""

from __future__ import annotations

from ..blocks import GraphBuilder, Outputs, TensorLoader
from ..dense_blocks import build_dense, load_dense_tensors
from ..hf_shared import LLAMA_HF
from . import Architecture, register


@register("llama", "mistral")
class Llama(Architecture):
    """RMSNorm, rotary attention (normal mode) with grouped KV heads, SwiGLU feed-forward."""

    def load_tensors(self, t: TensorLoader) -> None:
        load_dense_tensors(self, t)
        self._finish_tensors(t)

    def build(self, g: GraphBuilder) -> Outputs:
        return build_dense(self, g, moe_norm_w=True)  # Mixtral (llama with experts): top-k renormalized


HF_CONVERT = LLAMA_HF
