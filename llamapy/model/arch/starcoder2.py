"""StarCoder 2: LayerNorm with biases, neox rope, biases on q/k/v/o, a sequential GELU MLP with
biases (c_fc, c_proj), output tied to the embeddings unless the file has ``output.weight``."""

from __future__ import annotations

from ..blocks import GraphBuilder, Outputs, TensorLoader
from ..dense_blocks import build_dense, load_dense_tensors
from ..hf import HFConvert
from ..hparams import ROPE_NEOX, HParams, MetaReader
from . import Architecture, register


@register("starcoder2")
class StarCoder2(Architecture):
    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        hp.rope_type = ROPE_NEOX

    def load_tensors(self, t: TensorLoader) -> None:
        load_dense_tensors(self, t, biases=True, norm_biases=True, gated_ffn=False, ffn_biases=True)
        self._finish_tensors(t)

    def build(self, g: GraphBuilder) -> Outputs:
        return build_dense(self, g, norm="layer", ffn_act="gelu", gated_ffn=False)


HF_CONVERT = HFConvert("starcoder2", ("Starcoder2ForCausalLM",))
