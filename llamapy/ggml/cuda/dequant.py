"""Device functions reading one element of a row of any supported type (dequantize in registers).

Every operand reaches a kernel as views of one flat device buffer (``u8``, ``f16``, ``f32``) plus a
byte offset: ``dq(t, u8, f16, f32, row, k, st)`` is element ``k`` of the row starting at byte ``row``
(``st``: the byte stride of the last axis, used by plain types; block types are contiguous in a row).
Block layouts are ggml's (see ``llamapy.ggml.quants``).
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from ..types import GGMLType

__all__ = ["DQ_TYPES", "dq", "idx4", "off4", "off4b", "i8"]

F32, F16 = int(GGMLType.F32), int(GGMLType.F16)
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 = (int(GGMLType[n]) for n in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"))
Q4_K, Q5_K, Q6_K = int(GGMLType.Q4_K), int(GGMLType.Q5_K), int(GGMLType.Q6_K)
#: types ``dq`` reads
DQ_TYPES = frozenset(GGMLType(t) for t in (F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K))


@cuda.jit(device=True)
def i8(v):
    x = np.int32(v)
    return x - 256 if x >= 128 else x


@cuda.jit(device=True)
def h(f16, byte_off):
    return np.float32(f16[byte_off // 2])


@cuda.jit(device=True)
def _scale_min_k4(u8, sc, j):
    """Q4_K / Q5_K: the 6-bit scale and min of sub-block ``j`` (0..7) from the 12 bytes at ``sc``."""
    if j < 4:
        return np.int32(u8[sc + j]) & 63, np.int32(u8[sc + j + 4]) & 63
    a = np.int32(u8[sc + j + 4])
    return (a & 0xF) | ((np.int32(u8[sc + j - 4]) >> 6) << 4), (a >> 4) | ((np.int32(u8[sc + j]) >> 6) << 4)


@cuda.jit(device=True)
def dq(t, u8, f16, f32, row, k, st):
    if t == 0:
        return f32[(row + k * st) // 4]
    if t == 1:
        return np.float32(f16[(row + k * st) // 2])
    if t <= 8:  # legacy 32-element blocks
        j = k % 32
        if t == 2:
            b = row + (k // 32) * 18
            q = np.int32(u8[b + 2 + (j % 16)])
            q = (q & 0xF) if j < 16 else (q >> 4)
            return h(f16, b) * np.float32(q - 8)
        if t == 3:
            b = row + (k // 32) * 20
            q = np.int32(u8[b + 4 + (j % 16)])
            q = (q & 0xF) if j < 16 else (q >> 4)
            return h(f16, b) * np.float32(q) + h(f16, b + 2)
        if t == 6 or t == 7:
            ts = 22 if t == 6 else 24
            b = row + (k // 32) * ts
            qh = ts - 20  # qh at 2 (Q5_0) or 4 (Q5_1)
            q = np.int32(u8[b + qh + 4 + (j % 16)])
            q = (q & 0xF) if j < 16 else (q >> 4)
            q |= ((np.int32(u8[b + qh + j // 8]) >> (j % 8)) & 1) << 4
            if t == 6:
                return h(f16, b) * np.float32(q - 16)
            return h(f16, b) * np.float32(q) + h(f16, b + 2)
        b = row + (k // 32) * 34  # Q8_0
        return h(f16, b) * np.float32(i8(u8[b + 2 + j]))
    j = k % 256
    if t == 12 or t == 13:
        ts = 144 if t == 12 else 176
        b = row + (k // 256) * ts
        c = j // 64
        hi = (j % 64) >= 32
        l = j % 32
        sb = 2 * c + (1 if hi else 0)
        sc, m = _scale_min_k4(u8, b + 4, sb)
        qs = b + 16 if t == 12 else b + 48
        q = np.int32(u8[qs + 32 * c + l])
        q = (q >> 4) if hi else (q & 0xF)
        if t == 13:
            q += 16 if (np.int32(u8[b + 16 + l]) >> sb) & 1 else 0
        return h(f16, b) * np.float32(sc) * np.float32(q) - h(f16, b + 2) * np.float32(m)
    # Q6_K: ql[128] qh[64] scales[16] d
    b = row + (k // 256) * 210
    half = j // 128
    r = j % 128
    quarter = r // 32
    l = r % 32
    ql = np.int32(u8[b + 64 * half + l + (32 if quarter % 2 == 1 else 0)])
    ql = (ql >> 4) if quarter >= 2 else (ql & 0xF)
    qh = (np.int32(u8[b + 128 + 32 * half + l]) >> (2 * quarter)) & 3
    sc = i8(u8[b + 192 + 8 * half + l // 16 + 2 * quarter])
    return h(f16, b + 208) * np.float32(sc) * np.float32((ql | (qh << 4)) - 32)


@cuda.jit(device=True)
def idx4(i, sh):
    """The 4 indices of flat (row-major) element ``i`` of shape ``sh``."""
    i3 = i % sh[3]
    i = i // sh[3]
    i2 = i % sh[2]
    i = i // sh[2]
    i1 = i % sh[1]
    return i // sh[1], i1, i2, i3


@cuda.jit(device=True)
def off4(i0, i1, i2, i3, st):
    return i0 * st[0] + i1 * st[1] + i2 * st[2] + i3 * st[3]


@cuda.jit(device=True)
def off4b(i0, i1, i2, i3, sh, st):
    """Byte offset of a broadcast (tiled, ggml's repeat) operand of shape ``sh``."""
    return (i0 % sh[0]) * st[0] + (i1 % sh[1]) * st[1] + (i2 % sh[2]) * st[2] + (i3 % sh[3]) * st[3]
