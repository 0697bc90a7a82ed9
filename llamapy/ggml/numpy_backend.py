"""The NumPy reference backend: the plain, readable semantics of every op.

It is the yardstick the CPU backend is tested against and a second real backend for the scheduler.
Quantized data is dequantized with ``llamapy.ggml.quants`` (whole tensors here: this backend is a
reference, not a fast path).
"""

from __future__ import annotations

import math

import numpy as np

from .backend import ArrayMap, Backend, ComputeError, Step
from .ops import alibi_slopes
from .ssm_reference import SSM_REF_OPS
from .tensor import VIEW_OPS, Tensor
from .types import TRAITS, GGMLType

__all__ = ["NumpyBackend", "to_f32", "from_f32", "REF_OPS", "rope_cache"]

GELU_COEF_A = 0.044715
SQRT_2_OVER_PI = 0.7978845608028654


# -- type conversion --------------------------------------------------------------------------------
def to_f32(arr: np.ndarray, t: GGMLType) -> np.ndarray:
    """Values of an array of ggml type ``t`` (block types as ``uint8[..., row_bytes]``) as float32."""
    t = GGMLType(t)
    if t == GGMLType.F32:
        return np.asarray(arr, dtype=np.float32)
    if t == GGMLType.BF16:
        return (np.asarray(arr).astype(np.uint32) << 16).view(np.float32)
    tr = TRAITS[t]
    if tr.block_size == 1:
        return np.asarray(arr).astype(np.float32)
    from .quants import dequantize

    return np.asarray(dequantize(np.ascontiguousarray(arr), t), dtype=np.float32)


def from_f32(x: np.ndarray, t: GGMLType) -> np.ndarray:
    """float32 values -> an array of type ``t`` (block types: ``uint8[..., row_bytes]``)."""
    t = GGMLType(t)
    x = np.asarray(x, dtype=np.float32)
    if t == GGMLType.BF16:
        u = x.view(np.uint32)
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    tr = TRAITS[t]
    if tr.block_size == 1:
        return x.astype(tr.dtype)
    from .quants import quantize

    return quantize(np.ascontiguousarray(x), t)


