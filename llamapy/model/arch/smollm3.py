"""SmolLM3: LLaMA's layout and graph with no rope (NoPE) on every 4th layer."""

from __future__ import annotations

from dataclasses import replace

from ..blocks import Rope
from ..dense_blocks import DenseArchitecture, DenseLayout
from ..hf_shared import LLAMA_HF
from . import register


@register("smollm3")
class SmolLM3(DenseArchitecture):
    layout = DenseLayout(moe_norm_w=True)  # llama's
    no_rope_layer_step = 4  # llama.cpp's n_no_rope_layer_step (the files carry no key for it)

    def layer_rope(self, il: int, n_ctx: int = 0) -> Rope | None:
        return None if (il + 1) % self.no_rope_layer_step == 0 else super().layer_rope(il, n_ctx)


# SmolLM3Model is LlamaModel with its own arch name
HF_CONVERT = replace(LLAMA_HF, arch="smollm3", hf_archs=("SmolLM3ForCausalLM",))
