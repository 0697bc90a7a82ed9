"""The row loops of the small-batch mat-vec kernels, written once: a kernel of ``batch_kernels`` is one
of these loops specialized (inlined, as ``q16_kernels._matvec``) for one type's block functions
(``blocks32``, ``kquant_blocks``), so a fix to the loop (prefetch, tail rows) is one edit per loop.

- ``batch4``: float activations, a group of up to four rows per weight row (two when at most two are
  left, the last group repeating its last row). Per block: ``blk = load(wr, o, s, f16, tab)`` (the block's
  registers, decoded once), then ``acc = row(acc, blk, xf, i, xsf, j)`` for each row of the group (the
  row's products with the block, scale and offset; ``xsf`` the per-32 activation sums ``_xsums`` when
  ``xsums``). A block of ``bbytes`` holds ``nsub`` runs of 32 weights, ``s`` the run.
- ``batch8``: float activations, up to eight rows: ``w0..w3 = scaled(load(wr, o, s, f16, tab))`` (the 32
  weights as floats, scale applied), then four FMAs and one add per row (``_acc8``).
- ``kbatch4``: the k-quants against 8-bit activations (``kquant_kernels._q8k``): per 256-weight block
  ``h = head(wr, o)`` (the scales the runs need), ``runs`` (the block's eight runs of 32 bytes, each into
  the integer sums of the group's rows through ``run4``), ``t = tail(wr, o, f16, h)`` (the float scales,
  read after the runs: earlier, they cost registers in the runs), then ``acc = fin(acc, s, wr, o, t, d8,
  bsf, jb)`` per row, ``bsf`` the activations' byte sums per ``bsn`` (16 or 32) elements.

Consistency: the float steps are ``simd``'s strict operations in a fixed order per row, so a row's
result does not depend on which other rows are in the batch or where it sits (tested bit for bit). The
accumulators are plain variables and the rows offsets into the flat activations: array views or tuples
of them inside the row loop cost reference counting (measured: 2-5x slower). ``prange`` over weight
rows; the first group of each row prefetches the bytes of the row ``PREFETCH_ROWS`` ahead.
"""

from __future__ import annotations

from ..._numba import njit, prange  # first: it sets NUMBA_CACHE_DIR before Numba is imported

# isort: split
import numpy as np

from .hsimd import nan_rows
from .isimd import ibar4, izero
from .kquant_kernels import QK_K, _q8k
from .rowgroups import PREFETCH_ROWS, prefetch_bytes
from .simd import vadd, vadd_strict, vfma_strict, vhsum, vload, vmul_strict, vstore, vzero


@njit(inline="always")
def _xsums(x, nb):
    """Per 32-element block of each row: the 8-lane sum (x0 + x1) + (x2 + x3) of its four vectors
    (``nb`` 0: none, an empty array)."""
    M = x.shape[0]
    xs = np.empty((M, nb * 8), np.float32)
    for m in range(M):
        xm, xsm = x[m], xs[m]
        for b in range(nb):
            i = b * 32
            s = vadd(vadd(vload(xm, i), vload(xm, i + 8)), vadd(vload(xm, i + 16), vload(xm, i + 24)))
            vstore(xsm, b * 8, s)
    return xs


@njit(inline="always")
def _group(m0, M):
    """The activation rows of the group at ``m0``: four (the last repeated past ``M``), or two when
    at most two are left (``full`` False)."""
    last = M - 1
    return min(m0, last), min(m0 + 1, last), min(m0 + 2, last), min(m0 + 3, last), M - m0 >= 3


@njit(inline="always")
def _store(out, r, i0, i1, i2, i3, a0, a1, a2, a3, full):
    if full:
        out[i3, r] = vhsum(a3)
        out[i2, r] = vhsum(a2)
    out[i1, r] = vhsum(a1)
    out[i0, r] = vhsum(a0)


@njit(inline="always")
def dot(q0, q1, q2, q3, xm, i):
    """sum of q * x over a run of 32 elements, as four partial sums (this order, strict)."""
    t = vmul_strict(q0, vload(xm, i))
    t = vfma_strict(t, q1, vload(xm, i + 8))
    t = vfma_strict(t, q2, vload(xm, i + 16))
    return vfma_strict(t, q3, vload(xm, i + 24))


