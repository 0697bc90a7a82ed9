"""Llama 4 vision (llama.cpp's projector type ``llama4``, ``tools/mtmd/models/llama4.cpp``): a ViT with a class
token, learned positions and 2-D rope, pixel shuffle and a two-layer MLP adapter, then one linear projection.

The graph, in NumPy axis order: the unfold "convolution" (HF's ``Llama4UnfoldConvolution``: a linear map of each
patch's ``(channel, row, col)`` values, no bias; the converter stores it as ``[E, 3*p*p]``), the class token
appended after the patches, the learned table (``n_patches + 1`` rows) added, ``v.pre_ln``; pre-norm blocks with
LayerNorm, attention with biases and 2-D rope on q and k (``build_rope_2d`` without interleaved frequencies: the
first half of each head an adjacent-pair rope over the column + 1, the second half over the row + 1, the class
token at 0, HF's complex ``freqs_ci``), FFN (GELU); ``v.post_ln``; the class token dropped; pixel shuffle by
``clip.vision.projector.scale_factor`` (HF's ``pixel_shuffle_ratio = 0.5``; the same layout as SmolVLM's,
``siglip.pixel_shuffle``); ``mm.model.mlp.1`` -> GELU -> ``mm.model.mlp.2`` -> GELU (no biases);
``mm.model.fc`` (HF's ``multi_modal_projector.linear_1``). GELU is ggml's (tanh), as llama.cpp runs it
(``clip.use_gelu``); HF's model uses the erf GELU, 1e-3 apart.

Preprocessing is Hugging Face's ``Llama4ImageProcessor`` (Meta's own, with its defaults: ``max_patches`` 16 tiles of
``clip.vision.image_size``, ``resize_to_max_canvas`` false): the canvas is the ``a x b`` tile grid (``a * b <= 16``)
with the smallest scale >= 1 that fits the image without distortion (else the largest below 1), the smallest
area on ties (``get_best_fit``, in float32 as HF's tensors); the image is resized without distortion into that
canvas, but upscaled no further than one tile per side (bilinear), padded with black on the right and at the
bottom, normalized in bfloat16 (HF: "as in the original implementation"; the values here are those bfloat16
numbers) and cut into tiles row-major; with more than one tile the whole image stretched to one tile follows.
Resampling is Pillow's, whose antialiased filters torchvision's (HF's) port: within 1-2 levels of 255 per
pixel. Tokens (``Llama4Processor``, also llama.cpp's ``MTMD_SLICE_TMPL_LLAMA4``): ``<|image_start|>``, each tile,
with ``<|tile_x_separator|>`` between the tiles of a row and ``<|tile_y_separator|>`` after each row, then
``<|image|>`` and the last frame, ``<|image_end|>``; a 1 x 1 grid is that one padded tile alone. llama.cpp
differs (``mtmd_image_preprocessor_llava_uhd`` with the pinpoints of ``set_llava_uhd_res_candidates(model, 3)``):
grids up to 3 x 3 chosen by llava-1.6's ``select_best_resolution``, the image fitted and centred in the grid
(bicubic), an image within one tile stretched to it, and the overview after every grid, in float32.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from ..ggml import ops
from ..ggml.tensor import Tensor
from ..ggml.types import GGMLType
from .clip import ClipHParams, Projector, register_projector
from .errors import MtmdError
from .image import Bitmap, _resize
from .siglip import _act, _linear, _norm, pixel_shuffle

if TYPE_CHECKING:
    from ..model.blocks import TensorLoader
    from .clip import ClipModel

__all__ = ["LLAMA4", "best_fit", "frames", "pieces", "supported_resolutions"]

LLAMA4 = "llama4"
ROPE_BASE = 10000.0
MAX_CHUNKS = 16  # Llama4ImageProcessor's max_patches (tiles per image)


# -- preprocessing ----------------------------------------------------------------------------------
def supported_resolutions(tile: int, max_chunks: int = MAX_CHUNKS) -> list[tuple[int, int]]:
    """``(height, width)`` canvases of ``a x b <= max_chunks`` tiles in HF's order (find_supported_resolutions:
    by aspect ratio as first met from ``max_chunks`` tiles down)."""
    by_ratio: dict[float, list[tuple[int, int]]] = {}
    for n in range(max_chunks, 0, -1):
        for f in sorted({d for i in range(1, math.isqrt(n) + 1) if n % i == 0 for d in (i, n // i)}):
            by_ratio.setdefault(f / (n // f), []).append((f, n // f))
    return [(h * tile, w * tile) for v in by_ratio.values() for h, w in v]


def best_fit(h: int, w: int, resolutions: list[tuple[int, int]]) -> tuple[int, int]:
    """HF's ``get_best_fit`` (scales in float32, as its tensors): the smallest upscale, else the least downscale;
    the smallest canvas on ties."""
    res = np.asarray(resolutions, dtype=np.int64)
    scales = np.minimum(
        res[:, 1].astype(np.float32) / np.float32(w), res[:, 0].astype(np.float32) / np.float32(h)
    )
    up = scales[scales >= 1]
    sel = up.min() if len(up) else scales[scales < 1].max()
    chosen = res[scales == sel]
    th, tw = chosen[int(np.argmin(chosen[:, 0] * chosen[:, 1]))]
    return int(th), int(tw)


def _no_distortion(h: int, w: int, th: int, tw: int, th_f32: bool, tw_f32: bool) -> tuple[int, int]:
    """HF's ``get_max_res_without_distortion``; a target side that is still HF's tensor element (``*_f32``)
    makes its scale a float32, as there."""
    sw = np.float32(tw) / np.float32(w) if tw_f32 else tw / w
    sh = np.float32(th) / np.float32(h) if th_f32 else th / h
    less = np.float32(sw) < np.float32(sh) if (tw_f32 or th_f32) else sw < sh
    if less:
        return min(math.floor(np.float32(h) * sw if tw_f32 else h * sw), th), tw
    return th, min(math.floor(np.float32(w) * sh if th_f32 else w * sh), tw)


def _bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> the nearest bfloat16 (ties to even), as float32."""
    b = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return b.astype(np.uint32).view(np.float32)


