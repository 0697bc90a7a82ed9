"""Qwen3-VL's vision tower and patch merger with deepstack (projector type ``qwen3vl_merger``, llama.cpp's
``clip_graph_qwen3vl``, ``tools/mtmd/models/qwen3vl.cpp``).

- Patch embedding: HF's Conv3d over two identical frames (temporal patch 2) is llama.cpp's two 2-D kernels
  ``v.patch_embd.weight`` / ``v.patch_embd.weight.1`` applied to the one image and added, plus the bias;
  each as im2col (views) + ``mul_mat``. Patches are then in *merge order*: each ``n_merge x n_merge`` block
  of neighbouring patches consecutive, blocks row-major (HF's processor order, llama.cpp's permutes).
- Learned positions ``v.position_embd.weight`` (a square table) bilinearly interpolated to the patch grid with
  aligned corners (HF's ``align_corners=True``; llama.cpp's ``resize_position_embeddings``): four
  ``get_rows`` taps with constant indices/weights, so no table-sized matrix is built.
- 2-D vision rope (llama.cpp ``ggml_rope_multi(GGML_ROPE_TYPE_VISION)``, sections of head/4): of each head's
  quarters q0..q3, the pairs (q0, q2) rotate by the patch row and (q1, q3) by its column, each quarter with
  frequencies ``10000^(-4k/d)``: Qwen2-VL's ``qwen2vl.vision_rope`` (one multi-section rope op).
- Blocks: LayerNorm, fused qkv, bidirectional attention, LayerNorm, GELU (tanh) MLP, all with biases.
- Merger: ``v.post_ln`` (LayerNorm over n_embd), merge of 4 patches into one ``4 n_embd`` row, ``mm.0``,
  GELU, ``mm.2``. **Deepstack**: after each layer flagged in ``clip.vision.is_deepstack_layers`` the hidden
  state is merged, LayerNormed over ``4 n_embd`` (``v.deepstack.{il}.norm``) and projected by its own
  ``fc1``/GELU/``fc2``; the outputs are concatenated after the main embedding along the feature axis, so an
  image token is ``n_embd_text * (1 + n_deepstack)`` wide (the text model's ``n_embd_inp``).

Preprocessing is Qwen2-VL's dynamic size (``qwen2vl.preprocess``, llama.cpp's
``mtmd_image_preprocessor_dyn_size``: sides multiples of ``patch * merge``, 8..4096 tokens; see qwen2vl.py for
where it differs from HF's processor); the image's tokens take M-RoPE positions (``Projector.mrope``).

Where this differs from Hugging Face: the mergers' GELU is ggml's tanh approximation (llama.cpp's
``FFN_GELU``), HF's ``nn.GELU()`` is the exact erf one (measured on the tiny test model: 1.2e-4..1.8e-4
relative on the embeddings; the tests give the HF model the tanh GELU).
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
from .qwen2vl import preprocess, vision_rope, vision_rope_factors
from .siglip import _linear, _norm

if TYPE_CHECKING:
    from ..model.blocks import TensorLoader, Weights
    from .clip import ClipModel

__all__ = ["deepstack_layers", "interp_taps", "learned_pos", "merge_order_patches"]


# -- hyper-parameters and tensors ---------------------------------------------------------------------
def deepstack_layers(m: ClipModel) -> list[int]:
    """The layers whose output feeds a deepstack merger (``clip.vision.is_deepstack_layers``)."""
    v = m.metadata.get("clip.vision.is_deepstack_layers")
    if v is None:
        return []
    a = np.asarray(v).reshape(-1)
    if a.dtype.kind not in "biu":
        raise MtmdError(f"{m.path}: clip.vision.is_deepstack_layers must be an array of booleans, got {v!r}")
    flags = [bool(x) for x in a]
    if len(flags) != m.hparams.n_layer:
        raise MtmdError(
            f"{m.path}: clip.vision.is_deepstack_layers has {len(flags)} entries, expected one per layer "
            f"({m.hparams.n_layer})"
        )
    return [il for il, f in enumerate(flags) if f]


def _load(m: ClipModel, t: TensorLoader) -> None:
    hp = m.hparams
    mg = m.metadata.get("clip.vision.spatial_merge_size", 2)
    if not isinstance(mg, int) or mg < 1:
        raise MtmdError(f"{m.path}: clip.vision.spatial_merge_size must be a positive integer, got {mg!r}")
    hp.n_merge = mg
    e, p, ff = hp.n_embd, hp.patch_size, hp.n_ff
    if (e // hp.n_head) % 4:
        raise MtmdError(f"{m.path}: head size {e // hp.n_head} is not a multiple of 4 (2-D rope quarters)")
    t("v.patch_embd.weight", (e, 3, p, p))
    t("v.patch_embd.weight.1", (e, 3, p, p))
    t("v.patch_embd.bias", (e,))
    pos = t("v.position_embd.weight", None)
    side = math.isqrt(pos.shape[0]) if pos is not None and len(pos.shape) == 2 else 0
    if pos is None or side * side != pos.shape[0] or pos.shape[1] != e:
        raise MtmdError(
            f"{m.path}: tensor 'v.position_embd.weight' has shape {getattr(pos, 'shape', None)}; expected "
            f"(side * side, {e})"
        )
    hp.extra["pos_side"] = side
    for il in range(hp.n_layer):
        b = f"v.blk.{il}."
        t(b + "attn_qkv.weight", (3 * e, e))
        t(b + "attn_qkv.bias", (3 * e,))
        t(b + "attn_out.weight", (e, e))
        t(b + "attn_out.bias", (e,))
        for n in ("ln1", "ln2"):
            t(b + n + ".weight", (e,))
            t(b + n + ".bias", (e,))
        t(b + "ffn_up.weight", (ff, e))
        t(b + "ffn_up.bias", (ff,))
        t(b + "ffn_down.weight", (e, ff))
        t(b + "ffn_down.bias", (e,))
    t("v.post_ln.weight", (e,))
    t("v.post_ln.bias", (e,))
    em = e * mg * mg
    n_text = _merger_tensors(m, t, "mm.0", "mm.2", em)
    ds = deepstack_layers(m)
    for il in ds:
        t(f"v.deepstack.{il}.norm.weight", (em,))
        t(f"v.deepstack.{il}.norm.bias", (em,))
        n = _merger_tensors(m, t, f"v.deepstack.{il}.fc1", f"v.deepstack.{il}.fc2", em)
        if n != n_text:
            raise MtmdError(f"{m.path}: deepstack merger {il} makes {n} values, the main merger {n_text}")
    hp.extra["deepstack"] = ds
    if hp.projection_dim and hp.projection_dim != n_text:
        raise MtmdError(
            f"{m.path}: clip.vision.projection_dim = {hp.projection_dim} but mm.2.weight makes {n_text} values"
        )
    m._n_mmproj_embd = n_text * (1 + len(ds))


def _merger_tensors(m: ClipModel, t: TensorLoader, fc1: str, fc2: str, em: int) -> int:
    t(fc1 + ".weight", (em, em))
    t(fc1 + ".bias", (em,))
    w2 = t(fc2 + ".weight", None)
    if w2 is None or len(w2.shape) != 2 or w2.shape[1] != em:
        raise MtmdError(
            f"{m.path}: tensor '{fc2}.weight' has shape {getattr(w2, 'shape', None)}; expected "
            f"(n_embd of the text model, {em})"
        )
    t(fc2 + ".bias", (w2.shape[0],))
    return int(w2.shape[0])


# -- graph pieces -------------------------------------------------------------------------------------
def merge_order(gh: int, gw: int, mg: int) -> tuple[np.ndarray, np.ndarray]:
    """Row and column of each patch in merge order (``mg x mg`` blocks consecutive, blocks row-major)."""
    by, bx, dy, dx = np.meshgrid(
        np.arange(gh // mg), np.arange(gw // mg), np.arange(mg), np.arange(mg), indexing="ij"
    )
    return (by * mg + dy).reshape(-1), (bx * mg + dx).reshape(-1)


def merge_order_patches(inp_raw: Tensor, p: int, mg: int) -> Tensor:
    """``F32[C, H, W]`` -> ``F32[P, C*p*p]``: the pixels of each patch (channel, row, column), in merge order."""
    c, h, w = inp_raw.shape
    gh, gw = h // p, w // p
    x = ops.reshape(inp_raw, (c * gh, p, gw, p))
    x = ops.cont(ops.permute(x, (0, 2, 1, 3)))  # [C*gh, gw, p, p]
    x = ops.reshape(x, (c, gh * gw, p * p))
    x = ops.cont(ops.permute(x, (1, 0, 2)))  # [gh*gw, C, p*p] (row-major patches)
    x = ops.reshape(x, (gh // mg, mg, gw // mg, mg * c * p * p))  # [block row, dy, block col, (dx, K)]
    x = ops.cont(ops.permute(x, (0, 2, 1, 3)))
    return ops.reshape(x, (gh * gw, c * p * p), name="inp_patches")


def interp_taps(side: int, gh: int, gw: int, mg: int) -> tuple[np.ndarray, np.ndarray]:
    """Bilinear (aligned corners) resampling of a ``side x side`` table to a ``gh x gw`` grid, patches in
    merge order: indices ``int32[4, P]`` into the table and weights ``float32[4, P]``."""
    rows, cols = merge_order(gh, gw, mg)

    def axis(n: int, at: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        f = at * ((side - 1) / (n - 1)) if n > 1 else np.zeros(len(at))
        i0 = np.minimum(np.floor(f).astype(np.int64), side - 1)
        return i0, np.minimum(i0 + 1, side - 1), f - i0

    y0, y1, fy = axis(gh, rows.astype(np.float64))
    x0, x1, fx = axis(gw, cols.astype(np.float64))
    idx = np.stack([y0 * side + x0, y0 * side + x1, y1 * side + x0, y1 * side + x1]).astype(np.int32)
    wts = np.stack([(1 - fy) * (1 - fx), (1 - fy) * fx, fy * (1 - fx), fy * fx]).astype(np.float32)
    return idx, wts


def _const(name: str, arr: np.ndarray, t: GGMLType) -> Tensor:
    return ops.weight(name, t, arr.shape, np.ascontiguousarray(arr))


def learned_pos(table: Tensor, side: int, gh: int, gw: int, mg: int) -> Tensor:
    """``F32[P, E]``: the position table resampled to the grid (four weighted row lookups)."""
    idx, wts = interp_taps(side, gh, gw, mg)
    out = None
    for k in range(4):
        rows = ops.get_rows(table, _const(f"pos_idx_{k}", idx[k], GGMLType.I32))
        tap = ops.mul(rows, _const(f"pos_w_{k}", wts[k].reshape(-1, 1), GGMLType.F32))
        out = tap if out is None else ops.add(out, tap)
    return out


def _merger(x: Tensor, w: Weights, fc1: str, fc2: str) -> Tensor:
    x = ops.gelu(_linear(x, w[fc1 + ".weight"], w[fc1 + ".bias"]))
    return _linear(x, w[fc2 + ".weight"], w[fc2 + ".bias"])


def _build(m: ClipModel, inp_raw: Tensor) -> Tensor:
    hp, w = m.hparams, m.w
    c, h, wd = inp_raw.shape
    p, mg, e, nh = hp.patch_size, hp.n_merge, hp.n_embd, hp.n_head
    if h % (p * mg) or wd % (p * mg):
        raise MtmdError(f"encode: image {wd}x{h} is not a multiple of patch size x merge = {p * mg}")
    gh, gw = h // p, wd // p
    n_pos, dh, em = gh * gw, e // nh, e * mg * mg
    pix = merge_order_patches(inp_raw, p, mg)
    k0 = ops.reshape(w["v.patch_embd.weight"], (e, c * p * p))
    k1 = ops.reshape(w["v.patch_embd.weight.1"], (e, c * p * p))
    x = ops.add(
        ops.add(ops.mul_mat(k0, pix), ops.mul_mat(k1, pix)), w["v.patch_embd.bias"], name="patch_bias"
    )
    pos = learned_pos(w["v.position_embd.weight"], hp.extra["pos_side"], gh, gw, mg)
    x = ops.add(x, pos, name="inp_pos_emb")
    rows, cols = merge_order(gh, gw, mg)
    pos_rc = _const("pos_rc", np.concatenate([rows, cols, rows, cols]).astype(np.int32), GGMLType.I32)
    rope_ff = _const("rope_freq_factors", vision_rope_factors(dh), GGMLType.F32)
    ds = set(hp.extra["deepstack"])
    feats: list[Tensor] = []
    for il in range(hp.n_layer):
        b = f"v.blk.{il}."
        cur = _norm(x, w[b + "ln1.weight"], w[b + "ln1.bias"], hp.eps)
        qkv = _linear(cur, w[b + "attn_qkv.weight"], w[b + "attn_qkv.bias"])  # [P, 3E]
        q, k, v = (
            ops.reshape(ops.cont(ops.view(qkv, (n_pos, e), qkv.strides, 4 * e * i)), (n_pos, nh, dh))
            for i in range(3)
        )
        q, k = vision_rope(q, pos_rc, rope_ff), vision_rope(k, pos_rc, rope_ff)
        a = ops.flash_attn_ext(q, k, v, None, 1.0 / math.sqrt(dh), name=f"kqv_out-{il}")
        a = _linear(ops.reshape(a, (n_pos, e)), w[b + "attn_out.weight"], w[b + "attn_out.bias"])
        x = ops.add(a, x, name=f"ffn_inp-{il}")
        cur = _norm(x, w[b + "ln2.weight"], w[b + "ln2.bias"], hp.eps)
        cur = ops.gelu(_linear(cur, w[b + "ffn_up.weight"], w[b + "ffn_up.bias"]))
        cur = _linear(cur, w[b + "ffn_down.weight"], w[b + "ffn_down.bias"])
        x = ops.add(x, cur, name=f"layer_out-{il}")
        if il in ds:
            d = f"v.deepstack.{il}."
            f = _norm(
                ops.reshape(x, (n_pos // (mg * mg), em)), w[d + "norm.weight"], w[d + "norm.bias"], hp.eps
            )
            feats.append(_merger(f, w, d + "fc1", d + "fc2"))
    x = _norm(x, w["v.post_ln.weight"], w["v.post_ln.bias"], hp.eps)
    out = _merger(ops.reshape(x, (n_pos // (mg * mg), em)), w, "mm.0", "mm.2")
    for f in feats:  # [main | deepstack 0 | deepstack 1 ...] along the features
        out = ops.concat(out, f, axis=1)
    out.name = "mm_out"
    return out


def _tokens(hp: ClipHParams, width: int, height: int) -> int:
    s = hp.patch_size * hp.n_merge
    return (width // s) * (height // s)


# the same dynamic-size preprocessing as Qwen2-VL (llama.cpp's mtmd_image_preprocessor_dyn_size), the image's
# tokens at M-RoPE positions and <|vision_start|> ... <|vision_end|> around them (mtmd.py, ``mrope``)
register_projector(
    Projector("qwen3vl_merger", _load, _build, _tokens, resample="bicubic", mrope=True, preprocess=preprocess)
)
