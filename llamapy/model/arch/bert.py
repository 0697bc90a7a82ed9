"""BERT-family encoders (llama.cpp's ``src/models/bert.cpp``): bidirectional attention without a KV
cache, post-norm layers (LayerNorm after each residual), the embeddings' own LayerNorm.

- ``bert``: learned absolute positions, token type 0 added (llama.cpp hard-codes "sentence A"), GELU
  feed-forward with biases; also XLM-RoBERTa / bge-m3 / bge-reranker files (the converter drops the
  position offset rows), with their ``cls`` / ``cls.output`` head for pooling type rank.

The shared pieces (``llamapy/model/encoder_blocks.py``) also serve nomic-bert, jina-bert-v2, modern-bert.
"""

from __future__ import annotations

from ..blocks import Rope
from ..encoder_blocks import BertArchitecture, BertLayout, read_encoder_hparams
from ..hf import HFConvert
from ..hf_shared import bert_params, bert_tensor
from ..hparams import HParams, MetaReader
from . import register


@register("bert")
class Bert(BertArchitecture):
    """BERT / RoBERTa / XLM-R: absolute positions, token types, post-norm, GELU."""

    layout = BertLayout(positions=True, ffn="seq", ffn_biases=True)

    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        read_encoder_hparams(hp, md)
        if not md.has("attention.layer_norm_epsilon"):
            raise md._err(f"metadata key {md._key('attention.layer_norm_epsilon')!r} is missing")

    def layer_rope(self, il: int, n_ctx: int = 0) -> Rope | None:
        return None

    def layer_moe(self, il: int) -> bool:
        return False


HF_CONVERT = HFConvert(
    "bert",
    ("BertModel", "BertForMaskedLM", "CamembertModel", "BertForSequenceClassification"),
    vocab="bert",
    params=bert_params,
    tensor=bert_tensor,
)
