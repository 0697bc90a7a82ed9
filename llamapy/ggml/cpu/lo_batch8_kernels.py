"""Mat-vec kernels for 5 to ``MATVEC_MAX_TOKENS`` rows and IQ4_NL, IQ4_XS: each 32-weight run decoded once
for up to EIGHT activation rows, straight into its float values (``d * kvalues[q]``: four ``F32x8``), as
``batch8_kernels`` does for the 32-element types (same row loop, ``_acc8`` and ``_store8``). A row's
result does not depend on the other rows; against the 4-row kernels it differs in float rounding only.
Call as ``MATVEC``: ``kern(w, x, out, f16)``.
"""

from __future__ import annotations

import numpy as np

from ..._numba import njit, prange
from ..quants.layouts import (
    IQ4_NL_BYTES,
    IQ4_NL_QS,
    IQ4_XS_BYTES,
    IQ4_XS_QS,
    IQ4_XS_SCALES_H,
    IQ4_XS_SCALES_L,
)
from .batch8_kernels import _acc8, _store8
from .iq4_kernels import vnl4
from .rowgroups import PREFETCH_ROWS, f16at, prefetch_bytes
from .simd import u16at, vmul, vsplat, vzero


@njit(inline="always")
def _scaled(wr, q, d):
    u0, u1, u2, u3 = vnl4(wr, q)
    return vmul(d, u0), vmul(d, u1), vmul(d, u2), vmul(d, u3)


@njit(parallel=True, cache=True, fastmath=True)
def mmb8_iq4_nl(w, x, out, f16):
    N, rb = w.shape
    M, nb = x.shape[0], rb // IQ4_NL_BYTES
    wf, xf, K = w.reshape(-1), x.reshape(-1), x.shape[1]
    for r in prange(N):
        wr = w[r]
        pf = (r + PREFETCH_ROWS) * rb
        for m0 in range(0, M, 8):
            n, L = M - m0, M - 1
            x0, x1, x2, x3 = m0 * K, min(m0 + 1, L) * K, min(m0 + 2, L) * K, min(m0 + 3, L) * K
            x4, x5, x6, x7 = min(m0 + 4, L) * K, min(m0 + 5, L) * K, min(m0 + 6, L) * K, min(m0 + 7, L) * K
            a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
            a4, a5, a6, a7 = vzero(), vzero(), vzero(), vzero()
            for b in range(nb):
                if m0 == 0:
                    prefetch_bytes(wf, pf + b * IQ4_NL_BYTES, IQ4_NL_BYTES, N * rb)
                o = b * IQ4_NL_BYTES
                w0, w1, w2, w3 = _scaled(wr, o + IQ4_NL_QS, vsplat(f16at(wr, o, f16)))
                a0, a1, a2, a3, a4, a5, a6, a7 = _acc8(
                    a0, a1, a2, a3, a4, a5, a6, a7, w0, w1, w2, w3,
                    xf, x0, x1, x2, x3, x4, x5, x6, x7, b * 32, n,
                )  # fmt: skip
            _store8(out, r, m0, a0, a1, a2, a3, a4, a5, a6, a7, n)


@njit(parallel=True, cache=True, fastmath=True)
def mmb8_iq4_xs(w, x, out, f16):
    N, rb = w.shape
    M, nb = x.shape[0], rb // IQ4_XS_BYTES
    wf, xf, K = w.reshape(-1), x.reshape(-1), x.shape[1]
    for r in prange(N):
        wr = w[r]
        pf = (r + PREFETCH_ROWS) * rb
        for m0 in range(0, M, 8):
            n, L = M - m0, M - 1
            x0, x1, x2, x3 = m0 * K, min(m0 + 1, L) * K, min(m0 + 2, L) * K, min(m0 + 3, L) * K
            x4, x5, x6, x7 = min(m0 + 4, L) * K, min(m0 + 5, L) * K, min(m0 + 6, L) * K, min(m0 + 7, L) * K
            a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
            a4, a5, a6, a7 = vzero(), vzero(), vzero(), vzero()
            for b in range(nb):
                if m0 == 0:
                    prefetch_bytes(wf, pf + b * IQ4_XS_BYTES, IQ4_XS_BYTES, N * rb)
                o = b * IQ4_XS_BYTES
                dsb, sh = f16at(wr, o, f16), u16at(wr, o + IQ4_XS_SCALES_H)
                for ib in range(8):
                    lo = (wr[o + IQ4_XS_SCALES_L + ib // 2] >> (4 * (ib % 2))) & 15
                    d = vsplat(dsb * np.float32((lo | (((sh >> (2 * ib)) & 3) << 4)) - 32))
                    w0, w1, w2, w3 = _scaled(wr, o + IQ4_XS_QS + 16 * ib, d)
                    a0, a1, a2, a3, a4, a5, a6, a7 = _acc8(
                        a0, a1, a2, a3, a4, a5, a6, a7, w0, w1, w2, w3,
                        xf, x0, x1, x2, x3, x4, x5, x6, x7, b * 256 + 32 * ib, n,
                    )  # fmt: skip
            _store8(out, r, m0, a0, a1, a2, a3, a4, a5, a6, a7, n)
