"""``mul_mat_id`` on Q4_K experts repacked eight rows at a time (``moe_x8_kernels``).

A 3-D Q4_K experts weight (``uint8[E, N, row bytes]``, N a multiple of 8) that is a view of a memory-mapped
model file gets, the first time a ``mul_mat_id`` step is compiled for it, an uninitialized copy in
``q4k_x8``'s layout per expert (anonymous memory, transparent huge pages: no resident page until written);
each expert is repacked the first time a token chooses it (``repack_experts``, before the kernel), and its
mapped source pages are then dropped from this process (``madvise(MADV_DONTNEED)``, as ``q4k_x8`` does),
so resident memory grows only with the experts in use (+2.8 %: the decoded scales), as the plain path's
faulted-in pages do, and start-up does not pay for experts never chosen. Every batch then runs the fused
8-row kernel for the experts with up to ``matvec_max_rows("Q4_K")`` pairs (the plain kernels' switch
point: activations rounded to Q8_K exactly where they were); an expert with more pairs (long prompts) is
unpacked back to plain Q4_K a tile of rows at a time (``unpack_x8_rows``, bit for bit) for dequantize +
sgemm, never read from the released source.

**Off by default** (``LLAMAPY_MOE_X8=1`` in the environment, or ``ENABLED = True`` here, turns it on; it
is independent of ``LLAMAPY_Q4K_X8``, the 2-D weights): measured side by side with llama.cpp on the
Qwen3-30B-A3B shape (``benchmarks/results/vs_llamacpp_mid_avx2.md``, 2 threads, quiet machine), repacking
each expert at its first use costs more than the kernel saves until nearly every expert has been chosen:
``llamapy bench -n 16,64 -r 3`` gave tg16 8.7 / tg64 32.7 t/s with it on against 35.7 / 38.4 off. A
repack at load time, as llama.cpp does, would need the source pages released expert by expert to keep
peak memory (an eager repack of all experts at the first graph cost +2.9 CPU s and 2.46 GB peak RSS).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numba
import numpy as np

from ..tensor import Tensor
from ..types import GGMLType

__all__ = ["ENABLED", "mul_mat_id_step"]

#: repack Q4_K experts for the 8-row fused kernel (off by default; ``LLAMAPY_MOE_X8=1``: on)
ENABLED = os.environ.get("LLAMAPY_MOE_X8", "0") not in ("0", "false", "no", "off", "")

_lock = threading.Lock()
#: experts weight -> (address of its bytes, repacked copy uint8[E, N // 8, ...], done flags uint8[E])
_cache: weakref.WeakKeyDictionary[Tensor, tuple[int, np.ndarray, np.ndarray]] = weakref.WeakKeyDictionary()


def _lazy(a: Tensor, A: np.ndarray, any_memory: bool) -> tuple[np.ndarray, np.ndarray] | None:
    """(repacked copy, per-expert done flags) of the experts ``a`` (bytes ``A``), made empty on first use;
    None where they are not repacked."""
    if a.type != GGMLType.Q4_K or a.op != "weight" or A.ndim != 3 or A.dtype != np.uint8:
        return None
    if A.shape[1] % 8 or A.size == 0 or not A.flags.c_contiguous:
        return None
    from .q4k_x8_kernels import X8_BYTES
    from .repack import anonymous, mapped_source

    if mapped_source(A) is None and not any_memory:
        return None
    with _lock:
        hit = _cache.get(a)
        if hit is not None and hit[0] == A.ctypes.data:
            return hit[1], hit[2]
        E, N, rb = A.shape
        gb = rb // 144 * X8_BYTES
        R = anonymous(E * (N // 8) * gb).reshape(E, N // 8, gb)
        done = np.zeros(E, np.uint8)
        _cache[a] = (A.ctypes.data, R, done)
    return R, done


def mul_mat_id_step(
    be: Any,
    a: Tensor,
    A: np.ndarray,
    B: np.ndarray,
    ids: np.ndarray,
    out: np.ndarray,
    bad_id: Callable[[int], Exception],
    any_memory: bool = False,
) -> Callable[[], None] | None:
    """The ``mul_mat_id`` step for the experts ``a`` (bytes ``A``) with activations ``B`` ([T, 1 or U,
    K]), expert ids ``ids`` ([T, U]) into ``out`` ([T, U, N], C-contiguous) on the repacked layout, or
    None where the experts are not repacked (not Q4_K, N not a multiple of 8, not a mapped file unless
    ``any_memory``, switched off). ``bad_id(e)``: the error raised for an expert id out of range."""
    if not ENABLED or a.type != GGMLType.Q4_K or A.ndim != 3 or not out.flags.c_contiguous:
        return None
    lazy = _lazy(a, A, any_memory)
    if lazy is None:
        return None
    R, done = lazy
    from ..quants import dequantize_rows_into
    from .backend import MATVEC_MAX_TOKENS, TILE_FLOATS, _threads, matvec_max_rows
    from .blas import gemm_nt
    from .moe_x8_kernels import moe_q4_k_x8, repack_experts
    from .q4k_x8_kernels import unpack_x8_rows
    from .repack import mapped_source, release_pages

    be.need(moe_q4_k_x8, repack_experts, unpack_x8_rows)
    mm = mapped_source(A)
    new = np.empty(A.shape[0], np.int64)
    E, N, rb = A.shape
    K = a.shape[-1]
    max_rows = matvec_max_rows("Q4_K", MATVEC_MAX_TOKENS)
    out2 = out.reshape(-1, N)
    direct = B.dtype == np.float32 and B.flags.c_contiguous
    threads = _threads(be)
    tile = max(16, min(N, TILE_FLOATS // max(K, 1)))

    def tiles(e: int, sel: np.ndarray) -> None:
        """Expert ``e``'s pairs ``sel`` (flat t * U + u): tiles of rows unpacked + dequantized, sgemm."""
        U = ids.shape[1]
        t_idx, u_idx = sel // U, sel % U
        x = np.ascontiguousarray(B[t_idx, u_idx if B.shape[1] > 1 else 0], dtype=np.float32)
        y = np.empty((x.shape[0], N), np.float32)
        for r0 in range(0, N, tile):
            n = min(tile, N - r0)
            q = be.scratch("moe_x8_q", (n, rb), np.uint8)
            W = be.scratch("mm_tile", (n, K))
            unpack_x8_rows(R[e], r0, r0 + n, q)
            dequantize_rows_into(q, GGMLType.Q4_K, W)
            gemm_nt(x, W, y[:, r0 : r0 + n], threads)
        out[t_idx, u_idx] = y

    def ensure() -> None:
        """Repack the experts ``ids`` chooses for the first time; drop their mapped source pages."""
        with _lock:
            n = repack_experts(A, R, done, ids, new)
            if mm is not None:
                for e in new[:n]:
                    release_pages(A[e], mm)

    def step_x8() -> None:
        if ids.shape[0] * ids.shape[1] > 0:
            ensure()
        x = B if direct else np.ascontiguousarray(B, dtype=np.float32)
        bad = moe_q4_k_x8(R, x, ids, out2, max_rows, numba.get_num_threads())
        if bad >= 0:
            raise bad_id(ids.reshape(-1)[bad])
        if ids.size > max_rows:  # experts with more pairs than the kernel takes
            flat = ids.reshape(-1)
            counts = np.bincount(flat, minlength=E)
            for e in np.flatnonzero(counts > max_rows):
                tiles(int(e), np.flatnonzero(flat == e))

    return step_x8
