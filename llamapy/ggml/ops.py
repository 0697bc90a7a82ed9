"""Op constructors: each builds one graph node (nothing is computed here).

Shapes are in NumPy order (see ``llamapy.ggml.tensor``). Float ops read F32 or F16 and produce F32;
view ops keep their source's type; ``cpy``/``set_rows`` write into their destination's type.
The NumPy reference semantics of every op live in ``llamapy.ggml.numpy_backend``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .tensor import GraphError, Tensor, contiguous_strides, nbytes_of
from .types import TRAITS, GGMLType

F32 = GGMLType.F32
I32 = GGMLType.I32
_FLOAT_IN = (GGMLType.F32, GGMLType.F16)
_INDEX = (GGMLType.I32, GGMLType.I64)
KV_TYPES = (GGMLType.F32, GGMLType.F16, GGMLType.Q8_0, GGMLType.Q4_0)
ROPE_MROPE = 8  # ggml's GGML_ROPE_TYPE_MROPE: sections of the rotary dims take t/h/w/e positions
ROPE_IMROPE = 40  # GGML_ROPE_TYPE_IMROPE: the sections interleaved (Qwen3-VL, Qwen3.5)

__all__ = [
    "new_tensor", "weight", "buffer", "get_rows", "mul_mat", "mul_mat_id", "add", "sub", "mul", "div",
    "scale", "rms_norm", "norm", "silu", "gelu", "gelu_quick", "tanh", "relu", "swiglu", "geglu",
    "softcap", "rope", "soft_max", "flash_attn_ext", "concat", "view", "reshape", "permute",
    "transpose", "cont", "cpy", "set_rows", "argmax", "top_k", "sum_rows", "mean", "pad",
    "attn_temp_scale", "moe_group_mask",
    "sigmoid", "softplus", "l2_norm", "ssm_conv", "gated_delta_net", "ssm_scan",
    "swiglu_oai", "add_id",
]  # fmt: skip


def _where(op: str, a: Tensor) -> str:
    return f"{op}({a.name or a.op})"


def _need_float(op: str, *ts: Tensor) -> None:
    for t in ts:
        if t.type not in _FLOAT_IN:
            raise GraphError(f"{_where(op, t)}: needs an F32 or F16 tensor, got {t.type.name}")


def _shape(shape: Sequence[int] | int) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)):
        return (int(shape),)
    return tuple(int(s) for s in shape)


# -- leaves -----------------------------------------------------------------------------------------
def new_tensor(type: GGMLType | int, shape: Sequence[int] | int, name: str = "") -> Tensor:
    """A graph input, filled before each compute (``Scheduler.compute(graph, {t: array})``)."""
    return Tensor(GGMLType(type), _shape(shape), "input", name=name)


def weight(name: str, ggml_type: GGMLType | int, shape: Sequence[int], raw: np.ndarray) -> Tensor:
    """A weight leaf whose data is kept as given (zero-copy): a plain-typed array, or for block types
    ``uint8`` bytes (any shape whose total size is the tensor's byte size, e.g. ``[rows, row_bytes]``)."""
    t = Tensor(GGMLType(ggml_type), _shape(shape), "weight", name=name)
    raw = np.asarray(raw)
    if raw.nbytes != t.nbytes:
        raise GraphError(
            f"weight {name!r}: {raw.nbytes} bytes given, {t.type.name}{t.shape} takes {t.nbytes}"
        )
    if not raw.flags.c_contiguous:
        raw = np.ascontiguousarray(raw)
    t.data = raw
    return t


def buffer(name: str, ggml_type: GGMLType | int, shape: Sequence[int]) -> Tensor:
    """A persistent tensor owning zeroed memory (e.g. one layer of a KV cache)."""
    t = Tensor(GGMLType(ggml_type), _shape(shape), "buffer", name=name)
    t.data = np.zeros(t.nbytes, dtype=np.uint8)
    return t


# -- matrix ops -------------------------------------------------------------------------------------
def get_rows(a: Tensor, ids: Tensor, name: str = "") -> Tensor:
    if a.ndim != 2:
        raise GraphError(f"{_where('get_rows', a)}: needs a 2-D table, got shape {a.shape}")
    if ids.type not in _INDEX or ids.ndim != 1:
        raise GraphError(f"get_rows: ids must be I32/I64 of shape [n], got {ids.type.name}{ids.shape}")
    return Tensor(F32, (ids.shape[0], a.shape[1]), "get_rows", [a, ids], name=name)


def mul_mat(a: Tensor, b: Tensor, name: str = "") -> Tensor:
    """``a[..., N, K]`` (any type) x ``b[..., M, K]`` (F32) -> ``F32[..., M, N]`` (= b @ a.T)."""
    if b.type not in _FLOAT_IN:
        raise GraphError(f"{_where('mul_mat', b)}: activations must be F32/F16, got {b.type.name}")
    if a.shape[-1] != b.shape[-1]:
        raise GraphError(f"mul_mat({a.name or a.op}, {b.name or b.op}): K differs: {a.shape} vs {b.shape}")
    la, lb = a.shape[:-2], b.shape[:-2]
    nd = max(len(la), len(lb))
    la = (1,) * (nd - len(la)) + la
    lb = (1,) * (nd - len(lb)) + lb
    for i, (x, y) in enumerate(zip(la, lb, strict=False)):
        if x == 0 or y % x:
            raise GraphError(
                f"mul_mat({a.name or a.op}, {b.name or b.op}): leading dim {i} of a ({x}) must divide b's ({y});"
                f" shapes {a.shape} x {b.shape}"
            )
    m = b.shape[-2] if b.ndim >= 2 else 1
    shape = lb + ((m,) if b.ndim >= 2 else ()) + (a.shape[-2] if a.ndim >= 2 else 1,)
    return Tensor(F32, shape, "mul_mat", [a, b], name=name)


def mul_mat_id(a: Tensor, b: Tensor, ids: Tensor, name: str = "") -> Tensor:
    """Experts ``a[E, N, K]``, ``b[T, U or 1, K]``, ``ids I32[T, U]`` -> ``F32[T, U, N]``."""
    if a.ndim != 3 or b.ndim != 3 or ids.ndim != 2 or ids.type not in _INDEX:
        raise GraphError(
            f"mul_mat_id: shapes a{a.shape} b{b.shape} ids {ids.type.name}{ids.shape} do not fit"
        )
    _need_float("mul_mat_id", b)
    t, u = ids.shape
    if b.shape[0] != t or b.shape[1] not in (1, u) or b.shape[2] != a.shape[2]:
        raise GraphError(f"mul_mat_id: b{b.shape} does not fit a{a.shape} and ids{ids.shape}")
    return Tensor(F32, (t, u, a.shape[1]), "mul_mat_id", [a, b, ids], name=name)


# -- element-wise -----------------------------------------------------------------------------------
def _binary(op: str, a: Tensor, b: Tensor, name: str) -> Tensor:
    _need_float(op, a, b)
    if b.ndim > a.ndim:
        raise GraphError(f"{op}: b{b.shape} has more dims than a{a.shape}")
    pb = (1,) * (a.ndim - b.ndim) + b.shape
    for x, y in zip(a.shape, pb, strict=False):
        if y == 0 or x % y:
            raise GraphError(
                f"{op}({a.name or a.op}, {b.name or b.op}): b{b.shape} does not repeat into a{a.shape}"
            )
    return Tensor(F32, a.shape, op, [a, b], name=name)


def add(a: Tensor, b: Tensor, name: str = "") -> Tensor:
    return _binary("add", a, b, name)


def sub(a: Tensor, b: Tensor, name: str = "") -> Tensor:
    return _binary("sub", a, b, name)


def mul(a: Tensor, b: Tensor, name: str = "") -> Tensor:
    return _binary("mul", a, b, name)


def div(a: Tensor, b: Tensor, name: str = "") -> Tensor:
    return _binary("div", a, b, name)


def _unary(op: str, a: Tensor, name: str, **params: float) -> Tensor:
    _need_float(op, a)
    return Tensor(F32, a.shape, op, [a], params=params, name=name)


def scale(a: Tensor, s: float, bias: float = 0.0, name: str = "") -> Tensor:
    return _unary("scale", a, name, s=float(s), bias=float(bias))


def rms_norm(a: Tensor, eps: float = 1e-6, name: str = "") -> Tensor:
    return _unary("rms_norm", a, name, eps=float(eps))


def norm(a: Tensor, eps: float = 1e-5, name: str = "") -> Tensor:
    return _unary("norm", a, name, eps=float(eps))


def silu(a: Tensor, name: str = "") -> Tensor:
    return _unary("silu", a, name)


def gelu(a: Tensor, name: str = "") -> Tensor:
    return _unary("gelu", a, name)


def gelu_quick(a: Tensor, name: str = "") -> Tensor:
    return _unary("gelu_quick", a, name)


def tanh(a: Tensor, name: str = "") -> Tensor:
    return _unary("tanh", a, name)


def relu(a: Tensor, name: str = "") -> Tensor:
    return _unary("relu", a, name)


def softcap(a: Tensor, cap: float, name: str = "") -> Tensor:
    """``cap * tanh(a / cap)``."""
    if cap <= 0:
        raise GraphError(f"{_where('softcap', a)}: cap must be > 0, got {cap}")
    return _unary("softcap", a, name, cap=float(cap))


def _glu(op: str, a: Tensor, b: Tensor, name: str) -> Tensor:
    _need_float(op, a, b)
    if a.shape != b.shape:
        raise GraphError(f"{op}: a{a.shape} and b{b.shape} differ")
    return Tensor(F32, a.shape, op, [a, b], name=name)


def swiglu(a: Tensor, b: Tensor, name: str = "") -> Tensor:
    """``silu(a) * b``."""
    return _glu("swiglu", a, b, name)


def geglu(a: Tensor, b: Tensor, name: str = "") -> Tensor:
    """``gelu(a) * b``."""
    return _glu("geglu", a, b, name)


def swiglu_oai(a: Tensor, b: Tensor, alpha: float = 1.702, limit: float = 7.0, name: str = "") -> Tensor:
    """gpt-oss's clamped SwiGLU (ggml's ``swiglu_oai``), gate ``a``, up ``b``: with ``x = min(a, limit)``
    and ``y = clamp(b, -limit, limit)``, ``x * sigmoid(alpha * x) * (y + 1)``."""
    t = _glu("swiglu_oai", a, b, name)
    t.params = dict(alpha=float(alpha), limit=float(limit))
    return t


def add_id(a: Tensor, b: Tensor, ids: Tensor, name: str = "") -> Tensor:
    """Per-expert bias (ggml's ``add_id``): ``a F32[T, U, N]`` + ``b[ids[t, u]]`` with ``b F32[E, N]``,
    ``ids I32[T, U]`` (the experts ``mul_mat_id`` used)."""
    _need_float("add_id", a, b)
    if a.ndim != 3 or b.ndim != 2 or ids.ndim != 2 or ids.type not in _INDEX:
        raise GraphError(f"add_id: shapes a{a.shape} b{b.shape} ids {ids.type.name}{ids.shape} do not fit")
    if ids.shape != a.shape[:2] or b.shape[1] != a.shape[2]:
        raise GraphError(f"add_id: a{a.shape}, b{b.shape} and ids{ids.shape} do not fit")
    return Tensor(F32, a.shape, "add_id", [a, b, ids], name=name)


# -- rope, softmax, attention ------------------------------------------------------------------------
def rope(
    a: Tensor,
    pos: Tensor,
    n_dims: int,
    mode: int = 0,
    freq_base: float = 10000.0,
    freq_scale: float = 1.0,
    n_ctx_orig: int = 0,
    ext_factor: float = 0.0,
    attn_factor: float = 1.0,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    freq_factors: Tensor | None = None,
    sections: Sequence[int] | None = None,
    name: str = "",
) -> Tensor:
    """Rotary embedding of ``a[T, H, D]`` at positions ``pos I32[T]`` over the first ``n_dims`` dims;
    mode 0 rotates adjacent pairs, mode 2 (neox) rotates ``(i, i + n_dims/2)``. Modes 8 (mrope) and 40
    (imrope, interleaved) rotate as neox with ``sections`` (4 counts of dim pairs) taking the t/h/w/e
    positions of ``pos I32[4 * T]`` (section-major, as ggml), or ``pos I32[T]`` for all four (text)."""
    _need_float("rope", a)
    if a.ndim != 3:
        raise GraphError(f"{_where('rope', a)}: needs [T, H, D], got {a.shape}")
    if mode not in (0, 2, ROPE_MROPE, ROPE_IMROPE):
        raise GraphError(f"rope: mode {mode} is not supported (0 normal, 2 neox, 8 mrope, 40 imrope)")
    if (sections is not None) != (mode in (ROPE_MROPE, ROPE_IMROPE)):
        raise GraphError(f"rope: sections go with the multi-section modes 8 and 40 (mode {mode})")
    if sections is not None:
        sections = tuple(int(s) for s in sections) + (0,) * (4 - len(sections))
        if len(sections) != 4 or min(sections) < 0 or sum(sections) <= 0:
            raise GraphError(f"rope: sections {sections} must be 4 non-negative counts, not all 0")
    if pos.type == I32 and sections is not None and pos.shape == (4 * a.shape[0],):
        pos_ok = True  # one position per section and token, section-major (ggml's layout)
    else:
        pos_ok = pos.type == I32 and pos.shape == (a.shape[0],)
    if n_dims <= 0 or n_dims % 2 or n_dims > a.shape[2]:
        raise GraphError(f"rope: n_dims={n_dims} must be even and <= head size {a.shape[2]}")
    if not pos_ok:
        raise GraphError(f"rope: pos must be I32[{a.shape[0]}], got {pos.type.name}{pos.shape}")
    src = [a, pos]
    if freq_factors is not None:
        if freq_factors.type != F32 or freq_factors.shape != (n_dims // 2,):
            raise GraphError(f"rope: freq_factors must be F32[{n_dims // 2}], got {freq_factors.shape}")
        src.append(freq_factors)
    params = dict(
        n_dims=int(n_dims), mode=int(mode), freq_base=float(freq_base), freq_scale=float(freq_scale),
        n_ctx_orig=int(n_ctx_orig), ext_factor=float(ext_factor), attn_factor=float(attn_factor),
        beta_fast=float(beta_fast), beta_slow=float(beta_slow),
    )  # fmt: skip
    if sections is not None:
        params["sections"] = sections
        params["pos4"] = pos.shape[0] != a.shape[0] or a.shape[0] == 0
    return Tensor(F32, a.shape, "rope", src, params=params, name=name)


def soft_max(
    a: Tensor,
    mask: Tensor | None = None,
    scale: float = 1.0,
    max_bias: float = 0.0,
    name: str = "",
    sinks: Tensor | None = None,
) -> Tensor:
    """``softmax(a * scale + slope * mask)`` over the last axis; ``mask`` broadcasts over leading axes
    (the head axis is ``a``'s third-from-last, used for ALiBi slopes when ``max_bias > 0``). ``sinks``
    ``F32[H]`` (``a`` is ``[H, T, KV]``): one more logit per head in the normalization whose
    probability is dropped (ggml's ``soft_max_add_sinks``, gpt-oss)."""
    _need_float("soft_max", a)
    src = [a]
    if mask is not None:
        _need_float("soft_max", mask)
        if mask.shape[-1] != a.shape[-1] or mask.ndim > a.ndim:
            raise GraphError(f"soft_max: mask{mask.shape} does not fit a{a.shape}")
        pm = (1,) * (a.ndim - mask.ndim) + mask.shape
        if any(y != 1 and y != x for x, y in zip(a.shape, pm, strict=False)):
            raise GraphError(f"soft_max: mask{mask.shape} does not broadcast to a{a.shape}")
        src.append(mask)
    params: dict = dict(scale=float(scale), max_bias=float(max_bias))
    if sinks is not None:
        _check_sinks("soft_max", sinks, a.shape[-3] if a.ndim >= 3 else 1)
        src.append(sinks)
        params["sinks"] = True
    return Tensor(F32, a.shape, "soft_max", src, params=params, name=name)


def _check_sinks(op: str, sinks: Tensor, n_head: int) -> None:
    if sinks.type != F32 or sinks.shape != (n_head,):
        raise GraphError(f"{op}: sinks must be F32[n_head={n_head}], got {sinks.type.name}{sinks.shape}")


def flash_attn_ext(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    scale: float,
    max_bias: float = 0.0,
    logit_softcap: float = 0.0,
    name: str = "",
    sinks: Tensor | None = None,
) -> Tensor:
    """Fused attention: ``q F32[T, H, D]``, ``k[KV, Hkv, D]``, ``v[KV, Hkv, Dv]`` (F16/F32/Q8_0/Q4_0),
    ``mask F32[T, KV]`` (0 or -inf) -> ``F32[T, H, Dv]``; head ``h`` uses kv head ``h // (H // Hkv)``.
    ``sinks F32[H]`` (needs a mask): a per-head logit joining the softmax (ggml's
    ``flash_attn_ext_add_sinks``, gpt-oss); its value row is zero."""
    _need_float("flash_attn_ext", q)
    if q.ndim != 3 or k.ndim != 3 or v.ndim != 3:
        raise GraphError(f"flash_attn_ext: q{q.shape} k{k.shape} v{v.shape} must be 3-D")
    for x in (k, v):
        if x.type not in KV_TYPES:
            raise GraphError(
                f"{_where('flash_attn_ext', x)}: K/V type {x.type.name} not in F32, F16, Q8_0, Q4_0"
            )
    T, H, D = q.shape
    KV, Hkv, Dk = k.shape
    if Dk != D or v.shape[0] != KV or v.shape[1] != Hkv or Hkv == 0 or H % Hkv:
        raise GraphError(f"flash_attn_ext: q{q.shape} k{k.shape} v{v.shape} do not fit")
    src = [q, k, v]
    if mask is not None:
        _need_float("flash_attn_ext", mask)
        if mask.shape[-2:] != (T, KV) or mask.ndim != 2:
            raise GraphError(f"flash_attn_ext: mask must be [T={T}, KV={KV}], got {mask.shape}")
        src.append(mask)
    params = dict(scale=float(scale), max_bias=float(max_bias), logit_softcap=float(logit_softcap))
    if sinks is not None:
        if mask is None:
            raise GraphError("flash_attn_ext: sinks need a mask")
        _check_sinks("flash_attn_ext", sinks, H)
        src.append(sinks)
        params["sinks"] = True
    return Tensor(F32, (T, H, v.shape[2]), "flash_attn_ext", src, params=params, name=name)


# -- layout -----------------------------------------------------------------------------------------
def concat(a: Tensor, b: Tensor, axis: int, name: str = "") -> Tensor:
    _need_float("concat", a, b)
    if a.ndim != b.ndim:
        raise GraphError(f"concat: a{a.shape} and b{b.shape} differ in rank")
    ax = axis % a.ndim
    if any(x != y for i, (x, y) in enumerate(zip(a.shape, b.shape, strict=False)) if i != ax):
        raise GraphError(f"concat: a{a.shape} and b{b.shape} differ outside axis {axis}")
    shape = list(a.shape)
    shape[ax] += b.shape[ax]
    return Tensor(F32, shape, "concat", [a, b], params=dict(axis=ax), name=name)


def _check_view(a: Tensor, shape: tuple[int, ...], strides: tuple[int, ...], offset: int, op: str) -> None:
    base = a.owner
    tr = TRAITS[a.type]
    if len(strides) != len(shape):
        raise GraphError(f"{_where(op, a)}: {len(strides)} strides for shape {shape}")
    if tr.block_size > 1 and strides[-1] != tr.type_size:
        raise GraphError(f"{_where(op, a)}: a view of a {a.type.name} tensor must keep the last axis whole")
    if offset < 0 or any(s < 0 for s in strides):
        raise GraphError(f"{_where(op, a)}: negative offset or stride")
    if any(s == 0 for s in shape):
        return
    last = offset + sum((n - 1) * s for n, s in zip(shape[:-1], strides[:-1], strict=False))
    last += nbytes_of(a.type, (shape[-1],))
    if last > base.nbytes:
        raise GraphError(
            f"{_where(op, a)}: view shape {shape} strides {strides} offset {offset} reaches byte {last}, "
            f"beyond the {base.nbytes} bytes of {base.name or base.op}"
        )


def view(
    a: Tensor, shape: Sequence[int], strides: Sequence[int] | None = None, offset: int = 0, name: str = ""
) -> Tensor:
    """A view of ``a``'s memory: ``offset`` (bytes) is relative to ``a``; default strides are contiguous."""
    shape = _shape(shape)
    st = tuple(int(s) for s in strides) if strides is not None else contiguous_strides(a.type, shape)
    off = a.offset + int(offset)
    _check_view(a, shape, st, off, "view")
    return Tensor(a.type, shape, "view", [a], name=name, strides=st, offset=off, view_src=a.owner)


def reshape(a: Tensor, shape: Sequence[int], name: str = "") -> Tensor:
    shape = list(_shape(shape))
    if shape.count(-1) == 1:
        rest = math.prod(s for s in shape if s != -1)
        shape[shape.index(-1)] = a.n_elements // rest if rest else 0
    shape = tuple(shape)
    if math.prod(shape) != a.n_elements:
        raise GraphError(f"{_where('reshape', a)}: cannot reshape {a.shape} to {shape}")
    if not a.is_contiguous():
        raise GraphError(
            f"{_where('reshape', a)}: needs a contiguous tensor (use cont first); strides {a.strides}"
        )
    st = contiguous_strides(a.type, shape)
    _check_view(a, shape, st, a.offset, "reshape")
    return Tensor(a.type, shape, "reshape", [a], name=name, strides=st, offset=a.offset, view_src=a.owner)


def permute(a: Tensor, axes: Sequence[int], name: str = "") -> Tensor:
    """NumPy transpose semantics: result axis ``i`` is ``a``'s axis ``axes[i]``."""
    axes = tuple(int(x) % a.ndim for x in axes)
    if sorted(axes) != list(range(a.ndim)):
        raise GraphError(f"{_where('permute', a)}: {axes} is not a permutation of {a.ndim} axes")
    if a.quantized and axes[-1] != a.ndim - 1:
        raise GraphError(f"{_where('permute', a)}: a {a.type.name} tensor must keep its last axis last")
    shape = tuple(a.shape[i] for i in axes)
    st = tuple(a.strides[i] for i in axes)
    return Tensor(a.type, shape, "permute", [a], name=name, strides=st, offset=a.offset, view_src=a.owner)


def transpose(a: Tensor, name: str = "") -> Tensor:
    """Swap the last two axes."""
    if a.ndim < 2:
        raise GraphError(f"{_where('transpose', a)}: needs 2+ dims, got {a.shape}")
    ax = list(range(a.ndim))
    ax[-1], ax[-2] = ax[-2], ax[-1]
    t = permute(a, ax, name=name)
    t.op = "transpose"
    return t


def cont(a: Tensor, name: str = "") -> Tensor:
    """A contiguous copy (same type)."""
    if a.quantized and a.strides[-1] != TRAITS[a.type].type_size:
        raise GraphError(f"{_where('cont', a)}: bad strides for {a.type.name}")
    return Tensor(a.type, a.shape, "cont", [a], name=name)


def cpy(a: Tensor, b: Tensor, name: str = "") -> Tensor:
    """Copy ``a`` into ``b``'s memory converting to ``b``'s type; returns a node standing for ``b`` after."""
    if a.n_elements != b.n_elements:
        raise GraphError(f"cpy: {a.n_elements} elements of a{a.shape} into {b.n_elements} of b{b.shape}")
    if b.quantized and not b.is_contiguous():
        raise GraphError(f"{_where('cpy', b)}: a {b.type.name} destination must be contiguous")
    return Tensor(
        b.type,
        b.shape,
        "cpy",
        [a, b],
        name=name or b.name,
        strides=b.strides,
        offset=b.offset,
        view_src=b.owner,
    )


def set_rows(dst: Tensor, src: Tensor, idx: Tensor, name: str = "") -> Tensor:
    """``dst[idx[i]] = src[i]`` in place (converting to ``dst``'s type); returns a node standing for ``dst``."""
    _need_float("set_rows", src)
    if dst.ndim != 2 or src.ndim != 2 or src.shape[1] != dst.shape[1]:
        raise GraphError(f"set_rows: dst{dst.shape} and src{src.shape} must be [R, C] and [n, C]")
    if idx.type not in _INDEX or idx.shape != (src.shape[0],):
        raise GraphError(f"set_rows: idx must be I32/I64[{src.shape[0]}], got {idx.type.name}{idx.shape}")
    if dst.quantized and dst.strides[-1] != TRAITS[dst.type].type_size:
        raise GraphError(f"{_where('set_rows', dst)}: bad strides for {dst.type.name}")
    return Tensor(
        dst.type, dst.shape, "set_rows", [dst, src, idx], name=name or dst.name,
        strides=dst.strides, offset=dst.offset, view_src=dst.owner,
    )  # fmt: skip


# -- reductions -------------------------------------------------------------------------------------
def argmax(a: Tensor, name: str = "") -> Tensor:
    """Index of the largest value along the last axis: ``I32[...]`` (a 1-D input gives ``[1]``)."""
    _need_float("argmax", a)
    return Tensor(I32, a.shape[:-1] or (1,), "argmax", [a], name=name)


def top_k(a: Tensor, k: int, name: str = "") -> Tensor:
    """Indices of the ``k`` largest values along the last axis, largest first: ``I32[..., k]``."""
    _need_float("top_k", a)
    if not 0 < k <= a.shape[-1]:
        raise GraphError(f"{_where('top_k', a)}: k={k} must be in 1..{a.shape[-1]}")
    return Tensor(I32, a.shape[:-1] + (int(k),), "top_k", [a], params=dict(k=int(k)), name=name)


def sum_rows(a: Tensor, name: str = "") -> Tensor:
    """Sum along the last axis, kept as size 1."""
    return _reduce("sum_rows", a, name)


def mean(a: Tensor, name: str = "") -> Tensor:
    """Mean along the last axis, kept as size 1."""
    return _reduce("mean", a, name)


def _reduce(op: str, a: Tensor, name: str) -> Tensor:
    _need_float(op, a)
    return Tensor(F32, a.shape[:-1] + (1,), op, [a], name=name)


def pad(a: Tensor, pads: Sequence[int | Sequence[int]], name: str = "") -> Tensor:
    """Zero padding; ``pads[i]`` is ``after`` or ``(before, after)`` for axis ``i`` (NumPy order)."""
    _need_float("pad", a)
    if len(pads) != a.ndim:
        raise GraphError(f"{_where('pad', a)}: {len(pads)} pads for {a.ndim} axes")
    pp = []
    for p in pads:
        lo, hi = (0, int(p)) if isinstance(p, (int, np.integer)) else (int(p[0]), int(p[1]))
        if lo < 0 or hi < 0:
            raise GraphError(f"{_where('pad', a)}: negative padding {pads}")
        pp.append((lo, hi))
    shape = tuple(s + lo + hi for s, (lo, hi) in zip(a.shape, pp, strict=False))
    return Tensor(F32, shape, "pad", [a], params=dict(pads=tuple(pp)), name=name)


def attn_temp_scale(
    pos: Tensor, scale: float, floor_scale: int, offset: float = 0.0, name: str = ""
) -> Tensor:
    """Attention temperature tuning per token (llama.cpp's ``inp_attn_scale``, Llama 4 / Mistral 3):
    ``F32[T, 1, 1] = log(floor((pos + offset) / floor_scale) + 1) * scale + 1`` from ``pos I32[T]``."""
    if pos.type != I32 or pos.ndim != 1:
        raise GraphError(f"attn_temp_scale: pos must be I32[T], got {pos.type.name}{pos.shape}")
    if floor_scale <= 0:
        raise GraphError(f"attn_temp_scale: floor_scale must be positive, got {floor_scale}")
    params = dict(scale=float(scale), floor_scale=int(floor_scale), offset=float(offset))
    return Tensor(F32, (pos.shape[0], 1, 1), "attn_temp_scale", [pos], params=params, name=name)


def moe_group_mask(a: Tensor, n_group: int, n_group_used: int, name: str = "") -> Tensor:
    """Group-limited expert selection (DeepSeek V3, GLM-4.5): ``a[T, E]``'s experts in ``n_group``
    equal groups, each scored by the sum of its top two; the best ``n_group_used`` groups keep their
    values, the others become -inf (llama.cpp's top_k / sum_rows / fill / set_rows sequence)."""
    _need_float("moe_group_mask", a)
    if a.ndim != 2 or n_group <= 0 or a.shape[1] % n_group or not 0 < n_group_used <= n_group:
        raise GraphError(
            f"{_where('moe_group_mask', a)}: {a.shape} cannot be split into {n_group} groups keeping "
            f"{n_group_used}"
        )
    params = dict(n_group=int(n_group), n_group_used=int(n_group_used))
    return Tensor(F32, a.shape, "moe_group_mask", [a], params=params, name=name)


def alibi_slopes(n_head: int, max_bias: float) -> np.ndarray:
    """ALiBi slope per head, as ggml computes it (all ones when ``max_bias == 0``)."""
    if max_bias <= 0:
        return np.ones(n_head, dtype=np.float32)
    n_log2 = 2 ** int(math.floor(math.log2(n_head)))
    m0 = 2.0 ** (-max_bias / n_log2)
    m1 = 2.0 ** (-max_bias / 2.0 / n_log2)
    h = np.arange(n_head)
    s = np.where(h < n_log2, m0 ** (h + 1), m1 ** (2 * (h - n_log2) + 1))
    return s.astype(np.float32)


# -- recurrent (SSM / linear attention) ops -----------------------------------------------------------
def sigmoid(a: Tensor, name: str = "") -> Tensor:
    return _unary("sigmoid", a, name)


def softplus(a: Tensor, name: str = "") -> Tensor:
    """``log(1 + exp(a))`` (``a`` itself above 20, as ggml and torch)."""
    return _unary("softplus", a, name)


def l2_norm(a: Tensor, eps: float = 1e-6, name: str = "") -> Tensor:
    """``a / max(||a||, eps)`` over the last axis (ggml's ``l2_norm``)."""
    return _unary("l2_norm", a, name, eps=float(eps))


def ssm_conv(sx: Tensor, c: Tensor, name: str = "") -> Tensor:
    """Causal depthwise conv1d: ``sx F32[S, K - 1 + T, C]`` (each sequence's conv state, then its T new
    rows), kernel ``c F32[C, K]`` -> ``F32[S, T, C]`` with ``out[s, t, ch] = sum_k sx[s, t + k, ch] * c[ch, k]``.
    (ggml's ``ssm_conv``, whose ``sx`` is channel-major; here time is the middle axis.)"""
    _need_float("ssm_conv", sx, c)
    if sx.ndim != 3 or c.ndim != 2 or c.shape[0] != sx.shape[2] or sx.shape[1] < c.shape[1]:
        raise GraphError(f"ssm_conv: sx{sx.shape} and kernel{c.shape} must be [S, K-1+T, C] and [C, K]")
    n_s, n, ch = sx.shape
    return Tensor(F32, (n_s, n - c.shape[1] + 1, ch), "ssm_conv", [sx, c], name=name)


def gated_delta_net(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor, name: str = ""
) -> Tensor:
    """The gated delta rule (Gated DeltaNet) over ``S`` sequences of ``T`` tokens each.

    ``q, k F32[S, T, Hk, D]``, ``v F32[S, T, H, D]``, log-decay ``g F32[S, T, H]`` (<= 0), ``beta
    F32[S, T, H]``, ``state F32[S, H, D, D]`` (key dim, value dim). Value head ``h`` reads key head
    ``h % Hk`` (llama.cpp's converter tiles the value heads so). Per token and head:
    ``M = exp(g) M; M += k (beta (v - M^T k))^T; y = M^T q`` (q unscaled: scale it before).
    Result: ``F32[S*T*H*D + S*H*D*D]``, the outputs ``[S, T, H, D]`` then the final states ``[S, H, D, D]``
    (views of it give both, as ggml's ``gated_delta_net``)."""
    _need_float("gated_delta_net", q, k, v, g, beta, state)
    if q.ndim != 4 or k.shape != q.shape or v.ndim != 4 or v.shape[:2] != q.shape[:2]:
        raise GraphError(f"gated_delta_net: q{q.shape} k{k.shape} v{v.shape} must be [S, T, H, D]")
    n_s, n_t, hk, d = q.shape
    h = v.shape[2]
    if v.shape[3] != d or hk == 0 or h % hk:
        raise GraphError(f"gated_delta_net: v{v.shape} must be [S, T, H, {d}] with H a multiple of {hk}")
    for what, t in (("g", g), ("beta", beta)):
        if t.shape != (n_s, n_t, h):
            raise GraphError(f"gated_delta_net: {what}{t.shape} must be [{n_s}, {n_t}, {h}]")
    if state.shape != (n_s, h, d, d):
        raise GraphError(f"gated_delta_net: state{state.shape} must be [{n_s}, {h}, {d}, {d}]")
    n = n_s * n_t * h * d + n_s * h * d * d
    return Tensor(F32, (n,), "gated_delta_net", [q, k, v, g, beta, state], name=name)


def ssm_scan(s: Tensor, x: Tensor, dt: Tensor, a: Tensor, b: Tensor, c: Tensor, name: str = "") -> Tensor:
    """The Mamba2 selective scan with groups over ``S`` sequences of ``T`` tokens.

    ``s F32[S, H, P, N]`` (state), ``x F32[S, T, H, P]``, ``dt F32[S, T, H]`` (after softplus), ``a
    F32[H]`` (Mamba2) or ``F32[H, N]`` (Mamba1: P = 1, one decay per state), ``b, c F32[S, T, G, N]``
    (head ``h`` reads group ``h // (H // G)``). Per token and head:
    ``s = exp(dt a) s + dt x b^T``, ``y = s c``. Result ``F32[S*T*H*P + S*H*P*N]``: ``y [S, T, H, P]``
    then the final states (as ggml's ``ssm_scan``; the D skip and the gate are separate ops)."""
    _need_float("ssm_scan", s, x, dt, a, b, c)
    if s.ndim != 4 or x.ndim != 4 or b.ndim != 4 or c.shape != b.shape:
        raise GraphError(f"ssm_scan: s{s.shape} x{x.shape} b{b.shape} c{c.shape} must be 4-D")
    n_s, h, p, n = s.shape
    n_t, g = x.shape[1], b.shape[2]
    if x.shape != (n_s, n_t, h, p) or dt.shape != (n_s, n_t, h) or a.shape not in ((h,), (h, n)):
        raise GraphError(f"ssm_scan: x{x.shape} dt{dt.shape} a{a.shape} do not fit state{s.shape}")
    if b.shape != (n_s, n_t, g, n) or g == 0 or h % g:
        raise GraphError(f"ssm_scan: b{b.shape} must be [{n_s}, {n_t}, G, {n}] with G dividing {h}")
    size = n_s * n_t * h * p + n_s * h * p * n
    return Tensor(F32, (size,), "ssm_scan", [s, x, dt, a, b, c], name=name)