def _normalize_bf16(img: np.ndarray, hp: ClipHParams) -> np.ndarray:
    """``F32[3, H, W]``: Llama4ImageProcessor.rescale_and_normalize (bfloat16 ``x * (1/255)``, ``- mean``,
    ``/ std``, each rounded)."""
    x = _bf16(img.astype(np.float32) * np.float32(1 / 255))
    x = _bf16(x - _bf16(np.asarray(hp.image_mean, dtype=np.float32)))
    x = _bf16(x / _bf16(np.asarray(hp.image_std, dtype=np.float32)))
    return np.ascontiguousarray(x.transpose(2, 0, 1))


def frames(bmp: Bitmap, hp: ClipHParams) -> tuple[list[np.ndarray], int, int]:
    """The normalized ``F32[3, tile, tile]`` frames of one image and the grid's ``(rows, cols)``: the tiles
    row-major, then (more than one tile) the whole image stretched to one tile."""
    tile, h, w = hp.image_size, bmp.height, bmp.width
    th, tw = best_fit(h, w, supported_resolutions(tile))
    # HF's min(max(side, tile), target): the target (a tensor element there) when strictly smaller
    nth, ntw = min(max(h, tile), th), min(max(w, tile), tw)
    nh, nw = _no_distortion(h, w, nth, ntw, th < max(h, tile), tw < max(w, tile))
    canvas = np.zeros((th, tw, 3), dtype=np.uint8)
    canvas[: max(nh, 1), : max(nw, 1)] = _resize(bmp.data, max(nw, 1), max(nh, 1), "bilinear")
    px = _normalize_bf16(canvas, hp)
    rows, cols = th // tile, tw // tile
    out = [px[:, y : y + tile, x : x + tile] for y in range(0, th, tile) for x in range(0, tw, tile)]
    if rows * cols > 1:
        out.append(_normalize_bf16(_resize(bmp.data, tile, tile, "bilinear"), hp))
    return [np.ascontiguousarray(f) for f in out], rows, cols


def pieces(bmp: Bitmap, hp: ClipHParams) -> list[str | np.ndarray]:
    """Texts and frames between ``<|image_start|>`` and ``<|image_end|>`` (see the module docstring)."""
    fr, rows, cols = frames(bmp, hp)
    out: list[str | np.ndarray] = []
    if rows * cols > 1:
        for r in range(rows):
            for c in range(cols):
                out.append(fr[r * cols + c])
                out.append("<|tile_x_separator|>" if c < cols - 1 else "<|tile_y_separator|>")
    return [*out, "<|image|>", fr[-1]]


