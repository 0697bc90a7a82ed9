"""SigLIP / CLIP vision transformers (llama.cpp's ``clip_graph::build_vit``) and the projectors built on
them: ``gemma3`` (average pool, soft-embedding RMS norm, projection).

Axis order is NumPy's (see ARCHITECTURE.md): a ggml ``{n_embd, n_patches}`` tensor is ``[n_patches,
n_embd]`` here. The patch convolution (kernel = stride = patch size) is an im2col done with views
(reshape, permute, cont) followed by one ``mul_mat`` with the kernel seen as ``[n_embd, 3 * p * p]``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..ggml import ops
from ..ggml.tensor import Tensor
from .clip import ClipHParams, Projector, register_projector

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..model.blocks import TensorLoader
    from .clip import ClipModel


# -- tensors ----------------------------------------------------------------------------------------
def load_vit(
    m: ClipModel, t: TensorLoader, pre_ln: bool = False, post_ln: bool | None = True, n_extra_pos: int = 0
) -> None:
    """The ViT's tensors; ``post_ln=None``: optional; ``n_extra_pos``: positions beyond the patches (CLS)."""
    hp = m.hparams
    e, p, n_pos = hp.n_embd, hp.patch_size, hp.n_patches_side**2 + n_extra_pos
    t("v.patch_embd.weight", (e, 3, p, p))
    t("v.patch_embd.bias", (e,), required=False)
    t("v.position_embd.weight", (n_pos, e))
    if pre_ln:
        t("v.pre_ln.weight", (e,))
        t("v.pre_ln.bias", (e,))
    load_vit_blocks(m, t)
    if post_ln is not False:
        t("v.post_ln.weight", (e,), required=bool(post_ln))
        t("v.post_ln.bias", (e,), required=bool(post_ln))


def load_vit_blocks(
    m: ClipModel, t: TensorLoader, ffn: Callable[[ClipModel, TensorLoader, str], None] | None = None
) -> None:
    """The ViT's ``v.blk.N.`` tensors: attention (optional biases), the two layer norms, and the FFN
    (``ffn(m, t, prefix)`` where a projector's FFN differs; default up/down with optional biases)."""
    hp = m.hparams
    e = hp.n_embd
    for il in range(hp.n_layer):
        b = f"v.blk.{il}."
        for n in ("attn_q", "attn_k", "attn_v", "attn_out"):
            t(b + n + ".weight", (e, e))
            t(b + n + ".bias", (e,), required=False)
        for n in ("ln1", "ln2"):
            t(b + n + ".weight", (e,))
            t(b + n + ".bias", (e,))
        if ffn is not None:
            ffn(m, t, b)
            continue
        t(b + "ffn_up.weight", (hp.n_ff, e))
        t(b + "ffn_up.bias", (hp.n_ff,), required=False)
        t(b + "ffn_down.weight", (e, hp.n_ff))
        t(b + "ffn_down.bias", (e,), required=False)


# -- graph pieces -----------------------------------------------------------------------------------
def _norm(x: Tensor, w: Tensor | None, b: Tensor | None, eps: float, rms: bool = False) -> Tensor:
    x = ops.rms_norm(x, eps) if rms else ops.norm(x, eps)
    if w is not None:
        x = ops.mul(x, w)
    if b is not None:
        x = ops.add(x, b)
    return x


