"""More ``llamapy convert --mmproj`` projectors (``mmproj.py`` holds the machinery and the first ones):
LLaVA 1.5 (CLIP + ``mlp``), InternVL, Ultravox (audio), Kimi-K2.5 and MiniCPM-V 4.6, each as llama.cpp's
converter class writes it (``conversion/internvl.py``, ``ultravox.py``, ``kimivl.py``, ``minicpm.py``),
or, where it writes nothing, as its loader (``clip.cpp``) and llamapy's ``llamapy.mtmd`` read it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from ..ggml.types import GGMLType
from .errors import ConvertError
from .mmproj import (
    _N_BLOCK_KEYS,
    MmCtx,
    Projector,
    _conv_f16,
    _split_qkv,
    _whisper_filter,
    _whisper_modify,
    _whisper_params,
    _whisper_prepare,
)

# ---------------------------------------------------------------------------------------------
# LLaVA 1.5: a CLIP ViT and the mlp projector. llama.cpp's convert_hf_to_gguf.py takes
# LlavaForConditionalGeneration for Pixtral only (any other vision model_type is its ValueError);
# its legacy llava_surgery + convert_image_encoder_to_gguf.py path writes projector type "mlp", which
# is what this writes from the transformers checkpoint directly: the whole tower (post-layernorm dropped:
# the feature layer is below it), mm.0 / mm.2, the CLIP keys of MmprojModel.


def _llava15_prepare(ctx: MmCtx) -> None:
    strategy = ctx.global_config.get("vision_feature_select_strategy", "default")
    if strategy != "default":
        raise ConvertError(
            f"config.json: vision_feature_select_strategy {strategy!r}: llamapy (as llama.cpp's mlp projector) "
            "drops the class token ('default') only"
        )
    layers = ctx.global_config.get("vision_feature_layer", -2)
    layers = [layers] if isinstance(layers, int) else list(layers)
    n = int(ctx.vparam(["num_hidden_layers"]))
    ctx.state["feature_layers"] = [x if x >= 0 else n + x + 1 for x in layers]
    if any(not 0 < x <= n for x in ctx.state["feature_layers"]):
        raise ConvertError(f"config.json: vision_feature_layer {layers} outside the {n} layers of the tower")


def _llava15_params(ctx: MmCtx, kv: Any) -> None:
    kv.add_clip_projector_type("mlp")
    kv.add_vision_attention_layernorm_eps(ctx.hv.get("layer_norm_eps", 1e-5))
    act = ctx.hv.get("hidden_act", "quick_gelu")
    if act == "gelu":
        kv.add_vision_use_gelu(True)
    elif act == "silu":
        kv.add_vision_use_silu(True)
    elif act != "quick_gelu":  # (clip.cpp's default FFN op)
        raise ConvertError(f"config.json: unsupported CLIP hidden_act {act!r}")
    n = int(ctx.vparam(["num_hidden_layers"]))
    if ctx.state["feature_layers"] != [n - 1]:  # (HF's default -2: the loaders' default)
        kv.add_array("clip.vision.feature_layer", ctx.state["feature_layers"])


def _llava15_filter(name: str) -> str | None:
    if name.startswith(("model.vision_tower.", "model.multi_modal_projector.")):  # transformers 5's layout
        name = name[len("model.") :]
    if not name.startswith(("vision_tower.", "multi_modal_projector.")) or "post_layernorm" in name:
        return None
    if name.endswith(".position_ids"):  # (a buffer some older checkpoints hold)
        return None
    return name


def _llava15_modify(
    ctx: MmCtx, name: str, data: np.ndarray, bid: int | None
) -> Iterable[tuple[str, np.ndarray]]:
    if name.startswith("multi_modal_projector.linear_"):
        i, kind = name[len("multi_modal_projector.linear_") :].split(".", 1)
        if i not in ("1", "2"):
            raise ValueError(f"unexpected projector tensor {name}")
        yield f"mm.{2 * (int(i) - 1)}.{kind}", data
    else:
        yield name, data


# ---------------------------------------------------------------------------------------------
# InternVL (InternVisionModel: the vision_config's architectures entry of the Hub's checkpoints, and
# transformers' own InternVLForConditionalGeneration, which llama.cpp's converter does not take by name)

_INTERNVL_PREFIXES = ("vision_model", "mlp", "model.vision_tower", "model.multi_modal_projector")
_INTERNS1_NAMES = {
    "model.multi_modal_projector.layer_norm.bias": "mlp1.0.bias",
    "model.multi_modal_projector.layer_norm.weight": "mlp1.0.weight",
    "model.multi_modal_projector.linear_1.bias": "mlp1.1.bias",
    "model.multi_modal_projector.linear_1.weight": "mlp1.1.weight",
    "model.multi_modal_projector.linear_2.bias": "mlp1.3.bias",
    "model.multi_modal_projector.linear_2.weight": "mlp1.3.weight",
}


def _internvl_prepare(ctx: MmCtx) -> None:
    for k in ("image_size", "patch_size"):
        if isinstance(ctx.hv.get(k), list):
            ctx.hv[k] = ctx.hv[k][0]


def _internvl_params(ctx: MmCtx, kv: Any) -> None:
    import gguf

    kv.add_clip_projector_type(gguf.VisionProjectorType.INTERNVL)
    kv.add_vision_attention_layernorm_eps(ctx.hv["layer_norm_eps"])
    act = ctx.hv.get("hidden_act")
    if act == "silu":
        kv.add_vision_use_silu(True)
    elif act == "gelu":
        kv.add_vision_use_gelu(True)
    else:
        raise ConvertError(f"config.json: unsupported vision hidden_act {act!r} (gelu or silu)")
    ratio = ctx.global_config.get("downsample_ratio")
    if not ratio:
        raise ConvertError("config.json: no downsample_ratio")
    kv.add_vision_projector_scale_factor(int(1.0 / ratio))
    if (lo := ctx.global_config.get("min_dynamic_patch", 0)) > 0:
        kv.add_vision_preproc_min_tiles(lo)
    if (hi := ctx.global_config.get("max_dynamic_patch", 0)) > 0:
        kv.add_vision_preproc_max_tiles(hi)


def _internvl_filter(name: str) -> str | None:
    if name.startswith(("vision_tower.", "multi_modal_projector.")):  # transformers 5's save layout
        name = "model." + name
    if not name.startswith(_INTERNVL_PREFIXES):
        return None
    name = _INTERNS1_NAMES.get(name, name)
    if name.startswith("vision_model"):
        name = "vision_tower." + name
    if (".ls" in name or ".lambda_" in name or "position_embedding" in name) and not name.endswith(".weight"):
        name += ".weight"
    return name


def _internvl_modify(
    ctx: MmCtx, name: str, data: np.ndarray, bid: int | None
) -> Iterable[tuple[str, np.ndarray]]:
    if ".qkv." in name:
        q, k, v = _split_qkv(data)
        yield name.replace("attn.qkv", "self_attn.q_proj"), q
        yield name.replace("attn.qkv", "self_attn.k_proj"), k
        yield name.replace("attn.qkv", "self_attn.v_proj"), v
    else:
        yield name, data


def _position_f32(ctx: MmCtx, name: str, new: str) -> GGMLType | None:
    return GGMLType.F32 if ".position_embd." in new else None


# ---------------------------------------------------------------------------------------------
# Ultravox: a Whisper encoder (as Qwen2-Audio's) and a stacking projector


def _ultravox_params(ctx: MmCtx, kv: Any) -> None:
    import gguf

    _whisper_params(ctx, kv)
    kv.add_clip_projector_type(gguf.VisionProjectorType.ULTRAVOX)  # (overwrites qwen2a in its place)
    if "stack_factor" not in ctx.global_config:
        raise ConvertError("config.json: no stack_factor")
    kv.add_audio_stack_factor(ctx.global_config["stack_factor"])


# ---------------------------------------------------------------------------------------------
# MiniCPM-V 4.6: SigLIP, the window-attention ViT merger after layer insert_layer_id, the 2x2 downsampling
# MLP. Its names as gguf-py's map of llama.cpp's tree has them (the gguf package on PyPI predates them).

_MINICPM_BLOCK = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                  "self_attn.out_proj": "attn_out", "layer_norm1": "ln1", "layer_norm2": "ln2",
                  "mlp.fc1": "ffn_up", "mlp.fc2": "ffn_down"}  # fmt: skip
_MINICPM_MERGER = {"layer_norm1": "ln1", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                   "self_attn.v_proj": "attn_v", "self_attn.out_proj": "attn_out", "pre_norm": "ds_ln",
                   "linear_1": "ds_ffn_up", "linear_2": "ds_ffn_down"}  # fmt: skip
_MINICPM_OTHER = {"model.vision_tower.embeddings.patch_embedding": "v.patch_embd",
                  "model.vision_tower.embeddings.position_embedding": "v.position_embd",
                  "model.vision_tower.post_layernorm": "v.post_ln", "model.merger.mlp.0.pre_norm": "mm.input_norm",
                  "model.merger.mlp.0.linear_1": "mm.up", "model.merger.mlp.0.linear_2": "mm.down"}  # fmt: skip


def _minicpm_prepare(ctx: MmCtx) -> None:
    mode = ctx.preproc.get("downsample_mode", "16x")
    if mode not in ("4x", "16x"):
        raise ConvertError(f"preprocessor_config.json: unsupported downsample_mode {mode!r} (4x or 16x)")
    ctx.state["mode"] = mode
    if (res := ctx.preproc.get("scale_resolution")) is not None:  # the slice's size (clip.cpp's image size)
        ctx.hv["image_size"] = int(res)


def _minicpm_params(ctx: MmCtx, kv: Any) -> None:
    kv.add_clip_projector_type("minicpmv4_6")
    kv.add_vision_projector_scale_factor(2 if ctx.state["mode"] == "4x" else 4)
    kv.add_vision_wa_layer_indexes(
        [int(ctx.global_config.get("insert_layer_id", ctx.hv.get("insert_layer_id", 6)))]
    )
    kv.add_vision_use_gelu(True)
    kv.add_vision_attention_layernorm_eps(ctx.hv.get("layer_norm_eps", 1e-6))


def _minicpm_filter(name: str) -> str | None:
    return None if name.startswith(("lm_head.", "mtp")) else name


def _minicpm_modify(
    ctx: MmCtx, name: str, data: np.ndarray, bid: int | None
) -> Iterable[tuple[str, np.ndarray]]:
    if ".vit_merger." in name and ctx.state["mode"] == "4x":  # (the 4x mode has no ViT merger)
        return
    base, kind = name.rsplit(".", 1)
    layers = "model.vision_tower.encoder.layers."
    if base.startswith(layers) and bid is not None:
        mod = base[len(layers) :].split(".", 1)[1]
        if mod in _MINICPM_BLOCK:
            yield f"v.blk.{bid}.{_MINICPM_BLOCK[mod]}.{kind}", data
            return
    elif base.startswith("model.vision_tower.vit_merger."):
        mod = base[len("model.vision_tower.vit_merger.") :]
        if mod in _MINICPM_MERGER:
            yield f"v.vit_merger.{_MINICPM_MERGER[mod]}.{kind}", data
            return
    elif base in _MINICPM_OTHER:
        yield f"{_MINICPM_OTHER[base]}.{kind}", data
        return
    yield name, data  # (the common map, else its error)


# ---------------------------------------------------------------------------------------------
# Kimi-K2.5 (MoonViT3d): the Hub's layout (fused wqkv with q/k rows interleaved for its complex rope, which
# are permuted to llama.cpp's split 2-D rope). transformers' Kimi_K25ForConditionalGeneration saves the same
# names but for two (its reverse renames): model.mm_projector.pre_norm and vision_tower.encoder.patch_embed.


def _kimik25_prepare(ctx: MmCtx) -> None:
    hv = ctx.hv
    for k in ("height", "width", "time"):  # (transformers' config names them pos_emb_*)
        if f"init_pos_emb_{k}" not in hv and f"pos_emb_{k}" in hv:
            hv[f"init_pos_emb_{k}"] = hv[f"pos_emb_{k}"]
    ctx.state["merge"] = tuple(hv.get("merge_kernel_size", [2, 2]))
    ctx.state["patch"] = hv.get("patch_size", 14)
    hv["image_size"] = hv.get("init_pos_emb_height", 64) * ctx.state["patch"]


def _kimik25_params(ctx: MmCtx, kv: Any) -> None:
    hv = ctx.hv
    kv.add_clip_projector_type("kimik25")
    kv.add_uint32("vision.pos_emb_height", hv.get("init_pos_emb_height", 64))
    kv.add_uint32("vision.pos_emb_width", hv.get("init_pos_emb_width", 64))
    kv.add_uint32("vision.pos_emb_time", hv.get("init_pos_emb_time", 4))
    kv.add_vision_use_gelu(hv.get("projector_hidden_act", "gelu") == "gelu")
    kv.add_vision_attention_layernorm_eps(hv.get("projector_ln_eps", 1e-5))
    kv.add_vision_projector_scale_factor(ctx.state["merge"][0])
    pp = ctx.state["patch"] ** 2
    kv.add_vision_min_pixels(8 * pp)
    kv.add_vision_max_pixels(ctx.preproc.get("in_patch_limit", 16384) * pp)


def _kimik25_filter(name: str) -> str | None:
    if "vision_tower" not in name and "mm_projector" not in name:
        return None
    if name.startswith("model.mm_projector."):
        name = name[len("model.") :]
    return name.replace("vision_tower.encoder.patch_embed.", "vision_tower.patch_embed.")


def _rope_split(x: np.ndarray, n_head: int) -> np.ndarray:
    """q/k rows from the interleaved (complex) rope order to llama.cpp's split one (KimiK25Model.permute)."""
    d = x.shape[0] // n_head
    return x.reshape(n_head, d // 4, 2, 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)


def _kimik25_modify(
    ctx: MmCtx, name: str, data: np.ndarray, bid: int | None
) -> Iterable[tuple[str, np.ndarray]]:
    if "wqkv" in name:
        # (llama.cpp's converter reads num_attention_heads, else 16, where the Hub's config says
        # vt_num_attention_heads: the same for Kimi-K2.5's 16 heads)
        n_head = int(ctx.vparam(["num_attention_heads", "vt_num_attention_heads"], True) or 16)
        if data.shape[0] % (3 * n_head) or (data.shape[0] // 3 // n_head) % 4:
            raise ValueError(f"{data.shape[0]} qkv rows are not 3 x {n_head} heads of a multiple of 4")
        q, k, v = _split_qkv(data)
        data = np.concatenate([_rope_split(q, n_head), _rope_split(k, n_head), v])
    if "pos_emb.time_weight" in name:  # (T, 1, C) -> (T, C)
        data = data.reshape(data.shape[0], data.shape[-1])
    if "mm_projector.proj.0." in name:
        name = name.replace(".proj.0.", ".proj.linear_1.")
    elif "mm_projector.proj.2." in name:
        name = name.replace(".proj.2.", ".proj.linear_2.")
    yield name, data


PROJECTORS_MORE: dict[str, Projector] = {
    a: p
    for p in (
        Projector(("InternVisionModel", "InternVLForConditionalGeneration"), _internvl_params, _internvl_filter,
                  _internvl_modify, _position_f32, _internvl_prepare),
        Projector(("MiniCPMV4_6ForConditionalGeneration",), _minicpm_params, _minicpm_filter, _minicpm_modify,
                  None, _minicpm_prepare),
        Projector(("KimiK25ForConditionalGeneration", "Kimi_K25ForConditionalGeneration"), _kimik25_params,
                  _kimik25_filter, _kimik25_modify, None, _kimik25_prepare),
        Projector(("UltravoxModel",), _ultravox_params, _whisper_filter, _whisper_modify, _conv_f16,
                  _whisper_prepare, audio=True),
    )
    for a in p.hf_archs
}  # fmt: skip

from .mmproj_vl import PROJECTORS_VL  # noqa: E402 - Kimi-VL, MiniCPM-V 2.x

PROJECTORS_MORE.update(PROJECTORS_VL)

LLAVA15 = Projector(("LlavaForConditionalGeneration",), _llava15_params, _llava15_filter, _llava15_modify,
                    None, _llava15_prepare)  # fmt: skip


def resolve(arch: str, hp: dict[str, Any]) -> Projector | None:
    """The projector of ``arch`` where it is one of these (None: look in ``mmproj.PROJECTORS``)."""
    vc = hp.get("vision_config")
    if arch == "LlavaForConditionalGeneration" and isinstance(vc, dict):
        if vc.get("model_type", "clip_vision_model") == "clip_vision_model":
            return LLAVA15
        return None
    return PROJECTORS_MORE.get(arch)


__all__ = ["LLAVA15", "PROJECTORS_MORE", "resolve", "_N_BLOCK_KEYS"]
