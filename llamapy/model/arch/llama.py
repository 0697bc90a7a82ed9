"""LLaMA 1/2/3 (incl. llama3 rope frequency factors), Mistral, Mixtral (experts), SmolLM, TinyLlama."""

from __future__ import annotations

from ..dense_blocks import DenseArchitecture, DenseLayout
from ..hf_shared import LLAMA_HF
from . import register


@register("llama", "mistral")
class Llama(DenseArchitecture):
    """RMSNorm, rotary attention (normal mode) with grouped KV heads, SwiGLU feed-forward."""

    layout = DenseLayout(moe_norm_w=True)  # Mixtral (llama with experts): top-k renormalized


HF_CONVERT = LLAMA_HF
