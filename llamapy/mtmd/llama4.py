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

Preprocessing is llama.cpp's (``mtmd_image_preprocessor_llava_uhd`` with the pinpoints of
``set_llava_uhd_res_candidates(model, 3)``): an image no larger than the tile (``clip.vision.image_size``) on
both sides is the overview alone, stretched to the tile (bicubic). A larger one picks the grid among ``a x b``
tiles (1..3 each, not 1 x 1) with llava-1.6's ``select_best_resolution``, is fitted into it keeping its aspect
ratio and centred on black (bicubic), cut into tiles row-major, then the overview follows. Tokens (HF's
``Llama4Processor`` and llama.cpp's ``MTMD_SLICE_TMPL_LLAMA4``): ``<|image_start|>``, each tile, with
``<|tile_x_separator|>`` between the tiles of a row and ``<|tile_y_separator|>`` after each row, then
``<|image|>`` and the overview, ``<|image_end|>``. (The llama.cpp revision in the sdist at hand dropped the tile
and ``<|image|>`` tokens in a refactor; the layout here is the one the model was trained with. HF's image
processor needs torchvision and picks its grid differently, by resizing without padding.)
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
from .image import Bitmap, _normalize, _resize
from .internvl import select_best_resolution
from .qwen2vl import _fit
from .siglip import _act, _linear, _norm, pixel_shuffle

if TYPE_CHECKING:
    from ..model.blocks import TensorLoader
    from .clip import ClipModel

__all__ = ["LLAMA4", "frames", "grid_candidates", "pieces"]

LLAMA4 = "llama4"
ROPE_BASE = 10000.0
MAX_TILES_PER_SIDE = 3


# -- preprocessing ----------------------------------------------------------------------------------
def grid_candidates(tile: int, n: int = MAX_TILES_PER_SIDE) -> list[tuple[int, int]]:
    """``(width, height)`` pixel sizes of the tile grids, in llama.cpp's order (set_llava_uhd_res_candidates)."""
    return [(x * tile, y * tile) for x in range(1, n + 1) for y in range(1, n + 1) if (x, y) != (1, 1)]


def frames(bmp: Bitmap, hp: ClipHParams) -> tuple[list[np.ndarray], int, int]:
    """The normalized ``F32[3, tile, tile]`` frames of one image: the tiles row-major then the overview, and
    ``(rows, cols)`` of the tiles (``(0, 0)``: the overview alone)."""
    tile = hp.image_size
    overview = _normalize(_resize(bmp.data, tile, tile, "bicubic"), hp.image_mean, hp.image_std)
    if bmp.width <= tile and bmp.height <= tile:
        return [overview], 0, 0
    rw, rh = select_best_resolution(bmp.width, bmp.height, grid_candidates(tile))
    refined = _fit(bmp.data, rw, rh, True)
    tiles = [
        _normalize(refined[y : y + tile, x : x + tile], hp.image_mean, hp.image_std)
        for y in range(0, rh, tile)
        for x in range(0, rw, tile)
    ]
    return [*tiles, overview], rh // tile, rw // tile


def pieces(bmp: Bitmap, hp: ClipHParams) -> list[str | np.ndarray]:
    """Texts and frames between ``<|image_start|>`` and ``<|image_end|>`` (see the module docstring)."""
    fr, rows, cols = frames(bmp, hp)
    out: list[str | np.ndarray] = []
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
