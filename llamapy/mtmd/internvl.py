"""InternVL 2.5 / 3 vision (llama.cpp's projector type ``internvl``, ``tools/mtmd/models/internvl.cpp``): the
300M InternViT, pixel shuffle, and an MLP projector; images cut into tiles.

The graph, in NumPy axis order: patch embedding (with bias), the class token, learned positions, pre-norm blocks
with LayerNorm, attention and FFN (GELU) each scaled by a per-channel layer scale (``v.blk.N.ls1`` / ``ls2``,
HF's ``lambda_1`` / ``lambda_2``) before the residual add; the class token dropped; pixel shuffle by
``clip.vision.projector.scale_factor`` (2: HF's ``downsample_ratio = 0.5``, as SmolVLM's, ``siglip.pixel_shuffle``);
LayerNorm (``mm.model.mlp.0``, eps 1e-5), ``mm.model.mlp.1`` -> GELU (ggml's, tanh) -> ``mm.model.mlp.3``.

The class token goes first, with position 0 of the table, as HF and the original InternViT put it. llama.cpp's
graph appends it after the patches and adds the same table, so there every patch takes the position of the one
before it (a difference from the reference models; ours follows them). The 6B InternViT (RMS norm, q/k norm) is
not supported: its extra tensors make the file refused.

Preprocessing (``frames``) is llama.cpp's ``mtmd_image_preprocessor_internvl`` (llava-uhd with pinpoints): an
image no larger than the tile (``clip.vision.image_size``) on both sides is one tile, stretched to it (bicubic).
A larger one picks the grid ``a x b`` (``clip.vision.preproc_min_tiles``..``preproc_max_tiles`` tiles, default
1..12) with llava-1.6's ``select_best_resolution`` (most of the image's pixels kept, then least padding), is fitted
into ``a*tile x b*tile`` keeping its aspect ratio and centred on black (bicubic), cut into tiles row-major, and
followed by the whole image stretched to one tile. All go between ``<img>`` and ``</img>`` with nothing between the
tiles. HF's ``GotOcr2ImageProcessor`` (``crop_to_patches``) differs: it picks the grid with the closest aspect ratio
and stretches the image to it (no padding); for an image of one tile both give the same pixels.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from ..ggml import ops
from ..ggml.tensor import Tensor
from .clip import ClipHParams, Projector, register_projector
from .errors import MtmdError
from .image import Bitmap, _normalize, _resize
from .qwen2vl import _fit
from .siglip import _act, _linear, _norm, patch_embed, pixel_shuffle

if TYPE_CHECKING:
    from ..model.blocks import TensorLoader
    from .clip import ClipModel

__all__ = ["INTERNVL", "frames", "grid_candidates", "pieces", "select_best_resolution"]

INTERNVL = "internvl"
PROJ = "mm.model.mlp.{}."
_F = np.float32


# -- preprocessing ----------------------------------------------------------------------------------
def grid_candidates(tile: int, min_tiles: int, max_tiles: int) -> list[tuple[int, int]]:
    """``(width, height)`` pixel sizes of the tile grids, in llama.cpp's order (set_internvl_dhr_res_candidates)."""
    out = []
    for a in range(min_tiles, max_tiles + 1):
        b_lo = max((min_tiles + a - 1) // a, min_tiles)
        b_hi = min(max_tiles // a, max_tiles)
        out += [(a * tile, b * tile) for b in range(b_lo, b_hi + 1)]
    return out


def select_best_resolution(width: int, height: int, candidates: list[tuple[int, int]]) -> tuple[int, int]:
    """llava-1.6's choice: the candidate keeping most of the image's pixels, then wasting the least area."""
    best, best_eff, best_waste = candidates[0], 0, None
    for cw, ch in candidates:
        scale = min(_F(cw) / _F(width), _F(ch) / _F(height))
        tw, th = int(_F(width) * scale), int(_F(height) * scale)
        eff = min(tw * th, width * height)
        waste = cw * ch - eff
        if eff > best_eff or (eff == best_eff and best_waste is not None and waste < best_waste):
            best, best_eff, best_waste = (cw, ch), eff, waste
    return best


def frames(bmp: Bitmap, hp: ClipHParams) -> list[np.ndarray]:
    """The normalized ``F32[3, tile, tile]`` frames of one image: the tiles row-major, then the overview (or the
    image alone when it fits one tile)."""
    tile = hp.image_size
    overview = _normalize(_resize(bmp.data, tile, tile, "bicubic"), hp.image_mean, hp.image_std)
    if bmp.width <= tile and bmp.height <= tile:
        return [overview]
    cands = grid_candidates(tile, hp.extra["min_tiles"], hp.extra["max_tiles"])
    rw, rh = select_best_resolution(bmp.width, bmp.height, cands)
    refined = _fit(bmp.data, rw, rh, True)
    out = [
        _normalize(refined[y : y + tile, x : x + tile], hp.image_mean, hp.image_std)
        for y in range(0, rh, tile)
        for x in range(0, rw, tile)
    ]
    return [*out, overview]


def pieces(bmp: Bitmap, hp: ClipHParams) -> list[str | np.ndarray]:
    """The frames back to back, no text between them (mtmd.cpp's InternVL layout)."""
    return list(frames(bmp, hp))


# -- tensors ----------------------------------------------------------------------------------------
def _load(m: ClipModel, t: TensorLoader) -> None:
    hp, md = m.hparams, m.metadata
    sf = md.get("clip.vision.projector.scale_factor", 2)
    if not isinstance(sf, int) or sf < 1:
        raise MtmdError(
            f"{m.path}: clip.vision.projector.scale_factor must be a positive integer, got {sf!r}"
        )
    hp.n_merge = sf
    if hp.n_patches_side % sf:
        raise MtmdError(
            f"{m.path}: {hp.n_patches_side}x{hp.n_patches_side} patches cannot be shuffled by {sf}"
        )
    lo, hi = md.get("clip.vision.preproc_min_tiles", 1), md.get("clip.vision.preproc_max_tiles", 12)
    if not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi <= 64):
        raise MtmdError(
            f"{m.path}: tile counts clip.vision.preproc_min/max_tiles = {lo!r}/{hi!r} are not 1 <= min <= max <= 64"
        )
    hp.extra["min_tiles"], hp.extra["max_tiles"] = lo, hi
    e, p = hp.n_embd, hp.patch_size
    t("v.patch_embd.weight", (e, 3, p, p))
    t("v.patch_embd.bias", (e,), required=False)
    t("v.class_embd", (e,))
    t("v.position_embd.weight", (hp.n_patches_side**2 + 1, e))
    for il in range(hp.n_layer):
        b = f"v.blk.{il}."
        for n in ("attn_q", "attn_k", "attn_v", "attn_out"):
            t(b + n + ".weight", (e, e))
            t(b + n + ".bias", (e,), required=False)
        for n in ("ln1", "ln2"):
            t(b + n + ".weight", (e,))
            t(b + n + ".bias", (e,))
        t(b + "ls1.weight", (e,), required=False)
        t(b + "ls2.weight", (e,), required=False)
        t(b + "ffn_up.weight", (hp.n_ff, e))
        t(b + "ffn_up.bias", (hp.n_ff,), required=False)
        t(b + "ffn_down.weight", (e, hp.n_ff))
        t(b + "ffn_down.bias", (e,), required=False)
    n_in = e * sf * sf
    t(PROJ.format(0) + "weight", (n_in,))
    t(PROJ.format(0) + "bias", (n_in,))
    w1 = t(PROJ.format(1) + "weight", None)
    if w1 is None or len(w1.shape) != 2 or w1.shape[1] != n_in:
        raise MtmdError(f"{m.path}: tensor '{PROJ.format(1)}weight' has shape {getattr(w1, 'shape', None)}; "
                        f"expected (N, {n_in})")  # fmt: skip
    t(PROJ.format(1) + "bias", (w1.shape[0],))
    w3 = t(PROJ.format(3) + "weight", None)
    if w3 is None or len(w3.shape) != 2 or w3.shape[1] != w1.shape[0]:
        raise MtmdError(f"{m.path}: tensor '{PROJ.format(3)}weight' has shape {getattr(w3, 'shape', None)}; "
                        f"expected (n_embd of the text model, {w1.shape[0]})")  # fmt: skip
    t(PROJ.format(3) + "bias", (w3.shape[0],))
    m._n_mmproj_embd = w3.shape[0]


# -- graph ------------------------------------------------------------------------------------------
def _build(m: ClipModel, inp_raw: Tensor) -> Tensor:
    hp, w = m.hparams, m.w
    _, h_px, w_px = inp_raw.shape
    if h_px != hp.image_size or w_px != hp.image_size:
        raise MtmdError(f"encode: an internvl tile is {hp.image_size}x{hp.image_size} px, got {w_px}x{h_px}")
    e, nh = hp.n_embd, hp.n_head
    dh = e // nh
    x = patch_embed(m, inp_raw)
    n_p = x.shape[0]
    x = ops.concat(ops.reshape(w["v.class_embd"], (1, e)), x, axis=0)  # the class token first (HF)
    # (llama.cpp's converter keeps HF's [1, n + 1, e] table: 3-D in its files)
    x = ops.add(x, ops.reshape(w["v.position_embd.weight"], (n_p + 1, e)), name="pos_embed")
    n = n_p + 1
    for il in range(hp.n_layer):
        b = f"v.blk.{il}."
        cur = _norm(x, w[b + "ln1.weight"], w[b + "ln1.bias"], hp.eps)
        q = ops.reshape(_linear(cur, w[b + "attn_q.weight"], w.get(b + "attn_q.bias")), (n, nh, dh))
        k = ops.reshape(_linear(cur, w[b + "attn_k.weight"], w.get(b + "attn_k.bias")), (n, nh, dh))
        v = ops.reshape(_linear(cur, w[b + "attn_v.weight"], w.get(b + "attn_v.bias")), (n, nh, dh))
        a = ops.flash_attn_ext(q, k, v, None, 1.0 / math.sqrt(dh), name=f"kqv_out-{il}")
        a = _linear(ops.reshape(a, (n, e)), w[b + "attn_out.weight"], w.get(b + "attn_out.bias"))
        if b + "ls1.weight" in w:
            a = ops.mul(a, w[b + "ls1.weight"])
        x = ops.add(a, x, name=f"ffn_inp-{il}")
        cur = _norm(x, w[b + "ln2.weight"], w[b + "ln2.bias"], hp.eps)
        cur = _act(_linear(cur, w[b + "ffn_up.weight"], w.get(b + "ffn_up.bias")), hp.ffn_op)
        cur = _linear(cur, w[b + "ffn_down.weight"], w.get(b + "ffn_down.bias"))
        if b + "ls2.weight" in w:
            cur = ops.mul(cur, w[b + "ls2.weight"])
        x = ops.add(x, cur, name=f"layer_out-{il}")
    x = ops.cont(ops.view(x, (n_p, e), (4 * e, 4), offset=4 * e))  # drop the class token
    x = pixel_shuffle(x, hp.n_patches_side, hp.n_merge)
    x = _norm(x, w[PROJ.format(0) + "weight"], w[PROJ.format(0) + "bias"], 1e-5)
    x = ops.gelu(_linear(x, w[PROJ.format(1) + "weight"], w[PROJ.format(1) + "bias"]))
    return _linear(x, w[PROJ.format(3) + "weight"], w[PROJ.format(3) + "bias"])


def _n_tokens(hp: ClipHParams, width: int, height: int) -> int:
    return (hp.n_patches_side // hp.n_merge) ** 2


register_projector(Projector(INTERNVL, _load, _build, _n_tokens, resample="bicubic", stretch=True))
