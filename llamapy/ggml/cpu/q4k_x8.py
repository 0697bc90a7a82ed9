"""``mul_mat`` on Q4_K weights repacked eight rows at a time (``q4k_x8_kernels``).

A 2-D Q4_K weight whose row count is a multiple of 8 and whose bytes are a view of a memory-mapped model
file is repacked once, the first time a ``mul_mat`` step is compiled for it, into anonymous memory; the
mapped source pages are then dropped from this process (``madvise(MADV_DONTNEED)``: the file's pages stay
valid and fault back in if something else reads them, e.g. ``get_rows`` of a tied embedding), so the
resident memory stays the same size (+2.8 %: the decoded scales). Weights read into memory
(``use_mmap=False``) are not repacked: their source could not be released.

Up to ``matvec_max_rows("Q4_K")`` activation rows (the plain kernels' switch point, so activations are
rounded to Q8_K exactly where they were) run ``mm_q4_k_x8``, which decodes the weight again per row and
still beats the plain batch kernels that decode it once per 4-8 rows (one thread, CPU ms per row,
8960x1536: 64 rows 0.27 vs 0.31, 4 rows 0.31 vs 0.35-0.40; 1536x1536 at 200 rows 0.042 vs 0.054).
More rows convert a tile of rows back to plain Q4_K in a scratch buffer (``unpack_x8_rows``, bit for
bit) for the dequantize + sgemm path, as before.

``LLAMAPY_Q4K_X8=0`` in the environment, or ``ENABLED = False`` here, turns repacking off (for A/B).
"""

from __future__ import annotations

import mmap
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from ..tensor import Tensor
from ..types import GGMLType

__all__ = ["ENABLED", "repack", "mapped_source", "mul_mat_step"]

#: repack Q4_K weights for the 8-row kernel (``LLAMAPY_Q4K_X8=0``: no)
ENABLED = os.environ.get("LLAMAPY_Q4K_X8", "1") not in ("0", "false", "no", "off")

_lock = threading.Lock()
_cache: weakref.WeakKeyDictionary[Tensor, tuple[int, np.ndarray]] = weakref.WeakKeyDictionary()


def mapped_source(A: np.ndarray) -> mmap.mmap | None:
    """The ``mmap`` object ``A`` is a view of (None: ``A``'s memory is not a mapped file)."""
    b: Any = A
    while b is not None:
        if isinstance(b, mmap.mmap):
            try:
                b.size()  # a file's size; an anonymous map (no file) raises
            except OSError:
                return None
            return b
        b = b.obj if isinstance(b, memoryview) else getattr(b, "base", None)
    return None


def _release(A: np.ndarray, mm: mmap.mmap) -> None:
    """Drop the whole pages of ``A``'s bytes from this process's resident set (the file keeps them)."""
    try:
        start = np.frombuffer(mm, dtype=np.uint8, count=1).ctypes.data
    except (ValueError, TypeError):
        return
    lo = A.ctypes.data - start
    hi = lo + A.nbytes
    page = mmap.PAGESIZE
    lo = -(-lo // page) * page
    hi = hi // page * page
    if hi > lo and hasattr(mm, "madvise"):
        try:
            mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
        except (OSError, ValueError):
            pass


def repack(A: np.ndarray) -> np.ndarray:
    """The repacked copy of the Q4_K rows ``A`` (uint8[N, row bytes], N a multiple of 8), or of each
    expert's rows of ``A`` uint8[E, N, row bytes] (-> uint8[E, N // 8, ...]: ``moe_x8``)."""
    from .q4k_x8_kernels import X8_BYTES, repack_x8

    N, rb = A.shape[-2:]
    lead = A.shape[:-2]
    gb = rb // 144 * X8_BYTES
    R = _anonymous(int(np.prod(lead, dtype=np.int64)) * (N // 8) * gb).reshape(*lead, N // 8, gb)
    if A.ndim == 2:
        repack_x8(A, R)
    else:
        for e in range(A.shape[0]):
            repack_x8(A[e], R[e])
    return R


def _anonymous(nbytes: int) -> np.ndarray:
    """``nbytes`` of fresh memory, in transparent huge pages where the kernel gives them: on this KVM
    machine a first write to a 4 KiB page costs ~6 us of system time, so 4 KiB pages made repacking
    a 1.5B model's 625 MB of Q4_K cost ~1 s of CPU instead of ~0.3 s."""
    try:
        m = mmap.mmap(-1, max(nbytes, 1))
    except OSError:
        return np.empty(nbytes, np.uint8)
    if hasattr(m, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            m.madvise(mmap.MADV_HUGEPAGE)
        except OSError:
            pass
    return np.frombuffer(m, np.uint8, count=nbytes)


def _repacked(a: Tensor, A: np.ndarray, any_memory: bool) -> np.ndarray | None:
    if not ENABLED or a.type != GGMLType.Q4_K or A.ndim != 2 or A.dtype != np.uint8:
        return None
    if a.op != "weight":  # a view or a computed tensor: a new Tensor per graph, so no cache by tensor
        return None
    if A.shape[0] % 8 or A.shape[0] == 0 or not A.flags.c_contiguous:
        return None
    mm = mapped_source(A)
    if mm is None and not any_memory:
        return None
    with _lock:
        hit = _cache.get(a)
        if hit is not None and hit[0] == A.ctypes.data:
            return hit[1]
        R = repack(A)
        _cache[a] = (A.ctypes.data, R)
    if mm is not None:
        _release(A, mm)
    return R


def mul_mat_step(
    be: Any,
    a: Tensor,
    A: np.ndarray,
    x: np.ndarray,
    out2: np.ndarray,
    pre: Callable[[], None] | None,
    any_memory: bool = False,
) -> Callable[[], None] | None:
    """The ``mul_mat`` step for the weight ``a`` (bytes ``A``) on the repacked layout, or None where it
    is not repacked (not Q4_K, rows not a multiple of 8, not a mapped file unless ``any_memory``)."""
    R = _repacked(a, A, any_memory)
    if R is None:
        return None
    from .backend import MATVEC_MAX_TOKENS, TILE_FLOATS, _kernels, _threads, matvec_max_rows
    from .q4k_x8_kernels import mm_q4_k_x8, unpack_x8_rows

    mk, _ = _kernels()
    f16 = mk.F16_TABLE
    M = x.shape[0]
    N, rb = A.shape
    K = a.shape[-1]
    if M <= matvec_max_rows("Q4_K", MATVEC_MAX_TOKENS):
        kern = mm_q4_k_x8
        be.need(kern)

        def step_x8() -> None:
            if pre is not None:
                pre()
            kern(R, x, out2, f16)

        return step_x8
    be.need(unpack_x8_rows)
    from ..quants import dequantize_rows_into
    from .blas import gemm_nt

    threads = _threads(be)
    tile = max(16, min(N, TILE_FLOATS // max(K, 1)))

    def step_tiles() -> None:
        if pre is not None:
            pre()
        for r0 in range(0, N, tile):
            n = min(tile, N - r0)
            q = be.scratch("x8_q", (n, rb), np.uint8)
            W = be.scratch("mm_tile", (n, K))
            unpack_x8_rows(R, r0, r0 + n, q)
            dequantize_rows_into(q, GGMLType.Q4_K, W)
            gemm_nt(x, W, out2[:, r0 : r0 + n], threads)

    return step_tiles