@njit(inline="always")
def batch4(w, x, out, f16, tab, load, row, bbytes, nsub, xsums):
    N, rb = w.shape
    M, nb = x.shape[0], rb // bbytes
    wf, xf, K = w.reshape(-1), x.reshape(-1), x.shape[1]
    xs = _xsums(x, nb * nsub if xsums else 0)
    xsf, nx = xs.reshape(-1), xs.shape[1]
    for r in prange(N):
        wr = w[r]
        pf = (r + PREFETCH_ROWS) * rb
        for m0 in range(0, M, 4):
            i0, i1, i2, i3, full = _group(m0, M)
            x0, x1, x2, x3 = i0 * K, i1 * K, i2 * K, i3 * K
            s0, s1, s2, s3 = i0 * nx, i1 * nx, i2 * nx, i3 * nx
            a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
            for b in range(nb):
                if m0 == 0:
                    prefetch_bytes(wf, pf + b * bbytes, bbytes, N * rb)
                o = b * bbytes
                for s in range(nsub):
                    blk = load(wr, o, s, f16, tab)
                    i, j = (b * nsub + s) * 32, (b * nsub + s) * 8
                    a0 = row(a0, blk, xf, x0 + i, xsf, s0 + j)
                    a1 = row(a1, blk, xf, x1 + i, xsf, s1 + j)
                    if full:
                        a2 = row(a2, blk, xf, x2 + i, xsf, s2 + j)
                        a3 = row(a3, blk, xf, x3 + i, xsf, s3 + j)
            _store(out, r, i0, i1, i2, i3, a0, a1, a2, a3, full)


@njit(inline="always")
def _acc8(a0, a1, a2, a3, a4, a5, a6, a7, w0, w1, w2, w3, xf, x0, x1, x2, x3, x4, x5, x6, x7, i, n):
    """The run's products for the group's rows: two, four or eight of them (``n`` rows left)."""
    a0 = vadd_strict(a0, dot(w0, w1, w2, w3, xf, x0 + i))
    a1 = vadd_strict(a1, dot(w0, w1, w2, w3, xf, x1 + i))
    if n > 2:
        a2 = vadd_strict(a2, dot(w0, w1, w2, w3, xf, x2 + i))
        a3 = vadd_strict(a3, dot(w0, w1, w2, w3, xf, x3 + i))
    if n > 4:
        a4 = vadd_strict(a4, dot(w0, w1, w2, w3, xf, x4 + i))
        a5 = vadd_strict(a5, dot(w0, w1, w2, w3, xf, x5 + i))
        a6 = vadd_strict(a6, dot(w0, w1, w2, w3, xf, x6 + i))
        a7 = vadd_strict(a7, dot(w0, w1, w2, w3, xf, x7 + i))
    return a0, a1, a2, a3, a4, a5, a6, a7


@njit(inline="always")
def _store8(out, r, m0, a0, a1, a2, a3, a4, a5, a6, a7, n):
    """Each row's sum (rows repeated past the end are written before the real one)."""
    L = out.shape[0] - 1
    if n > 4:
        out[min(m0 + 7, L), r] = vhsum(a7)
        out[min(m0 + 6, L), r] = vhsum(a6)
        out[min(m0 + 5, L), r] = vhsum(a5)
        out[min(m0 + 4, L), r] = vhsum(a4)
    if n > 2:
        out[min(m0 + 3, L), r] = vhsum(a3)
        out[min(m0 + 2, L), r] = vhsum(a2)
    out[min(m0 + 1, L), r] = vhsum(a1)
    out[m0, r] = vhsum(a0)


@njit(inline="always")
def batch8(w, x, out, f16, tab, load, scaled, bbytes, nsub):
    N, rb = w.shape
    M, nb = x.shape[0], rb // bbytes
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
                    prefetch_bytes(wf, pf + b * bbytes, bbytes, N * rb)
                o = b * bbytes
                for s in range(nsub):
                    w0, w1, w2, w3 = scaled(load(wr, o, s, f16, tab))
                    a0, a1, a2, a3, a4, a5, a6, a7 = _acc8(
                        a0, a1, a2, a3, a4, a5, a6, a7, w0, w1, w2, w3,
                        xf, x0, x1, x2, x3, x4, x5, x6, x7, (b * nsub + s) * 32, n,
                    )  # fmt: skip
            _store8(out, r, m0, a0, a1, a2, a3, a4, a5, a6, a7, n)


