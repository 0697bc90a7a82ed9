"""``mul_mat`` on Q5_K weights repacked eight rows at a time (``q5k_x8_kernels``).

The Q5_K counterpart of ``q4k_x8`` (same rules, its memory helpers): a 2-D Q5_K weight whose row count is
a multiple of 8 and whose bytes are a view of a memory-mapped model file is repacked once, the first time a
``mul_mat`` step is compiled for it, into anonymous memory, and the mapped source pages are dropped from
this process (+2.3 % resident: the decoded scales). Up to ``matvec_max_rows("Q5_K")`` activation rows run
``mm_q5_k_x8``; more rows convert a tile of rows back to plain Q5_K (``unpack_x8_rows``, bit for bit) for
the dequantize + sgemm path.

``LLAMAPY_Q5K_X8=0`` in the environment, or ``ENABLED = False`` here, turns repacking off (for A/B).
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
from .q4k_x8 import _anonymous, _release, mapped_source

__all__ = ["ENABLED", "repack", "mul_mat_step"]

#: repack Q5_K weights for the 8-row kernel (``LLAMAPY_Q5K_X8=0``: no)
ENABLED = os.environ.get("LLAMAPY_Q5K_X8", "1") not in ("0", "false", "no", "off")

_lock = threading.Lock()
_cache: weakref.WeakKeyDictionary[Tensor, tuple[int, np.ndarray]] = weakref.WeakKeyDictionary()


def repack(A: np.ndarray) -> np.ndarray:
    """The repacked copy of the Q5_K rows ``A`` (uint8[N, row bytes], N a multiple of 8)."""
    from .q5k_x8_kernels import X8_BYTES, repack_x8

    N, rb = A.shape
    R = _anonymous(N // 8 * (rb // 176 * X8_BYTES)).reshape(N // 8, rb // 176 * X8_BYTES)
    repack_x8(A, R)
    return R


def _repacked(a: Tensor, A: np.ndarray, any_memory: bool) -> np.ndarray | None:
    """The cached repacked copy of the 2-D weight ``a`` (bytes ``A``), made on first use; None where it
    is not repacked."""
    if not ENABLED or a.type != GGMLType.Q5_K or A.ndim != 2 or A.dtype != np.uint8:
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
    is not repacked (not Q5_K, rows not a multiple of 8, not a mapped file unless ``any_memory``)."""
    R = _repacked(a, A, any_memory)
    if R is None:
        return None
    from .backend import MATVEC_MAX_TOKENS, TILE_FLOATS, _kernels, _threads, matvec_max_rows
    from .q5k_x8_kernels import mm_q5_k_x8, unpack_x8_rows

    mk, _ = _kernels()
    f16 = mk.F16_TABLE
    M = x.shape[0]
    N, rb = A.shape
    K = a.shape[-1]
    if M <= matvec_max_rows("Q5_K", MATVEC_MAX_TOKENS):
        kern = mm_q5_k_x8
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
            q = be.scratch("x8_q5", (n, rb), np.uint8)
            W = be.scratch("mm_tile", (n, K))
            unpack_x8_rows(R, r0, r0 + n, q)
            dequantize_rows_into(q, GGMLType.Q5_K, W)
            gemm_nt(x, W, out2[:, r0 : r0 + n], threads)

    return step_tiles
