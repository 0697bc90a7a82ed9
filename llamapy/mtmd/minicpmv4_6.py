"""MiniCPM-V 4.6 vision (llama.cpp's projector type ``minicpmv4_6``, ``clip_graph_minicpmv4_6`` in
``tools/mtmd/models/minicpmv.cpp``): a SigLIP ViT at the slice's own size with NaViT position buckets, a window
attention merger inside the tower (16x mode), and a 2 x 2 downsampling MLP into the text model.

The graph, in NumPy axis order: the patch embedding (with bias) plus ``v.position_embd.weight[positions]``, where a
patch at ``(i, j)`` of an ``h x w`` grid takes the table's bucket ``floor(S i / h) * S + floor(S j / w)`` (``S``:
the table's side, 70 in the real models, HF's ``get_vision_nearest_position_ids``); ``clip.vision.image_size`` is
the slice size (448); SigLIP blocks (LayerNorm, attention and FFN
with biases, GELU tanh). In 16x mode (``clip.vision.projector.scale_factor`` 4) after block
``clip.vision.wa_layer_indexes[0]``: the ViT merger (HF's ``MiniCPMV4_6ViTWindowAttentionMerger``): LayerNorm
``v.vit_merger.ln1``, self-attention within each 2 x 2 window (a block-diagonal mask over the tokens in window
order), residual; each window's four tokens concatenated (row-major in the window), LayerNorm ``ds_ln``,
``ds_ffn_up`` -> GELU (tanh) -> ``ds_ffn_down``, plus the window's mean; then the remaining blocks on the half-size
grid. ``v.post_ln``. The final merger (HF's ``MiniCPMV4_6DownsampleMLP``, one round): 2 x 2 blocks concatenated,
LayerNorm ``mm.input_norm``, ``mm.up`` -> GELU (erf, composed as in ``audio_encoder.gelu_erf``) -> ``mm.down``.
4x mode (scale_factor 2) skips the ViT merger.

Preprocessing: see ``frames``. Tokens (mtmd.cpp's ``MTMD_SLICE_TMPL_MINICPMV_2_6``): ``<image>`` overview
``</image>``, then for each slice ``<slice>`` slice ``</slice>``, rows separated by ``\\n``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from ..ggml import ops
from ..ggml.tensor import Tensor
from ..ggml.types import GGMLType
from .audio_encoder import gelu_erf
from .clip import ClipHParams, Projector, register_projector
from .errors import MtmdError
from .image import Bitmap, _normalize, _resize
from .siglip import _act, _linear, _norm, load_vit_blocks, patch_embed

if TYPE_CHECKING:
    from ..model.blocks import TensorLoader
    from .clip import ClipModel

__all__ = ["MINICPMV4_6", "frames", "pieces", "positions"]

MINICPMV4_6 = "minicpmv4_6"
MAX_SLICES = 9
VM = "v.vit_merger."


# -- preprocessing ----------------------------------------------------------------------------------
def _ensure_divide(length: float, p: int) -> int:
    return max(round(length / p) * p, p)


def _best_resize(w: float, h: float, res: int, p: int, upscale: bool) -> tuple[int, int]:
    """``(w, h)`` near ``res**2`` pixels keeping the aspect ratio, sides multiples of p (find_best_resize)."""
    if w * h > res * res or upscale:
        r = w / h
        h = int(res / math.sqrt(r))
        w = int(h * r)
    return _ensure_divide(w, p), _ensure_divide(h, p)


def _best_grid(w: int, h: int, res: int) -> tuple[int, int] | None:
    """``(cols, rows)`` of the slices, or None: at most one slice's area (get_sliced_grid)."""
    log_ratio = math.log(w / h)
    multiple = min(math.ceil(w * h / (res * res)), MAX_SLICES)
    if multiple <= 1:
        return None
    best, err = (1, 1), math.inf
    for n in (multiple - 1, multiple, multiple + 1):
        if n == 1 or n > MAX_SLICES:
            continue
        for rows in range(1, n + 1):
            if n % rows == 0:
                e = abs(log_ratio - math.log((n // rows) / rows))
                if e < err or (e == err and rows > best[1]):
                    best, err = (n // rows, rows), e
    return best


def frames(bmp: Bitmap, hp: ClipHParams) -> tuple[list[np.ndarray], int, int]:
    """The normalized frames: the overview then the slices row-major, and ``(rows, cols)`` (``(0, 0)``: the
    overview alone). HF's ``MiniCPMV4_6ImageProcessor`` (llava-uhd without pinpoints, as llama.cpp's
    ``mtmd_image_preprocessor_minicpmv``): sides multiples of ``patch_size * n_merge``; an image of at most one
    slice's area (``clip.vision.image_size`` squared) is the overview alone, resized to about that area; a larger
    one has the overview shrunk to it and a grid of up to 9 slices with the closest aspect ratio (ties: more rows),
    each slice resized to about the slice's area; bicubic. (llama.cpp's 16x mode instead stretches an image no
    larger than the slice on both sides to the square slice, and slices one larger on a side but of less area.)"""
    res, p = hp.image_size, hp.patch_size * hp.n_merge
    w, h = bmp.width, bmp.height
    norm = lambda a: _normalize(a, hp.image_mean, hp.image_std)  # noqa: E731
    grid = _best_grid(w, h, res)
    ow, oh = _best_resize(w, h, res, p, grid is None)
    overview = norm(_resize(bmp.data, ow, oh, "bicubic"))
    if grid is None:
        return [overview], 0, 0
    gw, gh = grid
    bw, bh = _best_resize(_ensure_divide(w, gw) / gw, _ensure_divide(h, gh) / gh, res, p, True)
    refined = _resize(bmp.data, bw * gw, bh * gh, "bicubic")
    slices = [
        norm(refined[r * bh : (r + 1) * bh, c * bw : (c + 1) * bw]) for r in range(gh) for c in range(gw)
    ]
    return [overview, *slices], gh, gw


def pieces(bmp: Bitmap, hp: ClipHParams) -> list[str | np.ndarray]:
    """``<image>`` overview ``</image>`` then ``<slice>`` each slice ``</slice>``, ``\\n`` between rows."""
    fr, rows, cols = frames(bmp, hp)
    out: list[str | np.ndarray] = ["<image>", fr[0], "</image>"]
    for r in range(rows):
        for c in range(cols):
            out += ["<slice>", fr[1 + r * cols + c], "</slice>"]
        if r < rows - 1:
            out.append("\n")
    return out


# -- tensors ----------------------------------------------------------------------------------------
def load_pos_table(m: ClipModel, t: TensorLoader) -> None:
    """The NaViT position table ``v.position_embd.weight``: a square grid of ``side * side`` rows of
    ``n_embd`` (``hparams.extra["pos_side"]``; 70 in the real models, which llama.cpp hard-codes)."""
    e = m.hparams.n_embd
    tab = t("v.position_embd.weight", None)
    side = math.isqrt(tab.shape[0]) if tab is not None and len(tab.shape) == 2 else 0
    if tab is None or side * side != tab.shape[0] or tab.shape[1] != e:
        raise MtmdError(f"{m.path}: tensor 'v.position_embd.weight' has shape {getattr(tab, 'shape', None)}; "
                        f"expected (side * side, {e})")  # fmt: skip
    m.hparams.extra["pos_side"] = side


def _load(m: ClipModel, t: TensorLoader) -> None:
    hp, md = m.hparams, m.metadata
    k = md.get("clip.vision.projector.scale_factor", 4)
    if k not in (2, 4):
        raise MtmdError(
            f"{m.path}: minicpmv4_6's clip.vision.projector.scale_factor must be 2 or 4, got {k!r}"
        )
    hp.n_merge = k
    e, p = hp.n_embd, hp.patch_size
    t("v.patch_embd.weight", (e, 3, p, p))
    t("v.patch_embd.bias", (e,), required=False)
    load_pos_table(m, t)
    load_vit_blocks(m, t)
    t("v.post_ln.weight", (e,))
    t("v.post_ln.bias", (e,))
    if k == 4:
        wa = md.get("clip.vision.wa_layer_indexes")
        lid = int(np.asarray(wa).reshape(-1)[0]) if wa is not None and np.asarray(wa).size else -1
        if not 0 <= lid < hp.n_layer:
            raise MtmdError(f"{m.path}: clip.vision.wa_layer_indexes must name the ViT merger's layer "
                            f"(0..{hp.n_layer - 1}), got {wa!r}")  # fmt: skip
        hp.extra["insert_layer"] = lid
    need = k == 4  # 4x mode skips the ViT merger; its tensors may still be in the file
    if need or t(VM + "ln1.weight", (e,), required=False) is not None:
        t(VM + "ln1.weight", (e,))
        t(VM + "ln1.bias", (e,))
        for n in ("attn_q", "attn_k", "attn_v", "attn_out"):
            t(f"{VM}{n}.weight", (e, e))
            t(f"{VM}{n}.bias", (e,), required=False)
        t(VM + "ds_ln.weight", (4 * e,))
        t(VM + "ds_ln.bias", (4 * e,))
        up = t(VM + "ds_ffn_up.weight", None)
        if up is None or len(up.shape) != 2 or up.shape[1] != 4 * e:
            raise MtmdError(f"{m.path}: tensor '{VM}ds_ffn_up.weight' has shape {getattr(up, 'shape', None)}; "
                            f"expected (N, {4 * e})")  # fmt: skip
        t(VM + "ds_ffn_up.bias", (up.shape[0],), required=False)
        t(VM + "ds_ffn_down.weight", (e, up.shape[0]))
        t(VM + "ds_ffn_down.bias", (e,), required=False)
    t("mm.input_norm.weight", (4 * e,))
    t("mm.input_norm.bias", (4 * e,), required=False)
    up = t("mm.up.weight", None)
    if up is None or len(up.shape) != 2 or up.shape[1] != 4 * e:
        raise MtmdError(f"{m.path}: tensor 'mm.up.weight' has shape {getattr(up, 'shape', None)}; "
                        f"expected (N, {4 * e})")  # fmt: skip
    t("mm.up.bias", (up.shape[0],), required=False)
    down = t("mm.down.weight", None)
    if down is None or len(down.shape) != 2 or down.shape[1] != up.shape[0]:
        raise MtmdError(f"{m.path}: tensor 'mm.down.weight' has shape {getattr(down, 'shape', None)}; "
                        f"expected (n_embd of the text model, {up.shape[0]})")  # fmt: skip
    t("mm.down.bias", (down.shape[0],), required=False)
    m._n_mmproj_embd = down.shape[0]


# -- graph ------------------------------------------------------------------------------------------
def positions(side: int, h: int, w: int) -> np.ndarray:
    """I32[h*w]: each patch's row of the ``side x side`` position table (NaViT's nearest bucket)."""
    bh = np.floor(side * np.arange(h) / h).astype(np.int64)
    bw = np.floor(side * np.arange(w) / w).astype(np.int64)
    return (bh[:, None] * side + bw[None, :]).reshape(-1).astype(np.int32)


def _ids(name: str, a: np.ndarray) -> Tensor:
    return ops.weight(name, GGMLType.I32, (a.size,), np.ascontiguousarray(a, dtype=np.int32))


def _blocks_of_4(name: str, h: int, w: int) -> list[Tensor]:
    """Row indices of the 4 corners (row-major in the block) of each 2 x 2 block of an h x w grid."""
    r, c = np.meshgrid(np.arange(h // 2), np.arange(w // 2), indexing="ij")
    return [_ids(f"{name}_{k}", ((2 * r + dr) * w + 2 * c + dc).reshape(-1)) for k, (dr, dc) in
            enumerate(((0, 0), (0, 1), (1, 0), (1, 1)))]  # fmt: skip


def _concat4(x: Tensor, idx: list[Tensor]) -> tuple[Tensor, list[Tensor]]:
    ps = [ops.get_rows(x, i) for i in idx]
    cat = ps[0]
    for q in ps[1:]:
        cat = ops.concat(cat, q, axis=1)
    return cat, ps


def _attn(x: Tensor, w: dict, b: str, nh: int, mask: Tensor | None) -> Tensor:
    n, e = x.shape
    dh = e // nh
    q = ops.reshape(_linear(x, w[b + "attn_q.weight"], w.get(b + "attn_q.bias")), (n, nh, dh))
    k = ops.reshape(_linear(x, w[b + "attn_k.weight"], w.get(b + "attn_k.bias")), (n, nh, dh))
    v = ops.reshape(_linear(x, w[b + "attn_v.weight"], w.get(b + "attn_v.bias")), (n, nh, dh))
    a = ops.flash_attn_ext(q, k, v, mask, 1.0 / math.sqrt(dh))
    return _linear(ops.reshape(a, (n, e)), w[b + "attn_out.weight"], w.get(b + "attn_out.bias"))


def _layers(m: ClipModel, x: Tensor, lo: int, hi: int) -> Tensor:
    hp, w = m.hparams, m.w
    for il in range(lo, hi):
        b = f"v.blk.{il}."
        cur = _norm(x, w[b + "ln1.weight"], w.get(b + "ln1.bias"), hp.eps)
        x = ops.add(_attn(cur, w, b, hp.n_head, None), x, name=f"ffn_inp-{il}")
        cur = _norm(x, w[b + "ln2.weight"], w.get(b + "ln2.bias"), hp.eps)
        cur = _act(_linear(cur, w[b + "ffn_up.weight"], w.get(b + "ffn_up.bias")), hp.ffn_op)
        x = ops.add(
            x, _linear(cur, w[b + "ffn_down.weight"], w.get(b + "ffn_down.bias")), name=f"layer_out-{il}"
        )
    return x


def _vit_merger(m: ClipModel, x: Tensor, gh: int, gw: int) -> Tensor:
    hp, w = m.hparams, m.w
    n = gh * gw
    r, c = np.meshgrid(np.arange(gh // 2), np.arange(gw // 2), indexing="ij")
    win = np.stack(
        [(2 * r + dr) * gw + 2 * c + dc for dr, dc in ((0, 0), (0, 1), (1, 0), (1, 1))], -1
    ).reshape(-1)
    inv = np.empty_like(win)
    inv[win] = np.arange(n)
    mask = np.full((n, n), -np.inf, np.float32)
    for i in range(0, n, 4):
        mask[i : i + 4, i : i + 4] = 0.0
    cur = _norm(x, w[VM + "ln1.weight"], w[VM + "ln1.bias"], hp.eps)
    cur = ops.get_rows(cur, _ids("vm_window", win))
    cur = _attn(cur, w, VM, hp.n_head, ops.weight("vm_window_mask", GGMLType.F32, (n, n), mask))
    x = ops.add(ops.get_rows(cur, _ids("vm_window_inv", inv)), x, name="vit_merger_attn")
    cat, ps = _concat4(x, _blocks_of_4("vm_ds", gh, gw))
    mean = ops.scale(ops.add(ops.add(ps[0], ps[1]), ops.add(ps[2], ps[3])), 0.25)
    cur = _norm(cat, w[VM + "ds_ln.weight"], w[VM + "ds_ln.bias"], hp.eps)
    cur = ops.gelu(_linear(cur, w[VM + "ds_ffn_up.weight"], w.get(VM + "ds_ffn_up.bias")))
    return ops.add(_linear(cur, w[VM + "ds_ffn_down.weight"], w.get(VM + "ds_ffn_down.bias")), mean)


def _build(m: ClipModel, inp_raw: Tensor) -> Tensor:
    hp, w = m.hparams, m.w
    _, h_px, w_px = inp_raw.shape
    p, k = hp.patch_size, hp.n_merge
    if h_px % (p * k) or w_px % (p * k):
        raise MtmdError(f"encode: image {w_px}x{h_px} is not a multiple of {p * k} px (patch size x merge)")
    gh, gw = h_px // p, w_px // p
    pos = _ids("positions", positions(hp.extra["pos_side"], gh, gw))
    x = ops.add(patch_embed(m, inp_raw), ops.get_rows(w["v.position_embd.weight"], pos), name="pos_embed")
    if k == 4:
        lid = hp.extra["insert_layer"]
        x = _layers(m, x, 0, lid + 1)
        x = _vit_merger(m, x, gh, gw)
        gh, gw = gh // 2, gw // 2
        x = _layers(m, x, lid + 1, hp.n_layer)
    else:
        x = _layers(m, x, 0, hp.n_layer)
    x = _norm(x, w["v.post_ln.weight"], w.get("v.post_ln.bias"), hp.eps)
    cat, _ = _concat4(x, _blocks_of_4("merger_ds", gh, gw))
    cur = _norm(cat, w["mm.input_norm.weight"], w.get("mm.input_norm.bias"), hp.eps)
    cur = gelu_erf(_linear(cur, w["mm.up.weight"], w.get("mm.up.bias")))
    return _linear(cur, w["mm.down.weight"], w.get("mm.down.bias"))


def _n_tokens(hp: ClipHParams, width: int, height: int) -> int:
    n = hp.patch_size * hp.n_merge
    return (width // n) * (height // n)


register_projector(Projector(MINICPMV4_6, _load, _build, _n_tokens, resample="bicubic"))
