"""Pixtral vision (llama.cpp's projector type ``pixtral``, ``tools/mtmd/models/pixtral.cpp``): Pixtral 12B
(LLaVA-style, no patch merge) and Mistral Small 3.1+ / Ministral 3 / Magistral (``Mistral3``: RMS norm and a
learned 2 x 2 patch merger before the projector).

The graph, in NumPy axis order:

- patch embedding (``v.patch_embd.weight``, no bias), ``v.pre_ln`` (RMS), then pre-norm blocks with RMS norms
  (``ln1``/``ln2``), bias-free q/k/v/out, and a gated FFN ``down(act(gate(x)) * up(x))`` (``clip.use_silu``:
  SiLU, ``clip.use_gelu``: GELU); no learned positions, no post norm.
- 2-D rope (``build_rope_2d`` with interleaved frequencies): llama.cpp's converter permutes q/k as for llama
  (HF's rotate-half layout -> adjacent pairs), so each head's first half is a normal (adjacent-pair) rope over
  ``d/2`` dims at the patch row, the second half the same at the column with ``freq_scale = base**(-2/d)``
  (the odd frequencies); base 10000, as llama.cpp hard-codes it.
- Mistral3's merger (``mm.input_norm.weight`` and ``mm.patch_merger.weight`` present,
  ``clip.vision.spatial_merge_size`` = k): RMS norm (eps of the vision tower, as llama.cpp), then each k x k
  block of patches becomes one row ``[E * k * k]`` ordered (channel, dy, dx) (``torch.nn.functional.unfold``),
  times ``mm.patch_merger.weight``.
- projector: ``mm.1`` -> GELU (ggml's, tanh approximation; HF's config says ``gelu``, the erf one) -> ``mm.2``,
  biases optional.
- ``[IMG_BREAK]``: ``v.token_embd.img_break`` (the text model's embedding of that token, copied by the converter)
  appended after every row of merged tokens but the last: ``nx * ny + ny - 1`` embeddings. The text
  ``[IMG_END]`` follows the image (mtmd.cpp), so the prompt is HF's ``[IMG]... [IMG_BREAK] ... [IMG]...
  [IMG_END]``.

Preprocessing is llama.cpp's ``mtmd_image_preprocessor_dyn_size`` (shared with Qwen-VL here:
``qwen2vl.preprocess_dynamic``): sides made multiples of ``patch_size * k`` keeping the aspect ratio, between 8 and
1024 merged tokens (``set_limit_image_tokens(8, 1024)``), bicubic, fitted and centred on black. HF's
``PixtralImageProcessor`` differs: it only shrinks (longest edge to ``size.longest_edge``, 1024 / 1540 px), rounds
each side *up* to whole patches, stretches to that size (no padding), and has no lower bound (tiny images stay
tiny); for images already of such a size the pixels agree (``pad=False`` stretches as HF).
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
from .qwen2vl import preprocess
from .siglip import patch_embed

if TYPE_CHECKING:
    from ..model.blocks import TensorLoader
    from .clip import ClipModel

__all__ = ["PIXTRAL", "merged_grid"]

PIXTRAL = "pixtral"
MIN_TOKENS, MAX_TOKENS = 8, 1024  # llama.cpp's set_limit_image_tokens(8, 1024) for pixtral
ROPE_BASE = 10000.0


def _shape(t: Tensor | None) -> tuple[int, ...] | None:
    return None if t is None else tuple(t.shape)


def _load(m: ClipModel, t: TensorLoader) -> None:
    hp, md = m.hparams, m.metadata
    k = md.get("clip.vision.spatial_merge_size", 1)
    if not isinstance(k, int) or k < 1:
        raise MtmdError(f"{m.path}: clip.vision.spatial_merge_size must be a positive integer, got {k!r}")
    hp.n_merge = k
    hp.extra.setdefault("image_min_tokens", MIN_TOKENS)
    hp.extra.setdefault("image_max_tokens", MAX_TOKENS)
    e, p = hp.n_embd, hp.patch_size
    dh = e // hp.n_head
    if dh % 4:
        raise MtmdError(f"{m.path}: head size {dh} is not a multiple of 4 (2-D rope)")
    t("v.patch_embd.weight", (e, 3, p, p))
    t("v.patch_embd.bias", (e,), required=False)
    t("v.pre_ln.weight", (e,), required=False)
    for il in range(hp.n_layer):
        b = f"v.blk.{il}."
        for n in ("attn_q", "attn_k", "attn_v", "attn_out"):
            t(b + n + ".weight", (e, e))
        t(b + "ln1.weight", (e,))
        t(b + "ln2.weight", (e,))
        up = t(b + "ffn_up.weight", None)
        if up is None or len(up.shape) != 2 or up.shape[1] != e:
            raise MtmdError(f"{m.path}: tensor {b}ffn_up.weight has shape {_shape(up)}; expected (n_ff, {e})")
        t(b + "ffn_gate.weight", (up.shape[0], e))
        t(b + "ffn_down.weight", (e, up.shape[0]))
    merger = t("mm.patch_merger.weight", None, required=False)
    if merger is not None:
        if _shape(merger) != (e, e * k * k):
            raise MtmdError(f"{m.path}: tensor 'mm.patch_merger.weight' has shape {_shape(merger)}; expected "
                            f"({e}, {e * k * k}) for clip.vision.spatial_merge_size = {k}")  # fmt: skip
        t("mm.input_norm.weight", (e,))
    elif k != 1:
        raise MtmdError(
            f"{m.path}: clip.vision.spatial_merge_size = {k} but the file has no mm.patch_merger.weight"
        )
    w1 = t("mm.1.weight", None)
    if w1 is None or len(w1.shape) != 2 or w1.shape[1] != e:
        raise MtmdError(f"{m.path}: tensor 'mm.1.weight' has shape {_shape(w1)}; expected (N, {e})")
    t("mm.1.bias", (w1.shape[0],), required=False)
    w2 = t("mm.2.weight", None)
    if w2 is None or len(w2.shape) != 2 or w2.shape[1] != w1.shape[0]:
        raise MtmdError(
            f"{m.path}: tensor 'mm.2.weight' has shape {_shape(w2)}; expected (n_embd, {w1.shape[0]})"
        )
    t("mm.2.bias", (w2.shape[0],), required=False)
    m._n_mmproj_embd = w2.shape[0]
    t("v.token_embd.img_break", (w2.shape[0],), required=False)


def merged_grid(hp: ClipHParams, width: int, height: int) -> tuple[int, int]:
    n = hp.patch_size * max(hp.n_merge, 1)
    return width // n, height // n


def _n_tokens(hp: ClipHParams, width: int, height: int) -> int:
    nx, ny = merged_grid(hp, width, height)
    return nx * ny + (ny - 1 if hp.extra.get("img_break", True) else 0)


# -- graph ------------------------------------------------------------------------------------------
def _rms(x: Tensor, w: Tensor, eps: float) -> Tensor:
    return ops.mul(ops.rms_norm(x, eps), w)


def _linear(x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
    y = ops.mul_mat(w, x)
    return ops.add(y, b) if b is not None else y


def _act(x: Tensor, op: str) -> Tensor:
    if op == "gelu":
        return ops.gelu(x)
    if op == "silu":
        return ops.silu(x)
    return ops.gelu_quick(x)


def rope_2d(x: Tensor, pos_h: Tensor, pos_w: Tensor, base: float = ROPE_BASE) -> Tensor:
    """llama.cpp's ``build_rope_2d(..., interleave_freq=true)`` of ``x F32[P, H, d]``."""
    n, nh, d = x.shape
    half = d // 2
    strides = (nh * d * 4, d * 4, 4)
    a = ops.cont(ops.view(x, (n, nh, half), strides, offset=0))
    b = ops.cont(ops.view(x, (n, nh, half), strides, offset=half * 4))
    a = ops.rope(a, pos_h, half, mode=0, freq_base=base)
    b = ops.rope(b, pos_w, half, mode=0, freq_base=base, freq_scale=float(base ** (-2.0 / d)))
    return ops.concat(a, b, axis=2)


