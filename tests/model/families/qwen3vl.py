"""Qwen3-VL's language model (``qwen3vl``), as llama.cpp's ``Qwen3VLTextModel`` converts it: Qwen3's tensors
plus ``rope.dimension_sections`` (the interleaved M-RoPE sections, an e section of 0 appended) and
``n_deepstack_layers`` (the vision side's deepstack merger count). transformers has no causal-LM class for
the text half alone: ``Qwen3VLTextLM`` is ``Qwen3VLTextModel`` + an ``lm_head`` (the names and maths of
``Qwen3VLForConditionalGeneration``'s language half), and also takes HF's deepstack inputs. ``qwen3vlmoe``:
the same with Qwen3-VL-MoE's experts (``Qwen3VLMoeTextModel``)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import torch
import transformers

from llamapy.ggml.types import GGMLType
from tests.model import hf_tiny
from tests.model.hf_tiny import Family

N_DEEPSTACK = 2
# head 16: 8 rotary pairs; t/h/w sections 3/3/2 cover them all (interleaved: t at 0,3,6; h at 1,4,7; w at
# 2,5), so llama.cpp's imrope and HF's layout agree on every pair
ROPE = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [3, 3, 2], "mrope_interleaved": True}


class Qwen3VLTextLM(torch.nn.Module):
    """``Qwen3VLTextModel`` with an output head; ``forward`` returns ``.logits`` and ``.hidden_states``."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = config
        moe = config.model_type == "qwen3_vl_moe_text"
        self.model = (transformers.Qwen3VLMoeTextModel if moe else transformers.Qwen3VLTextModel)(config)
        self.lm_head = torch.nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def forward(self, input_ids: Any = None, inputs_embeds: Any = None, **kw: Any) -> Any:
        kw.setdefault("use_cache", False)
        out = self.model(input_ids=input_ids, inputs_embeds=inputs_embeds, **kw)
        return SimpleNamespace(logits=self.lm_head(out.last_hidden_state), hidden_states=out.hidden_states)


def metadata(family: Family, cfg: Any, ftype: GGMLType) -> dict[str, Any]:
    md = hf_tiny.metadata(dataclasses.replace(family, metadata_fn=None), cfg, ftype)
    md[f"{family.arch}.rope.dimension_sections"] = [*cfg.rope_parameters["mrope_section"], 0]
    md[f"{family.arch}.n_deepstack_layers"] = N_DEEPSTACK
    if family.arch == "qwen3vlmoe":
        md[f"{family.arch}.expert_count"] = cfg.num_experts
        md[f"{family.arch}.expert_used_count"] = cfg.num_experts_per_tok
        md[f"{family.arch}.expert_feed_forward_length"] = cfg.moe_intermediate_size
    return md


FAMILY = hf_tiny.register(
    Family(
        "qwen3vl",
        "qwen3vl",
        "Qwen3VLTextConfig",
        dict(head_dim=16, rope_parameters=dict(ROPE)),
        hf_model=Qwen3VLTextLM,
        metadata_fn=metadata,
    )
)
# every layer MoE (llama.cpp's qwen3vlmoe has no dense layers): top-2 of 4, the top-k renormalized
hf_tiny.register(
    Family(
        "qwen3vlmoe",
        "qwen3vlmoe",
        "Qwen3VLMoeTextConfig",
        dict(
            head_dim=16,
            rope_parameters=dict(ROPE),
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
        ),
        hf_model=Qwen3VLTextLM,
        metadata_fn=metadata,
    )
)
