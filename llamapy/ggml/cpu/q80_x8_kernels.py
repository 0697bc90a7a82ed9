"""Q8_0 weights repacked eight rows at a time, and their mat-vec kernels over the same 16-bit activations
as ``q16_kernels.mm16_q8_0`` (``hsimd.quantize_rows_q16``: 1/32767 of each 32-element block's largest
value, not llama.cpp's 8 bits).

As ``q40_x8_kernels`` for Q4_0: eight rows sit side by side so that the eight 32-bit lanes are the eight
rows. One block of eight rows (``X8_BYTES``, 272: the same bytes as eight plain 34-byte blocks, moved):
the rows' ``d`` (8 float16), then the 256 quant bytes as ``[chunk c][row r][2]``: bytes ``2c, 2c + 1``
of row r's 32. One chunk (16 bytes) sign-extended to 16 words (``vpmovsxbw``, one instruction) holds
each row's weights ``2c, 2c + 1`` in the two halves of its lane; the pair of 16-bit activations they
multiply is broadcast to all eight rows (``vpbroadcastd`` straight from the quantized activations: no
permutation, no offset to correct), and one ``pmaddwd`` leaves each row's two products summed in its
own 32-bit lane. Per chunk: 1 widen, 1 broadcast, 1 ``pmaddwd``, 1 add; the eight rows' scales are one
``vcvtph2ps`` per block. ``mm_q8_0_x8r4`` takes four activation rows per pass, each widened weight
vector used four times.

The integer sum per row and block is the plain kernel's (``sum(q * a)``, exact in 32 bits: at most 32 *
128 * 32767 < 2^28). The plain kernel converts eight partial lanes of at most four products each to float
(exact: < 2^24); here the one sum per row and block is converted once, exact below 2^24 (every real
block: 2^24 needs weights and activations near their largest across the block) and else rounded to
float32 (relative 6e-8, as any float addition). So results differ from ``mm16_q8_0`` in the order of
the float additions only (tested against it, and bit for bit where every float step is exact).
"""

from __future__ import annotations

from ... import _numba  # noqa: F401  (first: it sets NUMBA_CACHE_DIR before Numba is imported)

# isort: split
import numpy as np

from ..._numba import njit, prange
from .hsimd import hmadd, hwiden, nan_rows, quantize_rows_q16
from .isimd import itof, izero
from .q40_x8_kernels import pbcast
from .rowgroups import x8_prefetch, x8_rows
from .simd import vfma_strict, vmul, vsplat, vstore, vzero
from .x8simd import xh8

#: bytes of one block of eight rows; of one plain block; of the halves at the start of a plain block
X8_BYTES = 272
SRC_BYTES = 34
#: bytes ahead of the block being read to prefetch (into L2), each 64-byte line once. Against the plain
#: one-row kernel on the 1.4 GB of a 1.5B-shaped Q8_0 model's matrices (one thread, CPU ms per sweep,
#: min / median of 8 alternating): plain 49.5 / 51.4; this 49.8 / 52.1; 256 KiB ahead 51.5 / 54.4; two
#: groups ahead, every block's 272 bytes (5 prefetches, lines twice) 56.4 / 59.4 (10-15 % slower).
#: That was the AMD EPYC VM. A kernel given a distance (``pfd`` != 0, ``prefetch_tune``) prefetches at
#: that distance instead (2048 on the Intel Xeon VM: the 1.5B-shaped Q8_0 file's tg32, 2 threads,
#: 13.0-13.7 -> 15.8-16.3 t/s; ``benchmarks/results/stop49_intel_prefetch.md``)
X8_PREFETCH_BYTES = 65536
#: from this many activation rows on, they are quantized in parallel (fewer: one parallel launch costs
#: more than it saves)
PAR_QUANT_ROWS = 16


