"""``mul_mat_id`` on Q4_K experts repacked eight rows at a time (``moe_x8_kernels``), and on Q6_K experts
(``q6k_x8_kernels``' layout, ``moe_q6k_x8_kernels``: llama-quantize's Q4_K_M makes some ``ffn_down_exps``
Q6_K) the same way.

A 3-D Q4_K experts weight (``uint8[E, N, row bytes]``, N a multiple of 8) that is a view of a memory-mapped
model file is repacked whole the first time a ``mul_mat_id`` step is compiled for it (the first graph,
before any timed token: llama.cpp repacks at load), into ``q4k_x8``'s layout per expert (anonymous memory,
transparent huge pages), one expert at a time with its mapped source pages dropped right after
(``madvise(MADV_DONTNEED)``), so at most one expert's source is resident on top of the copy (+2.8 %: the
decoded scales). Every batch then runs the fused 8-row kernel for the experts with up to
``matvec_max_rows("Q4_K")`` pairs (the plain kernels' switch point: activations rounded to Q8_K exactly
where they were), an expert's pairs four at a time; an expert with more pairs (long prompts) is unpacked
back to plain Q4_K a tile of rows at a time (``unpack_x8_rows``, bit for bit) for dequantize + sgemm,
never read from the released source.

**On by default** (``LLAMAPY_MOE_X8=0`` in the environment, or ``ENABLED = False`` here, turns it off;
independent of ``LLAMAPY_Q4K_X8``, the 2-D weights). Qwen3-30B-A3B shape, 6 layers, llama-quantize's
Q4_K_M (16 of 18 expert tensors Q4_K), AVX2 target, one thread, CPU time (the shared 2-core VM at load
~8; ``benchmarks/results/moe_x8.md``): tg 31.8-32.8 CPU ms/token against 39.7-47.6 off (llama.cpp
26.2-27.5); pp64 0.395-0.410 CPU s against 0.497-0.576 (llama.cpp 0.82). The cost is at start-up:
``llamapy run -p Hello -n 16`` 8.0 CPU s and 2.42 GB peak RSS against 4.3 s and 1.30 GB off (llama.cpp
6.7 s, 4.76 GB).

Q6_K experts (``LLAMAPY_MOE_Q6K_X8=0``: off; on by default): one ``ffn_down_exps`` call (8 of 128
experts of 2048x768, one token, one thread) 0.42-0.49 CPU ms against 0.97-1.06 for the plain fused
kernel; 64 tokens 17-19 against 38-43 for the per-expert loop prompts use otherwise (whole-model tg
medians 30.5 against 31.4 CPU ms/token, inside this VM's noise).

The first version repacked each expert lazily at its first use instead: the tokens that chose new
experts paid for it (``llamapy bench`` tg16 0.30x of llama.cpp against 0.88x off).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from ..tensor import Tensor
from ..types import GGMLType
from .prefetch_tune import Choice, distance_of, streams_of

__all__ = ["ENABLED", "mul_mat_id_step"]

#: repack Q4_K experts for the 8-row fused kernel (``LLAMAPY_MOE_X8=0``: no)
ENABLED = os.environ.get("LLAMAPY_MOE_X8", "1") not in ("0", "false", "no", "off")
#: the same for Q6_K experts (``q6k_x8_kernels``' layout, ``moe_q6k_x8_kernels``; ``LLAMAPY_MOE_Q6K_X8=0``: no)
ENABLED_Q6K = os.environ.get("LLAMAPY_MOE_Q6K_X8", "1") not in ("0", "false", "no", "off")

_lock = threading.Lock()
#: experts weight -> (address of its bytes, repacked copy uint8[E, N // 8, ...])
_cache: weakref.WeakKeyDictionary[Tensor, tuple[int, np.ndarray]] = weakref.WeakKeyDictionary()


def _layout(t: GGMLType) -> tuple[int, int, Any, Any, Any] | None:
    """(plain bytes per block, repacked bytes per 8-row block, repack, unpack, experts kernel) of the
    type ``t``, or None where its experts are not repacked (another type, or switched off)."""
    if t == GGMLType.Q4_K and ENABLED:
        from . import q4k_x8_kernels as k4
        from .moe_x8_kernels import moe_q4_k_x8

        return 144, k4.X8_BYTES, k4.repack_x8, k4.unpack_x8_rows, moe_q4_k_x8
    if t == GGMLType.Q6_K and ENABLED_Q6K:
        try:
            from . import q6k_x8_kernels as k6
            from .moe_q6k_x8_kernels import moe_q6_k_x8
        except ImportError:  # the Q6_K 8-row layout is not there
            return None

        return 210, k6.X8_BYTES, k6.repack_x8, k6.unpack_x8_rows, moe_q6_k_x8
    return None


def _repacked(a: Tensor, A: np.ndarray, any_memory: bool) -> np.ndarray | None:
    """The repacked copy of the experts ``a`` (bytes ``A``), made on first use: every expert repacked in
    turn and its mapped source pages dropped right after, so at most one expert's source is resident on
    top of the copy; None where they are not repacked."""
    lay = _layout(a.type)
    if lay is None or a.op != "weight" or A.ndim != 3 or A.dtype != np.uint8:
        return None
    if A.shape[1] % 8 or A.size == 0 or not A.flags.c_contiguous:
        return None
    block, X8_BYTES, repack_x8 = lay[:3]
    from .repack import anonymous, mapped_source, release_pages

    mm = mapped_source(A)
    if mm is None and not any_memory:
        return None
    with _lock:
        hit = _cache.get(a)
        if hit is not None and hit[0] == A.ctypes.data:
            return hit[1]
        E, N, rb = A.shape
        gb = rb // block * X8_BYTES
        R = anonymous(E * (N // 8) * gb).reshape(E, N // 8, gb)
        for e in range(E):
            repack_x8(A[e], R[e])
            if mm is not None:
                release_pages(A[e], mm)
        _cache[a] = (A.ctypes.data, R)
    return R


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
    lay = _layout(a.type)
    if lay is None or A.ndim != 3 or not out.flags.c_contiguous:
        return None
    R = _repacked(a, A, any_memory)
    if R is None:
        return None
    from ..._numba import thread_count_fns
    from ..quants import dequantize_rows_into
    from .backend import MATVEC_MAX_TOKENS, TILE_FLOATS, _threads, matvec_max_rows
    from .blas import gemm_nt

    unpack_x8_rows, kern = lay[3], lay[4]
    get_nt = thread_count_fns()[0]
    be.need(kern, unpack_x8_rows)
    E, N, rb = A.shape
    K = a.shape[-1]
    max_rows = matvec_max_rows(a.type.name, MATVEC_MAX_TOKENS)
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
            dequantize_rows_into(q, a.type, W)
            gemm_nt(x, W, y[:, r0 : r0 + n], threads)
        out[t_idx, u_idx] = y

    tuner = be.prefetch.for_type(f"moe {a.type.name}")
    state = tuner.counter() if B.shape[0] == 1 else None  # one token: the tuner may measure it

    def call(x: np.ndarray, c: Choice) -> int:
        """The kernel at the choice ``c``: one stream a thread is a negative thread count."""
        nt = get_nt()
        return kern(R, x, ids, out2, max_rows, nt if streams_of(c) == 2 else -nt, distance_of(c))

    def step_x8() -> None:
        x = B if direct else np.ascontiguousarray(B, dtype=np.float32)
        if state is not None and tuner.tuning:
            bad = tuner.run(lambda c: call(x, c), state)
        else:
            bad = call(x, tuner.choice)
        if bad >= 0:
            raise bad_id(ids.reshape(-1)[bad])
        if ids.size > max_rows:  # experts with more pairs than the kernel takes
            flat = ids.reshape(-1)
            counts = np.bincount(flat, minlength=E)
            for e in np.flatnonzero(counts > max_rows):
                tiles(int(e), np.flatnonzero(flat == e))

    return step_x8
