"""LFM2-VL vision (llama.cpp's projector type ``lfm2``, ``tools/mtmd/models/siglip.cpp``'s LFM2 branch): a SigLIP2
NaFlex tower at the image's own size, pixel unshuffle, LayerNorm and an MLP; big images cut into 512 px tiles.

The graph, in NumPy axis order: patch embedding (the converter stores HF's linear patch embedding as a conv kernel),
the learned position table (``side x side``) resized to the patch grid with antialiased bilinear interpolation
(``ggml_interpolate(BILINEAR | ANTIALIAS)``, HF's ``F.interpolate(mode="bilinear", antialias=True)``), done here as
one constant ``[h*w, side*side]`` matrix times the table; ``siglip.build_vit`` (LayerNorm, GELU, ``v.post_ln``);
pixel unshuffle by ``clip.vision.projector.scale_factor`` (rows of ``f x f`` patch blocks as SmolVLM's, for any
``h x w`` grid); ``mm.input_norm`` (LayerNorm, eps 1e-5, optional), ``mm.1`` -> GELU (tanh) -> ``mm.2``.

Preprocessing is llama.cpp's ``mtmd_image_preprocessor_lfm2``: 64..256 tokens of ``patch * f`` px. An image whose
rounded size is at most twice the token budget is one frame: resized (bilinear, stretched) to ``smart_resize``'s
size (``qwen2vl.smart_resize``). A bigger one is cut into a grid of 512 px tiles (2..10 tiles, the grid whose aspect
ratio is closest, ties to the larger when the image covers half of it), the image fitted into the grid keeping its
aspect ratio and centred on black (bilinear), then a thumbnail at ``smart_resize``'s size. Tokens:
``<|image_start|>`` then, tiled, ``<|img_row_R_col_C|>`` before each tile and ``<|img_thumbnail|>`` before the
thumbnail, then ``<|image_end|>``. Not compared with HF's ``Lfm2VlImageProcessor`` (it needs torchvision, which
the tests do not install); the model is checked on the frames this module makes.
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
from .qwen2vl import smart_resize
from .siglip import _linear, _norm, build_vit, load_vit, patch_embed

if TYPE_CHECKING:
    from ..model.blocks import TensorLoader
    from .clip import ClipModel

__all__ = ["LFM2", "aa_bilinear_matrix", "frames", "grid_layout", "pieces"]

LFM2 = "lfm2"
MIN_TOKENS, MAX_TOKENS = 64, 256
MIN_TILES, MAX_TILES, TILE, TOLERANCE = 2, 10, 512, 2.0
_F = np.float32


# -- preprocessing ----------------------------------------------------------------------------------
def _fit(src: np.ndarray, w: int, h: int) -> np.ndarray:
    """``src`` fitted into ``w x h`` keeping its aspect ratio, centred on black (img_tool::resize, PAD_CEIL)."""
    sw, sh = src.shape[1], src.shape[0]
    scale = min(_F(w) / _F(sw), _F(h) / _F(sh))
    nw = min(int(math.ceil(float(_F(sw) * scale))), w)
    nh = min(int(math.ceil(float(_F(sh) * scale))), h)
    out = np.zeros((h, w, 3), dtype=np.uint8)
    x0, y0 = (w - nw) // 2, (h - nh) // 2
    out[y0 : y0 + nh, x0 : x0 + nw] = _resize(src, nw, nh, "bilinear")
    return out


def grid_layout(width: int, height: int) -> tuple[int, int]:
    """``(cols, rows)`` of 512 px tiles (mtmd_image_preprocessor_lfm2::get_grid_layout)."""
    ratios = sorted(
        {(w, h) for n in range(MIN_TILES, MAX_TILES + 1) for w in range(1, n + 1) for h in range(1, n + 1)
         if MIN_TILES <= w * h <= MAX_TILES},
        key=lambda r: (r[0] * r[1], r),
    )  # fmt: skip
    aspect = _F(width) / _F(height)
    area = _F(width * height)
    best, best_diff = (1, 1), np.inf
    for w, h in ratios:
        diff = abs(aspect - _F(w) / _F(h))
        if diff < best_diff:
            best, best_diff = (w, h), diff
        elif diff == best_diff and area > _F(0.5) * _F(TILE * TILE * w * h):
            best = (w, h)
    return best


def frames(bmp: Bitmap, hp: ClipHParams) -> tuple[list[np.ndarray], int, int]:
    """The normalized frames of one image: ``([frame], 0, 0)``, or the tiles row-major then the thumbnail and
    ``(rows, cols)``."""
    align = hp.patch_size * hp.n_merge
    area = align * align
    lo, hi = (
        hp.extra.get("image_min_tokens", MIN_TOKENS) * area,
        hp.extra.get("image_max_tokens", MAX_TOKENS) * area,
    )
    oh, ow = smart_resize(bmp.height, bmp.width, align, lo, hi)
    overview = _normalize(_resize(bmp.data, ow, oh, "bilinear"), hp.image_mean, hp.image_std)
    h_bar = max(hp.patch_size, round(bmp.height / align) * align)
    w_bar = max(hp.patch_size, round(bmp.width / align) * align)
    if h_bar * w_bar <= hi * TOLERANCE:
        return [overview], 0, 0
    cols, rows = grid_layout(bmp.width, bmp.height)
    refined = _fit(bmp.data, TILE * cols, TILE * rows)
    tiles = [
        _normalize(refined[r * TILE : (r + 1) * TILE, c * TILE : (c + 1) * TILE], hp.image_mean, hp.image_std)
        for r in range(rows)
        for c in range(cols)
    ]
    return [*tiles, overview], rows, cols


def pieces(bmp: Bitmap, hp: ClipHParams) -> list[str | np.ndarray]:
    """The frames with the marker text before each tile and before the thumbnail (mtmd.cpp's LFM2 template)."""
    fr, rows, cols = frames(bmp, hp)
    if rows == 0:
        return fr
    out: list[str | np.ndarray] = []
    for k, f in enumerate(fr[:-1]):
        out += [f"<|img_row_{k // cols + 1}_col_{k % cols + 1}|>", f]
    return [*out, "<|img_thumbnail|>", fr[-1]]


# -- tensors ----------------------------------------------------------------------------------------
def _load(m: ClipModel, t: TensorLoader) -> None:
    hp, md = m.hparams, m.metadata
    f = md.get("clip.vision.projector.scale_factor", 2)
    if not isinstance(f, int) or f < 1:
        raise MtmdError(f"{m.path}: clip.vision.projector.scale_factor must be a positive integer, got {f!r}")
    hp.n_merge = f
    hp.extra.setdefault("image_min_tokens", MIN_TOKENS)
    hp.extra.setdefault("image_max_tokens", MAX_TOKENS)
    load_vit(m, t, post_ln=None)
    n_in = hp.n_embd * f * f
    if t("mm.input_norm.weight", (n_in,), required=False) is not None:
        t("mm.input_norm.bias", (n_in,), required=False)
    w1 = t("mm.1.weight", None)
    if w1 is None or len(w1.shape) != 2 or w1.shape[1] != n_in:
        raise MtmdError(
            f"{m.path}: tensor 'mm.1.weight' has shape {getattr(w1, 'shape', None)}; expected (N, {n_in})"
        )
    t("mm.1.bias", (w1.shape[0],), required=False)
    w2 = t("mm.2.weight", None)
    if w2 is None or len(w2.shape) != 2 or w2.shape[1] != w1.shape[0]:
        raise MtmdError(
            f"{m.path}: tensor 'mm.2.weight' has shape {getattr(w2, 'shape', None)}; expected (N, {w1.shape[0]})"
        )
    t("mm.2.bias", (w2.shape[0],), required=False)
    m._n_mmproj_embd = w2.shape[0]


# -- graph ------------------------------------------------------------------------------------------
def _aa_weights(n_in: int, n_out: int) -> np.ndarray:
    """``[n_out, n_in]``: antialiased linear (triangle) resampling, align_corners=False (torch's / Pillow's)."""
    scale = n_in / n_out
    support = max(scale, 1.0)
    out = np.zeros((n_out, n_in), dtype=np.float64)
    for i in range(n_out):
        center = scale * (i + 0.5)
        lo, hi = max(int(center - support + 0.5), 0), min(int(center + support + 0.5), n_in)
        j = np.arange(lo, hi)
        w = np.maximum(0.0, 1.0 - np.abs((j - center + 0.5) / support))
        out[i, lo:hi] = w / w.sum()
    return out


def aa_bilinear_matrix(side: int, h: int, w: int) -> np.ndarray:
    """``F32[h*w, side*side]``: the ``side x side`` grid resized to ``h x w`` (row-major both)."""
    return np.kron(_aa_weights(side, h), _aa_weights(side, w)).astype(np.float32)


def _unshuffle(x: Tensor, h: int, w: int, f: int) -> Tensor:
    """``[h*w, E]`` -> ``[(h/f)*(w/f), E*f*f]``: each f x f block of patches one token (HF Lfm2Vl's
    pixel_unshuffle, llama.cpp's build_patch_merge_permute)."""
    e = x.shape[1]
    t = ops.reshape(x, (h, w // f, e * f))
    t = ops.cont(ops.permute(t, (1, 0, 2)))  # [w/f, h, E*f]
    t = ops.reshape(t, (w // f, h // f, e * f * f))
    t = ops.cont(ops.permute(t, (1, 0, 2)))  # [h/f, w/f, E*f*f]
    return ops.reshape(t, ((h // f) * (w // f), e * f * f), name="pixel_unshuffle")


def _build(m: ClipModel, inp_raw: Tensor) -> Tensor:
    hp, w = m.hparams, m.w
    _, h_px, w_px = inp_raw.shape
    p, f = hp.patch_size, hp.n_merge
    if h_px % (p * f) or w_px % (p * f):
        raise MtmdError(
            f"encode: image {w_px}x{h_px} is not a multiple of {p * f} px (patch size x scale factor)"
        )
    gh, gw = h_px // p, w_px // p
    side = hp.n_patches_side
    table = w["v.position_embd.weight"]
    if (gh, gw) == (side, side):
        pos = table
    else:
        mat = aa_bilinear_matrix(side, gh, gw)
        mt = ops.weight("pos_resize", GGMLType.F32, mat.shape, mat)
        pos = ops.mul_mat(ops.cont(ops.transpose(table)), mt, name="pos_resized")  # [gh*gw, E]
    x = build_vit(m, patch_embed(m, inp_raw), pos)
    x = _unshuffle(x, gh, gw, f)
    if "mm.input_norm.weight" in w:
        x = _norm(x, w["mm.input_norm.weight"], w.get("mm.input_norm.bias"), 1e-5)
    x = ops.gelu(_linear(x, w["mm.1.weight"], w.get("mm.1.bias")))
    return _linear(x, w["mm.2.weight"], w.get("mm.2.bias"))


def _n_tokens(hp: ClipHParams, width: int, height: int) -> int:
    n = hp.patch_size * hp.n_merge
    return (width // n) * (height // n)


register_projector(Projector(LFM2, _load, _build, _n_tokens, resample="bilinear", stretch=True))
