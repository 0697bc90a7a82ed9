"""Numba dequantize kernels for the hot types, parallel over rows.

``KERNELS[t](raw2d: uint8[rows, row_bytes], out: float32[rows, n])`` fills ``out``. Every kernel does
the same float32 operations as the NumPy codec (and llama.cpp's ``dequantize_row_*``) in the same
order, so results are bit-identical; tests check that. Half floats are decoded through a 65536-entry
table. Inner loops have constant trip counts so LLVM can vectorize them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..._numba import njit, prange

# isort: split
from ..cpu.simd import u16at, vi8, vmul_strict, vq4, vsplat, vstore, vsub_strict
from ..types import GGMLType
from .iq_tables import KVALUES_IQ4NL
from .layouts import (
    IQ4_NL_BYTES,
    IQ4_NL_QS,
    IQ4_XS_BYTES,
    IQ4_XS_QS,
    IQ4_XS_SCALES_H,
    IQ4_XS_SCALES_L,
    Q2_K_BYTES,
    Q2_K_D,
    Q2_K_DMIN,
    Q2_K_QS,
    Q2_K_SCALES,
    Q3_K_BYTES,
    Q3_K_D,
    Q3_K_HMASK,
    Q3_K_QS,
    Q3_K_SCALES,
    Q4_0_BYTES,
    Q4_0_QS,
    Q4_1_BYTES,
    Q4_1_M,
    Q4_1_QS,
    Q4_K_BYTES,
    Q4_K_DMIN,
    Q4_K_QS,
    Q4_K_SCALES,
    Q5_0_BYTES,
    Q5_0_QH,
    Q5_0_QS,
    Q5_1_BYTES,
    Q5_1_M,
    Q5_1_QH,
    Q5_1_QS,
    Q5_K_BYTES,
    Q5_K_DMIN,
    Q5_K_QH,
    Q5_K_QS,
    Q5_K_SCALES,
    Q6_K_BYTES,
    Q6_K_D,
    Q6_K_QH,
    Q6_K_QL,
    Q6_K_SCALES,
    Q8_0_BYTES,
    Q8_0_QS,
)

F32 = np.float32
KVALUES_IQ4NL_F32 = KVALUES_IQ4NL.astype(np.float32)
F16_TABLE = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)


@njit(inline="always", cache=True)
def _h(src, o, tab):
    return tab[np.int64(src[o]) | (np.int64(src[o + 1]) << 8)]


@njit(parallel=True, cache=True)
def _q4_0(raw, out, tab):
    # d * ((q & 15) - 8) in 8-lane vectors (the same float operations: q - 8 is exact); 2.6x the scalar
    # loop, which LLVM did not vectorize (the prompt path dequantizes whole weight tiles)
    nb = raw.shape[1] // Q4_0_BYTES
    eight = vsplat(F32(8.0))
    for r in prange(raw.shape[0]):
        src = raw[r]
        dst = out[r]
        for b in range(nb):
            o = b * Q4_0_BYTES
            d = vsplat(tab[u16at(src, o)])
            y = b * 32
            for j in range(0, 16, 8):
                vstore(dst, y + j, vmul_strict(d, vsub_strict(vq4(src, o + Q4_0_QS + j, False), eight)))
                vstore(dst, y + j + 16, vmul_strict(d, vsub_strict(vq4(src, o + Q4_0_QS + j, True), eight)))


@njit(parallel=True, cache=True)
def _q4_1(raw, out, tab):
    nb = raw.shape[1] // Q4_1_BYTES
    for r in prange(raw.shape[0]):
        src = raw[r]
        dst = out[r]
        for b in range(nb):
            o = b * Q4_1_BYTES
            d = _h(src, o, tab)
            m = _h(src, o + Q4_1_M, tab)
            y = b * 32
            for j in range(16):
                v = np.int32(src[o + Q4_1_QS + j])
                dst[y + j] = d * F32(v & 15) + m
                dst[y + j + 16] = d * F32(v >> 4) + m


@njit(parallel=True, cache=True)
def _q5_0(raw, out, tab):
    nb = raw.shape[1] // Q5_0_BYTES
    for r in prange(raw.shape[0]):
        src = raw[r]
        dst = out[r]
        for b in range(nb):
            o = b * Q5_0_BYTES
            d = _h(src, o, tab)
            q = o + Q5_0_QH
            qh = (
                np.int64(src[q])
                | (np.int64(src[q + 1]) << 8)
                | (np.int64(src[q + 2]) << 16)
                | (np.int64(src[q + 3]) << 24)
            )
            y = b * 32
            for j in range(16):
                v = np.int64(src[o + Q5_0_QS + j])
                h0 = ((qh >> j) << 4) & 16
                h1 = (qh >> (j + 12)) & 16
                dst[y + j] = d * F32(((v & 15) | h0) - 16)
                dst[y + j + 16] = d * F32(((v >> 4) | h1) - 16)


@njit(parallel=True, cache=True)
def _q5_1(raw, out, tab):
    nb = raw.shape[1] // Q5_1_BYTES
    for r in prange(raw.shape[0]):
        src = raw[r]
        dst = out[r]
        for b in range(nb):
            o = b * Q5_1_BYTES
            d = _h(src, o, tab)
            m = _h(src, o + Q5_1_M, tab)
            q = o + Q5_1_QH
            qh = (
                np.int64(src[q])
                | (np.int64(src[q + 1]) << 8)
                | (np.int64(src[q + 2]) << 16)
                | (np.int64(src[q + 3]) << 24)
            )
            y = b * 32
            for j in range(16):
                v = np.int64(src[o + Q5_1_QS + j])
                h0 = ((qh >> j) << 4) & 16
                h1 = (qh >> (j + 12)) & 16
                dst[y + j] = d * F32((v & 15) | h0) + m
                dst[y + j + 16] = d * F32((v >> 4) | h1) + m


@njit(parallel=True, cache=True)
def _q8_0(raw, out, tab):
    nb = raw.shape[1] // Q8_0_BYTES
    for r in prange(raw.shape[0]):
        src = raw[r]
        dst = out[r]
        for b in range(nb):
            o = b * Q8_0_BYTES
            d = vsplat(tab[u16at(src, o)])
            y = b * 32
            for j in range(0, 32, 8):  # 8-lane vectors: 2.4x the scalar loop, the same products
                vstore(dst, y + j, vmul_strict(d, vi8(src, o + Q8_0_QS + j)))


@njit(parallel=True, cache=True)
def _q2_k(raw, out, tab):
    nb = raw.shape[1] // Q2_K_BYTES
    for r in prange(raw.shape[0]):
        src = raw[r]
        dst = out[r]
        for b in range(nb):
            o = b * Q2_K_BYTES
            d = _h(src, o + Q2_K_D, tab)
            dmin = _h(src, o + Q2_K_DMIN, tab)
            y0 = b * 256
            for s in range(16):  # sub-block of 16: half s//8, shift 2*((s%8)//2), bytes 16*(s%2)
                sc = np.int32(src[o + Q2_K_SCALES + s])
                dl = d * F32(sc & 15)
                ml = dmin * F32(sc >> 4)
                q0 = o + Q2_K_QS + 32 * (s // 8) + 16 * (s % 2)
                sh = 2 * ((s % 8) // 2)
                y = y0 + 16 * s
                for l in range(16):
                    dst[y + l] = dl * F32((np.int32(src[q0 + l]) >> sh) & 3) - ml


@njit(inline="always", cache=True)
def _q3_scale(src, o, j):
    lo = np.int32(src[o + j]) & 15 if j < 8 else np.int32(src[o + j - 8]) >> 4
    hi = (np.int32(src[o + 8 + j % 4]) >> (2 * (j // 4))) & 3
    return (lo | (hi << 4)) - 32


@njit(parallel=True, cache=True)
def _q3_k(raw, out, tab):
    nb = raw.shape[1] // Q3_K_BYTES
    for r in prange(raw.shape[0]):
        src = raw[r]
        dst = out[r]
        for b in range(nb):
            o = b * Q3_K_BYTES
            d = _h(src, o + Q3_K_D, tab)
            y0 = b * 256
            for s in range(16):
                dl = d * F32(_q3_scale(src, o + Q3_K_SCALES, s))
                k = (s % 8) // 2  # shift index inside the half
                sh = 2 * k
                hbit = (s // 8) * 4 + k
                q0 = o + Q3_K_QS + 32 * (s // 8) + 16 * (s % 2)
                h0 = o + Q3_K_HMASK + 16 * (s % 2)
                y = y0 + 16 * s
                for l in range(16):
                    q = (np.int32(src[q0 + l]) >> sh) & 3
                    h = (np.int32(src[h0 + l]) >> hbit) & 1
                    dst[y + l] = dl * F32(q - 4 + 4 * h)


@njit(inline="always", cache=True)
def _scale_min_k4(src, o, j):
    if j < 4:
        return np.int32(src[o + j]) & 63, np.int32(src[o + j + 4]) & 63
    sc = (np.int32(src[o + j + 4]) & 15) | ((np.int32(src[o + j - 4]) >> 6) << 4)
    m = (np.int32(src[o + j + 4]) >> 4) | ((np.int32(src[o + j]) >> 6) << 4)
    return sc, m


@njit(parallel=True, cache=True)
def _q4_k(raw, out, tab):
    nb = raw.shape[1] // Q4_K_BYTES
    for r in prange(raw.shape[0]):
        src = raw[r]
        dst = out[r]
        for b in range(nb):
            o = b * Q4_K_BYTES
            d = _h(src, o, tab)
            dmin = _h(src, o + Q4_K_DMIN, tab)
            for c in range(4):
                sc1, m1i = _scale_min_k4(src, o + Q4_K_SCALES, 2 * c)
                sc2, m2i = _scale_min_k4(src, o + Q4_K_SCALES, 2 * c + 1)
                d1 = d * F32(sc1)
                m1 = dmin * F32(m1i)
                d2 = d * F32(sc2)
                m2 = dmin * F32(m2i)
                q0 = o + Q4_K_QS + 32 * c
                y = b * 256 + 64 * c
                for l in range(32):
                    v = np.int32(src[q0 + l])
                    dst[y + l] = d1 * F32(v & 15) - m1
                    dst[y + 32 + l] = d2 * F32(v >> 4) - m2


@njit(parallel=True, cache=True)
def _q5_k(raw, out, tab):
    nb = raw.shape[1] // Q5_K_BYTES
    for r in prange(raw.shape[0]):
        src = raw[r]
        dst = out[r]
        for b in range(nb):
            o = b * Q5_K_BYTES
            d = _h(src, o, tab)
            dmin = _h(src, o + Q5_K_DMIN, tab)
            for c in range(4):
                sc1, m1i = _scale_min_k4(src, o + Q5_K_SCALES, 2 * c)
                sc2, m2i = _scale_min_k4(src, o + Q5_K_SCALES, 2 * c + 1)
                d1 = d * F32(sc1)
                m1 = dmin * F32(m1i)
                d2 = d * F32(sc2)
                m2 = dmin * F32(m2i)
                q0 = o + Q5_K_QS + 32 * c
                y = b * 256 + 64 * c
                for l in range(32):
                    v = np.int32(src[q0 + l])
                    h = np.int32(src[o + Q5_K_QH + l])
                    dst[y + l] = d1 * F32((v & 15) | (((h >> (2 * c)) & 1) << 4)) - m1
                    dst[y + 32 + l] = d2 * F32((v >> 4) | (((h >> (2 * c + 1)) & 1) << 4)) - m2


@njit(parallel=True, cache=True)
def _q6_k(raw, out, tab):
    nb = raw.shape[1] // Q6_K_BYTES
    for r in prange(raw.shape[0]):
        src = raw[r]
        dst = out[r]
        for b in range(nb):
            o = b * Q6_K_BYTES
            d = _h(src, o + Q6_K_D, tab)
            for half in range(2):  # like dequantize_row_q6_K: 4 outputs per ql/qh byte pair
                ql0 = o + Q6_K_QL + 64 * half
                qh0 = o + Q6_K_QH + 32 * half
                sc0 = o + Q6_K_SCALES + 8 * half
                for g in range(2):  # elements l = 16g .. 16g+15 of each 32-run share their scales
                    d1 = d * F32(np.int8(src[sc0 + g]))
                    d2 = d * F32(np.int8(src[sc0 + g + 2]))
                    d3 = d * F32(np.int8(src[sc0 + g + 4]))
                    d4 = d * F32(np.int8(src[sc0 + g + 6]))
                    y = b * 256 + 128 * half + 16 * g
                    for i in range(16):
                        l = 16 * g + i
                        a = np.int32(src[ql0 + l])
                        c = np.int32(src[ql0 + l + 32])
                        h = np.int32(src[qh0 + l])
                        dst[y + i] = d1 * F32(((a & 15) | ((h & 3) << 4)) - 32)
                        dst[y + i + 32] = d2 * F32(((c & 15) | (((h >> 2) & 3) << 4)) - 32)
                        dst[y + i + 64] = d3 * F32(((a >> 4) | (((h >> 4) & 3) << 4)) - 32)
                        dst[y + i + 96] = d4 * F32(((c >> 4) | (((h >> 6) & 3) << 4)) - 32)


@njit(parallel=True, cache=True)
def _iq4_nl(raw, out, tab, kv):
    nb = raw.shape[1] // IQ4_NL_BYTES
    for r in prange(raw.shape[0]):
        src = raw[r]
        dst = out[r]
        for b in range(nb):
            o = b * IQ4_NL_BYTES
            d = _h(src, o, tab)
            y = b * 32
            for j in range(16):
                v = np.int32(src[o + IQ4_NL_QS + j])
                dst[y + j] = d * kv[v & 15]
                dst[y + j + 16] = d * kv[v >> 4]


@njit(parallel=True, cache=True)
def _iq4_xs(raw, out, tab, kv):
    nb = raw.shape[1] // IQ4_XS_BYTES
    for r in prange(raw.shape[0]):
        src = raw[r]
        dst = out[r]
        for b in range(nb):
            o = b * IQ4_XS_BYTES
            d = _h(src, o, tab)
            sh = np.int32(src[o + IQ4_XS_SCALES_H]) | (np.int32(src[o + IQ4_XS_SCALES_H + 1]) << 8)
            for ib in range(8):
                sl = np.int32(src[o + IQ4_XS_SCALES_L + ib // 2])
                ls = ((sl >> (4 * (ib % 2))) & 15) | (((sh >> (2 * ib)) & 3) << 4)
                dl = d * F32(ls - 32)
                q0 = o + IQ4_XS_QS + 16 * ib
                y = b * 256 + 32 * ib
                for j in range(16):
                    v = np.int32(src[q0 + j])
                    dst[y + j] = dl * kv[v & 15]
                    dst[y + j + 16] = dl * kv[v >> 4]


def _with_lut(kernel, lut: np.ndarray) -> Callable[[np.ndarray, np.ndarray], None]:
    def run(raw2d: np.ndarray, out: np.ndarray) -> None:
        kernel(raw2d, out, F16_TABLE, lut)

    run.kernel = kernel  # type: ignore[attr-defined]
    return run


def _with_table(kernel) -> Callable[[np.ndarray, np.ndarray], None]:
    def run(raw2d: np.ndarray, out: np.ndarray) -> None:
        kernel(raw2d, out, F16_TABLE)

    run.kernel = kernel  # type: ignore[attr-defined]
    return run


KERNELS: dict[GGMLType, Callable[[np.ndarray, np.ndarray], None]] = {
    GGMLType.Q4_0: _with_table(_q4_0),
    GGMLType.Q4_1: _with_table(_q4_1),
    GGMLType.Q5_0: _with_table(_q5_0),
    GGMLType.Q5_1: _with_table(_q5_1),
    GGMLType.Q8_0: _with_table(_q8_0),
    GGMLType.Q2_K: _with_table(_q2_k),
    GGMLType.Q3_K: _with_table(_q3_k),
    GGMLType.Q4_K: _with_table(_q4_k),
    GGMLType.Q5_K: _with_table(_q5_k),
    GGMLType.Q6_K: _with_table(_q6_k),
    GGMLType.IQ4_NL: _with_lut(_iq4_nl, KVALUES_IQ4NL_F32),
    GGMLType.IQ4_XS: _with_lut(_iq4_xs, KVALUES_IQ4NL_F32),
}

from .mxfp4 import dequantize_mxfp4_rows  # noqa: E402  (its own module: the gpt-oss type)

KERNELS[GGMLType.MXFP4] = dequantize_mxfp4_rows
