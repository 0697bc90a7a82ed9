"""Qwen3 (RMS-normed q and k per head, neox rope) and Qwen3-MoE (softmax routing, normalized top-k)."""

from __future__ import annotations

from dataclasses import replace

from ..dense_blocks import DenseArchitecture, DenseLayout
from ..hf import HFConvert
from ..hf_shared import qwen_moe_params
from ..hparams import ROPE_NEOX, HParams, MetaReader, PoolingType
from . import register


@register("qwen3", "qwen3moe")
class Qwen3(DenseArchitecture):
    layout = DenseLayout(qk_norm=True)

    def __init__(self, hp: HParams) -> None:
        super().__init__(hp)
        if hp.arch == "qwen3":  # a reranker's rank head reads the last token, softmax'd (as llama.cpp)
            self.rank_rows, self.rank_softmax = PoolingType.LAST, True
        self.layout = replace(self.layout, moe_norm_w=hp.expert_weights_norm)

    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        hp.rope_type = ROPE_NEOX
        hp.expert_weights_norm = hp.arch == "qwen3moe"


HF_CONVERT = (
    HFConvert("qwen3", ("Qwen3ForCausalLM",), vocab="spm|gpt2"),
    HFConvert("qwen3moe", ("Qwen3MoeForCausalLM",), vocab="gpt2", params=qwen_moe_params),
)
