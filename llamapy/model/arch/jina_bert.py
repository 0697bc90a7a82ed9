"""jina-bert-v2 (jina-embeddings-v2, jina-reranker-v1; llama.cpp's ``src/models/bert.cpp`` branch):
BERT's post-norm encoder without positions; attention biased by ALiBi (slopes from max bias 8, which
llama.cpp hard-codes; the mask holds -|i - j|, symmetric); a GeGLU feed-forward: gelu(gate) * up
with the gate either ``ffn_gate`` or the first half of a fused ``ffn_up`` (the checkpoints'
``gated_layers``), then ``ffn_down`` with a bias."""

from __future__ import annotations

from ..blocks import GraphBuilder, Outputs, Rope
from ..encoder_blocks import BertArchitecture, BertLayout, build_bert, read_encoder_hparams
from ..hparams import HParams, MetaReader
from . import register


@register("jina-bert-v2")
class JinaBertV2(BertArchitecture):
    layout = BertLayout(positions=False, ffn="geglu", ffn_biases=False)

    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        read_encoder_hparams(hp, md)
        hp.f_max_alibi_bias = 8.0

    def layer_rope(self, il: int, n_ctx: int = 0) -> Rope | None:
        return None

    def layer_moe(self, il: int) -> bool:
        return False

    def build(self, g: GraphBuilder) -> Outputs:
        return build_bert(self, g, max_bias=self.hp.f_max_alibi_bias)
