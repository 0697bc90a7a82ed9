"""Qwen2 / Qwen2.5: LLaMA with q/k/v biases and neox rope."""

from __future__ import annotations

from ..dense_blocks import DenseArchitecture, DenseLayout
from ..hf import HFConvert
from ..hparams import ROPE_NEOX, HParams, MetaReader
from . import register


@register("qwen2")
class Qwen2(DenseArchitecture):
    layout = DenseLayout(biases=True)

    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        hp.rope_type = ROPE_NEOX


HF_CONVERT = HFConvert("qwen2", ("Qwen2ForCausalLM",), vocab="spm|gpt2")
