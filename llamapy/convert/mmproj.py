"""``llamapy convert --mmproj``: the multimodal projector of a vision-language checkpoint as an mmproj GGUF,
as llama.cpp's ``convert_hf_to_gguf.py --mmproj`` writes it (its ``MmprojModel`` and subclasses).

The file holds the vision tower and the projector (``v.*`` / ``mm.*`` tensors, gguf-py's
``TensorNameMap`` for ``MODEL_ARCH.MMPROJ``) and the ``clip.*`` keys llamapy's ``llamapy.mtmd`` (and
llama.cpp's ``clip.cpp``) read. Each projector declares what differs from ``MmprojModel`` (one
``Projector`` per ``architectures`` entry): which tensors are its own (``filter_tensors``), their
renames/splits (``modify_tensors``), the forced tensor types (``tensor_force_quant``) and its keys.
More projectors (LLaVA 1.5, InternVL, Ultravox, Kimi-K2.5, MiniCPM-V 4.6) are in ``mmproj_more.py``.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import field
from pathlib import Path
from typing import Any

import numpy as np

from .._dataclass import dataclass
from ..ggml.types import GGMLType
from .errors import ConvertError
from .safetensors import SafeTensor, SafetensorsFile, open_checkpoint

_N_BLOCK_KEYS = ["n_layers", "num_hidden_layers", "n_layer", "num_layers", "depth", "layers", "encoder_layers",
                 "vt_num_hidden_layers"]  # fmt: skip


@dataclass
class MmCtx:
    """What a projector's hooks see (MmprojModel's state): the whole config, the vision config (mutable, as
    the converter's ``__init__`` fix-ups edit it), the processor's config, the text width."""

    dir: Path
    global_config: dict[str, Any]
    hv: dict[str, Any]
    preproc: dict[str, Any]
    n_embd_text: int
    file_type: int
    qtype: GGMLType
    block_count: int = 0
    state: dict[str, Any] = field(default_factory=dict)

    def vparam(self, keys: list[str], optional: bool = False) -> Any:
        for k in keys:
            if k in self.hv:
                return self.hv[k]
        if optional:
            return None
        raise ConvertError(f"config.json: the encoder's config has none of {keys}")


Filter = Callable[[str], "str | None"]
Modify = Callable[[MmCtx, str, np.ndarray, "int | None"], Iterable[tuple[str, np.ndarray]]]
Force = Callable[[MmCtx, str, str], "GGMLType | None"]


@dataclass(frozen=True)
class Projector:
    """One ``MmprojModel`` subclass of llama.cpp's converter."""

    hf_archs: tuple[str, ...]
    params: Callable[[MmCtx, Any], None]
    filter: Filter = lambda name: name  # noqa: E731 - HF name -> name to map, or None (not ours)
    modify: Modify | None = None  # yields HF-named pairs (mapped after) or GGUF-named ones (v.*, mm.*)
    force: Force | None = None  # a forced type before MmprojModel's (None: none)
    prepare: Callable[[MmCtx], None] | None = None  # the vision config fix-ups of the class's __init__
    # text-model tensors the projector needs (name suffixes), kept although MmprojModel drops every
    # ``language_model.`` name: llama.cpp's LlavaVisionModel means to copy [IMG_BREAK]'s embedding (its
    # modify_tensors does) but since that filter it never sees it, and its clip.cpp then refuses the file
    keep_text: tuple[str, ...] = ()
    audio: bool = False  # an audio encoder (audio_config / whisper_config), no vision one


# ---------------------------------------------------------------------------------------------
# the projectors


def _split_qkv(data: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    c = data.shape[0]
    if c % 3:
        raise ValueError(f"fused qkv of {c} rows is not 3 equal parts")
    c //= 3
    return data[:c], data[c : 2 * c], data[2 * c :]


def _gemma3_params(ctx: MmCtx, kv: Any) -> None:
    import gguf

    kv.add_clip_projector_type(gguf.VisionProjectorType.GEMMA3)
    kv.add_vision_attention_layernorm_eps(ctx.hv.get("layer_norm_eps", 1e-6))
    kv.add_vision_use_gelu(True)
    n_per_side = int(ctx.preproc.get("image_seq_length", 256) ** 0.5)
    scale = (ctx.hv["image_size"] // ctx.hv["patch_size"]) // n_per_side
    if scale > 0 and scale != 4:
        kv.add_vision_projector_scale_factor(scale)


def _gemma3_filter(name: str) -> str | None:
    if "vision_model.head." in name:
        return None
    if not name.startswith(
        ("multi_modal_projector.", "vision_tower.", "multimodal_projector.", "vision_model.")
    ):
        return None
    return name.replace("_weight", ".weight")


def _gemma3_modify(
    ctx: MmCtx, name: str, data: np.ndarray, bid: int | None
) -> Iterable[tuple[str, np.ndarray]]:
    if "soft_emb_norm.weight" in name:
        data = data + np.float32(1)
    yield name, data


def _gemma3_force(ctx: MmCtx, name: str, new: str) -> GGMLType | None:
    if "input_projection" in name:
        return GGMLType.F16
    if ".embeddings." in name:
        return GGMLType.F32
    return None


def _embeddings_f32(ctx: MmCtx, name: str, new: str) -> GGMLType | None:
    return GGMLType.F32 if ".embeddings." in name else None


def _smolvlm_prepare(ctx: MmCtx) -> None:
    if ctx.hv.get("model_type") == "smolvlm_vision":  # SmolVLM2's config leaves these to the defaults
        ctx.hv.setdefault("hidden_size", 1152)
        ctx.hv.setdefault("num_attention_heads", 16)
        ctx.hv.setdefault("intermediate_size", 3072)


def _smolvlm_params(ctx: MmCtx, kv: Any) -> None:
    import gguf

    kv.add_clip_projector_type(gguf.VisionProjectorType.IDEFICS3)
    kv.add_vision_attention_layernorm_eps(ctx.hv.get("layer_norm_eps", 1e-5))
    kv.add_vision_projector_scale_factor(ctx.global_config.get("scale_factor", 2))
    kv.add_vision_use_gelu(True)
    kv.add_vision_preproc_image_size(ctx.preproc.get("size", {}).get("longest_edge", ctx.hv["image_size"]))


def _smolvlm_filter(name: str) -> str | None:
    return name if ("vision_tower" in name or "vision_model" in name or "model.connector" in name) else None


def _qwen2vl_prepare(ctx: MmCtx) -> None:
    hv = ctx.hv
    hv["image_size"] = hv.get("image_size", 560)
    hv["num_attention_heads"] = hv.get("num_heads")
    hv["num_hidden_layers"] = hv.get("depth")
    if "embed_dim" in hv:  # Qwen2-VL
        hv["intermediate_size"] = hv.get("hidden_size")
        hv["hidden_size"] = hv.get("embed_dim")


def _qwen2vl_params(ctx: MmCtx, kv: Any) -> None:
    import gguf

    mt = ctx.global_config.get("model_type")
    if mt == "qwen2_vl":
        kv.add_clip_projector_type(gguf.VisionProjectorType.QWEN2VL)
    elif mt == "qwen2_5_vl":
        kv.add_clip_projector_type(gguf.VisionProjectorType.QWEN25VL)
        kv.add_vision_use_silu(True)
        full = ctx.hv.get("fullatt_block_indexes")
        if not full:
            raise ConvertError("config.json: qwen2_5_vl's vision_config has no fullatt_block_indexes")
        n_wa = full[0] + 1
        if any(b - a != n_wa for a, b in zip(full, full[1:], strict=False)):
            raise ConvertError(f"config.json: invalid fullatt_block_indexes {full}")
        kv.add_vision_n_wa_pattern(n_wa)
    else:
        raise ConvertError(f"config.json: unknown Qwen-VL model_type {mt!r}")
    kv.add_vision_attention_layernorm_eps(ctx.global_config.get("rms_norm_eps", 1e-6))


def _qwen2vl_filter(name: str) -> str | None:
    if name.startswith("model.visual."):  # transformers 5's own save layout
        name = name[len("model.") :]
    return name if name.startswith("visual.") else None


def _qwen2vl_modify(
    ctx: MmCtx, name: str, data: np.ndarray, bid: int | None
) -> Iterable[tuple[str, np.ndarray]]:
    if ".qkv." in name:
        q, k, v = _split_qkv(data)
        yield name.replace("qkv", "q"), q
        yield name.replace("qkv", "k"), k
        yield name.replace("qkv", "v"), v
    elif "patch_embed.proj.weight" in name:  # the Conv3D as two Conv2D kernels
        if data.ndim != 5 or data.shape[2] != 2:
            raise ValueError("only a temporal_patch_size of 2 is supported")
        yield "v.patch_embd.weight", data[:, :, 0]
        yield "v.patch_embd.weight.1", data[:, :, 1]
    else:
        yield name, data


def _position_f32(ctx: MmCtx, name: str, new: str) -> GGMLType | None:
    return GGMLType.F32 if ".position_embd." in new else None


def _qwen3vl_prepare(ctx: MmCtx) -> None:
    hv = ctx.hv
    if "image_size" not in hv:  # from the position table's side
        hv["image_size"] = int(hv.get("num_position_embeddings", 2304) ** 0.5 * hv.get("patch_size", 16))
    hv["num_attention_heads"] = hv.get("num_heads")
    hv["num_hidden_layers"] = hv.get("depth")
    deep = [False] * int(hv["num_hidden_layers"] or 0)
    for i in hv.get("deepstack_visual_indexes", []):
        deep[i] = True
    ctx.state["deepstack"] = deep


def _qwen3vl_params(ctx: MmCtx, kv: Any) -> None:
    import gguf

    kv.add_clip_projector_type(gguf.VisionProjectorType.QWEN3VL)
    kv.add_vision_use_gelu(True)
    if (merge := ctx.hv.get("spatial_merge_size")) is not None:
        kv.add_vision_spatial_merge_size(int(merge))
    kv.add_vision_attention_layernorm_eps(ctx.global_config.get("text_config", {}).get("rms_norm_eps", 1e-6))
    if ctx.state["deepstack"]:
        kv.add_vision_is_deepstack_layers(ctx.state["deepstack"])


def _qwen3vl_filter(name: str) -> str | None:
    if name.startswith(("lm_head.", "mtp.")):
        return None
    if name.startswith("model.visual."):
        name = name.replace("model.visual.", "visual.", 1)
    return name if name.startswith("visual.") else None


def _qwen3vl_modify(
    ctx: MmCtx, name: str, data: np.ndarray, bid: int | None
) -> Iterable[tuple[str, np.ndarray]]:
    if name.startswith("visual.deepstack_merger_list."):
        j, rest = name.split(".", 3)[2:]
        idx = ctx.hv.get("deepstack_visual_indexes", [])[int(j)]
        part, suffix = rest.split(".", 1)
        kind = {"norm": "norm", "linear_fc1": "fc1", "linear_fc2": "fc2"}.get(part)
        if kind is None:
            raise ValueError(f"unexpected deepstack tensor {name}")
        yield f"v.deepstack.{idx}.{kind}.{suffix}", data
    elif name.startswith("visual.merger."):
        part, tail = name.split(".", 2)[2].split(".", 1)
        new = {"linear_fc1": "mm.0", "linear_fc2": "mm.2", "norm": "v.post_ln"}.get(part)
        if new is None:
            raise ValueError(f"unexpected merger tensor {name}")
        yield f"{new}.{tail}", data
    elif name == "visual.patch_embed.proj.weight":  # the Conv3D as two Conv2D kernels
        if data.ndim != 5 or data.shape[2] != 2:
            raise ValueError("only a temporal_patch_size of 2 is supported")
        yield "v.patch_embd.weight", data[:, :, 0]
        yield "v.patch_embd.weight.1", data[:, :, 1]
    elif name == "visual.patch_embed.proj.bias":
        yield "v.patch_embd.bias", data
    else:
        yield name, data


def _glm4v_params(ctx: MmCtx, kv: Any) -> None:
    import gguf

    kv.add_clip_projector_type(gguf.VisionProjectorType.GLM4V)
    act = str(ctx.hv.get("hidden_act", "")).lower()
    if act == "gelu":
        kv.add_vision_use_gelu(True)
    elif act == "silu":
        kv.add_vision_use_silu(True)
    kv.add_vision_attention_layernorm_eps(ctx.hv.get("rms_norm_eps", 1e-5))


def _glm4v_modify(
    ctx: MmCtx, name: str, data: np.ndarray, bid: int | None
) -> Iterable[tuple[str, np.ndarray]]:
    if name.startswith("visual.merger."):  # the common map (not Qwen3-VL's merger names)
        yield name, data
    else:
        yield from _qwen3vl_modify(ctx, name, data, bid)


def _whisper_prepare(ctx: MmCtx) -> None:
    hv = ctx.hv
    if "hidden_size" not in hv and "intermediate_size" not in hv:
        hv["hidden_size"] = hv["d_model"]
        hv["intermediate_size"] = hv["encoder_ffn_dim"]
        hv["num_attention_heads"] = hv["encoder_attention_heads"]


def _whisper_params(ctx: MmCtx, kv: Any) -> None:
    import gguf

    kv.add_clip_projector_type(gguf.VisionProjectorType.QWEN2A)
    kv.add_audio_num_mel_bins(ctx.hv["num_mel_bins"])
    kv.add_audio_attention_layernorm_eps(ctx.hv.get("layer_norm_eps", 1e-5))


def _voxtral_params(ctx: MmCtx, kv: Any) -> None:
    import gguf

    _whisper_params(ctx, kv)
    kv.add_clip_projector_type(gguf.VisionProjectorType.VOXTRAL)  # (overwrites qwen2a in its place)
    kv.add_audio_stack_factor(4)  # intermediate_size // hidden_size


def _whisper_filter(name: str) -> str | None:
    return "audio." + name if name.startswith("multi_modal_projector") else name


def _whisper_modify(
    ctx: MmCtx, name: str, data: np.ndarray, bid: int | None
) -> Iterable[tuple[str, np.ndarray]]:
    if "conv1.bias" in name or "conv2.bias" in name:
        data = data[:, None]
    yield name, data


def _conv_f16(ctx: MmCtx, name: str, new: str) -> GGMLType | None:
    return GGMLType.F16 if ".conv" in name and ".weight" in name else None


def _llama4_params(ctx: MmCtx, kv: Any) -> None:
    import gguf

    kv.add_clip_projector_type(gguf.VisionProjectorType.LLAMA4)
    kv.add_vision_attention_layernorm_eps(ctx.hv["norm_eps"])
    kv.add_vision_projector_scale_factor(int(1.0 / ctx.hv["pixel_shuffle_ratio"]))
    if ctx.hv.get("hidden_act") != "gelu":
        raise ConvertError(
            f"config.json: Llama 4 vision hidden_act {ctx.hv.get('hidden_act')!r} (gelu expected)"
        )
    kv.add_vision_use_gelu(True)


def _llama4_filter(name: str) -> str | None:
    if "multi_modal_projector" not in name and "vision_model" not in name:
        return None
    if "positional_embedding_vlm" in name and ".weight" not in name:
        name += ".weight"
    return name


def _llama4_modify(
    ctx: MmCtx, name: str, data: np.ndarray, bid: int | None
) -> Iterable[tuple[str, np.ndarray]]:
    if "multi_modal_projector.linear_1" in name:  # one fully connected layer despite its name
        yield "mm.model.fc.weight", data
    elif bid is not None and ".post_attention_layernorm." in name:
        # the FFN's pre-norm (clip.cpp's ln2). gguf-py's map lists this HF name for Gemma 4's attn_post_norm
        # too, and that later entry wins: llama.cpp's converter writes v.blk.N.attn_post_norm, which
        # clip.cpp then runs after attention, with no norm before the FFN
        yield f"v.blk.{bid}.ln2.{name.rsplit('.', 1)[1]}", data
    else:
        yield name, data


def _llava_prepare(ctx: MmCtx) -> None:
    if ctx.hv.get("model_type") != "pixtral":
        raise ConvertError(
            f"config.json: vision model_type {ctx.hv.get('model_type')!r} of a LLaVA checkpoint: llamapy (as "
            "llama.cpp's converter) converts the pixtral vision tower only"
        )
    ctx.hv["layer_norm_eps"] = ctx.hv.get("layer_norm_eps", 1e-5)
    ctx.state["img_break"] = _token_id(ctx.dir, "[IMG_BREAK]")


def _token_id(d: Path, token: str) -> int:
    try:
        p = d / "tokenizer_config.json"
        if p.is_file():
            for tid, t in (
                json.loads(p.read_text(encoding="utf-8")).get("added_tokens_decoder") or {}
            ).items():
                if t.get("content") == token:
                    return int(tid)
        p = d / "tokenizer.json"
        if p.is_file():
            for t in json.loads(p.read_text(encoding="utf-8")).get("added_tokens", []):
                if t.get("content") == token:
                    return int(t["id"])
    except (OSError, ValueError, AttributeError, KeyError, TypeError) as e:
        raise ConvertError(f"cannot read the tokenizer files to find {token} ({e})") from None
    raise ConvertError(f"token {token} not found in tokenizer_config.json or tokenizer.json")


def _llava_params(ctx: MmCtx, kv: Any) -> None:
    import gguf

    kv.add_clip_projector_type(gguf.VisionProjectorType.PIXTRAL)
    kv.add_vision_attention_layernorm_eps(ctx.hv["layer_norm_eps"])
    act = ctx.hv.get("hidden_act")
    if act == "silu":
        kv.add_vision_use_silu(True)
    elif act == "gelu":
        kv.add_vision_use_gelu(True)
    else:
        raise ConvertError(f"config.json: unsupported vision hidden_act {act!r}")
    if "spatial_merge_size" in ctx.global_config:
        kv.add_vision_spatial_merge_size(ctx.global_config["spatial_merge_size"])


_LLAVA_PREFIXES = ("multi_modal_projector.", "vision_tower.", "vision_encoder.", "vision_language_adapter.",
                   "patch_merger.", "pre_mm_projector_norm")  # fmt: skip


def _llava_filter(name: str) -> str | None:
    for pre in ("model.vision_tower.", "model.multi_modal_projector."):  # transformers 5's own save layout
        if name.startswith(pre):
            return name[len("model.") :]
    return name


def _llava_modify(
    ctx: MmCtx, name: str, data: np.ndarray, bid: int | None
) -> Iterable[tuple[str, np.ndarray]]:
    from .convert import _permute

    if name.startswith(_LLAVA_PREFIXES):
        if name.endswith(("q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias")):
            data = _permute(data, ctx.hv["num_attention_heads"])
        yield name, data
        return
    if ctx.state.get("img_break", -1) > 0 and "embed_tokens.weight" in name:
        yield "v.token_embd.img_break", data[ctx.state["img_break"]]


def _lfm2_prepare(ctx: MmCtx) -> None:
    ctx.hv["image_size"] = 256  # dynamic resolution: the converter's placeholder


def _lfm2_params(ctx: MmCtx, kv: Any) -> None:
    import gguf

    kv.add_clip_projector_type(gguf.VisionProjectorType.LFM2)
    kv.add_vision_attention_layernorm_eps(ctx.vparam(["layer_norm_eps"]))
    kv.add_vision_projector_scale_factor(ctx.global_config.get("downsample_factor", 2))
    kv.add_vision_use_gelu(True)
    drop = -(ctx.global_config.get("vision_feature_layer", -1) + 1)
    kv.add_vision_block_count(ctx.vparam(_N_BLOCK_KEYS) - drop)


def _lfm2_filter(name: str) -> str | None:
    return name.replace("model.vision_tower.", "vision_tower.").replace(
        "model.multi_modal_projector.", "multi_modal_projector."
    )


def _lfm2_modify(
    ctx: MmCtx, name: str, data: np.ndarray, bid: int | None
) -> Iterable[tuple[str, np.ndarray]]:
    if "patch_embedding.weight" in name:  # the linear patch embedding as a 16x16 conv kernel
        data = data.reshape(data.shape[0], 16, 16, 3).transpose(0, 3, 1, 2)
    yield name, data


PROJECTORS: dict[str, Projector] = {
    a: p
    for p in (
        Projector(("Gemma3ForConditionalGeneration",), _gemma3_params, _gemma3_filter, _gemma3_modify, _gemma3_force),
        Projector(("Idefics3ForConditionalGeneration", "SmolVLMForConditionalGeneration"), _smolvlm_params,
                  _smolvlm_filter, None, _embeddings_f32, _smolvlm_prepare),
        Projector(("Qwen2VLModel", "Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration"),
                  _qwen2vl_params, _qwen2vl_filter, _qwen2vl_modify, _position_f32, _qwen2vl_prepare),
        Projector(("LlavaForConditionalGeneration", "Mistral3ForConditionalGeneration"), _llava_params,
                  _llava_filter, _llava_modify, None, _llava_prepare, ("embed_tokens.weight",)),
        Projector(("Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration",
                   "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration"), _qwen3vl_params,
                  _qwen3vl_filter, _qwen3vl_modify, None, _qwen3vl_prepare),
        Projector(("Glm4vForConditionalGeneration", "Glm4vMoeForConditionalGeneration", "GlmOcrForConditionalGeneration"),
                  _glm4v_params, _qwen3vl_filter, _glm4v_modify, None, _qwen3vl_prepare),
        Projector(("Qwen2AudioForConditionalGeneration",), _whisper_params, _whisper_filter, _whisper_modify,
                  _conv_f16, _whisper_prepare, audio=True),
        Projector(("VoxtralForConditionalGeneration",), _voxtral_params, _whisper_filter, _whisper_modify,
                  _conv_f16, _whisper_prepare, audio=True),
        Projector(("Llama4ForConditionalGeneration",), _llama4_params, _llama4_filter, _llama4_modify),
        Projector(("Lfm2VlForConditionalGeneration",), _lfm2_params, _lfm2_filter, _lfm2_modify, None,
                  _lfm2_prepare),
    )
    for a in p.hf_archs
}  # fmt: skip

from .mmproj_gemma import GEMMA_PROJECTORS  # noqa: E402 - Gemma 3n / 4 (their module imports this one)

PROJECTORS.update(GEMMA_PROJECTORS)


# ---------------------------------------------------------------------------------------------
# MmprojModel


def _common_params(ctx: MmCtx, kv: Any, audio: bool) -> None:
    """MmprojModel.set_gguf_parameters."""
    kv.add_file_type(ctx.file_type)
    if audio:
        kv.add_clip_has_audio_encoder(True)
        kv.add_audio_projection_dim(ctx.n_embd_text)
        kv.add_audio_embedding_length(ctx.vparam(["hidden_size"]))
        kv.add_audio_feed_forward_length(ctx.vparam(["intermediate_size"]))
        kv.add_audio_block_count(ctx.vparam(_N_BLOCK_KEYS))
        kv.add_audio_head_count(ctx.vparam(["num_attention_heads"]))
        return
    kv.add_clip_has_vision_encoder(True)
    kv.add_vision_projection_dim(ctx.n_embd_text)
    kv.add_vision_image_size(ctx.vparam(["image_size"]))
    kv.add_vision_patch_size(ctx.vparam(["patch_size"]))
    kv.add_vision_embedding_length(ctx.vparam(["hidden_size", "width", "vt_hidden_size"]))
    kv.add_vision_feed_forward_length(ctx.vparam(["intermediate_size", "vt_intermediate_size"]))
    kv.add_vision_block_count(ctx.vparam(_N_BLOCK_KEYS))
    kv.add_vision_head_count(
        ctx.vparam(["num_attention_heads", "num_heads", "heads", "vt_num_attention_heads"])
    )
    for k in ("image_mean", "image_std"):
        if k not in ctx.preproc:
            raise ConvertError(f"no {k} in preprocessor_config.json / processor_config.json")
    kv.add_vision_image_mean(ctx.preproc["image_mean"])
    kv.add_vision_image_std(ctx.preproc["image_std"])


def _preprocessor_config(d: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for fname, sub in (
        ("preprocessor_config.json", "media_proc_cfg"),
        ("processor_config.json", "image_processor"),
    ):
        p = d / fname
        if not p.is_file():
            continue
        try:
            cfg = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ConvertError(f"{p}: cannot read it as JSON ({e})") from None
        if not isinstance(cfg, dict):
            raise ConvertError(f"{p}: not a JSON object")
        if isinstance(cfg.get(sub), dict):
            cfg = {**cfg, **cfg[sub]}
        out.update(cfg)
    return out


def mmproj_context(d: Path, hp: dict[str, Any], proj: Projector, file_type: int, qtype: GGMLType) -> MmCtx:
    text = {**hp, **(hp.get("text_config") or {})}
    n_embd_text = text.get("hidden_size", text.get("n_embd", 0))
    if not n_embd_text:
        raise ConvertError("config.json: no hidden_size of the text model")
    key = ("whisper_config" if "whisper_config" in hp else "audio_config") if proj.audio else "vision_config"
    hv = hp.get(key)
    if not isinstance(hv, dict):
        raise ConvertError(
            f"config.json: no {key} (not a {'speech' if proj.audio else 'vision'}-language checkpoint)"
        )
    ctx = MmCtx(d, copy.deepcopy(hp), dict(hv), _preprocessor_config(d), n_embd_text, file_type, qtype)
    if proj.prepare is not None:
        proj.prepare(ctx)
    ctx.block_count = ctx.vparam(_N_BLOCK_KEYS, True) or 0
    return ctx


def _hf_names(proj: Projector, tensors: dict[str, SafeTensor]) -> Iterator[tuple[str, SafeTensor]]:
    """filter_tensors: the projector's own, then MmprojModel's (no ``language_model.``), then ModelBase's."""
    for name, st in tensors.items():
        new = proj.filter(name)
        if new is None or (
            "language_model." in new and not (proj.keep_text and new.endswith(proj.keep_text))
        ):
            continue
        new = new.replace("e_score_correction_bias", "e_score_correction.bias")
        yield new, st


_LAYOUTS = ((re.compile(r"^vision_tower\.(?!vision_model\.)"), "vision_tower.vision_model."),
            (re.compile(r"^model\."), ""))  # fmt: skip


class _MmMapper:
    def __init__(self, ctx: MmCtx, proj: Projector) -> None:
        import gguf

        self.ctx, self.proj = ctx, proj
        # (llama.cpp's map takes mm.N for N below the block count only: a tiny tower's mm.2 would not map)
        self.names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, max(ctx.block_count, 8))

    def gguf_name(self, name: str) -> str:
        new = self.names.get_name(name, try_suffixes=(".weight", ".bias"))
        for pat, rep in _LAYOUTS:  # the names transformers 5 saves where the Hub's files differ
            if new is None and pat.search(name):
                new = self.names.get_name(pat.sub(rep, name, count=1), try_suffixes=(".weight", ".bias"))
        if new is None:
            raise ConvertError(f"cannot map tensor {name!r} to an mmproj GGUF name")
        m = re.match(r"^[va]\.blk\.(\d+)\.", new)
        if m and int(m.group(1)) >= self.ctx.block_count:
            raise ConvertError(
                f"tensor {name!r} is of layer {m.group(1)}, but config.json says {self.ctx.block_count} layers"
            )
        return new

    def __call__(self, name: str, data: np.ndarray, bid: int | None) -> Iterator[tuple[str, str, np.ndarray]]:
        pairs = (
            self.proj.modify(self.ctx, name, data, bid) if self.proj.modify is not None else [(name, data)]
        )
        for n, d in pairs:
            yield name, (n if n.startswith(("v.", "mm.", "a.", "resampler.")) else self.gguf_name(n)), d


def tensor_type(ctx: MmCtx, proj: Projector, name: str, new: str, data: np.ndarray) -> GGMLType:
    """prepare_tensors' choice for an mmproj tensor: the projector's forced type, MmprojModel's (the patch
    embedding F16 in an F16 file, else F32), 1-D / norms / position embeddings / non-``.weight`` F32, then
    the file's type (Q8_0 falls back to F16 on rows that are not whole blocks)."""
    t = proj.force(ctx, name, new) if proj.force is not None else None
    if t is None and (".patch_embd.weight" in new or ".patch_merger.weight" in new):
        t = GGMLType.F16 if ctx.file_type == 1 else GGMLType.F32
    if data.ndim <= 1 or new.endswith("_norm.weight"):
        return GGMLType.F32
    if t is None and (new in ("v.position_embd.weight", "a.position_embd.weight") or new[-7:] != ".weight"):
        return GGMLType.F32
    if t is None:
        t = ctx.qtype
    if t == GGMLType.Q8_0 and data.shape[-1] % 32:
        return GGMLType.F16
    return t


def iter_mmproj(
    ctx: MmCtx, proj: Projector, tensors: dict[str, SafeTensor]
) -> Iterator[tuple[str, str, np.ndarray]]:
    """(HF name, GGUF name, float array) of every mmproj tensor, in llama.cpp's order."""
    from .convert import _SKIP_SUFFIXES, _block_id

    mapper = _MmMapper(ctx, proj)
    for name, st in _hf_names(proj, tensors):
        if name.endswith(_SKIP_SUFFIXES):
            continue
        data = st.numpy()
        if data.dtype.kind == "f" and data.dtype != np.float32:
            data = data.astype(np.float32)
        try:
            for hf, new, d in mapper(name, data, _block_id(name)):
                yield hf, new, np.ascontiguousarray(d)
        except ConvertError:
            raise
        except (ValueError, IndexError, TypeError, KeyError) as e:
            raise ConvertError(
                f"tensor {name!r} {list(data.shape)}: does not match config.json ({e})"
            ) from None


def convert_mmproj(
    hf_dir: str | os.PathLike,
    out: str | os.PathLike | None,
    outtype: str,
    dry_run: bool,
    force: bool,
    model_name: str | None,
    metadata_file: str | os.PathLike | None,
    progress: Callable[[str], None] | None,
) -> Any:
    """The mmproj GGUF of the vision-language checkpoint in ``hf_dir`` (``llamapy convert --mmproj``)."""
    import gguf

    from .convert import OUTTYPES, ConvertResult, _checkpoint, _guess_outtype, _param_counts, _write

    logging.getLogger("gguf").setLevel(logging.ERROR)
    d, hp, arch = _checkpoint(hf_dir)
    vc = hp.get("vision_config")
    if isinstance(vc, dict) and vc.get("architectures"):
        arch = str(vc["architectures"][0])
    from . import mmproj_more

    proj = mmproj_more.resolve(arch, hp) or PROJECTORS.get(arch)
    if proj is None:
        raise ConvertError(
            f"architecture {arch!r} (config.json 'architectures'): llamapy writes the mmproj of "
            f"{', '.join(sorted({*PROJECTORS, *mmproj_more.PROJECTORS_MORE}))}"
        )
    if out is not None and not Path(out).is_dir() and Path(out).exists() and not force and not dry_run:
        raise ConvertError(f"{out} exists (use --force to overwrite it)")
    files: list[SafetensorsFile] = []
    try:
        tensors, files = open_checkpoint(d)
        if outtype == "auto":
            outtype = _guess_outtype(tensors)
        if outtype not in OUTTYPES:
            raise ConvertError(f"--mmproj writes f32, f16, bf16, q8_0 or auto, not {outtype!r}")
        file_type, qtype = OUTTYPES[outtype]
        try:
            ctx = mmproj_context(d, hp, proj, file_type, qtype)
            plan = [
                (new, tuple(data.shape), tensor_type(ctx, proj, hf, new, data), i)
                for i, (hf, new, data) in enumerate(iter_mmproj(ctx, proj, tensors))
            ]
        except ConvertError:
            raise
        except (KeyError, ValueError, TypeError, ZeroDivisionError) as e:
            raise ConvertError(
                f"config.json: a vision hyper-parameter is missing or malformed ({e!r})"
            ) from None
        if not plan:
            raise ConvertError(f"{d}: no vision tower or projector tensors in the checkpoint")
        names = [p[0] for p in plan]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise ConvertError(f"two HF tensors map to {dup!r}")
        kv = gguf.GGUFWriter(path=None, arch="clip")
        total, shared, expert, n_exp = _param_counts([(n, s) for n, s, _t, _k in plan])
        mf = Path(metadata_file) if metadata_file is not None else None
        if mf is not None and not mf.is_file():
            raise ConvertError(f"{mf}: no such metadata file")
        try:
            meta = gguf.Metadata.load(mf, d, model_name, total)
        except Exception as e:  # its model-card heuristics parse README.md (YAML) and file names
            raise ConvertError(
                f"cannot read the model's metadata (README.md model card, --metadata): {e}"
            ) from None
        if meta.name is None:
            meta.name = d.resolve().name
        if meta.size_label is None and total > 0:
            meta.size_label = gguf.size_label(total, shared, expert, n_exp)
        kv.add_type(gguf.GGUFType.MMPROJ)
        meta.set_gguf_meta_model(kv)
        try:
            _common_params(ctx, kv, proj.audio)
            proj.params(ctx, kv)
        except ConvertError:
            raise
        except (KeyError, ValueError, TypeError) as e:
            raise ConvertError(
                f"config.json: a vision hyper-parameter is missing or malformed ({e!r})"
            ) from None
        kv.add_quantization_version(gguf.GGML_QUANT_VERSION)
        md = {k: v.value for k, v in kv.kv_data[0].items()}
        fname = "mmproj-" + gguf.naming_convention(
            meta.name, meta.basename, meta.finetune, meta.version, None, outtype.upper(), model_type=None
        ) + ".gguf"  # fmt: skip
        out_path = d / fname if out is None else Path(out) / fname if Path(out).is_dir() else Path(out)
        result = ConvertResult([out_path], "clip", [(n, s, t) for n, s, t, _k in plan], md, total)
        if dry_run:
            return result
        if out_path.exists() and not force:
            raise ConvertError(f"{out_path} exists (use --force to overwrite it)")

        def produce() -> Iterator[tuple[str, np.ndarray]]:
            for _hf, new, data in iter_mmproj(ctx, proj, tensors):
                yield new, data

        _write(None, kv, plan, tensors, [(out_path, list(range(len(plan))))], progress, produce)
        return result
    finally:
        for f in files:
            f.close()
