"""Mat-vec kernels for the 32-element block types Q5_0, Q5_1 and Q8_0 against activations quantized to
16 bits (``hsimd``): one loop, written once, and one small block function per type. (Q4_0 and Q4_1 read
eight rows at a time where the file stores them: ``q40_r8_kernels``.)

Each call quantizes the activation rows per 32 elements (``hsimd.quantize_rows_q16``), then for each
group of four weight rows and each block: the block's 32 weights as two ``H16`` vectors (16 lanes,
widened from bytes, offsets folded in), two ``pmaddwd`` against the block's 32 activations into 8
lanes of 32 bits, and one float multiply-add of those lanes by the weight scale times the activation
scale. The format with a min (Q5_1) adds ``min * sum(x)`` of the block as a float per row.

The block function of a type is ``blk(acc, c, wr, o, xa, xb, d, xsum, f16) -> (acc, c)``: ``acc`` the
row's ``F32x8`` accumulator, ``c`` its float for the mins, ``wr`` the weight row's bytes, ``o`` the
block's byte offset, ``xa``/``xb`` the 16-bit activations of elements 0-15 / 16-31, ``d`` their scale,
``xsum`` their float sum. ``_matvec`` is the loop; each kernel is that loop specialized (inlined) for
one block function, so a fix to the loop is one edit.

Call as ``MATVEC`` in ``matmul_kernels``: ``kern(w, x, out, f16)`` with K a multiple of 32.
"""

from __future__ import annotations

import numpy as np

from ..._numba import njit, prange
from ..quants.layouts import (
    Q5_0_BYTES,
    Q5_0_QH,
    Q5_0_QS,
    Q5_1_BYTES,
    Q5_1_M,
    Q5_1_QH,
    Q5_1_QS,
    Q8_0_BYTES,
    Q8_0_QS,
)
from .hsimd import hload, hmadd, hq5, hwiden, nan_rows, quantize_rows_q16
from .isimd import itof, izero
from .layouts import ROWS_PER_PASS
from .rowgroups import PREFETCH_ROWS, f16at, prefetch_bytes, prefetch_bytes_l1, rows4
from .simd import vfma, vhsum, vsplat, vzero


# -- one block of each type -------------------------------------------------------------------------
@njit(inline="always")
def _blk_q5_0(acc, c, wr, o, xa, xb, d, xsum, f16):
    q, h = o + Q5_0_QS, o + Q5_0_QH
    lo, hi = hq5(wr, q, h, 0, -16)
    s = hmadd(hmadd(izero(), lo, xa), hi, xb)
    return vfma(acc, vsplat(f16at(wr, o, f16) * d), itof(s)), c


@njit(inline="always")
def _blk_q5_1(acc, c, wr, o, xa, xb, d, xsum, f16):
    q, h = o + Q5_1_QS, o + Q5_1_QH
    lo, hi = hq5(wr, q, h, 16, 0)
    s = hmadd(hmadd(izero(), lo, xa), hi, xb)
    return vfma(acc, vsplat(f16at(wr, o, f16) * d), itof(s)), c + f16at(wr, o + Q5_1_M, f16) * xsum


@njit(inline="always")
def _blk_q8_0(acc, c, wr, o, xa, xb, d, xsum, f16):
    si = wr.view(np.int8)
    s = hmadd(hmadd(izero(), hwiden(si, o + Q8_0_QS), xa), hwiden(si, o + Q8_0_QS + 16), xb)
    return vfma(acc, vsplat(f16at(wr, o, f16) * d), itof(s)), c


# -- the loop -----------------------------------------------------------------------------------------
# ``pfb``: the prefetch of the rows ahead, ``rowgroups.prefetch_bytes`` (into L2) or, in the ``*_l1``
# kernels (models mostly in L3: ``matmul_steps`` chooses), ``prefetch_bytes_l1``.
@njit(inline="always")
def _matvec(w, x, out, f16, blk, bbytes, pfb):
    N, rb = w.shape
    nb = rb // bbytes
    M = x.shape[0]
    wf = w.reshape(-1)
    xq = np.empty((M, nb * 32), np.int16)
    xd = np.empty((M, nb), np.float32)
    xs = np.empty((M, nb), np.float32)
    ok = quantize_rows_q16(x, xq, xd, xs)
    for g in prange((N + 3) // 4):
        w0, w1, w2, w3 = rows4(w, g, N)
        pf = (g * 4 + PREFETCH_ROWS) * rb
        for m in range(M):
            xqm = xq[m]
            a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
            c0 = c1 = c2 = c3 = np.float32(0.0)
            for b in range(nb):
                if m == 0:
                    pfb(wf, pf + b * ROWS_PER_PASS * bbytes, ROWS_PER_PASS * bbytes, N * rb)
                o = b * bbytes
                xa, xb, d, xsum = hload(xqm, b * 32), hload(xqm, b * 32 + 16), xd[m, b], xs[m, b]
                a0, c0 = blk(a0, c0, w0, o, xa, xb, d, xsum, f16)
                a1, c1 = blk(a1, c1, w1, o, xa, xb, d, xsum, f16)
                a2, c2 = blk(a2, c2, w2, o, xa, xb, d, xsum, f16)
                a3, c3 = blk(a3, c3, w3, o, xa, xb, d, xsum, f16)
            r0 = g * 4  # repeated rows past N written twice, the real one last
            out[m, min(r0 + 3, N - 1)] = vhsum(a3) + c3
            out[m, min(r0 + 2, N - 1)] = vhsum(a2) + c2
            out[m, min(r0 + 1, N - 1)] = vhsum(a1) + c1
            out[m, r0] = vhsum(a0) + c0
    nan_rows(out, ok)


@njit(parallel=True, cache=True)
def mm16_q5_0(w, x, out, f16):
    _matvec(w, x, out, f16, _blk_q5_0, Q5_0_BYTES, prefetch_bytes)


@njit(parallel=True, cache=True)
def mm16_q5_1(w, x, out, f16):
    _matvec(w, x, out, f16, _blk_q5_1, Q5_1_BYTES, prefetch_bytes)


@njit(parallel=True, cache=True)
def mm16_q8_0(w, x, out, f16):
    _matvec(w, x, out, f16, _blk_q8_0, Q8_0_BYTES, prefetch_bytes)


@njit(parallel=True, cache=True)
def mm16_q5_0_l1(w, x, out, f16):
    _matvec(w, x, out, f16, _blk_q5_0, Q5_0_BYTES, prefetch_bytes_l1)


@njit(parallel=True, cache=True)
def mm16_q5_1_l1(w, x, out, f16):
    _matvec(w, x, out, f16, _blk_q5_1, Q5_1_BYTES, prefetch_bytes_l1)


@njit(parallel=True, cache=True)
def mm16_q8_0_l1(w, x, out, f16):
    _matvec(w, x, out, f16, _blk_q8_0, Q8_0_BYTES, prefetch_bytes_l1)
