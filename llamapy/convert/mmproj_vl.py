"""``llamapy convert --mmproj`` for the vision-language models of remote code that llamapy runs: Kimi-VL
(``kimivl``, as llama.cpp's ``conversion/kimivl.py`` ``KimiVLModel`` writes it) and MiniCPM-V 2.x (the
``resampler`` projector: llama.cpp has only its legacy ``minicpmv-surgery.py`` +
``minicpmv-convert-image-encoder-to-gguf.py`` scripts, whose tensor names and keys this follows).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from .errors import ConvertError
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


# ---------------------------------------------------------------------------------------------
# MiniCPM-V 2.5 / 2.6 / 4.0 / 4.5 and MiniCPM-o 2.6 / 4.5 (openbmb's MiniCPMV / MiniCPMO remote code): the
# NaViT SigLIP tower ``vpm.`` and the perceiver ``resampler.``, as minicpmv-surgery.py splits them and
# minicpmv-convert-image-encoder-to-gguf.py names them: ``in_proj`` cut into q / k / v, ``proj`` transposed
# (divided by the text model's ``scale_emb`` where it has one), MAE's 70 x 70 sin-cos table added as
# ``resampler.pos_embed_k``, keys ``clip.has_minicpmv_projector``, ``clip.minicpmv_version`` (INT32) and
# ``clip.minicpmv_query_num``, ``clip.vision.image_size`` the slice size (config.json's ``image_size``). The
# tower's FFN is named as gguf-py maps it (``fc1`` -> ``ffn_up``), where the legacy script swaps up and down
# (clip.cpp and llamapy detect either by shape).

# (architecture, config.json "version") -> clip.minicpmv_version (the legacy script's --minicpmv_version)
_MINICPMV_VERSIONS = {("MiniCPMV", "2.5"): 2, ("MiniCPMV", "2.6"): 3, ("MiniCPMO", "2.6"): 4,
                      ("MiniCPMV", "4.0"): 5, ("MiniCPMV", "4.5"): 6, ("MiniCPMO", "4.5"): 100045}  # fmt: skip
_POS_SIDE = 70  # the table's side (the legacy script and clip.cpp hard-code it)


def _minicpmv_prepare(ctx: MmCtx) -> None:
    g = ctx.global_config
    arch = str((g.get("architectures") or ["MiniCPMV"])[0])
    raw = g.get("version")
    try:
        ver = _MINICPMV_VERSIONS.get((arch, f"{float(raw):.1f}"))
    except (TypeError, ValueError):
        ver = None
    if ver is None:
        known = ", ".join(f"{a} {v}" for a, v in _MINICPMV_VERSIONS)
        raise ConvertError(f"config.json: {arch} version {raw!r} is not one llamapy runs ({known})")
    if g.get("drop_vision_last_layer"):
        raise ConvertError("config.json: drop_vision_last_layer (MiniCPM-V 2.0) is not supported")
    ctx.state["version"] = ver
    size = g.get("image_size", ctx.preproc.get("scale_resolution", 448))
    ctx.hv["image_size"] = int(size)  # the slice's size, not the tower's position table
    for k, alt in (("image_mean", "norm_mean"), ("image_std", "norm_std")):
        ctx.preproc.setdefault(k, ctx.preproc.get(alt, [0.5] * 3))
    text = {**g, **(g.get("text_config") or {})}
    ctx.state["scale_emb"] = float(text.get("scale_emb") or 1.0)


def _minicpmv_params(ctx: MmCtx, kv: Any) -> None:
    kv.add_bool("clip.has_minicpmv_projector", True)
    kv.add_clip_projector_type("resampler")
    kv.add_int32("clip.minicpmv_version", ctx.state["version"])
    nq = ctx.global_config.get("query_num")
    if nq:
        kv.add_uint32("clip.minicpmv_query_num", int(nq))
    kv.add_vision_attention_layernorm_eps(ctx.hv.get("layer_norm_eps", 1e-6))
    kv.add_vision_use_gelu(True)


def _minicpmv_filter(name: str) -> str | None:
    if not name.startswith(("vpm.", "resampler.")) or name.endswith("position_ids"):
        return None
    return name


def _sincos(d: int, side: int) -> np.ndarray:
    """MAE's get_2d_sincos_pos_embed(d, (side, side)) as the legacy script computes it (in float32)."""
    gw, gh = np.meshgrid(np.arange(side, dtype=np.float32), np.arange(side, dtype=np.float32))

    def one(n: int, pos: np.ndarray) -> np.ndarray:
        omega = np.arange(n // 2, dtype=np.float32)
        omega /= n / 2.0
        omega = 1.0 / 10000**omega
        out = np.einsum("m,d->md", pos.reshape(-1), omega)
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)

    return np.concatenate([one(d // 2, gw), one(d // 2, gh)], axis=1)


def _minicpmv_modify(
    ctx: MmCtx, name: str, data: np.ndarray, bid: int | None
) -> Iterable[tuple[str, np.ndarray]]:
    if name == "vpm.post_layernorm.weight" or name == "vpm.post_layernorm.bias":
        yield "v.post_ln." + name.rsplit(".", 1)[1], data
    elif name.startswith("resampler.attn.in_proj_"):
        kind = name.rsplit("_", 1)[1]
        if data.shape[0] % 3:
            raise ValueError(f"{data.shape[0]} rows are not q, k and v of one width")
        for part, x in zip("qkv", _split_qkv(data), strict=True):
            yield f"resampler.attn.{part}.{kind}", x
    elif name == "resampler.proj":
        yield "resampler.pos_embed_k", _sincos(ctx.n_embd_text, _POS_SIDE)
        yield "resampler.proj.weight", np.ascontiguousarray(data.T) / np.float32(ctx.state["scale_emb"])
    elif name == "resampler.pos_embed":
        yield name, data
        yield "resampler.pos_embed_k", _sincos(ctx.n_embd_text, _POS_SIDE)
    elif name.startswith("resampler."):
        base, kind = name.rsplit(".", 1)
        new = {"resampler.kv_proj": "resampler.kv", "resampler.attn.out_proj": "resampler.attn.out"}.get(
            base, base
        )
        yield (f"{new}.{kind}" if base != "resampler" else name), data
    else:
        yield name, data  # (the tower: gguf-py's vpm.* map)


MINICPMV = Projector(("MiniCPMV", "MiniCPMO"), _minicpmv_params, _minicpmv_filter, _minicpmv_modify, None,
                     _minicpmv_prepare)  # fmt: skip

KIMIVL = Projector(("KimiVLForConditionalGeneration",), _kimivl_params, _kimivl_filter, _kimivl_modify, None,
                   _kimivl_prepare)  # fmt: skip

PROJECTORS_VL: dict[str, Projector] = {a: p for p in (KIMIVL, MINICPMV) for a in p.hf_archs}
