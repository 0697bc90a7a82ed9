"""Pieces shared by the mat-vec kernels (``matmul_kernels``, ``kquant_kernels``): the half-precision
block scales, software prefetch of the rows ahead, groups of four weight rows per pass (the last
group repeats its last row instead of taking a second code path), and the one-row loop of the kernels
that multiply float activations (``matvec_float``)."""

from __future__ import annotations

from ... import _numba  # noqa: F401  (first: it sets NUMBA_CACHE_DIR before Numba is imported)

# isort: split
from ..._numba import njit, prange
from .layouts import ROWS_PER_PASS
from .simd import prefetch, prefetch_l1, u16at, vhsum, vstore, vzero

#: rows ahead of the current group whose bytes are prefetched (the hardware prefetcher alone leaves
#: a large mat-vec at ~40 % of the bus)
PREFETCH_ROWS = 16
#: groups of eight rows (the MoE kernels: work items) ahead that the 8-row kernels prefetch at the
#: distance 0 (``prefetch_tune``)
X8_PREFETCH_GROUPS = 2


@njit(inline="always")
def x8_prefetch_from(grp, gb, pfd):
    """The flat weight offset the 8-row kernels prefetch from while reading the first block of group
    ``grp`` (``gb`` bytes a group): ``|pfd|`` bytes ahead, or (``pfd`` 0) ``X8_PREFETCH_GROUPS`` groups. A
    negative ``pfd`` is the same distance into L1 (``x8_prefetch``)."""
    if pfd != 0:
        return grp * gb + abs(pfd)
    return (grp + X8_PREFETCH_GROUPS) * gb


@njit(inline="always")
def f16at(w, o, f16):
    """The float16 at byte ``o`` of the byte row ``w``, through the 65536-entry table ``f16``."""
    return f16[u16at(w, o)]


@njit(inline="always")
def prefetch_bytes(wf, p, nbytes, total):
    """Prefetch ``nbytes`` from flat offset ``p`` of the weight (skipped past its end)."""
    if p + nbytes <= total:
        for c in range(0, nbytes, 64):
            prefetch(wf, p + c)


@njit(inline="always")
def prefetch_bytes_l1(wf, p, nbytes, total):
    """As ``prefetch_bytes``, into L1 (``prefetcht0``): the ``*_l1`` kernels, for weights that mostly
    come from L3 (small models; ``matmul_steps`` chooses)."""
    if p + nbytes <= total:
        for c in range(0, nbytes, 64):
            prefetch_l1(wf, p + c)


@njit(inline="always")
def x8_prefetch(wf, p, nbytes, total, pfd):
    """The one-row loops of the 8-row kernels: ``prefetch_bytes`` (into L2), or where the distance
    ``pfd`` is negative ``prefetch_bytes_l1`` (``prefetcht0``). Which is faster depends on the type and
    the CPU (Intel Xeon VM, haswell target, weights from DRAM, into L1: Q5_0 +10-18 %, Q4_0 +2-9 %, Q8_0
    +3-9 %; the k-quants from -31 % to +8 % by shape and run, and slower in the model;
    ``benchmarks/results/stop55_prefetch_l1.md``), so ``prefetch_tune`` measures it per type. The prompt
    loops (several activation rows per pass) prefetch into L2 at ``|pfd|`` whatever its sign."""
    if pfd < 0:
        prefetch_bytes_l1(wf, p, nbytes, total)
    else:
        prefetch_bytes(wf, p, nbytes, total)


@njit(inline="always")
def x8_group_prefetch(Rf, grp, gb, t, xbytes, total, pfd):
    """``x8_rows``' default ``pre``: block ``t`` of group ``grp`` at the distance ``pfd``
    (``x8_prefetch_from``, ``x8_prefetch``)."""
    x8_prefetch(Rf, x8_prefetch_from(grp, gb, pfd) + t, xbytes, total, pfd)


