"""Qwen2-VL and Qwen2.5-VL vision towers and patch mergers (llama.cpp's projector types ``qwen2vl_merger``
and ``qwen2.5vl_merger``, ``tools/mtmd/models/qwen2vl.cpp``), and their dynamic-resolution preprocessing.

The graph, in NumPy axis order:

- patch embedding: HF's Conv3d over two copies of the frame (temporal patch 2) is, as llama.cpp splits it,
  two 2-D kernels ``v.patch_embd.weight`` and ``v.patch_embd.weight.1`` applied to the same image and
  added: an im2col (views) and two ``mul_mat``. Patches come out in merge-block order (each 2 x 2 block
  of neighbouring patches consecutive, blocks row-major), HF's ``pixel_values`` order.
- 2-D vision rope: the first half of each head's rotary pairs ``(i, i + d/2)`` takes the patch row, the
  second half the column, with frequencies restarting per half (ggml's ``GGML_ROPE_TYPE_VISION``). Composed
  from the existing multi-section rope: ``ops.rope`` mode ``ROPE_MROPE`` over the whole head with sections
  ``(d/4, d/4, 0, 0)``, ``freq_base = base**2`` and ``freq_factors = [1] * d/4 + [1/base] * d/4`` gives
  exactly ``pos * base**(-2k / (d/2))`` with ``k`` counted from each half's start (``vision_rope``).
- window attention (Qwen2.5-VL, ``clip.vision.n_wa_pattern``: layer ``il`` is full attention when
  ``(il + 1) % n_wa_pattern == 0``, else windowed): merged units are reordered window by window
  (windows of 112 px, ``clip.vision.window_size`` if the file has one) with ``get_rows``, the windowed
  layers use a block-diagonal mask, and the merger's output is put back in raster order.
- norms: RMSNorm (2.5) or LayerNorm (2); FFN: SwiGLU (2.5, ``clip.use_silu``) or up/act/down (2, quick GELU);
  merger: ``v.post_ln`` (HF's ``merger.ln_q``), 2 x 2 merge (a reshape), ``mm.0`` -> GELU -> ``mm.2``.
  GELU is ggml's (tanh approximation), as llama.cpp; HF's merger uses the exact erf GELU.

Preprocessing (``preprocess_dynamic``) is llama.cpp's ``mtmd_image_preprocessor_dyn_size``: the size from
``smart_resize`` (float32 arithmetic, ``std::round``), token limits 8..4096 merged tokens, bicubic (Pillow's,
which llama.cpp's ``resize_pillow`` ports) fitted into that size keeping the aspect ratio and centred on black
(``pad=True``, llama.cpp's default ``PAD_CEIL``). HF's ``Qwen2VLImageProcessor`` differs: it stretches to the
size (``pad=False`` here gives exactly HF's pixels), rounds halves to even (``round(2.5) == 2``, llama.cpp 3),
does not clamp the rounded sides to at least one factor before the min/max checks, and its default limits are
4..16384 tokens (``min_pixels=3136``, ``max_pixels=12845056`` for 14-px patches).
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

if TYPE_CHECKING:
    from ..model.blocks import TensorLoader
    from .clip import ClipModel

__all__ = [
    "QWEN25VL", "QWEN2VL", "merged_grid", "preprocess", "preprocess_dynamic", "smart_resize", "vision_rope",
    "window_layout",
]  # fmt: skip

QWEN2VL = "qwen2vl_merger"
QWEN25VL = "qwen2.5vl_merger"
MIN_TOKENS, MAX_TOKENS = 8, 4096  # llama.cpp's set_limit_image_tokens(8, 4096) for these types
DEFAULT_WINDOW = 112  # px (HF's window_size; llama.cpp's attn_window_size default)
ROPE_BASE = 10000.0
_F = np.float32


# -- preprocessing -----------------------------------------------------------------------------------
def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """``(h, w)``: multiples of ``factor`` near the image's size, within ``min_pixels..max_pixels``
    (llama.cpp's ``img_tool::calc_size_preserved_ratio``, in float32 as it computes)."""
    if height <= 0 or width <= 0 or factor <= 0:
        raise MtmdError(f"smart_resize: bad size {width}x{height} or factor {factor}")
    f = _F(factor)

    def rnd(x: np.float32) -> int:  # std::round: halves away from zero
        return int(math.floor(float(x / f) + 0.5)) * factor

    def ceil(x: np.float32) -> int:
        return int(math.ceil(float(_F(x) / f))) * factor

    def floor(x: np.float32) -> int:
        return int(math.floor(float(_F(x) / f))) * factor

    w_bar = max(factor, rnd(_F(width)))
    h_bar = max(factor, rnd(_F(height)))
    if max_pixels > 0 and h_bar * w_bar > max_pixels:
        beta = np.sqrt(_F(height) * _F(width) / _F(max_pixels), dtype=_F)
        h_bar = max(factor, floor(_F(height) / beta))
        w_bar = max(factor, floor(_F(width) / beta))
    elif min_pixels > 0 and h_bar * w_bar < min_pixels:
        beta = np.sqrt(_F(min_pixels) / (_F(height) * _F(width)), dtype=_F)
        h_bar = ceil(_F(height) * beta)
        w_bar = ceil(_F(width) * beta)
    return h_bar, w_bar


def _fit(src: np.ndarray, w: int, h: int, pad: bool) -> np.ndarray:
    """``src`` resized to ``w x h`` (bicubic): stretched, or fitted and centred on black (img_tool::resize
    with PAD_CEIL)."""
    if not pad or (src.shape[1] == w and src.shape[0] == h):
        return _resize(src, w, h, "bicubic")
    sw, sh = src.shape[1], src.shape[0]
    scale = min(_F(w) / _F(sw), _F(h) / _F(sh))
    nw = min(int(math.ceil(float(_F(sw) * scale))), w)
    nh = min(int(math.ceil(float(_F(sh) * scale))), h)
    out = np.zeros((h, w, 3), dtype=np.uint8)
    x0, y0 = (w - nw) // 2, (h - nh) // 2
    out[y0 : y0 + nh, x0 : x0 + nw] = _resize(src, nw, nh, "bicubic")
    return out


def preprocess_dynamic(
    bmp: Bitmap, hp: ClipHParams, pad: bool = True, min_tokens: int = MIN_TOKENS, max_tokens: int = MAX_TOKENS
) -> np.ndarray:
    """``F32[3, H, W]``, H and W multiples of ``patch_size * n_merge`` (see the module docstring)."""
    factor = hp.patch_size * (hp.n_merge or 2)
    area = factor * factor
    h, w = smart_resize(bmp.height, bmp.width, factor, min_tokens * area, max_tokens * area)
    if h * w > max_tokens * area:  # one side clamped to a single factor: llama.cpp would go over the limit
        raise MtmdError(
            f"image of {bmp.width}x{bmp.height} is too elongated: {w}x{h} px ({h * w // area} tokens) is over the "
            f"limit of {max_tokens} image tokens"
        )
    return _normalize(_fit(bmp.data, w, h, pad), hp.image_mean, hp.image_std)


def preprocess(m: ClipModel, bmp: Bitmap, pad: bool) -> np.ndarray:
    """The projector's preprocessing hook (``clip.Projector.preprocess``); the token limits are
    ``hparams.extra["image_min_tokens"]`` / ``["image_max_tokens"]`` (llama.cpp's ``--image-min-tokens`` /
    ``--image-max-tokens``)."""
    x = m.hparams.extra
    return preprocess_dynamic(bmp, m.hparams, pad, x.get("image_min_tokens", MIN_TOKENS),
                              x.get("image_max_tokens", MAX_TOKENS))  # fmt: skip


def merged_grid(hp: ClipHParams, width: int, height: int) -> tuple[int, int]:
    """``(nx, ny)``: merged tokens per row and per column of a preprocessed ``width x height`` image."""
    n = hp.patch_size * (hp.n_merge or 2)
    return width // n, height // n


def _n_tokens(hp: ClipHParams, width: int, height: int) -> int:
    nx, ny = merged_grid(hp, width, height)
    return nx * ny


# -- tensors ------------------------------------------------------------------------------------------
def _load(m: ClipModel, t: TensorLoader) -> None:
    hp, md = m.hparams, m.metadata
    v25 = hp.projector_type == QWEN25VL
    hp.n_merge = int(md.get("clip.vision.spatial_merge_size", 2))
    if hp.n_merge != 2:
        raise MtmdError(f"{m.path}: clip.vision.spatial_merge_size = {hp.n_merge}; only 2 is supported")
    wa = md.get("clip.vision.n_wa_pattern")
    if v25 and wa is None:
        raise MtmdError(f"{m.path}: {QWEN25VL} needs clip.vision.n_wa_pattern (window attention pattern)")
    if wa is not None and (not isinstance(wa, int) or wa < 0):
        raise MtmdError(f"{m.path}: clip.vision.n_wa_pattern must be a non-negative integer, got {wa!r}")
    hp.extra["n_wa_pattern"] = int(wa or 0)
    win = int(md.get("clip.vision.window_size") or DEFAULT_WINDOW)
    if win < hp.patch_size * 2 or win % (hp.patch_size * 2):
        raise MtmdError(f"{m.path}: window size {win} px is not a multiple of {hp.patch_size * 2} px")
    hp.extra["window_size"] = win
    hp.extra.setdefault("image_min_tokens", MIN_TOKENS)
    hp.extra.setdefault("image_max_tokens", MAX_TOKENS)
    e, p = hp.n_embd, hp.patch_size
    if (e // hp.n_head) % 4:
        raise MtmdError(f"{m.path}: head size {e // hp.n_head} is not a multiple of 4 (2-D rope)")
    t("v.patch_embd.weight", (e, 3, p, p))
    t("v.patch_embd.weight.1", (e, 3, p, p))
    for il in range(hp.n_layer):
        b = f"v.blk.{il}."
        for n in ("attn_q", "attn_k", "attn_v", "attn_out"):
            t(b + n + ".weight", (e, e))
            t(b + n + ".bias", (e,))
        for n in ("ln1", "ln2"):
            t(b + n + ".weight", (e,))
            t(b + n + ".bias", (e,), required=not v25)
        up = t(b + "ffn_up.weight", None)
        if up is None or up.ndim != 2 or up.shape[1] != e:
            raise MtmdError(f"{m.path}: tensor {b}ffn_up.weight has shape {getattr(up, 'shape', None)}; "
                            f"expected (n_ff, {e})")  # fmt: skip
        n_ff = up.shape[0]
        t(b + "ffn_up.bias", (n_ff,))
        if v25:
            t(b + "ffn_gate.weight", (n_ff, e))
            t(b + "ffn_gate.bias", (n_ff,))
        t(b + "ffn_down.weight", (e, n_ff))
        t(b + "ffn_down.bias", (e,))
    t("v.post_ln.weight", (e,))
    t("v.post_ln.bias", (e,), required=not v25)
    w0 = t("mm.0.weight", None)
    if w0 is None or w0.ndim != 2 or w0.shape[1] != 4 * e:
        raise MtmdError(
            f"{m.path}: tensor 'mm.0.weight' has shape {getattr(w0, 'shape', None)}; expected (N, {4 * e})"
        )
    t("mm.0.bias", (w0.shape[0],))
    w2 = t("mm.2.weight", None)
    if w2 is None or w2.ndim != 2 or w2.shape[1] != w0.shape[0]:
        raise MtmdError(f"{m.path}: tensor 'mm.2.weight' has shape {getattr(w2, 'shape', None)}; "
                        f"expected (n_embd of the text model, {w0.shape[0]})")  # fmt: skip
    t("mm.2.bias", (w2.shape[0],))
    m._n_mmproj_embd = w2.shape[0]


# -- graph pieces -------------------------------------------------------------------------------------
def vision_rope(x: Tensor, pos: Tensor, freq_factors: Tensor, base: float = ROPE_BASE) -> Tensor:
    """2-D rope of ``x F32[P, H, d]`` at ``pos I32[4 * P]`` (rows, columns, rows, columns), with
    ``freq_factors = vision_rope_factors(d, base)`` (see the module docstring)."""
    d = x.shape[2]
    q = d // 4
    return ops.rope(x, pos, d, mode=ops.ROPE_MROPE, freq_base=base * base, freq_factors=freq_factors,
                    sections=(q, q, 0, 0))  # fmt: skip


def vision_rope_factors(d: int, base: float = ROPE_BASE) -> np.ndarray:
    q = d // 4
    return np.asarray([1.0] * q + [1.0 / base] * q, dtype=np.float32)


def window_layout(nx: int, ny: int, grid_window: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merged units grouped by window (llama.cpp's ``window_idx`` / ``inv_window_idx``): ``idx[src] = dst``,
    ``inv[dst] = src``, and ``win[dst]`` the window number of each reordered unit."""
    idx = np.empty(nx * ny, np.int32)
    inv = np.empty(nx * ny, np.int32)
    win = np.empty(nx * ny, np.int32)
    dst = nwin = 0
    for y in range(0, ny, grid_window):
        for x in range(0, nx, grid_window):
            for dy in range(min(grid_window, ny - y)):
                for dx in range(min(grid_window, nx - x)):
                    src = (y + dy) * nx + x + dx
                    idx[src], inv[dst], win[dst] = dst, src, nwin
                    dst += 1
            nwin += 1
    return idx, inv, win


def _positions(nx: int, ny: int, idx: np.ndarray | None) -> np.ndarray:
    """I32[4 * P]: row, column, row, column of each patch in the graph's (window-reordered) order."""
    by, bx = np.divmod(np.arange(nx * ny), nx)
    dy, dx = np.divmod(np.arange(4), 2)
    rows = (2 * by[:, None] + dy[None, :]).reshape(-1)
    cols = (2 * bx[:, None] + dx[None, :]).reshape(-1)
    if idx is not None:  # the patch of unit b, sub-patch s goes to slot idx[b] * 4 + s
        slot = (idx[:, None] * 4 + np.arange(4)[None, :]).reshape(-1)
        r, c = np.empty_like(rows), np.empty_like(cols)
        r[slot], c[slot] = rows, cols
        rows, cols = r, c
    return np.concatenate([rows, cols, rows, cols]).astype(np.int32)


def _norm(x: Tensor, w: Tensor, b: Tensor | None, eps: float, rms: bool) -> Tensor:
    x = ops.mul(ops.rms_norm(x, eps) if rms else ops.norm(x, eps), w)
    return ops.add(x, b) if b is not None else x


def _linear(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    y = ops.mul_mat(w, x)
    return ops.add(y, b) if b is not None else y


def _patches(inp_raw: Tensor, p: int) -> Tensor:
    """``F32[3, H, W]`` -> ``[P, 3 * p * p]`` in merge-block order (2 x 2 blocks of patches, row-major)."""
    c, h, w = inp_raw.shape
    nh, nw = h // p, w // p
    k = c * p * p
    x = ops.reshape(inp_raw, (c * nh, p, nw, p))
    x = ops.cont(ops.permute(x, (0, 2, 1, 3)))  # [C*nh, nw, p, p]
    x = ops.reshape(x, (c, nh * nw, p * p))
    x = ops.cont(ops.permute(x, (1, 0, 2)))  # [nh*nw, C, p*p]: row-major patches
    x = ops.reshape(x, (nh // 2, 2, nw // 2, 2 * k))  # [block row, dy, block col, (dx, K)]
    x = ops.cont(ops.permute(x, (0, 2, 1, 3)))
    return ops.reshape(x, (nh * nw, k), name="inp_patches")


def _build(m: ClipModel, inp_raw: Tensor) -> Tensor:
    hp, w = m.hparams, m.w
    _, h_px, w_px = inp_raw.shape
    p, e, nh = hp.patch_size, hp.n_embd, hp.n_head
    dh = e // nh
    if h_px % (2 * p) or w_px % (2 * p):
        raise MtmdError(f"encode: image {w_px}x{h_px} is not a multiple of {2 * p} px (patch size x merge)")
    rms = hp.projector_type == QWEN25VL
    nx, ny = w_px // (2 * p), h_px // (2 * p)
    n_pos = 4 * nx * ny
    x = _patches(inp_raw, p)
    k = ops.reshape(w["v.patch_embd.weight"], (e, 3 * p * p))
    k1 = ops.reshape(w["v.patch_embd.weight.1"], (e, 3 * p * p))
    x = ops.add(ops.mul_mat(k, x), ops.mul_mat(k1, x), name="inp_embd")  # both frames are the image
    n_wa = hp.extra.get("n_wa_pattern", 0)
    idx = mask = None
    if n_wa > 0:
        idx, inv, win = window_layout(nx, ny, hp.extra["window_size"] // (2 * p))
        x = ops.reshape(x, (nx * ny, 4 * e))
        x = ops.get_rows(x, ops.weight("inv_window_idx", GGMLType.I32, inv.shape, inv))
        x = ops.reshape(x, (n_pos, e))
        wp = np.repeat(win, 4)
        mk = np.where(wp[:, None] == wp[None, :], 0.0, -np.inf).astype(np.float32)
        mask = ops.weight("window_mask", GGMLType.F32, mk.shape, mk)
    pos_np = _positions(nx, ny, idx)
    pos = ops.weight("positions", GGMLType.I32, pos_np.shape, pos_np)
    ffac = vision_rope_factors(dh)
    ff = ops.weight("rope_freq_factors", GGMLType.F32, ffac.shape, ffac)
    for il in range(hp.n_layer):
        b = f"v.blk.{il}."
        full = n_wa == 0 or (il + 1) % n_wa == 0
        cur = _norm(x, w[b + "ln1.weight"], w.get(b + "ln1.bias"), hp.eps, rms)
        q = ops.reshape(_linear(cur, w[b + "attn_q.weight"], w[b + "attn_q.bias"]), (n_pos, nh, dh))
        kk = ops.reshape(_linear(cur, w[b + "attn_k.weight"], w[b + "attn_k.bias"]), (n_pos, nh, dh))
        v = ops.reshape(_linear(cur, w[b + "attn_v.weight"], w[b + "attn_v.bias"]), (n_pos, nh, dh))
        q, kk = vision_rope(q, pos, ff), vision_rope(kk, pos, ff)
        a = ops.flash_attn_ext(q, kk, v, None if full else mask, 1.0 / math.sqrt(dh), name=f"kqv_out-{il}")
        a = _linear(ops.reshape(a, (n_pos, e)), w[b + "attn_out.weight"], w[b + "attn_out.bias"])
        x = ops.add(a, x, name=f"ffn_inp-{il}")
        cur = _norm(x, w[b + "ln2.weight"], w.get(b + "ln2.bias"), hp.eps, rms)
        up = _linear(cur, w[b + "ffn_up.weight"], w[b + "ffn_up.bias"])
        if b + "ffn_gate.weight" in w:
            gate = _linear(cur, w[b + "ffn_gate.weight"], w[b + "ffn_gate.bias"])
            cur = ops.swiglu(gate, up) if hp.ffn_op == "silu" else ops.mul(_act(gate, hp.ffn_op), up)
        else:
            cur = _act(up, hp.ffn_op)
        cur = _linear(cur, w[b + "ffn_down.weight"], w[b + "ffn_down.bias"])
        x = ops.add(x, cur, name=f"layer_out-{il}")
    x = _norm(x, w["v.post_ln.weight"], w.get("v.post_ln.bias"), hp.eps, rms)
    x = ops.reshape(x, (nx * ny, 4 * e))  # the 2 x 2 merge: four consecutive patches side by side
    x = ops.gelu(_linear(x, w["mm.0.weight"], w["mm.0.bias"]))
    x = _linear(x, w["mm.2.weight"], w["mm.2.bias"])
    if idx is not None:
        x = ops.get_rows(x, ops.weight("window_idx", GGMLType.I32, idx.shape, idx))
    return x


def _act(x: Tensor, op: str) -> Tensor:
    if op == "gelu":
        return ops.gelu(x)
    if op == "silu":
        return ops.silu(x)
    return ops.gelu_quick(x)


for _name in (QWEN2VL, QWEN25VL):
    register_projector(
        Projector(_name, _load, _build, _n_tokens, resample="bicubic", mrope=True, preprocess=preprocess)
    )
