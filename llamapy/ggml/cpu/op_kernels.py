"""Numba kernels for the non-matmul ops: norms, rope, activations and gated units, and fast
KV-cache writes (row quantization to F16 / Q8_0 / Q4_0 is left to NumPy / ``quants``).

All kernels take C-contiguous 2-D ``float32`` arrays of rows (the backend reshapes or copies), work
in float32, and compile on first use with ``cache=True``. Norms and rope are serial: they are cheap,
and a parallel launch costs more than their work at decode sizes (and far more on a loaded machine).
"""

from __future__ import annotations

import math

from ..._numba import njit, prange  # first: it sets NUMBA_CACHE_DIR before Numba

# isort: split
import numpy as np
from numba import types
from numba.extending import overload

from .layouts import GLU_SWIGLU, UNARY_GELU, UNARY_GELU_QUICK, UNARY_RELU, UNARY_SILU, UNARY_TANH
from .simd import bitcast_f32
from .vmath import fexp, ftanh

_F0 = np.float32(0.0)
_F1 = np.float32(1.0)
GELU_COEF_A = np.float32(0.044715)
SQRT_2_OVER_PI = np.float32(0.7978845608028654)
_I8000 = np.int32(0x8000)
_I7FFF = np.int32(0x7FFF)
_I13 = np.int32(13)
_I16 = np.int32(16)
_P112 = np.float32(2.0**112)


@njit(cache=True, fastmath=True)
def rms_norm_rows(x, eps, out):
    """out[i] = x[i] / sqrt(mean(x[i]^2) + eps)."""
    n, d = x.shape
    for i in range(n):
        s = 0.0
        for j in range(d):
            v = np.float64(x[i, j])
            s += v * v
        sc = np.float32(1.0 / math.sqrt(s / d + eps))
        for j in range(d):
            out[i, j] = x[i, j] * sc


@njit(cache=True, fastmath=True)
def rms_norm_mul_rows(x, eps, w, out):
    """Fused ``rms_norm(x) * w`` with ``w`` broadcast over rows (``w.shape == (d,)``)."""
    n, d = x.shape
    for i in range(n):
        s = 0.0
        for j in range(d):
            v = np.float64(x[i, j])
            s += v * v
        sc = np.float32(1.0 / math.sqrt(s / d + eps))
        for j in range(d):
            out[i, j] = x[i, j] * sc * w[j]


@njit(cache=True, fastmath=True)
def rope_rows(x, cos, sin, n_dims, neox, out):
    """x, out: float32[T, H, D] (any strides); cos, sin: float32[T, n_dims // 2]."""
    T, H, D = x.shape
    half = n_dims // 2
    for t in range(T):
        for h in range(H):
            if neox:
                for i in range(half):
                    x0 = x[t, h, i]
                    x1 = x[t, h, i + half]
                    out[t, h, i] = x0 * cos[t, i] - x1 * sin[t, i]
                    out[t, h, i + half] = x0 * sin[t, i] + x1 * cos[t, i]
            else:
                for i in range(half):
                    x0 = x[t, h, 2 * i]
                    x1 = x[t, h, 2 * i + 1]
                    out[t, h, 2 * i] = x0 * cos[t, i] - x1 * sin[t, i]
                    out[t, h, 2 * i + 1] = x0 * sin[t, i] + x1 * cos[t, i]
            for j in range(n_dims, D):
                out[t, h, j] = x[t, h, j]


@njit(inline="always")
def _gelu(v):
    return np.float32(0.5) * v * (_F1 + ftanh(SQRT_2_OVER_PI * v * (_F1 + GELU_COEF_A * v * v)))


@njit(inline="always")
def _silu(v):
    return v / (_F1 + fexp(-v))


# kind: layouts.UNARY_KIND (UNARY_SOFTCAP: p = cap)
@njit(parallel=True, cache=True, fastmath=True, error_model="numpy")
def unary_rows(x, kind, p, out):
    n, d = x.shape
    for i in prange(n):
        if kind == UNARY_SILU:
            for j in range(d):
                out[i, j] = _silu(x[i, j])
        elif kind == UNARY_GELU:
            for j in range(d):
                out[i, j] = _gelu(x[i, j])
        elif kind == UNARY_GELU_QUICK:
            for j in range(d):
                v = x[i, j]
                out[i, j] = v / (_F1 + fexp(np.float32(-1.702) * v))
        elif kind == UNARY_TANH:
            for j in range(d):
                out[i, j] = ftanh(x[i, j])
        elif kind == UNARY_RELU:
            for j in range(d):
                out[i, j] = max(x[i, j], _F0)
        else:
            for j in range(d):
                out[i, j] = p * ftanh(x[i, j] / p)


# kind: layouts.GLU_KIND (GLU_SWIGLU = silu(a) * b, GLU_GEGLU = gelu(a) * b)
@njit(parallel=True, cache=True, fastmath=True, error_model="numpy")
def glu_rows(a, b, kind, out):
    n, d = a.shape
    for i in prange(n):
        if kind == GLU_SWIGLU:
            for j in range(d):
                out[i, j] = _silu(a[i, j]) * b[i, j]
        else:
            for j in range(d):
                out[i, j] = _gelu(a[i, j]) * b[i, j]


@njit(cache=True)
def check_ids(ids, n):
    """Index of the first id outside ``0..n-1`` or -1."""
    for i in range(ids.shape[0]):
        if ids[i] < 0 or ids[i] >= n:
            return i
    return -1


@njit(inline="always")
def h2f(bits):
    """Half-float bits (an integer, finite halves) -> float32 with bit operations only (vectorizes):
    sign and the 15 low bits move into a float32 whose exponent is 112 too small, then one multiply
    rebiases it (which also gets subnormal halves right)."""
    b = np.int32(bits)
    return bitcast_f32(((b & _I8000) << _I16) | ((b & _I7FFF) << _I13)) * _P112


def _as_f32(x):  # type: ignore[no-untyped-def]
    """Jitted code only (see the overload)."""
    raise NotImplementedError


@overload(_as_f32, inline="always")
def _as_f32_ov(x):  # type: ignore[no-untyped-def]
    """A K/V element as float32: half bits (a uint16 cache view) through ``h2f``, floats as they are."""
    if isinstance(x, types.Integer):
        return lambda x: h2f(x)
    return lambda x: np.float32(x)
