"""``llamapy convert --mmproj`` for Gemma 3n (``gemma3nv``: MobileNetV5 tower and the soft-token embedder, with
the ``gemma3na`` audio conformer llama.cpp writes beside it) and Gemma 4 (``gemma4v``: a ViT with clamped
linears, position tables and standardization), as llama.cpp's ``Gemma3nVisionAudioModel`` /
``Gemma4VisionAudioModel`` write them (``conversion/gemma.py``). The hooks plug into
:mod:`llamapy.convert.mmproj`'s ``Projector``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import numpy as np

from ..ggml.types import GGMLType
from .errors import ConvertError
from .mmproj import _N_BLOCK_KEYS, MmCtx, Projector

# the suffixes Gemma's projectors map (clamp bounds of Gemma 4's linears, Gemma 3n's audio ones)
_SUFFIXES = (".weight", ".bias", ".input_max", ".input_min", ".output_max", ".output_min")


def _map(ctx: MmCtx, name: str) -> str:
    """gguf-py's TensorNameMap for MODEL_ARCH.MMPROJ (the converter's block count) with Gemma's suffixes."""
    import gguf

    names = ctx.state.get("names")
    if names is None:
        n = max(ctx.block_count, ctx.state.get("map_blocks", 0))
        names = ctx.state["names"] = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, n)
    new = names.get_name(name, try_suffixes=_SUFFIXES)
    m = re.match(r"^([va])\.blk\.(\d+)\.", new or "")
    il = int(m.group(2)) if m else next((int(p) for p in name.split(".") if p.isdecimal()), None)
    if il is not None and (m is not None or "layers." in name):  # a layer the config may not have
        audio = m.group(1) == "a" if m else name.startswith("conformer.")
        n = ctx.state.get("n_audio", 0) if audio else ctx.block_count
        if il >= n:
            kind = "audio" if audio else "vision"
            raise ConvertError(f"tensor {name!r} is of {kind} layer {il}, but config.json says {n} layers")
    if new is None:
        raise ConvertError(f"cannot map tensor {name!r} to an mmproj GGUF name")
    return new


# ---------------------------------------------------------------------------------------------
# Gemma 4 (Gemma4VisionAudioModel)


def _g4_prepare(ctx: MmCtx) -> None:
    """The class's __init__: a placeholder image size; the audio encoder's mel bins and FFN width (4 x its
    width) when the checkpoint has one (E2B / E4B), the map then sized for two encoders as llama.cpp's."""
    ctx.hv["image_size"] = 224  # (unused: the converter's placeholder)
    ha = ctx.global_config.get("audio_config")
    if ha:
        if not isinstance(ha, dict):
            raise ConvertError("config.json: audio_config is not an object")
        ha = dict(ha)
        ha["feat_in"] = ha.get("input_feat_size", 128)
        if "hidden_size" in ha:
            ha["intermediate_size"] = ha["hidden_size"] * 4
        ctx.state["audio"] = ha
        ctx.state["map_blocks"] = 128
        ctx.state["n_audio"] = next((ha[k] for k in _N_BLOCK_KEYS if k in ha), None)
        if ctx.state["n_audio"] is None:
            raise ConvertError(f"config.json: the audio encoder's config has none of {_N_BLOCK_KEYS}")


def _g4_params(ctx: MmCtx, kv: Any) -> None:
    import gguf

    ha = ctx.state.get("audio")
    if ha is not None:
        kv.add_clip_has_audio_encoder(True)
        kv.add_audio_projection_dim(ctx.n_embd_text)
        kv.add_audio_embedding_length(ha["hidden_size"])
        kv.add_audio_feed_forward_length(ha["intermediate_size"])
        kv.add_audio_block_count(ctx.state["n_audio"])
        kv.add_audio_head_count(ha["num_attention_heads"])
    kv.add_clip_vision_projector_type(gguf.VisionProjectorType.GEMMA4V)
    kv.add_vision_attention_layernorm_eps(ctx.hv.get("layer_norm_eps", 1e-6))
    if ha is not None:
        kv.add_clip_audio_projector_type(gguf.VisionProjectorType.GEMMA4A)
        kv.add_audio_num_mel_bins(ha["feat_in"])
        kv.add_audio_attention_layernorm_eps(ha.get("layer_norm_eps", 1e-6))