# -- tensors ----------------------------------------------------------------------------------------
def _load(m: ClipModel, t: TensorLoader) -> None:
    hp, md = m.hparams, m.metadata
    sf = md.get("clip.vision.projector.scale_factor")
    if not isinstance(sf, int) or sf < 1:
        raise MtmdError(
            f"{m.path}: llama4 needs clip.vision.projector.scale_factor (a positive integer), got {sf!r}"
        )
    hp.n_merge = sf
    side = hp.n_patches_side
    if side % sf:
        raise MtmdError(f"{m.path}: {side}x{side} patches cannot be shuffled by {sf}")
    e, p = hp.n_embd, hp.patch_size
    dh = e // hp.n_head
    if dh % 4:
        raise MtmdError(f"{m.path}: head size {dh} is not a multiple of 4 (2-D rope)")
    pe = t("v.patch_embd.weight", None)
    if pe is None or tuple(pe.shape) not in ((e, 3 * p * p), (e, 3, p, p)):
        raise MtmdError(f"{m.path}: tensor 'v.patch_embd.weight' has shape {getattr(pe, 'shape', None)}; "
                        f"expected ({e}, {3 * p * p})")  # fmt: skip
    t("v.class_embd", (e,))
    t("v.position_embd.weight", (side * side + 1, e))
    for n in ("pre_ln", "post_ln"):
        t(f"v.{n}.weight", (e,))
        t(f"v.{n}.bias", (e,))
    for il in range(hp.n_layer):
        b = f"v.blk.{il}."
        for n in ("attn_q", "attn_k", "attn_v", "attn_out"):
            t(b + n + ".weight", (e, e))
            t(b + n + ".bias", (e,), required=False)
        for n in ("ln1", "ln2"):
            t(b + n + ".weight", (e,))
            t(b + n + ".bias", (e,))
        t(b + "ffn_up.weight", (hp.n_ff, e))
        t(b + "ffn_up.bias", (hp.n_ff,), required=False)
        t(b + "ffn_down.weight", (e, hp.n_ff))
        t(b + "ffn_down.bias", (e,), required=False)
    n_in = e * sf * sf
    w1 = t("mm.model.mlp.1.weight", None)
    if w1 is None or len(w1.shape) != 2 or w1.shape[1] != n_in:
        raise MtmdError(f"{m.path}: tensor 'mm.model.mlp.1.weight' has shape {getattr(w1, 'shape', None)}; "
                        f"expected (N, {n_in})")  # fmt: skip
    w2 = t("mm.model.mlp.2.weight", None)
    if w2 is None or len(w2.shape) != 2 or w2.shape[1] != w1.shape[0]:
        raise MtmdError(f"{m.path}: tensor 'mm.model.mlp.2.weight' has shape {getattr(w2, 'shape', None)}; "
                        f"expected (N, {w1.shape[0]})")  # fmt: skip
    fc = t("mm.model.fc.weight", None)
    if fc is None or len(fc.shape) != 2 or fc.shape[1] != w2.shape[0]:
        raise MtmdError(f"{m.path}: tensor 'mm.model.fc.weight' has shape {getattr(fc, 'shape', None)}; "
                        f"expected (n_embd of the text model, {w2.shape[0]})")  # fmt: skip
    m._n_mmproj_embd = fc.shape[0]


# -- graph ------------------------------------------------------------------------------------------
def rope_2d(x: Tensor, pos_w: Tensor, pos_h: Tensor, base: float = ROPE_BASE) -> Tensor:
    """``build_rope_2d(x, pos_w, pos_h, base, interleave_freq=false)`` of ``x F32[P, H, d]``."""
    n, nh, d = x.shape
    half = d // 2
    strides = (nh * d * 4, d * 4, 4)
    a = ops.cont(ops.view(x, (n, nh, half), strides, offset=0))
    b = ops.cont(ops.view(x, (n, nh, half), strides, offset=half * 4))
    a = ops.rope(a, pos_w, half, mode=0, freq_base=base)
    b = ops.rope(b, pos_h, half, mode=0, freq_base=base)
    return ops.concat(a, b, axis=2)


