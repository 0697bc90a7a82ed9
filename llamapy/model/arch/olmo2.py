"""OLMo 2: post-norm residuals (the attention and FFN outputs are RMS-normed before the add, their
inputs are not), q/k RMS-normed over the whole projection (not per head), neox rope, no biases."""

from __future__ import annotations

from ..dense_blocks import DenseArchitecture, DenseLayout
from ..hf import HFConvert
from ..hparams import ROPE_NEOX, HParams, MetaReader
from . import register


@register("olmo2")
class Olmo2(DenseArchitecture):
    layout = DenseLayout(qk_norm="full", post_norms=True)

    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        hp.rope_type = ROPE_NEOX


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
