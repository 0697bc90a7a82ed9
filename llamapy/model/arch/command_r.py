"""Command-R (Cohere) and Command R7B (cohere2): one LayerNorm (no bias) feeds the attention and the
SwiGLU FFN in parallel (x += attn(n) + ffn(n)), normal (interleaved) rope, output tied to the
embeddings and multiplied by ``logit_scale``. Cohere 2 interleaves sliding-window layers (3 local, 1
global) and ropes only the sliding-window layers: the global ones are NoPE."""

from __future__ import annotations

from ..blocks import GraphBuilder, Outputs, Rope
from ..dense_blocks import DenseArchitecture, DenseLayout, build_dense
from ..hf import HFConvert
from ..hparams import HParams, MetaReader, swa_pattern
from . import register


@register("command-r", "cohere2")
class CommandR(DenseArchitecture):
    layout = DenseLayout(norm="layer", ffn_norm=False, parallel=True)

    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        hp.f_logit_scale = md.f32("logit_scale", 0.0, required=hp.arch == "cohere2") or 0.0
        if hp.arch == "cohere2":
            hp.n_swa = md.u32("attention.sliding_window", required=True)
            hp.swa_layers = swa_pattern(md, hp.n_layer, 4)

    def layer_rope(self, il: int, n_ctx: int = 0) -> Rope | None:
        if self.hp.arch == "cohere2" and not self.hp.is_swa(il):
            return None
        return super().layer_rope(il, n_ctx)

    def build(self, g: GraphBuilder) -> Outputs:
        scale = self.hp.f_logit_scale
        return build_dense(self, g, logit_scale=1.0 / scale if scale else 0.0)


def _command_r_params(ctx, kv) -> None:
    """CommandR2Model.set_gguf_parameters (after the common keys)."""
    import gguf

    kv.add_logit_scale(ctx.hparams["logit_scale"])
    kv.add_rope_scaling_type(gguf.RopeScalingType.NONE)


def _command_r_hparams(hp: dict) -> dict:
    # max_position_embeddings is 8192 in config.json, the models were trained on model_max_length
    return {**hp, "max_position_embeddings": hp.get("model_max_length", hp["max_position_embeddings"])}


HF_CONVERT = HFConvert(
    "command-r", ("CohereForCausalLM",), params=_command_r_params, adjust_hparams=_command_r_hparams
)
