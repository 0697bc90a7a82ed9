"""StarCoder 2: LayerNorm with biases, neox rope, biases on q/k/v/o, a sequential GELU MLP with
biases (c_fc, c_proj), output tied to the embeddings unless the file has ``output.weight``."""

from __future__ import annotations

from ..dense_blocks import DenseArchitecture, DenseLayout
from ..hf import HFConvert
from ..hparams import ROPE_NEOX, HParams, MetaReader
from . import register


@register("starcoder2")
class StarCoder2(DenseArchitecture):
    layout = DenseLayout(
        biases=True, norm="layer", norm_biases=True, gated_ffn=False, ffn_act="gelu", ffn_biases=True
    )

    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        hp.rope_type = ROPE_NEOX


HF_CONVERT = HFConvert("starcoder2", ("Starcoder2ForCausalLM",))