# -- repacking ----------------------------------------------------------------------------------------
@njit(parallel=True, cache=True)
def repack_x8(A, R):
    """Plain Q8_0 rows ``A`` (uint8[N, nb * 34], N a multiple of 8) into ``R`` (uint8[N // 8, nb * 272]).
    Each block a slice indexed by the loop counters alone (every offset then non-negative and constant
    for LLVM, no wraparound steps): one thread, in cache (``benchmarks/repack_speed.py``), 2048x1536
    0.68-0.72 -> 0.38-0.51 ms, 1536x8960 3.2-3.4 -> 2.6-2.7 ms; the same bytes."""
    N, rb = A.shape
    nb = rb // SRC_BYTES
    A16 = A.view(np.uint16)
    R16 = R.view(np.uint16)
    for grp in prange(N // 8):
        for b in range(nb):
            s0, t0 = b * (SRC_BYTES // 2), b * (X8_BYTES // 2)
            out = R16[grp, t0 : t0 + X8_BYTES // 2]
            for r in range(8):
                w = A16[grp * 8 + r, s0 : s0 + SRC_BYTES // 2]
                for k in range(SRC_BYTES // 2):  # k = 0: the d; then the quants, two bytes at a time
                    out[8 * k + r] = w[k]


@njit(parallel=True, cache=True)
def unpack_x8_rows(R, r0, r1, dst):
    """Rows ``r0`` .. ``r1`` of a repacked weight back in plain bytes (``dst``: uint8[r1 - r0, nb * 34]),
    bit for bit the rows ``repack_x8`` was given."""
    nb = R.shape[1] // X8_BYTES
    R16 = R.view(np.uint16)
    D16 = dst.view(np.uint16)
    g0 = r0 // 8
    for gi in prange((r1 + 7) // 8 - g0):
        g8 = g0 + gi
        for b in range(nb):
            s0, t0 = b * (SRC_BYTES // 2), b * (X8_BYTES // 2)
            for r in range(max(0, r0 - g8 * 8), min(8, r1 - g8 * 8)):
                i = g8 * 8 + r - r0
                D16[i, s0] = R16[g8, t0 + r]
                for k in range(16):
                    D16[i, s0 + 1 + k] = R16[g8, t0 + 8 + 8 * k + r]


# -- the kernels ----------------------------------------------------------------------------------------
@njit(inline="always")
def _prepare(x, nb):
    """The activations as the kernels read them: (16-bit values, scales, finite rows); from
    ``PAR_QUANT_ROWS`` rows quantized in parallel, row by row (the same values)."""
    M = x.shape[0]
    xq = np.empty((M, nb * 32), np.int16)
    xd = np.empty((M, nb), np.float32)
    xs = np.empty((M, nb), np.float32)
    if M < PAR_QUANT_ROWS:
        return xq, xd, quantize_rows_q16(x, xq, xd, xs)
    ok = np.empty(M, np.bool_)
    for m in prange(M):
        ok[m] = quantize_rows_q16(x[m : m + 1], xq[m : m + 1], xd[m : m + 1], xs[m : m + 1])[0]
    return xq, xd, ok


@njit(inline="always")
def _prefetch_ahead(Rf, p, d, total, pfd):
    """Prefetch the 64-byte lines that start in the block ``d`` bytes after flat offset ``p`` (into L1
    where ``pfd`` < 0: ``rowgroups.x8_prefetch``)."""
    q = p + d
    if q + X8_BYTES <= total:
        for c in range((q + 63) // 64 * 64, q + X8_BYTES, 64):
            x8_prefetch(Rf, c, 1, total, pfd)


@njit(inline="always")
def _blk_sum(wi, q, xm, x0):
    """Each of the eight rows' integer sum over the block whose quants start at byte ``q``."""
    s = izero()
    for c in range(16):
        s = hmadd(s, hwiden(wi, q + 16 * c), pbcast(xm, x0 + 2 * c))
    return s


@njit(parallel=True, cache=True)
def mm_q8_0_x8(R, x, out, pfd, nth=2):
    """out[m, :] = W @ (the 16-bit quantized x[m]) for the repacked Q8_0 weight ``R`` (uint8[N // 8,
    nb * 272]); ``pfd``: the prefetch distance in bytes (0: ``X8_PREFETCH_BYTES``)."""
    nb = R.shape[1] // X8_BYTES
    xq, xd, ok = _prepare(x, nb)
    x8_rows(R, out, x.shape[0], pfd, nth, X8_BYTES, _row_block, _row_prefetch, (xq, xd))
    nan_rows(out, ok)


@njit(inline="always")
def _row_block(acc, w, t, m, b, a):
    """``rowgroups.x8_rows``' block: activation row ``m``'s step of block ``b``."""
    xq, xd = a
    s = _blk_sum(w.view(np.int8), t + 16, xq[m], b * 32)
    return vfma_strict(acc, vmul(xh8(w, t), vsplat(xd[m, b])), itof(s))


@njit(inline="always")
def _row_prefetch(Rf, grp, gb, t, xbytes, total, pfd):
    """``rowgroups.x8_rows``' prefetch: ``|pfd|`` bytes ahead (0: ``X8_PREFETCH_BYTES``)."""
    _prefetch_ahead(Rf, grp * gb + t, abs(pfd) if pfd != 0 else X8_PREFETCH_BYTES, total, pfd)


@njit(parallel=True, cache=True)
def mm_q8_0_x8r4(R, x, out, pfd):
    """As ``mm_q8_0_x8``, four activation rows per pass over the weight (prompts): each widened weight
    vector is used for four rows. Every row's integer sums and float steps are the one-row kernel's, so
    its result is too, bit for bit."""
    G, gb = R.shape
    nb = gb // X8_BYTES
    M = x.shape[0]
    Rf = R.reshape(-1)
    total = G * gb
    xq, xd, ok = _prepare(x, nb)
    ahead = abs(pfd) if pfd != 0 else X8_PREFETCH_BYTES  # prompts: into L2 whatever the sign
    for grp in prange(G):
        w = R[grp]
        wi = w.view(np.int8)
        g0 = grp * gb
        for m0 in range(0, M, 4):
            m1, m2, m3 = min(m0 + 1, M - 1), min(m0 + 2, M - 1), min(m0 + 3, M - 1)
            x0, x1, x2, x3 = xq[m0], xq[m1], xq[m2], xq[m3]
            a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
            for b in range(nb):
                t = b * X8_BYTES
                if m0 == 0:
                    _prefetch_ahead(Rf, g0 + t, ahead, total, ahead)
                s0, s1, s2, s3 = izero(), izero(), izero(), izero()
                for c in range(16):
                    v = hwiden(wi, t + 16 + 16 * c)
                    xc = b * 32 + 2 * c
                    s0 = hmadd(s0, v, pbcast(x0, xc))
                    s1 = hmadd(s1, v, pbcast(x1, xc))
                    s2 = hmadd(s2, v, pbcast(x2, xc))
                    s3 = hmadd(s3, v, pbcast(x3, xc))
                d = xh8(w, t)
                a0 = vfma_strict(a0, vmul(d, vsplat(xd[m0, b])), itof(s0))
                a1 = vfma_strict(a1, vmul(d, vsplat(xd[m1, b])), itof(s1))
                a2 = vfma_strict(a2, vmul(d, vsplat(xd[m2, b])), itof(s2))
                a3 = vfma_strict(a3, vmul(d, vsplat(xd[m3, b])), itof(s3))
            vstore(out[m3], grp * 8, a3)  # rows past M repeat the last one: written again, same values
            vstore(out[m2], grp * 8, a2)
            vstore(out[m1], grp * 8, a1)
            vstore(out[m0], grp * 8, a0)
    nan_rows(out, ok)
