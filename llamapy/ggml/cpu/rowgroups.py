"""Pieces shared by the mat-vec kernels (``matmul_kernels``, ``kquant_kernels``): the half-precision
block scales, software prefetch of the rows ahead, and groups of four weight rows per pass (the last
group repeats its last row instead of taking a second code path)."""

from __future__ import annotations

from ..._numba import njit
from .simd import prefetch, u16at, vhsum

#: rows ahead of the current group whose bytes are prefetched (the hardware prefetcher alone leaves
#: a large mat-vec at ~40 % of the bus)
PREFETCH_ROWS = 16


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
