"""LLaVA-style projectors over a CLIP ViT (llama.cpp's ``clip_graph_llava``): ``mlp`` (LLaVA 1.5:
linear, GELU, linear), ``ldp`` and ``ldpv2`` (MobileVLM's lightweight downsample projectors).

The CLIP tower: a class token before the patches, learned positions, a pre-layernorm, and the blocks up
to the feature layer (``clip.vision.feature_layer``, else all but the last: HF's
``vision_feature_layer=-2``); the class token is dropped (``vision_feature_select_strategy="default"``).
Preprocessing as llama.cpp's fixed-size one for these types: fit into the square, padded with the
CLIP mean colour (122, 116, 104), bicubic. Not done: llava-1.6's resolution candidates
(``image_grid_pinpoints``).

``ldp`` (MobileVLM): linear, GELU, linear, then two MobileNetV3 inverted-residual blocks over the patch
grid (3x3 depthwise conv, layer norm over channels, hardswish, squeeze-excite with a hardsigmoid gate, 1x1
conv, layer norm); the first keeps the grid and adds its input, the second has stride 2: ``ceil(side/2)^2``
tokens. ``ldpv2`` (MobileVLM V2): linear, GELU, linear, 2x2 average pool, then a positional 3x3 depthwise
conv (with bias) added to its input: ``(side/2)^2`` tokens. The grid is held channels-last (``[H*W, C]``,
NumPy order), so the layer norms are plain row norms; a depthwise conv is nine strided views of the
zero-padded grid, each times its tap's per-channel weights. (llama.cpp's graph assumes a 24x24 grid;
here the grid is the image's.) The projector tensors are stored squeezed, as llama.cpp's converter
writes them: depthwise kernels ``(C, 3, 3)``, 1x1 convs ``(C_out, C_in)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..ggml import ops
from ..ggml.tensor import Tensor
from .clip import ClipHParams, Projector, register_projector
from .errors import MtmdError
from .siglip import _linear, _norm, avg_pool_2d, build_vit, load_vit, patch_embed

if TYPE_CHECKING:
    from ..model.blocks import TensorLoader
    from .clip import ClipModel

PAD_COLOR = (122, 116, 104)


def _n_feature_layers(m: ClipModel) -> int:
    hp = m.hparams
    n = max(hp.feature_layers) if hp.feature_layers else hp.n_layer - 1
    if not 0 < n <= hp.n_layer:
        raise MtmdError(f"{m.path}: clip.vision.feature_layer {hp.feature_layers} is outside 1..{hp.n_layer}")
    if len(hp.feature_layers) > 1:
        raise MtmdError(f"{m.path}: several vision feature layers {hp.feature_layers} are not supported")
    return n


def _clip_load(m: ClipModel, t: TensorLoader) -> None:
    """The CLIP tower every LLaVA-style projector sits on."""
    hp = m.hparams
    t("v.class_embd", (hp.n_embd,))
    load_vit(m, t, pre_ln=True, post_ln=None, n_extra_pos=1)
    _n_feature_layers(m)


def _mlp_load(m: ClipModel, t: TensorLoader) -> None:
    hp = m.hparams
    _clip_load(m, t)
    w0 = t("mm.0.weight", None)
    if w0 is None or len(w0.shape) != 2 or w0.shape[1] != hp.n_embd:
        raise MtmdError(
            f"{m.path}: tensor 'mm.0.weight' has shape {getattr(w0, 'shape', None)}; expected (N, {hp.n_embd})"
        )
    t("mm.0.bias", (w0.shape[0],))
    w2 = t("mm.2.weight", None)
    if w2 is None or len(w2.shape) != 2 or w2.shape[1] != w0.shape[0]:
        raise MtmdError(
            f"{m.path}: tensor 'mm.2.weight' has shape {getattr(w2, 'shape', None)}; expected (n_embd, {w0.shape[0]})"
        )
    t("mm.2.bias", (w2.shape[0],))
    m._n_mmproj_embd = w2.shape[0]


def _clip_features(m: ClipModel, inp_raw: Tensor) -> Tensor:
    """``F32[3, H, W]`` -> the feature layer's patch states ``[P, E]`` (class token dropped)."""
    w = m.w
    x = patch_embed(m, inp_raw)  # [P, E]
    n_p, e = x.shape
    cls = ops.reshape(w["v.class_embd"], (1, e))
    x = ops.concat(cls, x, axis=0)  # [1 + P, E]: the class token first, as CLIPVisionEmbeddings
    x = build_vit(m, x, w["v.position_embd.weight"], n_layer=_n_feature_layers(m))
    return ops.cont(ops.view(x, (n_p, e), (4 * e, 4), offset=4 * e))  # drop the class token


