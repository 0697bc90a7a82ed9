"""OLMo 2: post-norm residuals (the attention and FFN outputs are RMS-normed before the add, their
inputs are not), q/k RMS-normed over the whole projection (not per head), neox rope, no biases."""

from __future__ import annotations

from ..blocks import GraphBuilder, Outputs, TensorLoader
from ..dense_blocks import load_dense_tensors
from ..hf import HFConvert
from ..hparams import ROPE_NEOX, HParams, MetaReader
from . import Architecture, register


@register("olmo2")
class Olmo2(Architecture):
    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        hp.rope_type = ROPE_NEOX

    def load_tensors(self, t: TensorLoader) -> None:
        load_dense_tensors(self, t, qk_norm="full", post_norms=True)
        self._finish_tensors(t)

    def build(self, g: GraphBuilder) -> Outputs:
        x = g.embed(self.w["token_embd.weight"])
        for il, blk in enumerate(self.blocks):
            h = g.attention(x, blk, il, qk_norm="full")
            h, x = g.select_outputs(il, h, x)
            h = g.build_norm(h, blk["post_attention_norm.weight"], name="attn_post_norm", il=il)
            x = g.cb(x + h, "ffn_inp", il)
            h = g.build_ffn(x, blk, il)
            h = g.build_norm(h, blk["post_ffw_norm.weight"], name="ffn_post_norm", il=il)
            x = g.cb(x + h, "l_out", il)
        return g.output(x, self.w["output_norm.weight"], self.output_weight())


def _olmo2_params(ctx, kv) -> None:
    """Olmo2Model.set_gguf_parameters: OLMo 3's window and its per-layer pattern."""
    hp = ctx.hparams
    if "sliding_window" in hp:
        kv.add_sliding_window(hp["sliding_window"])
        if "layer_types" in hp:
            pattern = [t == "sliding_attention" for t in hp["layer_types"]]
        else:
            pattern = [(i + 1) % 4 != 0 for i in range(hp["num_hidden_layers"])]
        kv.add_sliding_window_pattern(pattern)


HF_CONVERT = HFConvert("olmo2", ("Olmo2ForCausalLM", "Olmo3ForCausalLM"), params=_olmo2_params)
