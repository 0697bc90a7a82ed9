"""``mul_mat`` on Q5_K weights repacked eight rows at a time (``q5k_x8_kernels``).

The Q5_K counterpart of ``q4k_x8`` (same rules, its memory helpers): a 2-D Q5_K weight whose row count is
a multiple of 8 and whose bytes are a view of a memory-mapped model file is repacked once, the first time a
``mul_mat`` step is compiled for it, into anonymous memory, and the mapped source pages are dropped from
this process (+2.3 % resident: the decoded scales). Up to ``MAX_ROWS`` activation rows run the 8-row
kernels (``mm_q5_k_x8`` for 1-3 rows, ``mm_q5_k_x8r4``, four rows per pass and each row bit for bit the
one-row kernel's, for more); more rows convert a tile of rows back to plain Q5_K (``unpack_x8_rows``, bit
for bit) for the dequantize + sgemm path.

Measured on the shared 2-core AVX2-target VM (``NUMBA_CPU_NAME=haswell``, load 4-5), one thread, CPU ms
per activation row (median of 3), 8960x1536 / 1536x8960, x8r4 vs the path before (``mm_q5_k_x8`` up to
``matvec_max_rows("Q5_K")`` = 128 rows, then tiles): 4 rows 0.26 / 0.34 vs 0.40 / 0.35; 16 rows 0.28 /
0.23 vs 0.39 / 0.31; 64 rows 0.25 / 0.25 vs 0.41 / 0.35; 128 rows 0.36 / 0.31 vs 0.46 / 0.32 (tiles 0.46
/ 0.36); 256 rows 0.30 / 0.28 vs tiles 0.40 / 0.42; 512 rows 0.28 / 0.45 vs tiles 0.34 / 0.33 (past 256
rows the Q8_K activations outgrow L2 with a long K). So one call takes at most ``CHUNK_ROWS`` = 256 rows,
and up to ``MAX_ROWS`` = 512 (a default ubatch) run as chunks of them: two threads, wall ms for 512 rows
(median of 7, haswell target, stop 46), one call / chunks of 256 / tiles: 8960x1536 94.1 / 92.1 / 125.0,
1536x8960 94.6 / 93.0 / 108.8, 1536x1536 17.4 / 17.6 / 16.0; Qwen2.5-1.5B-shaped Q5_K_M pp512 went from
53.4 and 63.4 t/s (tiles) to 69.8 and 74.6 (x8r4), alternating processes.
Qwen2.5-1.5B-shaped Q5_K_M, pp64, two threads, CPU s (5 runs each, median; the old path: ``mm_q5_k_x8``
for every row count): 3.47 / 3.16 and 3.68 / 3.17 (load 6-7).

``LLAMAPY_Q5K_X8=0`` in the environment, or ``ENABLED = False`` here, turns repacking off (for A/B).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from ..tensor import Tensor
from ..types import GGMLType
from .repack import Cache, copy_rows, repacked, x8_step

__all__ = ["CHUNK_ROWS", "ENABLED", "MAX_ROWS", "repack", "mul_mat_step"]

#: repack Q5_K weights for the 8-row kernel (``LLAMAPY_Q5K_X8=0``: no)
ENABLED = os.environ.get("LLAMAPY_Q5K_X8", "1") not in ("0", "false", "no", "off")
#: the most activation rows the 8-row kernels take (more: dequantized tiles + sgemm)
MAX_ROWS = 512
#: more activation rows than this run as even chunks of at most this many, one kernel call each
CHUNK_ROWS = 256

_cache: Cache = weakref.WeakKeyDictionary()


def repack(A: np.ndarray, t: GGMLType = GGMLType.Q5_K) -> np.ndarray:
    """The repacked copy of the Q5_K rows ``A`` (uint8[N, row bytes], N a multiple of 8)."""
    from .q5k_x8_kernels import X8_BYTES, repack_x8

    _, rb = A.shape
    return copy_rows(A, rb // 176 * X8_BYTES, repack_x8)


def _repacked(a: Tensor, A: np.ndarray, any_memory: bool) -> np.ndarray | None:
    """The cached repacked copy of the 2-D weight ``a`` (bytes ``A``), made on first use; None where it
    is not repacked."""
    return repacked(a, A, any_memory, ENABLED, (GGMLType.Q5_K,), _cache, repack)


def mul_mat_step(
    be: Any,
    a: Tensor,
    A: np.ndarray,
    x: np.ndarray,
    out2: np.ndarray,
    pre: Callable[[], None] | None,
    any_memory: bool = False,
    R: np.ndarray | None = None,
) -> Callable[[], None] | None:
    """The ``mul_mat`` step for the weight ``a`` (bytes ``A``) on the repacked layout, or None where it
    is not repacked (not Q5_K, rows not a multiple of 8, not a mapped file unless ``any_memory``)."""
    if R is None:  # (given: a block of several weights' rows, ``matvec_groups``)
        R = _repacked(a, A, any_memory)
    if R is None:
        return None
    from .q5k_x8_kernels import mm_q5_k_x8, mm_q5_k_x8r4, unpack_x8_rows

    M = x.shape[0]
    kern = None if M > MAX_ROWS else mm_q5_k_x8r4 if M >= 4 else mm_q5_k_x8
    return x8_step(be, a, A, x, out2, pre, R, kern, unpack_x8_rows, unpack_x8_rows, "x8_q5", CHUNK_ROWS)