def _linear(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    y = ops.mul_mat(w, x)
    return ops.add(y, b) if b is not None else y


def _act(x: Tensor, op: str) -> Tensor:
    if op == "gelu":
        return ops.gelu(x)
    if op == "silu":
        return ops.silu(x)
    return ops.gelu_quick(x)


def patch_embed(m: ClipModel, inp_raw: Tensor) -> Tensor:
    """``F32[3, H, W]`` -> ``F32[n_patches, n_embd]`` (patches row-major), as ``ggml_conv_2d`` + bias."""
    hp, w = m.hparams, m.w
    c, h, wd = inp_raw.shape
    p = hp.patch_size
    nh, nw = h // p, wd // p
    # [C*nh, p, nw, p] -> [C*nh, nw, p, p] -> [C, nh*nw, p*p] -> [nh*nw, C, p*p] -> [P, C*p*p]
    x = ops.reshape(inp_raw, (c * nh, p, nw, p))
    x = ops.cont(ops.permute(x, (0, 2, 1, 3)))
    x = ops.reshape(x, (c, nh * nw, p * p))
    x = ops.cont(ops.permute(x, (1, 0, 2)))
    x = ops.reshape(x, (nh * nw, c * p * p), name="inp_patches")
    k = ops.reshape(w["v.patch_embd.weight"], (hp.n_embd, c * p * p))
    return _linear(x, k, w.get("v.patch_embd.bias"))


def build_vit(m: ClipModel, x: Tensor, learned_pos: Tensor | None, n_layer: int | None = None) -> Tensor:
    """Pre-norm ViT blocks over ``x F32[n_pos, n_embd]``: bidirectional attention, then the FFN
    (the first ``n_layer`` blocks; all by default)."""
    hp, w = m.hparams, m.w
    n_pos, e = x.shape
    nh = hp.n_head
    dh = e // nh
    if learned_pos is not None:
        x = ops.add(x, learned_pos, name="pos_embed")
    if "v.pre_ln.weight" in w:
        x = _norm(x, w["v.pre_ln.weight"], w.get("v.pre_ln.bias"), hp.eps)
    for il in range(hp.n_layer if n_layer is None else n_layer):
        b = f"v.blk.{il}."
        cur = _norm(x, w[b + "ln1.weight"], w.get(b + "ln1.bias"), hp.eps)
        q = ops.reshape(_linear(cur, w[b + "attn_q.weight"], w.get(b + "attn_q.bias")), (n_pos, nh, dh))
        k = ops.reshape(_linear(cur, w[b + "attn_k.weight"], w.get(b + "attn_k.bias")), (n_pos, nh, dh))
        v = ops.reshape(_linear(cur, w[b + "attn_v.weight"], w.get(b + "attn_v.bias")), (n_pos, nh, dh))
        a = ops.flash_attn_ext(q, k, v, None, 1.0 / math.sqrt(dh), name=f"kqv_out-{il}")
        a = _linear(ops.reshape(a, (n_pos, e)), w[b + "attn_out.weight"], w.get(b + "attn_out.bias"))
        x = ops.add(a, x, name=f"ffn_inp-{il}")
        cur = _norm(x, w[b + "ln2.weight"], w.get(b + "ln2.bias"), hp.eps)
        cur = _act(_linear(cur, w[b + "ffn_up.weight"], w.get(b + "ffn_up.bias")), hp.ffn_op)
        cur = _linear(cur, w[b + "ffn_down.weight"], w.get(b + "ffn_down.bias"))
        x = ops.add(x, cur, name=f"layer_out-{il}")
    if "v.post_ln.weight" in w:
        x = _norm(x, w["v.post_ln.weight"], w.get("v.post_ln.bias"), hp.eps)
    return x


def avg_pool_2d(x: Tensor, side: int, k: int) -> Tensor:
    """``[side*side, E]`` (row-major patches) -> ``[(side/k)^2, E]``: mean over k x k blocks
    (ggml_pool_2d AVG, kernel = stride = k)."""
    e = x.shape[1]
    s = side // k
    t = ops.cont(ops.transpose(x))  # [E, side*side] = [E*s, k, s, k] (rows R, i; cols C, j)
    t = ops.reshape(t, (e * s, k, s, k))
    t = ops.cont(ops.permute(t, (0, 2, 1, 3)))  # [E*s, s, k, k]
    t = ops.mean(ops.reshape(t, (e * s * s, k * k)))
    return ops.cont(ops.transpose(ops.reshape(t, (e, s * s))))


# -- gemma3 -----------------------------------------------------------------------------------------
def _gemma3_load(m: ClipModel, t: TensorLoader) -> None:
    hp = m.hparams
    if hp.n_merge == 0:
        hp.n_merge = int(m.metadata.get("clip.vision.projector.scale_factor", 4))  # llama.cpp's default
    side = hp.n_patches_side
    if hp.n_merge <= 0 or side % hp.n_merge:
        raise_pool(m, side)
    load_vit(m, t)
    t("mm.soft_emb_norm.weight", (hp.n_embd,))
    proj = t("mm.input_projection.weight", None)
    if proj is None or len(proj.shape) != 2 or proj.shape[0] != hp.n_embd:
        from .errors import MtmdError

        raise MtmdError(
            f"{m.path}: tensor 'mm.input_projection.weight' has shape {getattr(proj, 'shape', None)}; "
            f"expected ({hp.n_embd}, n_embd of the text model)"
        )
    m._n_mmproj_embd = proj.shape[1]
    if hp.projection_dim and hp.projection_dim != proj.shape[1]:
        from .errors import MtmdError

        raise MtmdError(
            f"{m.path}: clip.vision.projection_dim = {hp.projection_dim} but mm.input_projection.weight "
            f"makes {proj.shape[1]} values"
        )


def raise_pool(m: ClipModel, side: int) -> None:
    from .errors import MtmdError

    raise MtmdError(
        f"{m.path}: {side}x{side} patches cannot be pooled by clip.vision.projector.scale_factor = "
        f"{m.hparams.n_merge}"
    )


def _gemma3_build(m: ClipModel, inp_raw: Tensor) -> Tensor:
    hp, w = m.hparams, m.w
    x = build_vit(m, patch_embed(m, inp_raw), w["v.position_embd.weight"])
    side = inp_raw.shape[1] // hp.patch_size
    x = avg_pool_2d(x, side, hp.n_merge)
    x = ops.mul(ops.rms_norm(x, hp.eps), w["mm.soft_emb_norm.weight"])
    proj = ops.cont(ops.transpose(w["mm.input_projection.weight"]))  # [n_embd_text, n_embd]
    return ops.mul_mat(proj, x, name="mm_out")


def _pooled_tokens(hp: ClipHParams, width: int, height: int) -> int:
    return (hp.n_patches_side // hp.n_merge) ** 2


register_projector(Projector("gemma3", _gemma3_load, _gemma3_build, _pooled_tokens, non_causal=True))


# -- idefics3 (SmolVLM) -----------------------------------------------------------------------------
def pixel_shuffle(x: Tensor, side: int, s: int) -> Tensor:
    """``[side*side, E]`` -> ``[(side/s)^2, E*s*s]`` (clip_graph::build_patch_merge_permute, HF's
    Idefics3Connector.pixel_shuffle): each s x s block of patches becomes one token."""
    e = x.shape[1]
    t = ops.reshape(x, (side, side // s, e * s))  # s neighbouring columns merged
    t = ops.cont(ops.permute(t, (1, 0, 2)))  # [W/s, H, E*s]
    t = ops.reshape(t, (side // s, side // s, e * s * s))  # s neighbouring rows merged
    t = ops.cont(ops.permute(t, (1, 0, 2)))  # [H/s, W/s, E*s*s]
    return ops.reshape(t, ((side // s) ** 2, e * s * s), name="pixel_shuffle")


def _idefics3_load(m: ClipModel, t: TensorLoader) -> None:
    from .errors import MtmdError

    hp = m.hparams
    sf = m.metadata.get("clip.vision.projector.scale_factor")
    if not isinstance(sf, int) or sf < 2:
        raise MtmdError(
            f"{m.path}: idefics3 needs clip.vision.projector.scale_factor (the pixel shuffle factor, >= 2), "
            f"got {sf!r}"
        )
    hp.n_merge = sf
    if hp.n_patches_side % sf:
        raise_pool(m, hp.n_patches_side)
    load_vit(m, t)
    fc = t("mm.model.fc.weight", None)
    if fc is None or len(fc.shape) != 2 or fc.shape[1] != hp.n_embd * sf * sf:
        raise MtmdError(
            f"{m.path}: tensor 'mm.model.fc.weight' has shape {getattr(fc, 'shape', None)}; expected "
            f"(n_embd of the text model, {hp.n_embd * sf * sf})"
        )
    m._n_mmproj_embd = fc.shape[0]


def _idefics3_build(m: ClipModel, inp_raw: Tensor) -> Tensor:
    hp, w = m.hparams, m.w
    x = build_vit(m, patch_embed(m, inp_raw), w["v.position_embd.weight"])
    x = pixel_shuffle(x, inp_raw.shape[1] // hp.patch_size, hp.n_merge)
    return ops.mul_mat(w["mm.model.fc.weight"], x, name="mm_out")


register_projector(
    Projector("idefics3", _idefics3_load, _idefics3_build, _pooled_tokens, resample="lanczos", stretch=True)
)
