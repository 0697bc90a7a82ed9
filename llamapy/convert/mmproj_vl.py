"""``llamapy convert --mmproj`` for the vision-language models of remote code that llamapy runs: Kimi-VL
(``kimivl``, as llama.cpp's ``conversion/kimivl.py`` ``KimiVLModel`` writes it) and MiniCPM-V 2.x (the
``resampler`` projector: llama.cpp has only its legacy ``minicpmv-surgery.py`` +
``minicpmv-convert-image-encoder-to-gguf.py`` scripts, whose tensor names and keys this follows).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from .mmproj import MmCtx, Projector, _split_qkv

# ---------------------------------------------------------------------------------------------
# Kimi-VL: MoonViT (fused wqkv, a [H, W, E] position table) and the pre-norm MLP projector


def _kimivl_prepare(ctx: MmCtx) -> None:
    ctx.hv["image_size"] = 64 * 14  # (llama.cpp's "for compatibility": the loader sizes the table itself)


def _kimivl_params(ctx: MmCtx, kv: Any) -> None:
    kv.add_clip_projector_type("kimivl")
    kv.add_vision_use_gelu(True)
    kv.add_vision_projector_scale_factor(2)
    kv.add_vision_attention_layernorm_eps(ctx.hv.get("layer_norm_eps", 1e-5))


def _kimivl_filter(name: str) -> str | None:
    return name if ("vision_tower" in name or "multi_modal_projector" in name) else None


def _kimivl_modify(
    ctx: MmCtx, name: str, data: np.ndarray, bid: int | None
) -> Iterable[tuple[str, np.ndarray]]:
    if "pos_emb.weight" in name:
        data = data.reshape(data.shape[0] * data.shape[1], data.shape[2])
    if "wqkv" in name:
        if data.shape[0] % 3:
            raise ValueError(f"{data.shape[0]} rows are not q, k and v of one width")
        for part, x in zip(("wq", "wk", "wv"), _split_qkv(data), strict=True):
            yield name.replace("wqkv", part), x
    else:
        yield name, data


KIMIVL = Projector(("KimiVLForConditionalGeneration",), _kimivl_params, _kimivl_filter, _kimivl_modify, None,
                   _kimivl_prepare)  # fmt: skip

PROJECTORS_VL: dict[str, Projector] = {a: p for p in (KIMIVL,) for a in p.hf_archs}
