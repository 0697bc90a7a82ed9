"""EmbeddingGemma: Gemma 3 with ``use_bidirectional_attention`` (HF halves the configured window:
|i - j| <= window / 2 on the local layers, as llama.cpp's symmetric window over the file's
``sliding_window``), mean pooling, then sentence-transformers' two Dense modules (no bias), written
as llama.cpp's converter does with --sentence-transformers-dense-modules (``dense_2``, ``dense_3``).
The HF side is a small wrapper: Gemma 3's CausalLM (its ``model`` is the encoder) plus the two
projections, which the test applies after pooling (``post_pool``)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch
import transformers

from llamapy.ggml.types import GGMLType
from tests.model import hf_tiny
from tests.model.hf_tiny import Family

WINDOW = 8  # the configured sliding window (HF stores window // 2 + 1 with bidirectional attention)


class EmbeddingGemmaHF(torch.nn.Module):
    base_model_prefix = "model"

    def __init__(self, cfg: Any) -> None:
        super().__init__()
        self.config = cfg
        self.model = transformers.Gemma3TextModel(cfg)
        self.dense_2 = torch.nn.Linear(cfg.hidden_size, 2 * cfg.hidden_size, bias=False)
        self.dense_3 = torch.nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=False)

    def post_pool(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense_3(self.dense_2(x))

    def forward(self, **kw: Any) -> Any:
        return self.model(**kw)


def _convert(family: Family, cfg: Any, sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    dense = {k: np.ascontiguousarray(sd[k], dtype=np.float32) for k in ("dense_2.weight", "dense_3.weight")}
    rest = {k: v for k, v in sd.items() if k not in dense}
    out = hf_tiny.convert(dataclasses.replace(family, arch="gemma3", convert_fn=None), cfg, rest)
    return {**out, **dense}


def _metadata(family: Family, cfg: Any, ftype: GGMLType) -> dict[str, Any]:
    base = hf_tiny.metadata(dataclasses.replace(family, arch="gemma3", metadata_fn=None), cfg, ftype)
    a = family.arch
    md = {k.replace("gemma3.", f"{a}.", 1): v for k, v in base.items()}
    md[f"{a}.attention.sliding_window"] = WINDOW
    md[f"{a}.attention.causal"] = False
    md[f"{a}.pooling_type"] = 1
    md[f"{a}.rope.freq_base_swa"] = float(cfg.rope_parameters["sliding_attention"]["rope_theta"])
    md[f"{a}.dense_2_feat_in"] = cfg.hidden_size
    md[f"{a}.dense_2_feat_out"] = 2 * cfg.hidden_size
    md[f"{a}.dense_3_feat_in"] = 2 * cfg.hidden_size
    md[f"{a}.dense_3_feat_out"] = cfg.hidden_size
    return md


hf_tiny.register(
    Family(
        "gemma-embedding",
        "gemma-embedding",
        "Gemma3TextConfig",
        dict(
            num_hidden_layers=6,
            head_dim=16,
            query_pre_attn_scalar=16,
            sliding_window=WINDOW,
            use_bidirectional_attention=True,
            tie_word_embeddings=True,
        ),
        kind="encoder",
        hf_model=EmbeddingGemmaHF,
        convert_fn=_convert,
        metadata_fn=_metadata,
    )
)
