"""Kimi-K2.5 vision (llama.cpp's projector type ``kimik25``, ``tools/mtmd/models/kimik25.cpp``): MoonViT at the
image's own size with a bicubically resized position table and 2-D rope, pixel unshuffle, LayerNorm and an MLP.

The graph, in NumPy axis order: the patch embedding (with bias) plus the learned ``H x W`` table
(``v.position_embd.weight``, ``[H, W, E]``) resized to the patch grid with bicubic interpolation (``align_corners``
false, A = -0.75, edge indices clamped: torch's ``F.interpolate(mode="bicubic")`` and HF's fused gather, llama.cpp's
``ggml_interpolate(BICUBIC)``), done as one constant ``[h*w, H*W]`` matrix (the table itself at its own size);
pre-norm blocks (LayerNorm, attention and FFN with biases, GELU tanh) with 2-D rope on q and k: the first half of
each head an adjacent-pair rope over the column, the second over the row (``build_rope_2d`` without interleaved
frequencies, base 10000; llama.cpp's converter permutes q/k from the model's interleaved layout to this split one);
``v.post_ln``; pixel unshuffle by ``clip.vision.projector.scale_factor`` (``(row, col, channel)`` blocks for any grid,
``lfm2._unshuffle``); LayerNorm ``mm.input_norm`` over each patch's ``E`` values (eps ``clip.vision.attention.
layer_norm_epsilon``); ``mm.1`` -> GELU (ggml's, tanh; HF's projector uses the erf one) -> ``mm.2``.

Preprocessing is Hugging Face's ``Kimi_K25ImageProcessor`` (``navit_resize``): scaled by ``min(1, sqrt(max_patches
/ patches), 512 * p / h, 512 * p / w)`` with ``patches = max(1, h // p) * max(1, w // p)`` (sides ``max(1, int(side *
scale))``, never upscaled; Pillow bicubic, which torchvision's antialiased bicubic ports: within a few levels of 255
on downscales), then padded with black on the right and at the bottom to multiples of ``patch_size *
scale_factor``. ``max_patches`` is ``image_max_tokens * scale_factor**2``: 16384 by default (HF's), or from
``clip.vision.image_max_pixels``. llama.cpp instead resizes every image to sides multiples of ``p * k`` between 2
and 4096 tokens (``mtmd_image_preprocessor_dyn_size``, bicubic, centred on black). Tokens: ``<|media_begin|>``
... ``<|media_end|>`` (``<|begin_of_image|>`` ... ``<|end_of_image|>`` when the vocabulary has them: GLM-5.2-V
reuses this tower).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ..ggml import ops
from ..ggml.tensor import Tensor
from ..ggml.types import GGMLType
from .clip import ClipHParams, Projector, register_projector
from .errors import MtmdError
from .image import Bitmap, _normalize, _resize
from .lfm2 import _unshuffle
from .llama4 import rope_2d
from .siglip import _act, _linear, _norm, patch_embed

if TYPE_CHECKING:
    from ..model.blocks import TensorLoader
    from .clip import ClipModel

__all__ = [
    "KIMIK25",
    "bicubic_matrix",
    "build_moonvit",
    "load_moonvit",
    "merge_factor",
    "navit_size",
    "preprocess",
]

KIMIK25 = "kimik25"
MIN_TOKENS, MAX_TOKENS = 2, 4096  # llama.cpp's set_limit_image_tokens(2, 4096); 4096 * 4 = HF's max_patches
MAX_SIDE = 512  # patches a side (HF's size["max_height"])
ROPE_BASE = 10000.0
_A = -0.75


# -- preprocessing ----------------------------------------------------------------------------------
def navit_size(h: int, w: int, p: int, k: int, max_patches: int, max_side: int = MAX_SIDE) -> tuple[int, ...]:
    """``(rh, rw, ph, pw)``: HF's ``navit_resize`` (the resized and the padded size)."""
    n = max(1, h // p) * max(1, w // p)
    s = min(1.0, math.sqrt(max_patches / n), max_side * p / h, max_side * p / w)
    rh, rw = min(max(1, int(h * s)), max_side * p), min(max(1, int(w * s)), max_side * p)
    a = p * k
    return rh, rw, -(-rh // a) * a, -(-rw // a) * a


def preprocess(m: ClipModel, bmp: Bitmap, pad: bool) -> np.ndarray:
    """``F32[3, H, W]`` (see the module docstring; ``pad`` is not used: HF's processor always pads)."""
    hp = m.hparams
    k = hp.n_merge
    rh, rw, ph, pw = navit_size(bmp.height, bmp.width, hp.patch_size, k, hp.extra["image_max_tokens"] * k * k)
    img = np.zeros((ph, pw, 3), dtype=np.uint8)
    img[:rh, :rw] = _resize(bmp.data, rw, rh, "bicubic")
    return _normalize(img, hp.image_mean, hp.image_std)


# -- tensors ----------------------------------------------------------------------------------------
def merge_factor(m: ClipModel) -> int:
    """``clip.vision.projector.scale_factor`` (default 2), checked with the head size (a multiple of 4)."""
    k = m.metadata.get("clip.vision.projector.scale_factor", 2)
    if not isinstance(k, int) or k < 1:
        raise MtmdError(f"{m.path}: clip.vision.projector.scale_factor must be a positive integer, got {k!r}")
    if (m.hparams.n_embd // m.hparams.n_head) % 4:
        raise MtmdError(
            f"{m.path}: head size {m.hparams.n_embd // m.hparams.n_head} is not a multiple of 4 (2-D rope)"
        )
    return k


def _load(m: ClipModel, t: TensorLoader) -> None:
    hp, md = m.hparams, m.metadata
    k = hp.n_merge = merge_factor(m)
    e, p = hp.n_embd, hp.patch_size
    area = (p * k) ** 2
    lo, hi = md.get("clip.vision.image_min_pixels", 0), md.get("clip.vision.image_max_pixels", 0)
    if isinstance(lo, int) and isinstance(hi, int) and lo > 0 and hi > 0:
        hp.extra["image_min_tokens"], hp.extra["image_max_tokens"] = max(lo // area, 1), max(hi // area, 1)
    else:
        hp.extra["image_min_tokens"], hp.extra["image_max_tokens"] = MIN_TOKENS, MAX_TOKENS
    t("v.patch_embd.weight", (e, 3, p, p))
    t("v.patch_embd.bias", (e,), required=False)
    tab = t("v.position_embd.weight", None)
    if tab is None or len(tab.shape) != 3 or tab.shape[2] != e:
        raise MtmdError(f"{m.path}: tensor 'v.position_embd.weight' has shape {getattr(tab, 'shape', None)}; "
                        f"expected (height, width, {e})")  # fmt: skip
    hp.extra["pos_hw"] = (tab.shape[0], tab.shape[1])
    load_moonvit(m, t)


def load_moonvit(m: ClipModel, t: TensorLoader) -> None:
    """MoonViT's blocks, ``v.post_ln`` and the projector (``mm.input_norm``, ``mm.1``, ``mm.2``): all but the
    patch embedding and the position table."""
    hp = m.hparams
    e, k = hp.n_embd, hp.n_merge
    for il in range(hp.n_layer):
        b = f"v.blk.{il}."
        fused = t(b + "attn_qkv.weight", (3 * e, e), required=False) is not None  # llama.cpp's converter's
        if fused:
            t(b + "attn_qkv.bias", (3 * e,), required=False)
        for n in ("attn_out",) if fused else ("attn_q", "attn_k", "attn_v", "attn_out"):
            t(b + n + ".weight", (e, e))
            t(b + n + ".bias", (e,), required=False)
        for n in ("ln1", "ln2"):
            t(b + n + ".weight", (e,))
            t(b + n + ".bias", (e,))
        t(b + "ffn_up.weight", (hp.n_ff, e))
        t(b + "ffn_up.bias", (hp.n_ff,), required=False)
        t(b + "ffn_down.weight", (e, hp.n_ff))
        t(b + "ffn_down.bias", (e,), required=False)
    t("v.post_ln.weight", (e,))
    t("v.post_ln.bias", (e,))
    t("mm.input_norm.weight", (e,))
    t("mm.input_norm.bias", (e,))
    w1 = t("mm.1.weight", None)
    if w1 is None or len(w1.shape) != 2 or w1.shape[1] != e * k * k:
        raise MtmdError(f"{m.path}: tensor 'mm.1.weight' has shape {getattr(w1, 'shape', None)}; "
                        f"expected (N, {e * k * k})")  # fmt: skip
    t("mm.1.bias", (w1.shape[0],))
    w2 = t("mm.2.weight", None)
    if w2 is None or len(w2.shape) != 2 or w2.shape[1] != w1.shape[0]:
        raise MtmdError(f"{m.path}: tensor 'mm.2.weight' has shape {getattr(w2, 'shape', None)}; "
                        f"expected (n_embd of the text model, {w1.shape[0]})")  # fmt: skip
    t("mm.2.bias", (w2.shape[0],))
    m._n_mmproj_embd = w2.shape[0]


# -- graph ------------------------------------------------------------------------------------------
def _cubic(x: np.ndarray) -> np.ndarray:
    x = np.abs(x)
    return np.where(
        x <= 1,
        ((_A + 2) * x - (_A + 3)) * x * x + 1,
        np.where(x < 2, ((_A * x - 5 * _A) * x + 8 * _A) * x - 4 * _A, 0),
    )


def _bicubic_weights(n_in: int, n_out: int) -> np.ndarray:
    """``[n_out, n_in]``: torch's bicubic resampling along one axis (align_corners=False, clamped taps)."""
    out = np.zeros((n_out, n_in), dtype=np.float64)
    scale = n_in / n_out
    for i in range(n_out):
        src = (i + 0.5) * scale - 0.5
        x0 = math.floor(src)
        t = src - x0
        for j, d in zip(range(x0 - 1, x0 + 3), (1 + t, t, 1 - t, 2 - t), strict=True):
            out[i, min(max(j, 0), n_in - 1)] += _cubic(np.asarray(d))
    return out


def bicubic_matrix(th: int, tw: int, h: int, w: int) -> np.ndarray:
    """``F32[h*w, th*tw]``: a ``th x tw`` grid resized to ``h x w`` (row-major both)."""
    return np.kron(_bicubic_weights(th, h), _bicubic_weights(tw, w)).astype(np.float32)


def _interleaved_to_split(x: Tensor) -> Tensor:
    """``F32[P, H, d]`` with MoonViT's interleaved rope pairs (pair ``j`` = dims ``2j, 2j+1``: the column's at
    even ``j``, the row's at odd ``j``, frequency index ``j // 2``) -> ``build_rope_2d``'s split layout (the
    column's pairs, then the row's). Applied to q and k alike, it leaves their dot products unchanged."""
    n, nh, d = x.shape
    t = ops.cont(ops.permute(ops.reshape(x, (n * nh, d // 4, 2, 2)), (0, 2, 1, 3)))
    return ops.reshape(t, (n, nh, d))


def _build(m: ClipModel, inp_raw: Tensor) -> Tensor:
    return build_moonvit(m, inp_raw, merger_eps=m.hparams.eps)


def build_moonvit(
    m: ClipModel,
    inp_raw: Tensor,
    *,
    merger_eps: float,
    interleaved_rope: bool = False,
    act: Callable[[Tensor], Tensor] = ops.gelu,
) -> Tensor:
    """The MoonViT graph (see the module docstring). ``interleaved_rope``: q/k rows in the model's own
    interleaved layout (Kimi-VL files), reordered here to the split one; ``act``: the projector's GELU."""
    hp, w = m.hparams, m.w
    _, h_px, w_px = inp_raw.shape
    p, k, e, nh = hp.patch_size, hp.n_merge, hp.n_embd, hp.n_head
    dh = e // nh
    if h_px % (p * k) or w_px % (p * k):
        raise MtmdError(f"encode: image {w_px}x{h_px} is not a multiple of {p * k} px (patch size x merge)")
    gh, gw = h_px // p, w_px // p
    n = gh * gw
    th, tw = hp.extra["pos_hw"]
    table = ops.reshape(w["v.position_embd.weight"], (th * tw, e))
    if (gh, gw) == (th, tw):
        pos = table
    else:
        mat = bicubic_matrix(th, tw, gh, gw)
        mt = ops.weight("pos_resize", GGMLType.F32, mat.shape, mat)
        pos = ops.mul_mat(ops.cont(ops.transpose(table)), mt, name="pos_resized")  # [gh*gw, E]
    x = ops.add(patch_embed(m, inp_raw), pos, name="pos_embed")
    rows, cols = np.divmod(np.arange(n, dtype=np.int32), gw)
    pos_w = ops.weight("pos_w", GGMLType.I32, (n,), cols.astype(np.int32))
    pos_h = ops.weight("pos_h", GGMLType.I32, (n,), rows.astype(np.int32))
    for il in range(hp.n_layer):
        b = f"v.blk.{il}."
        cur = _norm(x, w[b + "ln1.weight"], w[b + "ln1.bias"], hp.eps)
        if b + "attn_qkv.weight" in w:  # fused (llama.cpp's converter): q, k, v rows one after the other
            qkv = _linear(cur, w[b + "attn_qkv.weight"], w.get(b + "attn_qkv.bias"))  # [n, 3E]
            q, kk, v = (
                ops.reshape(ops.cont(ops.view(qkv, (n, e), qkv.strides, 4 * e * i)), (n, nh, dh))
                for i in range(3)
            )
        else:
            q = ops.reshape(_linear(cur, w[b + "attn_q.weight"], w.get(b + "attn_q.bias")), (n, nh, dh))
            kk = ops.reshape(_linear(cur, w[b + "attn_k.weight"], w.get(b + "attn_k.bias")), (n, nh, dh))
            v = ops.reshape(_linear(cur, w[b + "attn_v.weight"], w.get(b + "attn_v.bias")), (n, nh, dh))
        if interleaved_rope:
            q, kk = _interleaved_to_split(q), _interleaved_to_split(kk)
        q, kk = rope_2d(q, pos_w, pos_h, ROPE_BASE), rope_2d(kk, pos_w, pos_h, ROPE_BASE)
        a = ops.flash_attn_ext(q, kk, v, None, 1.0 / math.sqrt(dh), name=f"kqv_out-{il}")
        a = _linear(ops.reshape(a, (n, e)), w[b + "attn_out.weight"], w.get(b + "attn_out.bias"))
        x = ops.add(a, x, name=f"ffn_inp-{il}")
        cur = _norm(x, w[b + "ln2.weight"], w[b + "ln2.bias"], hp.eps)
        cur = _act(_linear(cur, w[b + "ffn_up.weight"], w.get(b + "ffn_up.bias")), hp.ffn_op)
        x = ops.add(
            x, _linear(cur, w[b + "ffn_down.weight"], w.get(b + "ffn_down.bias")), name=f"layer_out-{il}"
        )
    x = _norm(x, w["v.post_ln.weight"], w["v.post_ln.bias"], hp.eps)
    # per patch, before the merge
    x = _norm(x, w["mm.input_norm.weight"], w["mm.input_norm.bias"], merger_eps)
    x = _unshuffle(x, gh, gw, k)
    x = act(_linear(x, w["mm.1.weight"], w["mm.1.bias"]))
    return _linear(x, w["mm.2.weight"], w["mm.2.bias"])


def _n_tokens(hp: ClipHParams, width: int, height: int) -> int:
    n = hp.patch_size * hp.n_merge
    return (width // n) * (height // n)


register_projector(Projector(KIMIK25, _load, _build, _n_tokens, resample="bicubic", preprocess=preprocess))