@njit(inline="always")
def x8_rows(R, out, M, pfd, nth, xbytes, blk, pre, a):
    """The one-row (decode) loop of the 8-row kernels, written once: ``out[m, 8g:8g + 8]`` for each group
    ``g`` of ``R`` (uint8[G, nb * xbytes]) and activation row ``m < M``, ``blk(acc, w, t, m, b, a) -> acc``
    the type's block ``b`` at byte ``t`` of the group's bytes ``w`` (``a``: the kernel's prepared
    activations), ``pre(Rf, g, gb, t, xbytes, total, pfd)`` its prefetch, for the first row only.

    Each of ``nth`` parts (``prange``: one a thread where ``nth`` is the thread count) is a contiguous
    range of groups, read as two streams: the first and second halves of the range together, a block of
    one, then the same block of the other. On the Intel VM (haswell target, 2 threads, weights from DRAM)
    the kernels read 5-30 % faster by type and shape than one group after the other, and the 0.5B-shaped
    Q4_K_M file decoded 23 % faster (``benchmarks/results/stop56_decode_steps.md``); two adjacent groups
    together, or whole groups alternating between the halves, were not faster. Each group's sum runs
    block by block as before, whatever the parts: the same bits for any ``nth`` (so the types' float
    steps are ``vfma_strict``: with fast-math flags LLVM contracted them differently in the paired and
    the single code paths). ``nth`` 0: one group a part, so each thread reads one group after the other
    (``prange`` hands a thread a contiguous range): on the AMD (Zen 4) VM that read 2-20 % faster by type
    (``benchmarks/results/stop57_amd.md``), so ``prefetch_tune`` measures both."""
    G, gb = R.shape
    nb = gb // xbytes
    Rf = R.reshape(-1)
    total = G * gb
    parts = G if nth <= 0 else max(1, min(nth, G))  # nth 0: a group a part, one stream a thread
    for th in prange(parts):
        lo = th * G // parts
        hi = (th + 1) * G // parts
        h = (hi - lo) // 2
        for i in range(h):
            g0 = lo + i
            g1 = g0 + h
            w0 = R[g0]
            w1 = R[g1]
            for m in range(M):
                a0 = vzero()
                a1 = vzero()
                for b in range(nb):
                    t = b * xbytes
                    if m == 0:
                        pre(Rf, g0, gb, t, xbytes, total, pfd)
                        pre(Rf, g1, gb, t, xbytes, total, pfd)
                    a0 = blk(a0, w0, t, m, b, a)
                    a1 = blk(a1, w1, t, m, b, a)
                vstore(out[m], g0 * 8, a0)
                vstore(out[m], g1 * 8, a1)
        if (hi - lo) & 1:
            g = hi - 1
            w = R[g]
            for m in range(M):
                acc = vzero()
                for b in range(nb):
                    t = b * xbytes
                    if m == 0:
                        pre(Rf, g, gb, t, xbytes, total, pfd)
                    acc = blk(acc, w, t, m, b, a)
                vstore(out[m], g * 8, acc)


@njit(inline="always")
def rows4(w, g, N):
    """The four rows of group ``g`` (the last one repeated past ``N``)."""
    r0 = g * 4
    return w[r0], w[min(r0 + 1, N - 1)], w[min(r0 + 2, N - 1)], w[min(r0 + 3, N - 1)]


@njit(inline="always")
def store4(out, m, g, N, a0, a1, a2, a3):
    """The horizontal sums of the four row accumulators into ``out[m]`` (repeated rows written twice,
    the real one last)."""
    r0 = g * 4
    out[m, min(r0 + 3, N - 1)] = vhsum(a3)
    out[m, min(r0 + 2, N - 1)] = vhsum(a2)
    out[m, min(r0 + 1, N - 1)] = vhsum(a1)
    out[m, r0] = vhsum(a0)


@njit(inline="always")
def matvec_float(w, x, out, f16, row, bbytes, belems):
    """``matvec_float_pf`` with the prefetch into L2 (``prefetch_bytes``)."""
    matvec_float_pf(w, x, out, f16, row, bbytes, belems, prefetch_bytes)


@njit(inline="always")
def matvec_float_pf(w, x, out, f16, row, bbytes, belems, pfb):
    """The loop of the one-row kernels that multiply float activations (IQ4_NL, IQ4_XS, MXFP4), written
    once: ``prange`` over groups of four weight rows, the rows ``PREFETCH_ROWS`` ahead prefetched, each
    row's ``F32x8`` accumulator summed horizontally at the end. ``row(acc, wr, o, xm, xe, f16) -> acc``
    is the type's block at byte ``o`` of the weight row ``wr`` against ``xm[xe:xe + belems]``; ``pfb`` is
    ``prefetch_bytes`` or ``prefetch_bytes_l1``."""
    N, rb = w.shape
    nb = rb // bbytes
    wf = w.reshape(-1)
    for g in prange((N + 3) // 4):
        w0, w1, w2, w3 = rows4(w, g, N)
        pf = (g * 4 + PREFETCH_ROWS) * rb
        for m in range(x.shape[0]):
            xm = x[m]
            a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
            for b in range(nb):
                if m == 0:
                    pfb(wf, pf + b * ROWS_PER_PASS * bbytes, ROWS_PER_PASS * bbytes, N * rb)
                o, xe = b * bbytes, b * belems
                a0 = row(a0, w0, o, xm, xe, f16)
                a1 = row(a1, w1, o, xm, xe, f16)
                a2 = row(a2, w2, o, xm, xe, f16)
                a3 = row(a3, w3, o, xm, xe, f16)
            store4(out, m, g, N, a0, a1, a2, a3)
