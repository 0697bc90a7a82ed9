"""Gemma 3n vision (llama.cpp's projector type ``gemma3nv``, ``clip_graph_mobilenetv5`` in
``tools/mtmd/models/mobilenetv5.cpp``): the MobileNetV5 tower, its multi-scale fusion adapter (MSFA) and Gemma
3n's soft-token embedder.

The feature map is held channels-last, ``F32[H, W, C]`` (NumPy order; ggml's ``[W, H, C]``), so the RMS norms
over channels (timm's ``RmsNorm2d``, eps 1e-6) are plain row norms and 1x1 convolutions are one ``mul_mat``. A
depthwise ``k x k`` convolution is ``k * k`` strided views of the zero-padded map, each times its tap's
per-channel weights; a full one (the stem, the edge residuals' expansion) is ``k * k`` views each through its
tap's ``[C_out, C_in]`` matrix. Stride-2 convolutions pad as TF's SAME (``Conv2dSame``: ``max((ceil(n / s) - 1)
* s + k - n, 0)``, the odd pixel after), stride-1 ones symmetrically by ``k // 2``.

Blocks (``v.blk.{stage}.{i}.*``, stages 0..3 found by their tensors; the first block of each stage has stride 2):
- edge residual (``conv_exp``): 3x3 conv, RMS norm ``bn1``, GELU (tanh), 1x1 ``conv_pwl``, RMS norm ``bn2``,
  plus the input when the shape is kept;
- universal inverted residual (``dw_start`` / ``pw_exp``): optional depthwise start (+ norm), 1x1 expansion
  (+ norm, GELU), optional depthwise middle (the stride; + norm, GELU), 1x1 projection (+ norm), times
  ``layer_scale.gamma``, plus the input when the shape is kept;
- multi-query attention (``attn.query``): RMS norm ``norm``; queries ``n_head x D`` by a 1x1 conv; one key
  and one value head, each after an optional stride-2 depthwise ``down_conv`` (+ norm); softmax(q k^T /
  sqrt(D)) v; 1x1 ``attn.output``; times ``layer_scale.gamma``, plus the input.
The MSFA takes the outputs of the last blocks of stages 2 and 3 (of the last block when there are fewer than
four stages), upsamples the smaller to the first's size (nearest, whole factors), concatenates the channels,
runs ``v.msfa.ffn`` (1x1 expansion + norm + GELU, 1x1 projection + norm), average-pools to 16 x 16
(llama.cpp's fixed output) and applies ``v.msfa.norm``. The 256 tokens (row-major) are scaled by
``sqrt(C)``, RMS-normed times ``mm.soft_emb_norm``, projected by ``mm.input_projection`` (HF's
``embedding_projection``, ``[n_embd_text, C]``) and RMS-normed again without a weight.

Preprocessing and tokens as gemma3: the image fitted into ``clip.vision.image_size`` (bilinear, black padding;
HF stretches), ``<start_of_image>`` 256 embeddings ``<end_of_image>``, causal attention in the text model.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from .._dataclass import dataclass
from ..ggml import ops
from ..ggml.tensor import Tensor
from ..ggml.types import GGMLType
from .clip import ClipHParams, Projector, register_projector
from .errors import MtmdError

if TYPE_CHECKING:
    from ..model.blocks import TensorLoader
    from .clip import ClipModel

__all__ = ["GEMMA3NV", "OUT_SIDE"]

GEMMA3NV = "gemma3nv"
OUT_SIDE = 16  # llama.cpp's target_out_res: the MSFA's output grid
EPS = 1e-6
_UIR = ("dw_start.conv", "dw_start.bn", "pw_exp.conv", "pw_exp.bn", "dw_mid.conv", "dw_mid.bn",
        "pw_proj.conv", "pw_proj.bn")  # fmt: skip
_ATTN = ("attn.query.proj", "attn.key.proj", "attn.value.proj", "attn.output.proj", "attn.key.down_conv",
         "attn.key.norm", "attn.value.down_conv", "attn.value.norm", "norm")  # fmt: skip


@dataclass
class _Block:
    prefix: str  # "v.blk.S.I."
    kind: str  # "edge", "uir" or "attn"
    stride: int


# -- tensors ----------------------------------------------------------------------------------------
def _shape(m: ClipModel, t: TensorLoader, name: str, ndim: int) -> tuple[int, ...] | None:
    w = t(name, None, required=False)
    if w is None:
        return None
    if len(w.shape) != ndim:
        raise MtmdError(f"{m.path}: tensor {name!r} has shape {w.shape}; expected {ndim} dimensions")
    return tuple(w.shape)


def _conv(m: ClipModel, t: TensorLoader, name: str, c_in: int | None, depthwise: bool = False) -> int | None:
    """A conv weight ``(C_out, C_in, k, k)`` (depthwise: ``(C, 1, k, k)``, odd k); returns C_out."""
    s = _shape(m, t, name, 4)
    if s is None:
        return None
    want_in = 1 if depthwise else c_in
    if (
        s[2] != s[3]
        or s[2] % 2 == 0
        or (want_in is not None and s[1] != want_in)
        or (depthwise and s[0] != c_in)
    ):
        raise MtmdError(f"{m.path}: tensor {name!r} has shape {s}; expected "
                        f"({c_in if depthwise else 'C_out'}, {want_in}, k, k) with k odd")  # fmt: skip
    return s[0]


def _norm_w(m: ClipModel, t: TensorLoader, name: str, c: int) -> None:
    t(name, (c,), required=False)


def _gamma(m: ClipModel, t: TensorLoader, name: str, c: int) -> None:
    g = t(name, None, required=False)
    if g is not None and int(np.prod(g.shape)) != c:
        raise MtmdError(f"{m.path}: tensor {name!r} has shape {g.shape}; expected {c} values")


def _load_block(m: ClipModel, t: TensorLoader, p: str, c: int, stride: int) -> tuple[_Block, int] | None:
    """The block's tensors (checked against the channel count ``c`` coming in); None: no block here."""
    mid = _conv(m, t, p + "conv_exp.weight", c)
    if mid is not None:
        _norm_w(m, t, p + "bn1.weight", mid)
        out = _conv(m, t, p + "conv_pwl.weight", mid)
        if out is None:
            raise MtmdError(f"{m.path}: edge residual {p[:-1]!r} has conv_exp but no conv_pwl.weight")
        _norm_w(m, t, p + "bn2.weight", out)
        return _Block(p, "edge", stride), out
    if _shape(m, t, p + "attn.query.proj.weight", 4) is not None:
        q = _conv(m, t, p + "attn.query.proj.weight", c)
        _norm_w(m, t, p + "norm.weight", c)
        dims = []
        for kv in ("key", "value"):
            if _conv(m, t, f"{p}attn.{kv}.down_conv.weight", c, depthwise=True) is not None:
                _norm_w(m, t, f"{p}attn.{kv}.norm.weight", c)
            d = _conv(m, t, f"{p}attn.{kv}.proj.weight", c)
            if d is None:
                raise MtmdError(f"{m.path}: attention block {p[:-1]!r} has no attn.{kv}.proj.weight")
            dims.append(d)
        dk, dv = dims
        if q is None or q % dk:
            raise MtmdError(f"{m.path}: attention block {p[:-1]!r}: {q} query channels are not whole heads of "
                            f"the key's {dk}")  # fmt: skip
        out = _conv(m, t, p + "attn.output.proj.weight", (q // dk) * dv)
        if out is None or out != c:
            raise MtmdError(f"{m.path}: attention block {p[:-1]!r}: attn.output.proj.weight must give back "
                            f"{c} channels")  # fmt: skip
        _gamma(m, t, p + "layer_scale.gamma", c)
        return _Block(p, "attn", stride), c
    cur, found = c, False
    if _conv(m, t, p + "dw_start.conv.weight", cur, depthwise=True) is not None:
        found = True
        _norm_w(m, t, p + "dw_start.bn.weight", cur)
    e = _conv(m, t, p + "pw_exp.conv.weight", cur)
    if e is not None:
        found, cur = True, e
        _norm_w(m, t, p + "pw_exp.bn.weight", cur)
    if not found:
        return None
    if _conv(m, t, p + "dw_mid.conv.weight", cur, depthwise=True) is not None:
        _norm_w(m, t, p + "dw_mid.bn.weight", cur)
    out = _conv(m, t, p + "pw_proj.conv.weight", cur)
    if out is not None:
        cur = out
        _norm_w(m, t, p + "pw_proj.bn.weight", cur)
    _gamma(m, t, p + "layer_scale.gamma", cur)
    return _Block(p, "uir", stride), cur


def _load(m: ClipModel, t: TensorLoader) -> None:
    hp = m.hparams
    stem = _conv(m, t, "v.conv_stem.conv.weight", 3)
    if stem is None:
        raise MtmdError(f"{m.path}: tensor 'v.conv_stem.conv.weight' is missing")
    _gamma(m, t, "v.conv_stem.conv.bias", stem)
    _norm_w(m, t, "v.conv_stem.bn.weight", stem)
    blocks: list[_Block] = []
    stage_ends: list[int] = []
    chans: list[int] = []  # channels after each block
    c = stem
    for stage in range(4):
        i = 0
        while True:
            got = _load_block(m, t, f"v.blk.{stage}.{i}.", c, 2 if i == 0 else 1)
            if got is None:
                break
            blocks.append(got[0])
            c = got[1]
            chans.append(c)
            i += 1
        if i:
            stage_ends.append(len(blocks) - 1)
    if not blocks:
        raise MtmdError(f"{m.path}: no MobileNetV5 blocks (v.blk.0.0.*) in the mmproj")
    # llama.cpp's is_stage_start: the first block and each one after a stage's end
    for b, blk in enumerate(blocks):
        blk.stride = 2 if b == 0 or (b - 1) in stage_ends else 1
    fusion = [stage_ends[2], stage_ends[3]] if len(stage_ends) >= 4 else [len(blocks) - 1]
    n_in = sum(chans[i] for i in fusion)
    e = _conv(m, t, "v.msfa.ffn.pw_exp.conv.weight", n_in)
    if e is not None:
        _norm_w(m, t, "v.msfa.ffn.pw_exp.bn.weight", e)
        n_in = e
    out = _conv(m, t, "v.msfa.ffn.pw_proj.conv.weight", n_in)
    if out is not None:
        _norm_w(m, t, "v.msfa.ffn.pw_proj.bn.weight", out)
        n_in = out
    _norm_w(m, t, "v.msfa.norm.weight", n_in)
    if n_in != hp.n_embd:
        raise MtmdError(f"{m.path}: the MSFA gives {n_in} channels but clip.vision.embedding_length is "
                        f"{hp.n_embd}")  # fmt: skip
    t("mm.soft_emb_norm.weight", (hp.n_embd,))
    # the hard-token embedder (Gemma 3n's vision vocabulary): written by the converter, unused (llama.cpp)
    t("mm.embedding.weight", None, required=False)
    t("mm.hard_emb_norm.weight", None, required=False)
    proj = t("mm.input_projection.weight", None)
    if proj is None or len(proj.shape) != 2 or proj.shape[1] != hp.n_embd:
        raise MtmdError(f"{m.path}: tensor 'mm.input_projection.weight' has shape {getattr(proj, 'shape', None)}"
                        f"; expected (n_embd of the text model, {hp.n_embd})")  # fmt: skip
    m._n_mmproj_embd = proj.shape[0]
    if hp.image_size % 32:
        raise MtmdError(f"{m.path}: gemma3nv needs clip.vision.image_size to be a multiple of 32, "
                        f"got {hp.image_size}")  # fmt: skip
    hp.extra["mnv5_blocks"] = blocks
    hp.extra["mnv5_fusion"] = fusion


# -- graph pieces ------------------------------------------------------------------------------------
def _rms(x: Tensor, w: Tensor | None) -> Tensor:
    x = ops.rms_norm(x, EPS)
    return ops.mul(x, w) if w is not None else x


def _pads(n: int, k: int, s: int) -> tuple[int, int, int]:
    """(before, after, output size): SAME padding for stride > 1 (the odd pixel after), k // 2 for stride 1."""
    if s == 1:
        return k // 2, k // 2, n
    o = (n + s - 1) // s
    p = max((o - 1) * s + k - n, 0)
    return p // 2, p - p // 2, o


def _taps(x: Tensor, k: int, s: int) -> tuple[list[Tensor], int, int]:
    """The ``k * k`` strided views ``[oh, ow, C]`` of the padded map ``x [H, W, C]`` (row-major taps)."""
    h, w, c = x.shape
    t0, b0, oh = _pads(h, k, s)
    l0, r0, ow = _pads(w, k, s)
    if t0 or b0 or l0 or r0:
        x = ops.pad(x, ((t0, b0), (l0, r0), (0, 0)))
    row = x.shape[1] * c * 4
    return [ops.view(x, (oh, ow, c), (s * row, s * c * 4, 4), offset=ky * row + kx * c * 4)
            for ky in range(k) for kx in range(k)], oh, ow  # fmt: skip


def _conv_dw(x: Tensor, w: Tensor, s: int) -> Tensor:
    """Depthwise conv of ``x [H, W, C]`` with ``w (C, 1, k, k)``, no bias."""
    c, k = w.shape[0], w.shape[2]
    views, _, _ = _taps(x, k, s)
    taps = ops.cont(ops.transpose(ops.reshape(w, (c, k * k))))  # [k*k, C]
    isz = taps.nbytes // (k * k * c)
    out: Tensor | None = None
    for i, v in enumerate(views):
        y = ops.mul(v, ops.view(taps, (c,), (isz,), offset=i * c * isz))
        out = y if out is None else ops.add(out, y)
    assert out is not None
    return out


def _conv_full(x: Tensor, w: Tensor, s: int) -> Tensor:
    """Full conv of ``x [H, W, C_in]`` with ``w (C_out, C_in, k, k)``, no bias: each tap's view through its
    ``[C_out, C_in]`` matrix, summed."""
    co, ci, k = w.shape[0], w.shape[1], w.shape[2]
    if k == 1 and s == 1:
        return ops.mul_mat(ops.reshape(w, (co, ci)), x)
    views, oh, ow = _taps(x, k, s)
    wt = ops.cont(ops.permute(w, (2, 3, 0, 1)))  # [k, k, C_out, C_in]
    isz = wt.nbytes // (k * k * co * ci)
    out: Tensor | None = None
    for i, v in enumerate(views):
        wi = ops.view(wt, (co, ci), (ci * isz, isz), offset=i * co * ci * isz)
        y = ops.mul_mat(wi, ops.cont(v))
        out = y if out is None else ops.add(out, y)
    assert out is not None
    return out


def _pw(x: Tensor, w: Tensor) -> Tensor:
    """1x1 conv: ``x [H, W, C_in]`` through ``w (C_out, C_in, 1, 1)``."""
    return ops.mul_mat(ops.reshape(w, w.shape[:2]), x)


def _gamma_mul(x: Tensor, g: Tensor | None) -> Tensor:
    return ops.mul(x, ops.reshape(g, (g.n_elements,))) if g is not None else x


def _edge(m: ClipModel, x: Tensor, b: _Block) -> Tensor:
    w, p = m.w, b.prefix
    cur = _conv_full(x, w[p + "conv_exp.weight"], b.stride)
    cur = ops.gelu(_rms(cur, w.get(p + "bn1.weight")))
    cur = _rms(_pw(cur, w[p + "conv_pwl.weight"]), w.get(p + "bn2.weight"))
    return ops.add(cur, x) if b.stride == 1 and cur.shape == x.shape else cur


def _uir(m: ClipModel, x: Tensor, p: str, stride: int) -> Tensor:
    w = m.w
    cur = x
    if p + "dw_start.conv.weight" in w:
        cur = _rms(_conv_dw(cur, w[p + "dw_start.conv.weight"], 1), w.get(p + "dw_start.bn.weight"))
    if p + "pw_exp.conv.weight" in w:
        cur = ops.gelu(_rms(_pw(cur, w[p + "pw_exp.conv.weight"]), w.get(p + "pw_exp.bn.weight")))
    if p + "dw_mid.conv.weight" in w:
        cur = ops.gelu(
            _rms(_conv_dw(cur, w[p + "dw_mid.conv.weight"], stride), w.get(p + "dw_mid.bn.weight"))
        )
    if p + "pw_proj.conv.weight" in w:
        cur = _rms(_pw(cur, w[p + "pw_proj.conv.weight"]), w.get(p + "pw_proj.bn.weight"))
    cur = _gamma_mul(cur, w.get(p + "layer_scale.gamma"))
    return ops.add(cur, x) if cur.shape == x.shape else cur


def _attn(m: ClipModel, x: Tensor, p: str) -> Tensor:
    w = m.w
    h, wd, c = x.shape
    cur = _rms(x, w.get(p + "norm.weight"))
    kv = []
    for name in ("key", "value"):
        src = cur
        if f"{p}attn.{name}.down_conv.weight" in w:
            src = _conv_dw(cur, w[f"{p}attn.{name}.down_conv.weight"], 2)
            src = _rms(src, w.get(f"{p}attn.{name}.norm.weight"))
        y = _pw(src, w[f"{p}attn.{name}.proj.weight"])  # [hk, wk, D]
        kv.append(ops.reshape(ops.cont(y), (y.shape[0] * y.shape[1], 1, y.shape[2])))
    k, v = kv
    d = k.shape[2]
    q = _pw(cur, w[p + "attn.query.proj.weight"])
    nh = q.shape[2] // d
    q = ops.reshape(q, (h * wd, nh, d))
    o = ops.flash_attn_ext(q, k, v, None, 1.0 / math.sqrt(d))  # [N, nh, Dv]
    o = ops.reshape(o, (h, wd, nh * v.shape[2]))
    out = _gamma_mul(_pw(o, w[p + "attn.output.proj.weight"]), w.get(p + "layer_scale.gamma"))
    return ops.add(out, x)


def _upsample(x: Tensor, f: int, name: str) -> Tensor:
    """Nearest-neighbour upsampling of ``x [h, w, C]`` by a whole factor (rows gathered)."""
    h, w, c = x.shape
    r = np.arange(h * f) // f
    col = np.arange(w * f) // f
    ids = (r[:, None] * w + col[None, :]).reshape(-1).astype(np.int32)
    idt = ops.weight(name, GGMLType.I32, (ids.size,), ids)
    return ops.reshape(ops.get_rows(ops.reshape(x, (h * w, c)), idt), (h * f, w * f, c))


def _avg_pool(x: Tensor, s: int) -> Tensor:
    """Average pool, kernel = stride = s, of ``x [H, W, C]`` (H, W multiples of s)."""
    h, w, c = x.shape
    row = w * c * 4
    out: Tensor | None = None
    for dy in range(s):
        for dx in range(s):
            v = ops.view(x, (h // s, w // s, c), (s * row, s * c * 4, 4), offset=dy * row + dx * c * 4)
            out = v if out is None else ops.add(out, v)
    assert out is not None
    return ops.scale(out, 1.0 / (s * s))


def _build(m: ClipModel, inp_raw: Tensor) -> Tensor:
    hp, w = m.hparams, m.w
    x = ops.cont(ops.permute(inp_raw, (1, 2, 0)))  # [H, W, 3]
    x = _conv_full(x, w["v.conv_stem.conv.weight"], 2)
    bias = w.get("v.conv_stem.conv.bias")
    if bias is not None:
        x = ops.add(x, ops.reshape(bias, (bias.n_elements,)))
    x = ops.gelu(_rms(x, w.get("v.conv_stem.bn.weight")))
    feats: list[Tensor] = []
    fusion = hp.extra["mnv5_fusion"]
    for i, b in enumerate(hp.extra["mnv5_blocks"]):
        if b.kind == "edge":
            x = _edge(m, x, b)
        elif b.kind == "attn":
            x = _attn(m, x, b.prefix)
        else:
            x = _uir(m, x, b.prefix, b.stride)
        if i in fusion:
            feats.append(x)
    hi_h, hi_w = feats[0].shape[:2]
    cur: Tensor | None = None
    for j, f in enumerate(feats):
        fh, fw = f.shape[:2]
        if fh < hi_h or fw < hi_w:
            if hi_h % fh or hi_w % fw or hi_h // fh != hi_w // fw:
                raise MtmdError(
                    f"encode: MSFA feature {fw}x{fh} does not scale to {hi_w}x{hi_h} by a whole factor"
                )
            f = _upsample(f, hi_w // fw, f"msfa_up_{j}")
        cur = f if cur is None else ops.concat(cur, f, axis=2)
    assert cur is not None
    if "v.msfa.ffn.pw_exp.conv.weight" in w:
        cur = ops.gelu(
            _rms(_pw(cur, w["v.msfa.ffn.pw_exp.conv.weight"]), w.get("v.msfa.ffn.pw_exp.bn.weight"))
        )
    if "v.msfa.ffn.pw_proj.conv.weight" in w:
        cur = _rms(_pw(cur, w["v.msfa.ffn.pw_proj.conv.weight"]), w.get("v.msfa.ffn.pw_proj.bn.weight"))
    if hi_w > OUT_SIDE:
        if hi_w % OUT_SIDE or hi_h != hi_w:
            raise MtmdError(f"encode: the MSFA's {hi_w}x{hi_h} grid does not pool to {OUT_SIDE}x{OUT_SIDE}")
        cur = _avg_pool(cur, hi_w // OUT_SIDE)
    cur = _rms(cur, w.get("v.msfa.norm.weight"))
    gh, gw, c = cur.shape
    if gh * gw != _n_tokens(hp, 0, 0):
        raise MtmdError(f"encode: the MSFA gives {gw}x{gh} tokens but the mmproj announces "
                        f"{_n_tokens(hp, 0, 0)} (clip.vision.image_size / patch_size)")  # fmt: skip
    cur = ops.scale(ops.reshape(ops.cont(cur), (gh * gw, c)), math.sqrt(c))
    cur = _rms(cur, w["mm.soft_emb_norm.weight"])
    cur = ops.mul_mat(w["mm.input_projection.weight"], cur)
    return ops.rms_norm(cur, EPS, name="mm_out")


def _n_tokens(hp: ClipHParams, width: int, height: int) -> int:
    return hp.image_size // hp.patch_size  # llama.cpp's count (the converter writes patch_size = size // 256)


register_projector(Projector(GEMMA3NV, _load, _build, _n_tokens))
