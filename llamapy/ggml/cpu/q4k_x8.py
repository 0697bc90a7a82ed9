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

import os
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from ..tensor import Tensor
from ..types import GGMLType
from .repack import Cache, anonymous, mapped_source, repacked, x8_step

__all__ = ["ENABLED", "repack", "mapped_source", "mul_mat_step"]

#: repack Q4_K weights for the 8-row kernel (``LLAMAPY_Q4K_X8=0``: no)
ENABLED = os.environ.get("LLAMAPY_Q4K_X8", "1") not in ("0", "false", "no", "off")

_cache: Cache = weakref.WeakKeyDictionary()


def repack(A: np.ndarray, t: GGMLType = GGMLType.Q4_K) -> np.ndarray:
    """The repacked copy of the Q4_K rows ``A`` (uint8[N, row bytes], N a multiple of 8; or [E, N, row
    bytes], experts)."""
    from .q4k_x8_kernels import X8_BYTES, repack_x8

    N, rb = A.shape[-2:]
    lead = A.shape[:-2]
    gb = rb // 144 * X8_BYTES
    R = anonymous(int(np.prod(lead, dtype=np.int64)) * (N // 8) * gb).reshape(*lead, N // 8, gb)
    if A.ndim == 2:
        repack_x8(A, R)
    else:
        for e in range(A.shape[0]):
            repack_x8(A[e], R[e])
    return R


def _repacked(a: Tensor, A: np.ndarray, any_memory: bool) -> np.ndarray | None:
    return repacked(a, A, any_memory, ENABLED, (GGMLType.Q4_K,), _cache, repack)


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
    from .backend import MATVEC_MAX_TOKENS, matvec_max_rows
    from .q4k_x8_kernels import mm_q4_k_x8, unpack_x8_rows

    kern = mm_q4_k_x8 if x.shape[0] <= matvec_max_rows("Q4_K", MATVEC_MAX_TOKENS) else None
    return x8_step(be, a, A, x, out2, pre, R, kern, unpack_x8_rows, unpack_x8_rows, "x8_q")
