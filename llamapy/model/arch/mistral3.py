"""Mistral 3 text (Ministral 3, Mistral Small 3.x; llama.cpp's ``mistral3``), LLaMA's layout (normal
rope, permuted q/k rows, optional experts) with YaRN whose magnitude correction is cancelled (rope
attention factor ``1 / (1 + 0.1 ln(1 / freq_scale))``) and optional attention temperature tuning:
Q x ``1 + temperature_scale * log(1 + floor(pos / n_ctx_orig))`` (Llama 4's, without its offset)."""

from __future__ import annotations

import dataclasses
import math

from ..blocks import GraphBuilder, Outputs, Rope
from ..dense_blocks import DenseArchitecture, DenseLayout, build_dense
from ..hf import HFConvert
from ..hf_shared import LLAMA_HF
from ..hparams import HParams, MetaReader, ModelLoadError
from . import register


@register("mistral3")
class Mistral3(DenseArchitecture):
    layout = DenseLayout(moe_norm_w=True)

    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        hp.f_attn_temp_scale = md.f32("attention.temperature_scale", 0.0)
        hp.f_attn_temp_offset = 0.0
        if hp.f_attn_temp_scale:
            hp.n_attn_temp_floor_scale = md.u32("attention.temperature_length", 0) or hp.n_ctx_orig_yarn
            if not hp.n_attn_temp_floor_scale:
                raise ModelLoadError(
                    f"{md.where}: attention.temperature_scale needs rope.scaling.original_context_length > 0"
                )
        hp.expert_weights_norm = True

    def layer_rope(self, il: int, n_ctx: int = 0) -> Rope | None:
        rope = super().layer_rope(il, n_ctx)
        fs = rope.freq_scale
        # llama.cpp's mistral3 graph: the YaRN magnitude (1 + 0.1 ln(1/s)) is cancelled
        return dataclasses.replace(rope, attn_factor=1.0 / (1.0 + 0.1 * math.log(1.0 / fs)))

    def build(self, g: GraphBuilder) -> Outputs:
        hp = self.hp
        temp = None
        if hp.f_attn_temp_scale:
            temp = g.inp_attn_temp(hp.f_attn_temp_scale, hp.n_attn_temp_floor_scale, hp.f_attn_temp_offset)
        return build_dense(self, g, attn_temp=temp)


def _ministral3_params(ctx, kv) -> None:
    """Mistral3Model.Ministral3Model.set_gguf_parameters: yarn's log multiplier, the attention temperature."""
    rp = ctx.rope_parameters
    if ctx.hparams.get("model_type") == "ministral3":
        if not rp or rp.get("rope_type") != "yarn":
            raise ValueError("ministral3's rope_parameters must be yarn")
        kv.add_rope_scaling_yarn_log_mul(rp["mscale_all_dim"])
        kv.add_attn_temperature_scale(rp["llama_4_scaling_beta"])


# Ministral 3 (text): LlamaModel with its own arch name and yarn keys
HF_CONVERT: HFConvert = dataclasses.replace(
    LLAMA_HF, arch="mistral3", hf_archs=("Ministral3ForCausalLM",), params=_ministral3_params
)
