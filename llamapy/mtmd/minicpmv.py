"""MiniCPM-V 2.5 / 2.6 / o-2.6 / 4.0 / 4.5 / o-4.5 vision (llama.cpp's projector type ``resampler``,
``PROJECTOR_TYPE_MINICPMV``, ``clip_graph_minicpmv`` in ``tools/mtmd/models/minicpmv.cpp``): a SigLIP ViT
(idefics2's NaViT position buckets) at the slice's own size, then a perceiver resampler: one cross-attention
layer from a learned query set onto the ViT's tokens, whose keys carry 2-D sin-cos positions.

The graph, in NumPy axis order: the patch embedding (with bias) plus ``v.position_embd.weight[positions]``
(a patch at ``(i, j)`` of an ``h x w`` grid takes the table's bucket ``floor(S i / h) * S + floor(S j / w)``,
``S`` the table's side: 70 in the real models, which llama.cpp hard-codes), the SigLIP blocks, ``v.post_ln``. The resampler
(``resampler.*``): ``kv = ln_kv(x @ kv.T)``, ``q = ln_q(query)``, keys ``kv + pos`` where ``pos[i * w + j]`` is
``[sin(j w_k), cos(j w_k), sin(i w_k), cos(i w_k)]`` with ``w_k = 10000 ** (-k / (D / 4))``, ``k < D / 4``
(MAE's 2-D sin-cos table, the column first), values ``kv``; multi-head attention with heads of 128 (as the
model and llama.cpp: ``n_head = D / 128``), the output projection, ``ln_post``, then ``proj`` (stored
transposed). ``clip.minicpmv_query_num`` queries come out per frame (legacy files: 96 for version 2, else 64).

Versions (``clip.minicpmv_version``): 2 = MiniCPM-Llama3-V 2.5, 3 = 2.6, 4 = o-2.6, 5 = V 4.0, 6 = V 4.5,
100045 = o-4.5; the graph is the same, the tokens differ: version 2 (``MTMD_SLICE_TMPL_MINICPMV_2_5``)
``<image>`` overview ``</image><slice><image>`` slice ``</image>`` ... ``</slice>``; the others
(``MTMD_SLICE_TMPL_MINICPMV_2_6``) ``<image>`` overview ``</image>`` then ``<slice>`` slice ``</slice>`` each;
rows separated by ``\\n``.

Preprocessing: the official llava-uhd slicing (``MiniCPMVImageProcessor.slice_image``, see
``minicpmv4_6.frames`` with a merge of 1: sides multiples of the patch size, slices of about
``clip.vision.image_size`` squared, up to 9). llama.cpp's ``mtmd_image_preprocessor_llava_uhd`` differs on small
images: it slices as soon as a side exceeds the slice size (the model: the area), and stretches an image it does
not slice to the square slice (the model keeps the aspect ratio); and it rounds halves away from zero where
the model's Python rounds them to even.
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
from .minicpmv4_6 import frames, load_pos_table, positions
from .siglip import _linear, _norm, build_vit, load_vit_blocks, patch_embed

if TYPE_CHECKING:
    from ..model.blocks import TensorLoader
    from .clip import ClipModel

__all__ = ["RESAMPLER", "QUERY_NUM", "pieces", "sincos_2d"]

RESAMPLER = "resampler"
# clip.minicpmv_version -> queries when clip.minicpmv_query_num is absent (clip.cpp's legacy fallback)
QUERY_NUM = {2: 96, 3: 64, 4: 64, 5: 64, 6: 64, 100045: 64}
D_HEAD = 128  # the resampler's head size (the model's num_heads = embed_dim // 128; llama.cpp hard-codes it)
R = "resampler."


# -- preprocessing and tokens -----------------------------------------------------------------------
def pieces(bmp: Bitmap, hp: ClipHParams) -> list[str | np.ndarray]:
    """The overview then the slices, with the version's marker texts (mtmd.cpp's MiniCPM-V slice templates)."""
    fr, rows, cols = frames(bmp, hp)
    v25 = hp.extra.get("minicpmv_version") == 2
    out: list[str | np.ndarray] = ["<image>", fr[0], "</image>"]
    if rows == 0:
        return out
    beg, end = ("<image>", "</image>") if v25 else ("<slice>", "</slice>")
    if v25:
        out.append("<slice>")
    for r in range(rows):
        for c in range(cols):
            out += [beg, fr[1 + r * cols + c], end]
        if r < rows - 1:
            out.append("\n")
    if v25:
        out.append("</slice>")
    return out


# -- tensors ----------------------------------------------------------------------------------------
def _shape(m: ClipModel, t: TensorLoader, name: str, ndim: int, what: str) -> Tensor:
    x = t(name, None)
    if x is None or len(x.shape) != ndim:
        raise MtmdError(f"{m.path}: tensor {name!r} has shape {getattr(x, 'shape', None)}; expected {what}")
    return x


def _ffn(m: ClipModel, t: TensorLoader, b: str) -> None:
    """A block's FFN. llama.cpp's legacy MiniCPM-V converter (the only one for this projector) names fc1
    ``ffn_down`` and fc2 ``ffn_up``; as clip.cpp, a ``ffn_down`` that takes ``n_embd`` inputs is fc1 and
    the pair is swapped back."""
    e, f, tl = m.hparams.n_embd, m.hparams.n_ff, t.tensors
    up, down = t(b + "ffn_up.weight", None), t(b + "ffn_down.weight", None)
    bu, bd = t(b + "ffn_up.bias", None, required=False), t(b + "ffn_down.bias", None, required=False)
    if up is not None and down is not None and len(down.shape) == 2 and down.shape[1] == e:
        tl[b + "ffn_up.weight"], tl[b + "ffn_down.weight"] = down, up
        for k, x in ((b + "ffn_up.bias", bd), (b + "ffn_down.bias", bu)):
            tl.pop(k, None)
            if x is not None:
                tl[k] = x
    for k, want in (("ffn_up.weight", (f, e)), ("ffn_up.bias", (f,)), ("ffn_down.weight", (e, f)),
                    ("ffn_down.bias", (e,))):  # fmt: skip
        x = tl.get(b + k)
        if x is not None and tuple(x.shape) != want:
            raise MtmdError(f"{m.path}: tensor '{b + k}' (or its legacy swapped name) has shape "
                            f"{tuple(x.shape)}; expected {want}")  # fmt: skip


def _load(m: ClipModel, t: TensorLoader) -> None:
    hp, md = m.hparams, m.metadata
    raw = md.get("clip.minicpmv_version", 0)
    ver = 2 if raw is None or (isinstance(raw, (int, np.integer)) and raw == 0) else raw  # clip.cpp: 0 -> 2
    if isinstance(ver, bool) or not isinstance(ver, (int, np.integer)) or int(ver) not in QUERY_NUM:
        raise MtmdError(f"{m.path}: clip.minicpmv_version {raw!r} is not a known MiniCPM-V version "
                        f"(known: {', '.join(map(str, QUERY_NUM))})")  # fmt: skip
    ver = int(ver)
    nq = md.get("clip.minicpmv_query_num", 0) or QUERY_NUM[ver]
    if isinstance(nq, bool) or not isinstance(nq, (int, np.integer)) or nq <= 0:
        raise MtmdError(f"{m.path}: clip.minicpmv_query_num must be a positive integer, got {nq!r}")
    nq = int(nq)
    hp.n_merge = 1
    hp.extra.update(minicpmv_version=ver, query_num=nq)
    e, p = hp.n_embd, hp.patch_size
    t("v.patch_embd.weight", (e, 3, p, p))
    t("v.patch_embd.bias", (e,), required=False)
    load_pos_table(m, t)
    load_vit_blocks(m, t, _ffn)
    t("v.post_ln.weight", (e,), required=False)
    t("v.post_ln.bias", (e,), required=False)
    d = _shape(m, t, R + "query", 2, "(query_num, width)").shape[1]
    if d % D_HEAD or d % 4:
        raise MtmdError(f"{m.path}: the resampler's width {d} is not a multiple of its head size {D_HEAD}")
    t(R + "query", (nq, d))
    t(R + "kv.weight", (d, e))
    for n in ("q", "k", "v", "out"):
        t(f"{R}attn.{n}.weight", (d, d))
        t(f"{R}attn.{n}.bias", (d,))
    for n in ("q", "kv", "post"):
        t(f"{R}ln_{n}.weight", (d,))
        t(f"{R}ln_{n}.bias", (d,))
    proj = _shape(m, t, R + "proj.weight", 2, f"(n_embd of the text model, {d})")
    if proj.shape[1] != d:
        raise MtmdError(f"{m.path}: tensor '{R}proj.weight' has shape {proj.shape}; expected (N, {d})")
    t(R + "pos_embed_k", None, required=False)  # the converter's 70 x 70 table; the graph computes it
    t(R + "pos_embed", None, required=False)  # older checkpoints' learned table (unused, as clip.cpp)
    m._n_mmproj_embd = proj.shape[0]


# -- graph ------------------------------------------------------------------------------------------
def sincos_2d(d: int, h: int, w: int) -> np.ndarray:
    """F32[h*w, d]: the resampler's key positions (row-major patches; the column's half first)."""
    omega = 1.0 / 10000.0 ** (np.arange(d // 4, dtype=np.float64) / (d // 4))
    ys, xs = np.divmod(np.arange(h * w, dtype=np.float64), w)
    tx, ty = xs[:, None] * omega, ys[:, None] * omega
    return np.concatenate([np.sin(tx), np.cos(tx), np.sin(ty), np.cos(ty)], axis=1).astype(np.float32)


def _build(m: ClipModel, inp_raw: Tensor) -> Tensor:
    hp, w = m.hparams, m.w
    _, h_px, w_px = inp_raw.shape
    gh, gw = h_px // hp.patch_size, w_px // hp.patch_size
    pos = positions(hp.extra["pos_side"], gh, gw)
    pos_t = ops.weight("positions", GGMLType.I32, (pos.size,), pos)
    x = build_vit(m, patch_embed(m, inp_raw), ops.get_rows(w["v.position_embd.weight"], pos_t))
    eps = hp.eps
    nq, d = w[R + "query"].shape
    nh, n = d // D_HEAD, gh * gw
    v = _norm(_linear(x, w[R + "kv.weight"], None), w[R + "ln_kv.weight"], w[R + "ln_kv.bias"], eps)
    q = w[R + "query"]
    if q.type not in (GGMLType.F32, GGMLType.F16):  # a quantized mmproj: the rows dequantized
        q = ops.get_rows(q, ops.weight("query_rows", GGMLType.I32, (nq,), np.arange(nq, dtype=np.int32)))
    q = _norm(q, w[R + "ln_q.weight"], w[R + "ln_q.bias"], eps)
    k = ops.add(
        v, ops.weight("resampler_pos", GGMLType.F32, (n, d), sincos_2d(d, gh, gw)), name="resampler_k"
    )
    q = ops.reshape(_linear(q, w[R + "attn.q.weight"], w[R + "attn.q.bias"]), (nq, nh, D_HEAD))
    k = ops.reshape(_linear(k, w[R + "attn.k.weight"], w[R + "attn.k.bias"]), (n, nh, D_HEAD))
    v = ops.reshape(_linear(v, w[R + "attn.v.weight"], w[R + "attn.v.bias"]), (n, nh, D_HEAD))
    a = ops.flash_attn_ext(q, k, v, None, 1.0 / math.sqrt(D_HEAD), name="resampler_attn")
    a = _linear(ops.reshape(a, (nq, d)), w[R + "attn.out.weight"], w[R + "attn.out.bias"])
    a = _norm(a, w[R + "ln_post.weight"], w[R + "ln_post.bias"], eps)
    return _linear(a, w[R + "proj.weight"], None)


def _n_tokens(hp: ClipHParams, width: int, height: int) -> int:
    return int(hp.extra["query_num"])


register_projector(Projector(RESAMPLER, _load, _build, _n_tokens, resample="bicubic"))
