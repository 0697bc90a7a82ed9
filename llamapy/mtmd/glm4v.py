"""GLM-4.1V / GLM-4.5V / GLM-4.6V vision tower and patch merger (projector type ``glm4v``, llama.cpp's
``clip_graph_glm4v``, ``tools/mtmd/models/glm4v.cpp``; HF's ``Glm4vVisionModel``).

- Patch embedding: HF's Conv3d over two identical frames is the two 2-D kernels ``v.patch_embd.weight`` /
  ``.weight.1`` on the one image, added, plus ``v.patch_embd.bias``; patches in merge order (2 x 2 blocks
  consecutive, blocks row-major: HF's processor order), then RMSNorm ``v.norm_embd`` (HF's
  ``post_conv_layernorm``).
- Learned positions ``v.position_embd.weight`` (a square table) resampled to the patch grid **bicubically**
  (HF's ``grid_sample(mode="bicubic", align_corners=False, padding_mode="border")``, llama.cpp's
  ``resize_position_embeddings(GGML_SCALE_MODE_BICUBIC)``: half-pixel centres, the cubic convolution kernel
  with a = -0.75, taps clamped at the border): sixteen ``get_rows`` taps with constant indices and weights.
- Blocks: RMSNorm, fused qkv (no bias; or q, k, v apart), 2-D vision rope (``qwen2vl.vision_rope``), bidirectional attention,
  RMSNorm, SwiGLU; then ``v.post_ln`` (RMSNorm).
- Merger: the 2 x 2 downsample convolution ``mm.patch_merger`` (weight ``[out, E, 2, 2]`` + bias) as one
  matrix over the four consecutive patches, ``mm.model.fc`` (no bias), LayerNorm ``mm.post_norm`` (eps 1e-5),
  exact GELU, SwiGLU ``mm.gate`` / ``mm.up`` / ``mm.down``.

Preprocessing is llama.cpp's ``mtmd_image_preprocessor_dyn_size`` (Qwen2-VL's, ``qwen2vl.preprocess``); the
image's tokens take M-RoPE positions and sit between ``<|begin_of_image|>`` and ``<|end_of_image|>``.
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
from .qwen2vl import preprocess, vision_rope, vision_rope_factors
from .qwen3vl import merge_order, merge_order_patches
from .siglip import _linear, _norm

if TYPE_CHECKING:
    from ..model.blocks import TensorLoader
    from .clip import ClipModel

__all__ = ["GLM4V", "bicubic_taps", "learned_pos"]

GLM4V = "glm4v"
_A = -0.75  # the cubic convolution kernel of PyTorch's bicubic and ggml's GGML_SCALE_MODE_BICUBIC


def _shape_err(m: ClipModel, name: str, got: object, want: str) -> MtmdError:
    return MtmdError(f"{m.path}: tensor '{name}' has shape {got}; expected {want}")


def _load(m: ClipModel, t: TensorLoader) -> None:
    hp = m.hparams
    mg = m.metadata.get("clip.vision.spatial_merge_size", 2)
    if mg != 2:
        raise MtmdError(f"{m.path}: clip.vision.spatial_merge_size = {mg!r}; only 2 is supported")
    hp.n_merge = 2
    e, p = hp.n_embd, hp.patch_size
    if e % hp.n_head or (e // hp.n_head) % 4:
        raise MtmdError(f"{m.path}: head size {e / hp.n_head:g} is not a multiple of 4 (2-D rope quarters)")
    t("v.patch_embd.weight", (e, 3, p, p))
    t("v.patch_embd.weight.1", (e, 3, p, p))
    t("v.patch_embd.bias", (e,))
    t("v.norm_embd.weight", (e,))
    pos = t("v.position_embd.weight", None)
    side = math.isqrt(pos.shape[0]) if pos is not None and len(pos.shape) == 2 else 0
    if pos is None or side * side != pos.shape[0] or pos.shape[1] != e:
        raise _shape_err(m, "v.position_embd.weight", getattr(pos, "shape", None), f"(side * side, {e})")
    hp.extra["pos_side"] = side
    for il in range(hp.n_layer):
        b = f"v.blk.{il}."
        if t(b + "attn_qkv.weight", (3 * e, e), required=False) is not None:  # the converter's fused qkv
            t(b + "attn_qkv.bias", (3 * e,), required=False)
        else:  # or q, k, v apart (clip.cpp's build_vit takes either)
            for n in ("attn_q", "attn_k", "attn_v"):
                t(b + n + ".weight", (e, e))
                t(b + n + ".bias", (e,), required=False)
        t(b + "attn_out.weight", (e, e))
        t(b + "attn_out.bias", (e,), required=False)
        t(b + "ln1.weight", (e,))
        t(b + "ln2.weight", (e,))
        up = t(b + "ffn_up.weight", None)
        if up is None or len(up.shape) != 2 or up.shape[1] != e:
            raise _shape_err(m, b + "ffn_up.weight", getattr(up, "shape", None), f"(n_ff, {e})")
        t(b + "ffn_gate.weight", (up.shape[0], e))
        t(b + "ffn_down.weight", (e, up.shape[0]))
    t("v.post_ln.weight", (e,))
    mw = t("mm.patch_merger.weight", None)
    if mw is None or tuple(mw.shape)[1:] != (e, 2, 2):
        raise _shape_err(m, "mm.patch_merger.weight", getattr(mw, "shape", None), f"(N, {e}, 2, 2)")
    n = mw.shape[0]
    t("mm.patch_merger.bias", (n,))
    t("mm.model.fc.weight", (n, n))
    t("mm.post_norm.weight", (n,))
    t("mm.post_norm.bias", (n,))
    g = t("mm.gate.weight", None)
    if g is None or len(g.shape) != 2 or g.shape[1] != n:
        raise _shape_err(m, "mm.gate.weight", getattr(g, "shape", None), f"(n_ff, {n})")
    t("mm.up.weight", (g.shape[0], n))
    t("mm.down.weight", (n, g.shape[0]))
    if hp.projection_dim and hp.projection_dim != n:
        raise MtmdError(
            f"{m.path}: clip.vision.projection_dim = {hp.projection_dim} but the merger makes {n}"
        )
    m._n_mmproj_embd = n


# -- graph pieces -------------------------------------------------------------------------------------
def _cubic(t: np.ndarray) -> np.ndarray:
    """float64[4, N]: the weights of the taps at offsets -1, 0, 1, 2 for fractions ``t``."""
    w0 = ((_A * (t + 1) - 5 * _A) * (t + 1) + 8 * _A) * (t + 1) - 4 * _A
    w1 = ((_A + 2) * t - (_A + 3)) * t * t + 1
    u = 1 - t
    w2 = ((_A + 2) * u - (_A + 3)) * u * u + 1
    return np.stack([w0, w1, w2, 1 - w0 - w1 - w2])


def bicubic_taps(side: int, gh: int, gw: int) -> tuple[np.ndarray, np.ndarray]:
    """Bicubic (half-pixel, border-clamped) resampling of a ``side x side`` table to a ``gh x gw`` grid,
    patches in merge order: indices ``int32[16, P]`` into the table and weights ``float32[16, P]``."""
    rows, cols = merge_order(gh, gw, 2)

    def axis(n: int, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        f = (at + 0.5) * (side / n) - 0.5
        i0 = np.floor(f)
        idx = np.clip(i0[None, :] + np.arange(-1, 3)[:, None], 0, side - 1).astype(np.int64)
        return idx, _cubic(f - i0)

    iy, wy = axis(gh, rows.astype(np.float64))
    ix, wx = axis(gw, cols.astype(np.float64))
    idx = (iy[:, None, :] * side + ix[None, :, :]).reshape(16, -1).astype(np.int32)
    wts = (wy[:, None, :] * wx[None, :, :]).reshape(16, -1).astype(np.float32)
    return idx, wts


def _const(name: str, arr: np.ndarray, t: GGMLType) -> Tensor:
    return ops.weight(name, t, arr.shape, np.ascontiguousarray(arr))


def learned_pos(table: Tensor, side: int, gh: int, gw: int) -> Tensor:
    """``F32[P, E]``: the position table resampled to the grid (sixteen weighted row lookups)."""
    idx, wts = bicubic_taps(side, gh, gw)
    out = None
    for k in range(16):
        rows = ops.get_rows(table, _const(f"pos_idx_{k}", idx[k], GGMLType.I32))
        tap = ops.mul(rows, _const(f"pos_w_{k}", wts[k].reshape(-1, 1), GGMLType.F32))
        out = tap if out is None else ops.add(out, tap)
    return out


def _build(m: ClipModel, inp_raw: Tensor) -> Tensor:
    hp, w = m.hparams, m.w
    c, h, wd = inp_raw.shape
    p, e, nh = hp.patch_size, hp.n_embd, hp.n_head
    if h % (2 * p) or wd % (2 * p):
        raise MtmdError(f"encode: image {wd}x{h} is not a multiple of patch size x merge = {2 * p}")
    gh, gw = h // p, wd // p
    n_pos, dh = gh * gw, e // nh
    pix = merge_order_patches(inp_raw, p, 2)
    k0 = ops.reshape(w["v.patch_embd.weight"], (e, c * p * p))
    k1 = ops.reshape(w["v.patch_embd.weight.1"], (e, c * p * p))
    x = ops.add(
        ops.add(ops.mul_mat(k0, pix), ops.mul_mat(k1, pix)), w["v.patch_embd.bias"], name="patch_bias"
    )
    x = _norm(x, w["v.norm_embd.weight"], None, hp.eps, rms=True)
    x = ops.add(x, learned_pos(w["v.position_embd.weight"], hp.extra["pos_side"], gh, gw), name="inp_pos")
    rows, cols = merge_order(gh, gw, 2)
    pos_rc = _const("pos_rc", np.concatenate([rows, cols, rows, cols]).astype(np.int32), GGMLType.I32)
    rope_ff = _const("rope_freq_factors", vision_rope_factors(dh), GGMLType.F32)
    for il in range(hp.n_layer):
        b = f"v.blk.{il}."
        cur = _norm(x, w[b + "ln1.weight"], None, hp.eps, rms=True)
        if b + "attn_qkv.weight" in w:
            qkv = _linear(cur, w[b + "attn_qkv.weight"], w.get(b + "attn_qkv.bias"))  # [P, 3E]
            q, k, v = (
                ops.reshape(ops.cont(ops.view(qkv, (n_pos, e), qkv.strides, 4 * e * i)), (n_pos, nh, dh))
                for i in range(3)
            )
        else:
            q, k, v = (
                ops.reshape(
                    _linear(cur, w[f"{b}attn_{n}.weight"], w.get(f"{b}attn_{n}.bias")), (n_pos, nh, dh)
                )
                for n in "qkv"
            )
        q, k = vision_rope(q, pos_rc, rope_ff), vision_rope(k, pos_rc, rope_ff)
        a = ops.flash_attn_ext(q, k, v, None, 1.0 / math.sqrt(dh), name=f"kqv_out-{il}")
        a = _linear(ops.reshape(a, (n_pos, e)), w[b + "attn_out.weight"], w.get(b + "attn_out.bias"))
        x = ops.add(a, x, name=f"ffn_inp-{il}")
        cur = _norm(x, w[b + "ln2.weight"], None, hp.eps, rms=True)
        cur = ops.swiglu(ops.mul_mat(w[b + "ffn_gate.weight"], cur), ops.mul_mat(w[b + "ffn_up.weight"], cur))
        x = ops.add(x, ops.mul_mat(w[b + "ffn_down.weight"], cur), name=f"layer_out-{il}")
    x = _norm(x, w["v.post_ln.weight"], None, hp.eps, rms=True)
    # the 2 x 2 downsample conv: each unit's four consecutive patches (dy, dx) as [E, dy, dx], the order of
    # the kernel's [out, E, 2, 2] rows
    mw = w["mm.patch_merger.weight"]
    x = ops.cont(ops.permute(ops.reshape(x, (n_pos // 4, 4, e)), (0, 2, 1)))
    x = _linear(
        ops.reshape(x, (n_pos // 4, 4 * e)), ops.reshape(mw, (mw.shape[0], 4 * e)), w["mm.patch_merger.bias"]
    )
    x = ops.mul_mat(w["mm.model.fc.weight"], x)
    x = gelu_erf(_norm(x, w["mm.post_norm.weight"], w["mm.post_norm.bias"], 1e-5))
    x = ops.swiglu(ops.mul_mat(w["mm.gate.weight"], x), ops.mul_mat(w["mm.up.weight"], x))
    out = ops.mul_mat(w["mm.down.weight"], x)
    out.name = "mm_out"
    return out


def _tokens(hp: ClipHParams, width: int, height: int) -> int:
    s = hp.patch_size * 2
    return (width // s) * (height // s)


register_projector(
    Projector(GLM4V, _load, _build, _tokens, resample="bicubic", mrope=True, preprocess=preprocess)
)