def _mlp_build(m: ClipModel, inp_raw: Tensor) -> Tensor:
    w = m.w
    x = _clip_features(m, inp_raw)
    x = ops.gelu(_linear(x, w["mm.0.weight"], w["mm.0.bias"]))
    return _linear(x, w["mm.2.weight"], w["mm.2.bias"])


def _mlp_tokens(hp: ClipHParams, width: int, height: int) -> int:
    return (width // hp.patch_size) * (height // hp.patch_size)


register_projector(
    Projector("mlp", _mlp_load, _mlp_build, _mlp_tokens, resample="bicubic", pad_color=PAD_COLOR)
)


# -- ldp / ldpv2 (MobileVLM) --------------------------------------------------------------------------
_MLP = "mm.model.mlp.{}."
_BLK = "mm.model.mb_block.{}.block.{}."


def _shape_of(t: Tensor | None) -> tuple[int, ...] | None:
    return None if t is None else tuple(t.shape)


def _matrix(m: ClipModel, t: TensorLoader, name: str, n_in: int, n_out: int | None = None) -> int:
    """A linear (or squeezed 1x1 conv) weight ``(n_out, n_in)``; returns n_out."""
    w = t(name, None)
    s = _shape_of(w)
    if s is None or len(s) != 2 or s[1] != n_in or (n_out is not None and s[0] != n_out):
        want = f"({n_out if n_out is not None else 'N'}, {n_in})"
        raise MtmdError(f"{m.path}: tensor {name!r} has shape {s}; expected {want}")
    return s[0]


def _dw_kernel(m: ClipModel, t: TensorLoader, name: str, c: int) -> None:
    w = t(name, None)
    s = _shape_of(w)
    if s not in ((c, 3, 3), (c, 1, 3, 3)):
        raise MtmdError(
            f"{m.path}: tensor {name!r} has shape {s}; expected ({c}, 3, 3), a 3x3 depthwise kernel"
        )


def _ldp_mlp_load(m: ClipModel, t: TensorLoader, i0: int, i1: int) -> int:
    _clip_load(m, t)
    c = _matrix(m, t, _MLP.format(i0) + "weight", m.hparams.n_embd)
    t(_MLP.format(i0) + "bias", (c,))
    _matrix(m, t, _MLP.format(i1) + "weight", c, c)
    t(_MLP.format(i1) + "bias", (c,))
    m._n_mmproj_embd = c
    return c


def _ldp_load(m: ClipModel, t: TensorLoader) -> None:
    c = _ldp_mlp_load(m, t, 1, 3)
    for b in (1, 2):
        _dw_kernel(m, t, _BLK.format(b, 0) + "0.weight", c)
        for k in (0, 2):
            t(_BLK.format(b, k) + "1.weight", (c,))
            t(_BLK.format(b, k) + "1.bias", (c,))
        sq = _matrix(m, t, _BLK.format(b, 1) + "fc1.weight", c)
        t(_BLK.format(b, 1) + "fc1.bias", (sq,))
        _matrix(m, t, _BLK.format(b, 1) + "fc2.weight", sq, c)
        t(_BLK.format(b, 1) + "fc2.bias", (c,))
        _matrix(m, t, _BLK.format(b, 2) + "0.weight", c, c)


def _ldpv2_load(m: ClipModel, t: TensorLoader) -> None:
    c = _ldp_mlp_load(m, t, 0, 2)
    if m.hparams.n_patches_side % 2:
        raise MtmdError(f"{m.path}: ldpv2 pools 2x2 but the patch grid is {m.hparams.n_patches_side} wide")
    _dw_kernel(m, t, "mm.model.peg.0.weight", c)
    t("mm.model.peg.0.bias", (c,))


def _hardsigmoid(x: Tensor) -> Tensor:
    """``relu6(x + 3) / 6`` as ``(relu(x + 3) - relu(x - 3)) / 6``."""
    return ops.scale(ops.sub(ops.relu(ops.scale(x, 1.0, 3.0)), ops.relu(ops.scale(x, 1.0, -3.0))), 1.0 / 6.0)


def _hardswish(x: Tensor) -> Tensor:
    return ops.mul(x, _hardsigmoid(x))


def _conv_dw(x: Tensor, k: Tensor, side: int, stride: int, name: str = "") -> tuple[Tensor, int]:
    """3x3 depthwise conv, zero padding 1 (``ggml_conv_2d_dw``) of ``x [side*side, C]`` (row-major grid,
    channels last) with ``k (C, 3, 3)``; returns ``[so*so, C]`` and ``so``."""
    c = x.shape[1]
    so = (side - 1) // stride + 1
    xp = ops.pad(ops.reshape(x, (side, side, c)), ((1, 1), (1, 1), (0, 0)))  # [side+2, side+2, C]
    taps = ops.cont(ops.transpose(ops.reshape(k, (c, 9))))  # [9, C]: row ky*3+kx
    isz = taps.nbytes // (9 * c)
    row = (side + 2) * c * 4
    out: Tensor | None = None
    for ky in range(3):
        for kx in range(3):
            v = ops.view(xp, (so, so, c), (stride * row, stride * c * 4, 4), offset=ky * row + kx * c * 4)
            tap = ops.view(taps, (c,), (isz,), offset=(ky * 3 + kx) * c * isz)
            y = ops.mul(v, tap)
            out = y if out is None else ops.add(out, y)
    assert out is not None
    return ops.reshape(out, (so * so, c), name=name), so


def _ldp_block(m: ClipModel, x: Tensor, side: int, b: int, stride: int) -> tuple[Tensor, int]:
    """One MobileNetV3 inverted residual (depthwise conv + LN + hardswish, squeeze-excite, 1x1 conv + LN)."""
    w, eps = m.w, m.hparams.eps
    p0, p1, p2 = (_BLK.format(b, k) for k in range(3))
    cur, so = _conv_dw(x, w[p0 + "0.weight"], side, stride)
    cur = _hardswish(_norm(cur, w[p0 + "1.weight"], w[p0 + "1.bias"], eps))
    se = ops.reshape(ops.mean(ops.cont(ops.transpose(cur))), (1, cur.shape[1]))  # global average pool
    se = ops.relu(_linear(se, w[p1 + "fc1.weight"], w[p1 + "fc1.bias"]))
    se = _hardsigmoid(_linear(se, w[p1 + "fc2.weight"], w[p1 + "fc2.bias"]))
    cur = ops.mul_mat(w[p2 + "0.weight"], ops.mul(cur, se))
    cur = _norm(cur, w[p2 + "1.weight"], w[p2 + "1.bias"], eps)
    if stride == 1:
        cur = ops.add(x, cur)
    return cur, so


def _ldp_build(m: ClipModel, inp_raw: Tensor) -> Tensor:
    w = m.w
    side = inp_raw.shape[1] // m.hparams.patch_size
    x = ops.gelu(
        _linear(_clip_features(m, inp_raw), w[_MLP.format(1) + "weight"], w[_MLP.format(1) + "bias"])
    )
    x = _linear(x, w[_MLP.format(3) + "weight"], w[_MLP.format(3) + "bias"])
    x, side = _ldp_block(m, x, side, 1, 1)
    x, side = _ldp_block(m, x, side, 2, 2)
    return ops.cont(x, name="mm_out")


def _ldpv2_build(m: ClipModel, inp_raw: Tensor) -> Tensor:
    w = m.w
    side = inp_raw.shape[1] // m.hparams.patch_size
    x = ops.gelu(
        _linear(_clip_features(m, inp_raw), w[_MLP.format(0) + "weight"], w[_MLP.format(0) + "bias"])
    )
    x = _linear(x, w[_MLP.format(2) + "weight"], w[_MLP.format(2) + "bias"])
    x = avg_pool_2d(x, side, 2)
    peg, _ = _conv_dw(x, w["mm.model.peg.0.weight"], side // 2, 1)
    return ops.add(ops.add(peg, w["mm.model.peg.0.bias"]), x, name="mm_out")


def _ldp_tokens(hp: ClipHParams, width: int, height: int) -> int:
    return ((width // hp.patch_size + 1) // 2) * ((height // hp.patch_size + 1) // 2)


def _ldpv2_tokens(hp: ClipHParams, width: int, height: int) -> int:
    return (width // hp.patch_size // 2) * (height // hp.patch_size // 2)


register_projector(
    Projector("ldp", _ldp_load, _ldp_build, _ldp_tokens, resample="bicubic", pad_color=PAD_COLOR)
)
register_projector(
    Projector("ldpv2", _ldpv2_load, _ldpv2_build, _ldpv2_tokens, resample="bicubic", pad_color=PAD_COLOR)
)