@njit(inline="always")
def run4(s0, s1, s2, s3, mad, u, k0, k1, xqf, q0, q1, q2, q3, xo, full):
    """One run of 32 weight bytes ``u`` into the integer sums of the group's rows (``xo``: the run's
    activation offset)."""
    s0 = mad(s0, u, xqf, q0 + xo, k0, k1)
    s1 = mad(s1, u, xqf, q1 + xo, k0, k1)
    if full:
        s2 = mad(s2, u, xqf, q2 + xo, k0, k1)
        s3 = mad(s3, u, xqf, q3 + xo, k0, k1)
    return ibar4(s0, s1, s2, s3)


@njit(inline="always")
def _kblocks(
    wf, base, pf, prefetch, N, rb, nb, xqf, xd, bsf, f16, head, runs, tail, fin, bbytes, bsn, g, full
):
    """One group's pass over the weight row at ``base`` in ``wf``: the four (``full``, a literal: no
    branch inside the runs) or two rows' float sums."""
    i0, i1, i2, i3 = g
    K = nb * QK_K
    q0, q1, q2, q3 = i0 * K, i1 * K, i2 * K, i3 * K
    a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
    for b in range(nb):
        if prefetch:
            prefetch_bytes(wf, pf + b * bbytes, bbytes, N * rb)
        o, x0 = base + b * bbytes, b * QK_K
        h = head(wf, o)
        z = izero()
        s0, s1, s2, s3 = runs(z, z, z, z, wf, o, h, xqf, q0, q1, q2, q3, x0, full)
        t = tail(wf, o, f16, h)
        jb = b * (QK_K // bsn)
        a0 = fin(a0, s0, wf, o, t, xd[i0, b], bsf, q0 // bsn + jb)
        a1 = fin(a1, s1, wf, o, t, xd[i1, b], bsf, q1 // bsn + jb)
        if full:
            a2 = fin(a2, s2, wf, o, t, xd[i2, b], bsf, q2 // bsn + jb)
            a3 = fin(a3, s3, wf, o, t, xd[i3, b], bsf, q3 // bsn + jb)
    return a0, a1, a2, a3


#: weight rows per work item of ``kbatch4``: each group of activation rows runs over all of them while
#: its bytes are in L1 (before: over one weight row, so every weight row streamed all the activations)
KROWS = 8


@njit(inline="always")
def kbatch4(w, x, out, f16, head, runs, tail, fin, bbytes, bsn):
    N, rb = w.shape
    M, nb = x.shape[0], rb // bbytes
    wf = w.reshape(-1)
    xq, xd, bs16, bs32, ok = _q8k(x)
    xqf = xq.reshape(-1)
    bsf = bs16.reshape(-1) if bsn == 16 else bs32.reshape(-1)
    for c in prange((N + KROWS - 1) // KROWS):
        r0 = c * KROWS
        r1 = min(r0 + KROWS, N)
        for m0 in range(0, M, 4):
            i0, i1, i2, i3, full = _group(m0, M)
            g = (i0, i1, i2, i3)
            for r in range(r0, r1):
                base, pf = r * rb, (r + PREFETCH_ROWS) * rb
                if full:
                    a0, a1, a2, a3 = _kblocks(
                        wf, base, pf, m0 == 0, N, rb, nb, xqf, xd, bsf, f16,
                        head, runs, tail, fin, bbytes, bsn, g, True,
                    )  # fmt: skip
                else:
                    a0, a1, a2, a3 = _kblocks(
                        wf, base, pf, m0 == 0, N, rb, nb, xqf, xd, bsf, f16,
                        head, runs, tail, fin, bbytes, bsn, g, False,
                    )  # fmt: skip
                _store(out, r, i0, i1, i2, i3, a0, a1, a2, a3, full)
    nan_rows(out, ok)
