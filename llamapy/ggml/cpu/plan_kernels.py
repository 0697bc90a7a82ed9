"""Serial Numba kernels for the cheap steps of a decode token, where a NumPy call or a parallel launch
costs more than the work (benchmarks/results/decode_overhead.md):

* ``set_rows_f16`` / ``set_rows_same``: the K/V cache writes (``set_rows``), id check and float32 ->
  half conversion in one call. NumPy's fancy assignment ``out[idx] = src`` took 3-4 us a call (60 a
  token on SmolLM2) against ~1 us here. The conversion rounds to nearest even, as NumPy's does, bit for
  bit; a NaN makes the kernel stop and the caller falls back to NumPy (whose NaN payloads it then keeps).
* ``glu_rows_serial``: ``op_kernels.glu_rows`` without ``prange`` for a few rows (a decode token's one
  row): a parallel launch for 1-9k elements costs more than the loop. Same expression, same flags, so
  the same bits.
"""

from __future__ import annotations

from ..._numba import njit  # first: it sets NUMBA_CACHE_DIR before Numba

# isort: split
import numpy as np

from .layouts import GLU_SWIGLU
from .op_kernels import _gelu, _silu

_U13 = np.uint32(13)
_U16 = np.uint32(16)
_SIGN = np.uint32(0x80000000)
_ABS = np.uint32(0x7FFFFFFF)
_INF32 = np.uint32(0x7F800000)
_F16MAX = np.uint32((127 + 16) << 23)  # 65536.0: at or above, a finite float rounds to infinity
_MIN_NORMAL = np.uint32(113 << 23)  # 2^-14: below, the half is subnormal
_REBIAS = np.uint32(((15 - 127) << 23) & 0xFFFFFFFF)  # added modulo 2^32: exponent 127 -> 15
_RND = np.uint32(0xFFF)


@njit(inline="always")
def f32_bits_to_f16(u):
    """float32 bits (uint32) -> half bits (int32, round to nearest even); -1 for a NaN."""
    sign = np.int32((u & _SIGN) >> _U16)
    a = u & _ABS
    if a > _INF32:
        return np.int32(-1)
    if a >= _F16MAX:
        return sign | np.int32(0x7C00)
    if a >= _MIN_NORMAL:
        m = a + _REBIAS + _RND + ((a >> _U13) & np.uint32(1))
        return sign | np.int32(m >> _U13)
    e = np.int32(a >> np.uint32(23))
    if e < 102:  # below 2^-25: rounds to zero
        return sign
    mant = np.int32((a & np.uint32(0x7FFFFF)) | np.uint32(0x800000))
    shift = 126 - e  # 14..24: the half's unit 2^-24 is 2^shift of the float's
    r = mant >> shift
    rem = mant & ((np.int32(1) << shift) - 1)
    half = np.int32(1) << (shift - 1)
    if rem > half or (rem == half and (r & 1) == 1):
        r += 1
    return sign | r


@njit(cache=True)
def set_rows_f16(src_bits, ids, out, n):
    """out[ids[i]] = half(src[i]) with ``src_bits`` the float32 rows as uint32, ``out`` uint16 rows.
    Returns -1 when done, the position of the first id outside 0..n-1 (nothing written), or -2 when a
    NaN was met (rows written up to it; the caller redoes the whole write)."""
    T, D = src_bits.shape
    for i in range(T):
        if ids[i] < 0 or ids[i] >= n:
            return i
    for i in range(T):
        r = ids[i]
        for j in range(D):
            h = f32_bits_to_f16(src_bits[i, j])
            if h < 0:
                return -2
            out[r, j] = np.uint16(h)
    return -1


@njit(cache=True)
def set_rows_same(src, ids, out, n):
    """out[ids[i]] = src[i] for rows of one dtype; -1, or the position of the first bad id."""
    T, D = src.shape
    for i in range(T):
        if ids[i] < 0 or ids[i] >= n:
            return i
    for i in range(T):
        r = ids[i]
        for j in range(D):
            out[r, j] = src[i, j]
    return -1


# the loop of op_kernels.glu_rows, serial (kind: layouts.GLU_KIND)
@njit(cache=True, fastmath=True, error_model="numpy")
def glu_rows_serial(a, b, kind, out):
    n, d = a.shape
    for i in range(n):
        if kind == GLU_SWIGLU:
            for j in range(d):
                out[i, j] = _silu(a[i, j]) * b[i, j]
        else:
            for j in range(d):
                out[i, j] = _gelu(a[i, j]) * b[i, j]