def _build(m: ClipModel, inp_raw: Tensor) -> Tensor:
    hp, w = m.hparams, m.w
    c, h_px, w_px = inp_raw.shape
    if h_px != hp.image_size or w_px != hp.image_size:
        raise MtmdError(f"encode: a llama4 tile is {hp.image_size}x{hp.image_size} px, got {w_px}x{h_px}")
    e, nh, p, side = hp.n_embd, hp.n_head, hp.patch_size, hp.n_patches_side
    dh = e // nh
    n_p = side * side
    n = n_p + 1
    # unfold: [C*side, p, side, p] -> [side*side, C*p*p] in (channel, row, col) order
    x = ops.reshape(inp_raw, (c * side, p, side, p))
    x = ops.cont(ops.permute(x, (0, 2, 1, 3)))
    x = ops.reshape(x, (c, n_p, p * p))
    x = ops.cont(ops.permute(x, (1, 0, 2)))
    x = ops.reshape(x, (n_p, c * p * p), name="inp_patches")
    x = ops.mul_mat(ops.reshape(w["v.patch_embd.weight"], (e, c * p * p)), x, name="patch_conv")
    x = ops.concat(x, ops.reshape(w["v.class_embd"], (1, e)), axis=0)  # the class token last
    x = ops.add(x, w["v.position_embd.weight"], name="pos_embed")
    x = _norm(x, w["v.pre_ln.weight"], w["v.pre_ln.bias"], hp.eps)
    rows, cols = np.divmod(np.arange(n_p, dtype=np.int32), side)
    pos_w = ops.weight("pos_w", GGMLType.I32, (n,), np.append(cols + 1, 0).astype(np.int32))
    pos_h = ops.weight("pos_h", GGMLType.I32, (n,), np.append(rows + 1, 0).astype(np.int32))
    for il in range(hp.n_layer):
        b = f"v.blk.{il}."
        cur = _norm(x, w[b + "ln1.weight"], w[b + "ln1.bias"], hp.eps)
        q = ops.reshape(_linear(cur, w[b + "attn_q.weight"], w.get(b + "attn_q.bias")), (n, nh, dh))
        k = ops.reshape(_linear(cur, w[b + "attn_k.weight"], w.get(b + "attn_k.bias")), (n, nh, dh))
        v = ops.reshape(_linear(cur, w[b + "attn_v.weight"], w.get(b + "attn_v.bias")), (n, nh, dh))
        q, k = rope_2d(q, pos_w, pos_h), rope_2d(k, pos_w, pos_h)
        a = ops.flash_attn_ext(q, k, v, None, 1.0 / math.sqrt(dh), name=f"kqv_out-{il}")
        a = _linear(ops.reshape(a, (n, e)), w[b + "attn_out.weight"], w.get(b + "attn_out.bias"))
        x = ops.add(a, x, name=f"ffn_inp-{il}")
        cur = _norm(x, w[b + "ln2.weight"], w[b + "ln2.bias"], hp.eps)
        cur = _act(_linear(cur, w[b + "ffn_up.weight"], w.get(b + "ffn_up.bias")), hp.ffn_op)
        cur = _linear(cur, w[b + "ffn_down.weight"], w.get(b + "ffn_down.bias"))
        x = ops.add(x, cur, name=f"layer_out-{il}")
    x = _norm(x, w["v.post_ln.weight"], w["v.post_ln.bias"], hp.eps)
    x = ops.cont(ops.view(x, (n_p, e), (4 * e, 4), offset=0))  # drop the class token
    x = pixel_shuffle(x, side, hp.n_merge)
    x = ops.gelu(ops.mul_mat(w["mm.model.mlp.1.weight"], x))
    x = ops.gelu(ops.mul_mat(w["mm.model.mlp.2.weight"], x))
    return ops.mul_mat(w["mm.model.fc.weight"], x, name="mm_out")


def _n_tokens(hp: ClipHParams, width: int, height: int) -> int:
    return (hp.n_patches_side // hp.n_merge) ** 2


register_projector(Projector(LLAMA4, _load, _build, _n_tokens, resample="bicubic", stretch=True))
