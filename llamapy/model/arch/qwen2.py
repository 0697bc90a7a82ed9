"""Qwen2 / Qwen2.5: LLaMA with q/k/v biases and neox rope."""

from __future__ import annotations

from ..blocks import GraphBuilder, Outputs, TensorLoader
from ..dense_blocks import build_dense, load_dense_tensors
from ..hf import HFConvert
from ..hparams import ROPE_NEOX, HParams, MetaReader
from . import Architecture, register


@register("qwen2")
class Qwen2(Architecture):
    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        hp.rope_type = ROPE_NEOX

    def load_tensors(self, t: TensorLoader) -> None:
        load_dense_tensors(self, t, biases=True)
        self._finish_tensors(t)

    def build(self, g: GraphBuilder) -> Outputs:
        return build_dense(self, g)


HF_CONVERT = HFConvert("qwen2", ("Qwen2ForCausalLM",), vocab="spm|gpt2")
