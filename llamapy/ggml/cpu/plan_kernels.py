"""Serial Numba kernels for the cheap steps of a decode token, where a NumPy call or a parallel launch
costs more than the work (benchmarks/results/decode_overhead.md):

* ``set_rows_f16`` / ``set_rows_same``: the K/V cache writes (``set_rows``), id check and float32 ->
  half conversion in one call. NumPy's fancy assignment ``out[idx] = src`` took 3-4 us a call (60 a
  token on SmolLM2) against ~1 us here. The conversion rounds to nearest even, as NumPy's does, bit for
  bit; a NaN makes the kernel stop and the caller falls back to NumPy (whose NaN payloads it then keeps).
* ``glu_rows_serial``: ``op_kernels.glu_rows`` without ``prange`` for a few rows (a decode token's one
  row): a parallel launch for 1-9k elements costs more than the loop. Same expression, same flags, so
  the same bits.
* ``attn_short_keys``: how much of the KV cache view a decode attention at a short context reads (the
  view is padded to 256 cells; the kernel's pass over the padding's masked keys cost a third of its 25 us
  a layer on SmolLM2).
* ``add_rms_norm_mul_rows``: a residual ``add`` and the ``rms_norm`` + ``mul`` after it (two a layer in
  a llama-style decoder), one call instead of two steps.
"""

from __future__ import annotations

import math

from ..._numba import njit  # first: it sets NUMBA_CACHE_DIR before Numba

# isort: split
import numpy as np

from .attn_decode import SB
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


@njit(cache=True)
def attn_short_keys(mask, has_mask, KV, n_chunks):
    """How many cache cells a decode attention (``attn_decode.attn_group_f16x8`` with ``n_chunks`` chunks
    over ``KV`` cells) needs to read: the used part when every unmasked key lies in the first chunk (a
    short context: the cache view is padded to 256 cells), cut at the end of a sub-block of ``SB`` keys or
    the chunk's end; ``KV`` otherwise. Run over that many cells as one chunk, the kernel gives the same
    bits: the first chunk keeps its start and its sub-blocks, and what is cut holds masked keys only, which
    add nothing (a fully masked chunk is skipped by the merge, a fully masked sub-block leaves the running
    max, sum and accumulators as they were)."""
    if not has_mask or n_chunks < 1:
        return KV
    csz = (KV + n_chunks - 1) // n_chunks
    ninf = np.float32(-np.inf)
    T = mask.shape[0]
    used = 0
    for j in range(KV - 1, -1, -1):
        hit = False
        for t in range(T):
            if mask[t, j] != ninf:
                hit = True
        if hit:
            used = j + 1
            break
    if used > csz:
        return KV
    return min(csz, max(SB, (used + SB - 1) // SB * SB))


@njit(cache=True, fastmath=True)
def add_rms_norm_mul_rows(a, b, s, eps, w, out):
    """A residual add and the next norm as one call: ``s = a + b`` (written: later nodes read it), then
    ``out = rms_norm(s) * w`` by the loops of ``op_kernels.rms_norm_mul_rows`` over ``s`` (the same bits:
    the sum is exact float32 addition, as NumPy's, and the norm reads it back from ``s``)."""
    n, d = s.shape
    for i in range(n):
        for j in range(d):
            s[i, j] = a[i, j] + b[i, j]
    for i in range(n):
        acc = 0.0
        for j in range(d):
            v = np.float64(s[i, j])
            acc += v * v
        sc = np.float32(1.0 / math.sqrt(acc / d + eps))
        for j in range(d):
            out[i, j] = s[i, j] * sc * w[j]
