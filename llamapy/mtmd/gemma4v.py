"""Gemma 4 vision (llama.cpp's projector type ``gemma4v``, ``tools/mtmd/models/gemma4v.cpp``): a ViT at the image's
own size with learned x / y position tables and 2-D neox rope, k x k average pooling, and an RMS-normed projection.

The graph, in NumPy axis order: pixels ``2 x - 1`` (the file's mean 0 / std 1 leave them in 0..1, HF's patch
embedder rescales), the patch embedding without bias (the converter stores HF's ``[E, p*p*3]`` linear as a
``[E, 3, p, p]`` kernel), plus ``table[0][col] + table[1][row]`` (``v.position_embd.weight``, ``[2, S, E]``).
Blocks: RMS ``ln1``; q, k, v (no biases); per-head RMS norms of q and k with weights, of v without; rope on q and
k, neox style, the first half of each head at the patch column, the second at the row (base 100, ``d/2`` dims
each); attention with scale 1; ``attn_out``; RMS ``attn_post_norm``; residual; RMS ``ln2``; ``ffn_down(gelu(
ffn_gate(x)) * ffn_up(x))`` (GELU tanh, HF's ``gelu_pytorch_tanh``); RMS ``ffn_post_norm``; residual. Every
matrix product may be clamped (HF's ``Gemma4ClippableLinear``: the optional one-value tensors ``<w>.input_min``,
``.input_max``, ``.output_min``, ``.output_max`` beside a weight ``<w>.weight``). Then the patches averaged over
``k x k`` blocks (``clip.vision.projector.scale_factor``, default 3) times ``sqrt(E)``, optionally standardized
(``(x - v.std_bias) * v.std_scale``), an RMS norm without weight and ``mm.input_projection`` (``[n_embd_text,
E]``, as HF's ``embedding_projection``).

Preprocessing is llama.cpp's ``mtmd_image_preprocessor_dyn_size`` with ``set_limit_image_tokens(70, 1120)``: sides
multiples of ``patch_size * k`` keeping the aspect ratio (``qwen2vl.smart_resize``), bicubic, fitted and centred on
black. Tokens: ``<|image>`` ... ``<image|>``.

The image's tokens see each other (``hparams.extra["non_causal"]``, llama.cpp's ``mtmd_decode_use_non_causal``)
unless the text model is 1536 or 2560 wide (E2B, E4B: HF's ``use_bidirectional_attention=None``; the others
have ``"vision"``). Then the image is decoded in one ubatch with ``set_causal_attn(False)``, which Gemma 4's
``non_causal_type = "swa_only"`` (llama.cpp's ``LLAMA_NON_CAUSAL_TYPE_SWA_ONLY``) applies to the sliding-window
cache only: sliding layers ``AND(window, OR(causal, same image))``, full-attention layers causal, as HF's
``create_masks_for_vision_model``. An image of more tokens than ``n_ubatch`` (or the ``n_batch`` it is decoded
with) is an ``MtmdError`` naming both (llama.cpp asserts ``n_ubatch >= n_tokens`` and aborts): split, its first
tokens would not see its last ones.
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
from .image import Bitmap
from .qwen2vl import preprocess_dynamic
from .siglip import patch_embed

if TYPE_CHECKING:
    from ..model.blocks import TensorLoader
    from .clip import ClipModel

__all__ = ["GEMMA4V", "preprocess"]

GEMMA4V = "gemma4v"
MIN_TOKENS, MAX_TOKENS = 70, 1120  # llama.cpp's set_limit_image_tokens(70, 1120)
ROPE_BASE = 100.0
CAUSAL_N_EMBD = (1536, 2560)  # E2B, E4B: HF's use_bidirectional_attention None (the others: "vision")
_CLAMPS = ("input_min", "input_max", "output_min", "output_max")


# -- preprocessing ----------------------------------------------------------------------------------
def preprocess(m: ClipModel, bmp: Bitmap, pad: bool) -> np.ndarray:
    """``F32[3, H, W]``, sides multiples of ``patch_size * k``, 70..1120 tokens (the limits in
    ``hparams.extra["image_min_tokens"]`` / ``["image_max_tokens"]`` when set)."""
    x = m.hparams.extra
    return preprocess_dynamic(bmp, m.hparams, pad, x.get("image_min_tokens", MIN_TOKENS),
                              x.get("image_max_tokens", MAX_TOKENS))  # fmt: skip


# -- tensors ----------------------------------------------------------------------------------------
def _shape(t: Tensor | None) -> tuple[int, ...] | None:
    return None if t is None else tuple(t.shape)


def _matrix(m: ClipModel, t: TensorLoader, name: str, shape: tuple[int, int] | None) -> Tensor:
    """A weight and its optional clamp bounds (read into ``hparams.extra["clamp"][name]``)."""
    w = t(name + ".weight", shape)
    assert w is not None
    bounds = {}
    for c in _CLAMPS:
        s = t(f"{name}.{c}", (1,), required=False)
        if s is not None:
            bounds[c] = float(np.asarray(s.data, dtype=np.float32).reshape(-1)[0])
    if bounds:
        m.hparams.extra.setdefault("clamp", {})[name] = bounds
    return w


def _load(m: ClipModel, t: TensorLoader) -> None:
    hp, md = m.hparams, m.metadata
    k = md.get("clip.vision.projector.scale_factor", 3)
    if not isinstance(k, int) or k < 1:
        raise MtmdError(f"{m.path}: clip.vision.projector.scale_factor must be a positive integer, got {k!r}")
    hp.n_merge = k
    e, nh = hp.n_embd, hp.n_head
    dh = e // nh
    if dh % 4:
        raise MtmdError(f"{m.path}: head size {dh} is not a multiple of 4 (2-D rope)")
    for key, default in (("image_min_tokens", MIN_TOKENS), ("image_max_tokens", MAX_TOKENS)):
        hp.extra.setdefault(key, default)
    p = hp.patch_size
    t("v.patch_embd.weight", (e, 3, p, p))
    pos = t("v.position_embd.weight", None)
    if pos is None or len(pos.shape) != 3 or pos.shape[0] != 2 or pos.shape[2] != e:
        raise MtmdError(f"{m.path}: tensor 'v.position_embd.weight' has shape {_shape(pos)}; "
                        f"expected (2, n_positions, {e})")  # fmt: skip
    hp.extra["n_pos_table"] = pos.shape[1]
    for il in range(hp.n_layer):
        b = f"v.blk.{il}."
        for n in ("attn_q", "attn_k", "attn_v", "attn_out"):
            _matrix(m, t, b + n, (e, e))
        for n in ("attn_q_norm", "attn_k_norm"):
            t(b + n + ".weight", (dh,))
        for n in ("ln1", "ln2", "attn_post_norm", "ffn_post_norm"):
            t(b + n + ".weight", (e,))
        up = _matrix(m, t, b + "ffn_up", None)
        if len(up.shape) != 2 or up.shape[1] != e:
            raise MtmdError(f"{m.path}: tensor {b}ffn_up.weight has shape {_shape(up)}; expected (n_ff, {e})")
        _matrix(m, t, b + "ffn_gate", (up.shape[0], e))
        _matrix(m, t, b + "ffn_down", (e, up.shape[0]))
    if t("v.std_bias", (e,), required=False) is not None:
        t("v.std_scale", (e,))
    proj = _matrix(m, t, "mm.input_projection", None)
    if len(proj.shape) != 2 or proj.shape[1] != e:
        raise MtmdError(f"{m.path}: tensor 'mm.input_projection.weight' has shape {_shape(proj)}; "
                        f"expected (n_embd of the text model, {e})")  # fmt: skip
    m._n_mmproj_embd = proj.shape[0]
    # mtmd_decode_use_non_causal: E2B (1536 wide) and E4B (2560) decode images causally, the others not
    hp.extra["non_causal"] = proj.shape[0] not in CAUSAL_N_EMBD


# -- graph ------------------------------------------------------------------------------------------
def _clamp(x: Tensor, lo: float | None, hi: float | None) -> Tensor:
    """``min(max(x, lo), hi)`` from relu: ``max(x, lo) = relu(x - lo) + lo``, ``min(y, hi) = hi - relu(hi - y)``."""
    if lo is not None and math.isfinite(lo):
        x = ops.scale(ops.relu(ops.scale(x, 1.0, -lo)), 1.0, lo)
    if hi is not None and math.isfinite(hi):
        x = ops.scale(ops.relu(ops.scale(x, -1.0, hi)), -1.0, hi)
    return x


def _mm(m: ClipModel, name: str, x: Tensor) -> Tensor:
    """``name.weight @ x`` with Gemma4ClippableLinear's clamps (gemma4v's ``build_mm``)."""
    c = m.hparams.extra.get("clamp", {}).get(name)
    if c:
        x = _clamp(x, c.get("input_min"), c.get("input_max"))
    y = ops.mul_mat(m.w[name + ".weight"], x)
    return _clamp(y, c.get("output_min"), c.get("output_max")) if c else y


def _rms(x: Tensor, w: Tensor | None, eps: float) -> Tensor:
    x = ops.rms_norm(x, eps)
    return ops.mul(x, w) if w is not None else x


def rope_2d_neox(x: Tensor, pos_x: Tensor, pos_y: Tensor, base: float = ROPE_BASE) -> Tensor:
    """``x F32[P, H, d]``: the first half of each head neox-roped at ``pos_x``, the second at ``pos_y``."""
    n, nh, d = x.shape
    half = d // 2
    strides = (nh * d * 4, d * 4, 4)
    a = ops.cont(ops.view(x, (n, nh, half), strides, offset=0))
    b = ops.cont(ops.view(x, (n, nh, half), strides, offset=half * 4))
    a = ops.rope(a, pos_x, half, mode=2, freq_base=base)
    b = ops.rope(b, pos_y, half, mode=2, freq_base=base)
    return ops.concat(a, b, axis=2)


def avg_pool(x: Tensor, ny: int, nx: int, k: int) -> Tensor:
    """``[ny*nx, E]`` (row-major patches) -> ``[(ny/k)*(nx/k), E]``: the mean of each k x k block."""
    e = x.shape[1]
    t = ops.cont(ops.transpose(x))  # [E, ny, nx] = [E * ny/k, k, nx/k, k]
    t = ops.reshape(t, (e * (ny // k), k, nx // k, k))
    t = ops.cont(ops.permute(t, (0, 2, 1, 3)))  # [E * ny/k, nx/k, k, k]
    t = ops.mean(ops.reshape(t, (e * (ny // k) * (nx // k), k * k)))
    return ops.cont(ops.transpose(ops.reshape(t, (e, (ny // k) * (nx // k)))))


def _build(m: ClipModel, inp_raw: Tensor) -> Tensor:
    hp, w = m.hparams, m.w
    _, h_px, w_px = inp_raw.shape
    p, k, e, nh = hp.patch_size, hp.n_merge, hp.n_embd, hp.n_head
    dh = e // nh
    if h_px % (p * k) or w_px % (p * k):
        raise MtmdError(f"encode: image {w_px}x{h_px} is not a multiple of {p * k} px (patch size x pooling)")
    nx, ny = w_px // p, h_px // p
    n_tab = hp.extra["n_pos_table"]
    if max(nx, ny) > n_tab:
        raise MtmdError(f"encode: image {w_px}x{h_px} has {max(nx, ny)} patches on a side; the position "
                        f"table has {n_tab}")  # fmt: skip
    n = nx * ny
    rows, cols = np.divmod(np.arange(n, dtype=np.int32), nx)
    pos_x = ops.weight("pos_x", GGMLType.I32, (n,), cols.astype(np.int32))
    pos_y = ops.weight("pos_y", GGMLType.I32, (n,), rows.astype(np.int32))
    pos_y_tab = ops.weight("pos_y_tab", GGMLType.I32, (n,), (rows + n_tab).astype(np.int32))
    x = patch_embed(m, ops.scale(inp_raw, 2.0, -1.0))
    table = ops.reshape(w["v.position_embd.weight"], (2 * n_tab, e))
    x = ops.add(x, ops.add(ops.get_rows(table, pos_x), ops.get_rows(table, pos_y_tab)), name="pos_embd")
    eps = hp.eps
    for il in range(hp.n_layer):
        b = f"v.blk.{il}."
        cur = _rms(x, w[b + "ln1.weight"], eps)
        q = _rms(ops.reshape(_mm(m, b + "attn_q", cur), (n, nh, dh)), w[b + "attn_q_norm.weight"], eps)
        kk = _rms(ops.reshape(_mm(m, b + "attn_k", cur), (n, nh, dh)), w[b + "attn_k_norm.weight"], eps)
        v = _rms(ops.reshape(_mm(m, b + "attn_v", cur), (n, nh, dh)), None, eps)
        q, kk = rope_2d_neox(q, pos_x, pos_y), rope_2d_neox(kk, pos_x, pos_y)
        a = ops.flash_attn_ext(q, kk, v, None, 1.0, name=f"kqv_out-{il}")
        a = _rms(_mm(m, b + "attn_out", ops.reshape(a, (n, e))), w[b + "attn_post_norm.weight"], eps)
        x = ops.add(x, a, name=f"ffn_inp-{il}")
        cur = _rms(x, w[b + "ln2.weight"], eps)
        cur = ops.mul(ops.gelu(_mm(m, b + "ffn_gate", cur)), _mm(m, b + "ffn_up", cur))
        cur = _rms(_mm(m, b + "ffn_down", cur), w[b + "ffn_post_norm.weight"], eps)
        x = ops.add(x, cur, name=f"layer_out-{il}")
    x = ops.scale(avg_pool(x, ny, nx, k), math.sqrt(e), name="pooled")
    if "v.std_bias" in w:
        x = ops.mul(ops.sub(x, w["v.std_bias"]), w["v.std_scale"])
    return _mm(m, "mm.input_projection", ops.rms_norm(x, eps))


def _n_tokens(hp: ClipHParams, width: int, height: int) -> int:
    n = hp.patch_size * hp.n_merge
    return (width // n) * (height // n)


register_projector(Projector(GEMMA4V, _load, _build, _n_tokens, resample="bicubic", preprocess=preprocess))
