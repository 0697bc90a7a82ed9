"""``llamapy convert --mmproj`` for Gemma 3n (``gemma3nv``: MobileNetV5 tower and the soft-token embedder, with
the ``gemma3na`` audio conformer llama.cpp writes beside it) and Gemma 4 (``gemma4v``: a ViT with clamped
linears, position tables and standardization), as llama.cpp's ``Gemma3nVisionAudioModel`` /
``Gemma4VisionAudioModel`` write them (``conversion/gemma.py``). The hooks plug into
:mod:`llamapy.convert.mmproj`'s ``Projector``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from ..ggml.types import GGMLType
from .errors import ConvertError
from .mmproj import MmCtx, Projector

# the suffixes Gemma's projectors map (clamp bounds of Gemma 4's linears, Gemma 3n's audio ones)
_SUFFIXES = (".weight", ".bias", ".input_max", ".input_min", ".output_max", ".output_min")


def _map(ctx: MmCtx, name: str) -> str:
    """gguf-py's TensorNameMap for MODEL_ARCH.MMPROJ (the converter's block count) with Gemma's suffixes."""
    import gguf

    names = ctx.state.get("names")
    if names is None:
        names = ctx.state["names"] = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, ctx.block_count)
    new = names.get_name(name, try_suffixes=_SUFFIXES)
    if new is None:
        raise ConvertError(f"cannot map tensor {name!r} to an mmproj GGUF name")
    return new


# ---------------------------------------------------------------------------------------------
# Gemma 4 (Gemma4VisionAudioModel)


def _g4_prepare(ctx: MmCtx) -> None:
    if ctx.global_config.get("audio_config"):
        raise ConvertError(
            "config.json: a Gemma 4 checkpoint with an audio tower (audio_config): llamapy converts the "
            "vision projector of Gemma 4 without one only (it does not run the gemma4a audio encoder)"
        )
    ctx.hv["image_size"] = 224  # (unused: the converter's placeholder)


def _g4_params(ctx: MmCtx, kv: Any) -> None:
    import gguf

    kv.add_clip_vision_projector_type(gguf.VisionProjectorType.GEMMA4V)
    kv.add_vision_attention_layernorm_eps(ctx.hv.get("layer_norm_eps", 1e-6))


def _g4_modify(ctx: MmCtx, name: str, data: np.ndarray, bid: int | None) -> Iterable[tuple[str, np.ndarray]]:
    """Scalars (the clamp bounds) as 1-D, the encoder's names as gguf-py maps them, the linear patch
    embedding as a [E, 3, p, p] kernel."""
    if data.ndim == 0:
        data = data.reshape(1)
    if "audio_tower" in name or "embed_audio" in name:
        raise ValueError("an audio tower tensor in a checkpoint whose config has no audio_config")
    name = name.replace("model.vision_tower.encoder.", "vision_model.model.").replace(
        ".linear.weight", ".weight"
    )
    if name.endswith(("layer_scalar", "position_embedding_table")):
        name += ".weight"
    if name.endswith("patch_embedder.input_proj.weight"):
        n_embd, k = data.shape
        p = int((k // 3) ** 0.5)
        if 3 * p * p != k:
            raise ValueError(f"patch embedding of {k} columns is not 3 x p x p")
        data = np.ascontiguousarray(data.reshape(n_embd, p, p, 3).transpose(0, 3, 1, 2))
    yield _map(ctx, name), data


def _g4_force(ctx: MmCtx, name: str, new: str) -> GGMLType | None:
    return GGMLType.F32 if "position_embedding_table" in name else None


GEMMA_PROJECTORS: dict[str, Projector] = {
    "Gemma4ForConditionalGeneration": Projector(
        ("Gemma4ForConditionalGeneration",),
        _g4_params,
        modify=_g4_modify,
        force=_g4_force,
        prepare=_g4_prepare,
    ),
}