# -- reference ops: f(node, *source arrays as float32 or raw) -> result ------------------------------
def _repeat_to(b: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    b = b.reshape((1,) * (len(shape) - b.ndim) + b.shape)
    reps = tuple(s // x for s, x in zip(shape, b.shape, strict=False))
    return np.tile(b, reps) if any(r > 1 for r in reps) else b


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)))


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _mul_mat(node: Tensor, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.ndim > 2 and b.ndim > 2:
        lb = b.shape[:-2]
        la = (1,) * (len(lb) - (a.ndim - 2)) + a.shape[:-2]
        a = a.reshape(la + a.shape[-2:])
        for ax, (x, y) in enumerate(zip(la, lb, strict=False)):
            if x != y:
                a = np.repeat(a, y // x, axis=ax)
    if b.ndim == 1:
        return a @ b
    return np.matmul(b, np.swapaxes(a, -1, -2))


def _mul_mat_id(node: Tensor, a: np.ndarray, b: np.ndarray, ids: np.ndarray) -> np.ndarray:
    T, U = ids.shape
    E = a.shape[0]
    out = np.zeros((T, U, a.shape[1]), dtype=np.float32)
    for t in range(T):
        for u in range(U):
            e = int(ids[t, u])
            if not 0 <= e < E:
                raise ComputeError(f"mul_mat_id {node.name!r}: expert id {e} at [{t}, {u}] not in 0..{E - 1}")
            out[t, u] = a[e] @ b[t, u if b.shape[1] > 1 else 0]
    return out


def rope_cache(p: dict, pos: np.ndarray, freq_factors: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin ``[T, n_dims // 2]`` (attention factor and YaRN included), as ggml computes them."""
    n_dims = p["n_dims"]
    base, fs, ext, n_ctx_orig = p["freq_base"], p["freq_scale"], p["ext_factor"], p["n_ctx_orig"]
    i = np.arange(n_dims // 2, dtype=np.float64)
    if p.get("sections") is not None:  # mrope / imrope: each dim pair takes its section's position
        pos = mrope_positions(p["sections"], p["mode"] == 40, n_dims, pos, p.get("pos4", False))
        theta_extrap = pos.astype(np.float64) * base ** (-2.0 * i / n_dims)[None, :]
    else:
        theta_extrap = pos.astype(np.float64)[:, None] * base ** (-2.0 * i / n_dims)[None, :]
    if freq_factors is not None:
        theta_extrap = theta_extrap / freq_factors.astype(np.float64)[None, :]
    theta_interp = fs * theta_extrap
    mscale = p["attn_factor"]
    if ext != 0.0:

        def corr_dim(n_rot: float) -> float:
            return n_dims * math.log(n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))

        low = max(0.0, math.floor(corr_dim(p["beta_fast"])))
        high = min(n_dims - 1.0, math.ceil(corr_dim(p["beta_slow"])))
        y = (i - low) / max(0.001, high - low)
        ramp_mix = (1.0 - np.clip(y, 0.0, 1.0)) * ext
        theta = theta_interp * (1 - ramp_mix) + theta_extrap * ramp_mix
        mscale *= 1.0 + 0.1 * math.log(1.0 / fs)
    else:
        theta = theta_interp
    return np.cos(theta) * mscale, np.sin(theta) * mscale


def mrope_positions(
    sections: tuple, interleaved: bool, n_dims: int, pos: np.ndarray, pos4: bool
) -> np.ndarray:
    """``[T, n_dims // 2]``: the position each rotary dim pair of each token uses (ggml's
    ``ggml_mrope_cache_init``); ``pos`` is ``[4 * T]`` section-major (``pos4``) or ``[T]`` for all four."""
    pos = np.asarray(pos).reshape(-1)
    p4 = pos.reshape(4, -1) if pos4 else np.tile(pos, (4, 1))
    s0, s1, s2, _ = sections
    sector = np.arange(n_dims // 2) % sum(sections)
    if interleaved:
        which = np.full(len(sector), 3)
        which[(sector % 3 == 0) & (sector < 3 * s0)] = 0
        which[(sector % 3 == 1) & (sector < 3 * s1)] = 1
        which[(sector % 3 == 2) & (sector < 3 * s2)] = 2
    else:
        which = np.searchsorted(np.cumsum([s0, s1, s2]), sector, side="right")
    return p4[which].T


def _rope(node: Tensor, a: np.ndarray, pos: np.ndarray, ff: np.ndarray | None = None) -> np.ndarray:
    p = node.params
    n = p["n_dims"]
    cos, sin = rope_cache(p, pos, ff)
    cos, sin = cos[:, None, :], sin[:, None, :]
    out = a.astype(np.float64)
    if p["mode"] != 0:  # neox; mrope and imrope rotate the same pairs
        x0, x1 = a[..., : n // 2], a[..., n // 2 : n]
        out[..., : n // 2] = x0 * cos - x1 * sin
        out[..., n // 2 : n] = x0 * sin + x1 * cos
    else:
        x0, x1 = a[..., 0:n:2], a[..., 1:n:2]
        out[..., 0:n:2] = x0 * cos - x1 * sin
        out[..., 1:n:2] = x0 * sin + x1 * cos
    return out


def _sink_logits(sinks: np.ndarray, ndim: int) -> np.ndarray:
    """The per-head sink logits ``[H]`` shaped to broadcast over ``[..., H, T, 1]``."""
    return sinks.astype(np.float64).reshape((-1,) + (1,) * min(2, ndim - 1))


def _soft_max(node: Tensor, a: np.ndarray, *rest: np.ndarray) -> np.ndarray:
    p = node.params
    sinks = rest[-1] if p.get("sinks") else None
    mask = rest[0] if len(rest) > (sinks is not None) else None
    x = a.astype(np.float64) * p["scale"]
    if mask is not None:
        m = mask.astype(np.float64)
        if p["max_bias"] > 0:
            n_head = a.shape[-3] if a.ndim >= 3 else 1
            slope = alibi_slopes(n_head, p["max_bias"]).astype(np.float64)
            m = m * slope.reshape((n_head, 1, 1)) if a.ndim >= 3 else m * slope[0]
        x = x + m
    mx = np.max(x, axis=-1, keepdims=True)
    if sinks is not None:  # one more logit per head: in the max and the sum, its probability dropped
        s = _sink_logits(sinks, a.ndim)
        mx = np.maximum(mx, s)
        e = np.exp(x - mx)
        return e / (np.sum(e, axis=-1, keepdims=True) + np.exp(s - mx))
    e = np.exp(x - mx)
    return e / np.sum(e, axis=-1, keepdims=True)


def _flash_attn(
    node: Tensor,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    mask: np.ndarray | None = None,
    sinks: np.ndarray | None = None,
):
    p = node.params
    T, H, _ = q.shape
    Hkv = k.shape[1]
    g = H // Hkv
    slopes = alibi_slopes(H, p["max_bias"]) if p["max_bias"] > 0 else np.ones(H)
    out = np.zeros((T, H, v.shape[2]), dtype=np.float64)
    for h in range(H):
        kh, vh = k[:, h // g, :].astype(np.float64), v[:, h // g, :].astype(np.float64)
        s = q[:, h, :].astype(np.float64) @ kh.T * p["scale"]
        if p["logit_softcap"]:
            s = p["logit_softcap"] * np.tanh(s / p["logit_softcap"])
        if mask is not None:
            s = s + slopes[h] * mask
        mx = np.max(s, axis=-1, keepdims=True)
        if sinks is not None:  # the head's sink logit joins the max and the sum (its value row is 0)
            mx = np.maximum(mx, np.float64(sinks[h]))
        mx = np.where(np.isfinite(mx), mx, 0.0)
        e = np.exp(s - mx)
        den = np.sum(e, axis=-1, keepdims=True)
        if sinks is not None:
            den = den + np.exp(np.float64(sinks[h]) - mx)
        out[:, h, :] = (e @ vh) / np.where(den == 0, 1.0, den)
    return out


def _swiglu_oai(node: Tensor, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """gpt-oss's clamped SwiGLU: ``x = min(a, limit)``, ``y = clamp(b, -limit, limit)``,
    ``x * sigmoid(alpha * x) * (y + 1)``."""
    alpha, limit = node.params["alpha"], node.params["limit"]
    x = np.minimum(a.astype(np.float64), limit)
    y = np.clip(b.astype(np.float64), -limit, limit)
    return x / (1.0 + np.exp(-alpha * x)) * (y + 1.0)


def _get_rows(node: Tensor, a_raw: np.ndarray, ids: np.ndarray) -> np.ndarray:
    n = a_raw.shape[0]
    bad = (ids < 0) | (ids >= n)
    if bad.any():
        raise ComputeError(f"get_rows {node.name!r}: row id {int(ids[bad][0])} not in 0..{n - 1}")
    return to_f32(a_raw[ids], node.src[0].type)


def _set_rows(node: Tensor, out: np.ndarray, src: np.ndarray, idx: np.ndarray) -> None:
    n = out.shape[0]
    bad = (idx < 0) | (idx >= n)
    if bad.any():
        raise ComputeError(f"set_rows {node.name!r}: row index {int(idx[bad][0])} not in 0..{n - 1}")
    out[idx] = from_f32(src, node.type)


def _cpy(node: Tensor, out: np.ndarray, a: np.ndarray) -> None:
    vals = a.reshape(node.shape)
    out[...] = from_f32(vals, node.type)


def _top_k(node: Tensor, a: np.ndarray) -> np.ndarray:
    return np.argsort(-a, axis=-1, kind="stable")[..., : node.params["k"]]


def _attn_temp_scale(node: Tensor, pos: np.ndarray) -> np.ndarray:
    p = node.params
    x = np.floor((pos.astype(np.float64) + p["offset"]) / p["floor_scale"])
    return (np.log(x + 1.0) * p["scale"] + 1.0).reshape(node.shape)


def _moe_group_mask(node: Tensor, a: np.ndarray) -> np.ndarray:
    g, used = node.params["n_group"], node.params["n_group_used"]
    t, e = a.shape
    x = a.reshape(t, g, e // g)
    score = np.sort(x, axis=-1)[..., -min(2, e // g) :].sum(axis=-1)  # [T, G]: sum of each group's top 2
    keep = np.zeros((t, g), dtype=bool)
    keep[np.arange(t)[:, None], np.argsort(-score, axis=-1, kind="stable")[:, :used]] = True
    return np.where(keep[:, :, None], x, -np.inf).reshape(t, e)


# name -> (function, which sources are passed raw (not converted to float32))
REF_OPS: dict[str, tuple] = {
    "get_rows": (_get_rows, (0, 1)),
    "mul_mat": (_mul_mat, ()),
    "mul_mat_id": (_mul_mat_id, (2,)),
    "add": (lambda n, a, b: a + _repeat_to(b, a.shape), ()),
    "sub": (lambda n, a, b: a - _repeat_to(b, a.shape), ()),
    "mul": (lambda n, a, b: a * _repeat_to(b, a.shape), ()),
    "div": (lambda n, a, b: a / _repeat_to(b, a.shape), ()),
    "scale": (lambda n, a: a * n.params["s"] + n.params["bias"], ()),
    "rms_norm": (
        lambda n, a: (
            a / np.sqrt(np.mean(a.astype(np.float64) ** 2, axis=-1, keepdims=True) + n.params["eps"])
        ),
        (),
    ),
    "norm": (
        lambda n, a: (
            (a - a.mean(axis=-1, keepdims=True, dtype=np.float64))
            / np.sqrt(a.var(axis=-1, keepdims=True, dtype=np.float64) + n.params["eps"])
        ),
        (),
    ),
    "silu": (lambda n, a: _silu(a.astype(np.float64)), ()),
    "gelu": (lambda n, a: _gelu(a.astype(np.float64)), ()),
    "gelu_quick": (lambda n, a: a / (1.0 + np.exp(-1.702 * a.astype(np.float64))), ()),
    "tanh": (lambda n, a: np.tanh(a), ()),
    "relu": (lambda n, a: np.maximum(a, 0), ()),
    "softcap": (lambda n, a: n.params["cap"] * np.tanh(a.astype(np.float64) / n.params["cap"]), ()),
    "swiglu": (lambda n, a, b: _silu(a.astype(np.float64)) * b, ()),
    "geglu": (lambda n, a, b: _gelu(a.astype(np.float64)) * b, ()),
    "swiglu_oai": (_swiglu_oai, ()),
    "add_id": (lambda n, a, b, ids: a + b[ids], (2,)),
    "rope": (_rope, (1,)),
    "soft_max": (_soft_max, ()),
    "flash_attn_ext": (_flash_attn, ()),
    "concat": (lambda n, a, b: np.concatenate([a, b], axis=n.params["axis"]), ()),
    "cont": (lambda n, a: a, (0,)),
    "argmax": (lambda n, a: np.argmax(a, axis=-1).reshape(n.shape), ()),
    "top_k": (_top_k, ()),
    "sum_rows": (lambda n, a: a.sum(axis=-1, keepdims=True, dtype=np.float64), ()),
    "mean": (lambda n, a: a.mean(axis=-1, keepdims=True, dtype=np.float64), ()),
    "pad": (lambda n, a: np.pad(a, n.params["pads"]), ()),
    "attn_temp_scale": (_attn_temp_scale, (0,)),
    "moe_group_mask": (_moe_group_mask, ()),
}
REF_OPS.update(SSM_REF_OPS)
_INPLACE = {"set_rows": (_set_rows, (0, 2)), "cpy": (_cpy, (1,))}


class NumpyBackend(Backend):
    """Executes every op with plain NumPy (float32 in, float64 inside where it is cheap to be exact)."""

    name = "numpy"

    def supports_op(self, node: Tensor) -> bool:
        return node.op in REF_OPS or node.op in _INPLACE or node.op in VIEW_OPS

    def compile(self, node: Tensor, arrays: ArrayMap) -> Step | None:
        if node.op in VIEW_OPS:
            return None
        out = arrays[id(node)]
        srcs = [arrays[id(s)] for s in node.src]
        types = [s.type for s in node.src]
        if node.op in _INPLACE:
            fn, raw = _INPLACE[node.op]
            rest = [
                (i, a, t)
                for i, (a, t) in enumerate(zip(srcs, types, strict=False))
                if i != (1 if node.op == "cpy" else 0)
            ]

            def step_inplace() -> None:
                args = [a if i in raw else to_f32(a, t) for i, a, t in rest]
                fn(node, out, *args)

            return step_inplace
        fn, raw = REF_OPS[node.op]
        dtype = TRAITS[node.type].dtype

        def step() -> None:
            args = [
                a if i in raw else to_f32(a, t) for i, (a, t) in enumerate(zip(srcs, types, strict=False))
            ]
            r = np.asarray(fn(node, *args))
            if dtype is not None and r.dtype != out.dtype:
                r = r.astype(out.dtype)
            out[...] = r

        return step