def _g4_audio(name: str) -> bool:
    return "audio_tower" in name or "embed_audio" in name


def _softplus(x: np.ndarray) -> np.ndarray:
    """torch.nn.functional.softplus (threshold 20) in float32, rounded from float64."""
    x64 = x.astype(np.float64)
    return np.where(x64 > 20, x64, np.log1p(np.exp(np.minimum(x64, 20)))).astype(np.float32)


def _g4_modify(ctx: MmCtx, name: str, data: np.ndarray, bid: int | None) -> Iterable[tuple[str, np.ndarray]]:
    """Scalars (the clamp bounds) as 1-D, the encoders' names as gguf-py maps them, the linear patch
    embedding as a [E, 3, p, p] kernel; audio: per-dim scales through softplus, the depthwise kernel 2-D."""
    if data.ndim == 0:
        data = data.reshape(1)
    if _g4_audio(name):
        if "audio" not in ctx.state:
            raise ValueError("an audio tower tensor in a checkpoint whose config has no audio_config")
        name = name.replace("model.audio_tower.", "conformer.").replace(".linear.", ".")
        if name.endswith(("per_dim_key_scale", "per_dim_scale")):
            name += ".weight"
            data = _softplus(data)
        if "lconv1d.depthwise_conv1d" in name and name.endswith(".weight"):
            if data.ndim != 3 or data.shape[1] != 1:
                raise ValueError("the depthwise convolution's kernel is not [C, 1, K]")
            data = data.reshape(data.shape[0], data.shape[2])
        yield _map(ctx, name), data
        return
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
    if _g4_audio(name) and (".conv" in name or "_conv" in name and ".weight" in name):
        return GGMLType.F32
    return GGMLType.F32 if "position_embedding_table" in name else None


# ---------------------------------------------------------------------------------------------
# Gemma 3n (Gemma3nVisionAudioModel: the vision tower and, as llama.cpp writes it, the audio conformer)

# MobileNetV5 block tensors (double-indexed: v.blk.{stage}.{block}.*), the converter's block_tensor_mapping
_MNV5_BLOCK = {"conv_exp.weight", "bn1.weight", "conv_pwl.weight", "bn2.weight", "dw_start.conv.weight",
               "dw_start.bn.weight", "dw_mid.conv.weight", "dw_mid.bn.weight", "pw_exp.conv.weight",
               "pw_exp.bn.weight", "pw_proj.conv.weight", "pw_proj.bn.weight", "layer_scale.gamma",
               "attn.query.proj.weight", "attn.key.proj.weight", "attn.value.proj.weight",
               "attn.output.proj.weight", "attn.key.down_conv.weight", "attn.key.norm.weight",
               "attn.value.down_conv.weight", "attn.value.norm.weight", "norm.weight"}  # fmt: skip
_AUDIO_PARTS = ("audio", "codebook", "conformer", "depth_embedding", "depthformer", "depth_linear")


def _g3n_prepare(ctx: MmCtx) -> None:
    """The class's __init__: a fake block count (two encoders), the FFN x4, 8 heads, the image size from the
    processor, patch size = image size / soft tokens, MobileNetV5's identity normalization."""
    hv = ctx.hv
    ha = ctx.global_config.get("audio_config")
    if not isinstance(ha, dict):
        raise ConvertError("config.json: no audio_config (Gemma 3n's mmproj holds its audio encoder too)")
    hv["n_layers"] = 128
    hv["intermediate_size"] = hv.get("intermediate_size", 2048) * 4
    hv["num_attention_heads"] = hv.get("num_attention_heads", 8)
    ctx.preproc["image_mean"] = [0.0, 0.0, 0.0]
    ctx.preproc["image_std"] = [1.0, 1.0, 1.0]
    hv["image_size"] = ctx.preproc.get("size", {"height": 768, "width": 768})["height"]
    hv["patch_size"] = hv["image_size"] // ctx.preproc.get("image_seq_length", 256)
    ctx.state["n_audio"] = ha["conf_num_hidden_layers"]
    ctx.state["audio"] = {
        "n_layers": ha["conf_num_hidden_layers"],
        "num_attention_heads": ha["conf_num_attention_heads"],
        "feat_in": ha["input_feat_size"],
        "intermediate_size": ha.get("intermediate_size", 6144),
        "hidden_size": ha["hidden_size"],
    }