def _merge(x: Tensor, nx: int, ny: int, k: int) -> Tensor:
    """``[ny*nx, E]`` -> ``[(ny/k)*(nx/k), E*k*k]``, each row (channel, dy, dx) as ``F.unfold``."""
    e = x.shape[1]
    t = ops.cont(ops.transpose(x))  # [E, ny, nx] = [E, by, dy, bx, dx]
    t = ops.reshape(t, (e * (ny // k), k, nx // k, k))
    t = ops.cont(ops.permute(t, (0, 2, 1, 3)))  # [E*by, bx, dy, dx]
    t = ops.reshape(t, (e, (ny // k) * (nx // k), k * k))
    t = ops.cont(ops.permute(t, (1, 0, 2)))  # [L, E, k*k]
    return ops.reshape(t, ((ny // k) * (nx // k), e * k * k), name="patch_unfold")


def _build(m: ClipModel, inp_raw: Tensor) -> Tensor:
    hp, w = m.hparams, m.w
    _, h_px, w_px = inp_raw.shape
    p, e, nh, k = hp.patch_size, hp.n_embd, hp.n_head, max(hp.n_merge, 1)
    dh = e // nh
    if h_px % (p * k) or w_px % (p * k):
        raise MtmdError(f"encode: image {w_px}x{h_px} is not a multiple of {p * k} px (patch size x merge)")
    px, py = w_px // p, h_px // p
    n = px * py
    rows, cols = np.divmod(np.arange(n, dtype=np.int32), px)
    pos_h = ops.weight("pos_h", GGMLType.I32, (n,), rows.astype(np.int32))
    pos_w = ops.weight("pos_w", GGMLType.I32, (n,), cols.astype(np.int32))
    x = patch_embed(m, inp_raw)
    if "v.pre_ln.weight" in w:
        x = _rms(x, w["v.pre_ln.weight"], hp.eps)
    for il in range(hp.n_layer):
        b = f"v.blk.{il}."
        cur = _rms(x, w[b + "ln1.weight"], hp.eps)
        q = ops.reshape(_linear(cur, w[b + "attn_q.weight"]), (n, nh, dh))
        kk = ops.reshape(_linear(cur, w[b + "attn_k.weight"]), (n, nh, dh))
        v = ops.reshape(_linear(cur, w[b + "attn_v.weight"]), (n, nh, dh))
        q, kk = rope_2d(q, pos_h, pos_w), rope_2d(kk, pos_h, pos_w)
        a = ops.flash_attn_ext(q, kk, v, None, 1.0 / math.sqrt(dh), name=f"kqv_out-{il}")
        x = ops.add(_linear(ops.reshape(a, (n, e)), w[b + "attn_out.weight"]), x, name=f"ffn_inp-{il}")
        cur = _rms(x, w[b + "ln2.weight"], hp.eps)
        g = _act(_linear(cur, w[b + "ffn_gate.weight"]), hp.ffn_op)
        cur = _linear(ops.mul(g, _linear(cur, w[b + "ffn_up.weight"])), w[b + "ffn_down.weight"])
        x = ops.add(x, cur, name=f"layer_out-{il}")
    if "mm.patch_merger.weight" in w:
        x = _rms(x, w["mm.input_norm.weight"], hp.eps)
        x = ops.mul_mat(w["mm.patch_merger.weight"], _merge(x, px, py, k))
    x = ops.gelu(_linear(x, w["mm.1.weight"], w.get("mm.1.bias")))
    x = _linear(x, w["mm.2.weight"], w.get("mm.2.bias"))
    brk = w.get("v.token_embd.img_break")
    if brk is None:
        return ops.cont(x, name="mm_out")
    nx, ny = px // k, py // k
    n_out = x.shape[1]
    grid = ops.reshape(x, (ny, nx, n_out))
    zeros = ops.weight("img_break_rows", GGMLType.F32, (ny, 1, n_out), np.zeros((ny, 1, n_out), np.float32))
    grid = ops.concat(grid, ops.add(zeros, brk), axis=1)  # [ny, nx + 1, n_out]: a break after each row
    flat = ops.reshape(grid, (ny * (nx + 1), n_out))
    n_tok = nx * ny + ny - 1  # no break after the last row
    return ops.cont(ops.view(flat, (n_tok, n_out), (n_out * 4, 4), offset=0), name="mm_out")


def _load_all(m: ClipModel, t: TensorLoader) -> None:
    _load(m, t)
    m.hparams.extra["img_break"] = "v.token_embd.img_break" in t.tensors


register_projector(
    Projector(PIXTRAL, _load_all, _build, _n_tokens, resample="bicubic", preprocess=preprocess)
)