def _g3n_params(ctx: MmCtx, kv: Any) -> None:
    import gguf

    a = ctx.state["audio"]
    kv.add_clip_has_audio_encoder(True)
    kv.add_audio_projection_dim(ctx.n_embd_text)
    kv.add_audio_embedding_length(a["hidden_size"])
    kv.add_audio_feed_forward_length(a["intermediate_size"])
    kv.add_audio_block_count(a["n_layers"])
    kv.add_audio_head_count(a["num_attention_heads"])
    kv.add_clip_vision_projector_type(gguf.VisionProjectorType.GEMMA3NV)
    kv.add_vision_attention_layernorm_eps(ctx.hv.get("layer_norm_eps", 1e-6))
    kv.add_clip_audio_projector_type(gguf.VisionProjectorType.GEMMA3NA)
    kv.add_audio_num_mel_bins(a["feat_in"])
    kv.add_audio_attention_layernorm_eps(1e-5)


def _g3n_audio(ctx: MmCtx, name: str, data: np.ndarray) -> tuple[str, np.ndarray]:
    """ConformerAudioModel.modify_tensors (Gemma 3n has no batch norms to fold)."""
    import re

    if "batch_norm" in name:
        raise ValueError("batch-normed conformer convolutions are not Gemma 3n's")
    name = name.replace("model.audio_tower.conformer.", "conformer.layers.")
    m = re.fullmatch(r"model\.audio_tower\.subsample_conv_projection\.conv_(\d+)\.norm\.weight", name)
    if m:  # not in gguf-py's map (llama.cpp's converter stops there): Gemma 4's name for the same norm
        return f"a.conv1d.{m.group(1)}.norm.weight", data
    if name.startswith("conformer.pre_encode.conv.") and name.endswith(".bias"):
        data = data[:, None, None]
    if "conv.depthwise_conv" in name and name.endswith(".weight"):
        data = data.reshape(data.shape[0], data.shape[2])
    if "conv.pointwise_conv" in name and name.endswith(".weight"):
        data = data.reshape(data.shape[0], data.shape[1])
    return _map(ctx, name), data


def _g3n_modify(ctx: MmCtx, name: str, data: np.ndarray, bid: int | None) -> Iterable[tuple[str, np.ndarray]]:
    if any(p in name for p in _AUDIO_PARTS):
        yield _g3n_audio(ctx, name, data)
        return
    if not name.startswith(("model.embed_vision.", "model.vision_tower.")):
        return
    pre = "model.vision_tower.timm_model.blocks."
    if name.startswith(pre):
        parts = name[len(pre) :].split(".", 2)
        if len(parts) < 3 or parts[2] not in _MNV5_BLOCK:
            raise ValueError(f"unknown MobileNetV5 block tensor {name!r}")
        yield f"v.blk.{parts[0]}.{parts[1]}.{parts[2]}", data
        return
    new = _map(ctx, name)
    if new.endswith(("conv_stem.conv.bias", "layer_scale.gamma")):
        data = data.reshape(1, -1, 1, 1)
    yield new, data


def _g3n_force(ctx: MmCtx, name: str, new: str) -> GGMLType | None:
    if "input_projection" in name or "input_proj" in name:
        return GGMLType.F16
    if ".embeddings." in name or "stem" in name:
        return GGMLType.F32
    if any(p in name for p in _AUDIO_PARTS) and (".conv" in name or "_conv" in name and ".weight" in name):
        return GGMLType.F32
    return None


GEMMA_PROJECTORS: dict[str, Projector] = {
    "Gemma3nForConditionalGeneration": Projector(
        ("Gemma3nForConditionalGeneration",),
        _g3n_params,
        modify=_g3n_modify,
        force=_g3n_force,
        prepare=_g3n_prepare,
    ),
    "Gemma4ForConditionalGeneration": Projector(
        ("Gemma4ForConditionalGeneration",),
        _g4_params,
        modify=_g4_modify,
        force=_g4_force,
        prepare=_g4_prepare,
    ),
}
