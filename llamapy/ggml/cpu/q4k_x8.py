"""``mul_mat`` on Q4_K weights repacked eight rows at a time (``q4k_x8_kernels``).

A 2-D Q4_K weight whose row count is a multiple of 8 and whose bytes are a view of a memory-mapped model
file is repacked once, the first time a ``mul_mat`` step is compiled for it, into anonymous memory; the
mapped source pages are then dropped from this process (``madvise(MADV_DONTNEED)``: the file's pages stay
valid and fault back in if something else reads them, e.g. ``get_rows`` of a tied embedding), so the
resident memory stays the same size (+2.8 %: the decoded scales). Weights read into memory
(``use_mmap=False``) are not repacked: their source could not be released.

Up to ``MAX_ROWS`` activation rows run the 8-row kernels over Q8_K activations: ``mm_q4_k_x8`` (1-3
rows), which decodes the weight again per row and still beats the plain batch kernels that decode it once
per 4-8 rows (one thread, CPU ms per row, 8960x1536: 64 rows 0.27 vs 0.31, 4 rows 0.31 vs 0.35-0.40;
1536x1536 at 200 rows 0.042 vs 0.054), and ``mm_q4_k_x8r4`` (4 rows and more), four rows per pass and
each row bit for bit the one-row kernel's. More rows convert a tile of rows back to plain Q4_K in a
scratch buffer (``unpack_x8_rows``, bit for bit) for the dequantize + sgemm path, as before.

Measured on the shared 2-core AVX2-target VM (``NUMBA_CPU_NAME=haswell``, load 4-5 from other work, so
the three paths interleaved, best of 7): one thread, CPU ms per activation row, x8 / x8r4 / tiles:

    rows        8960x1536              1536x8960              18944x3584
      4    0.19 / 0.14 / 3.6      0.29 / 0.16 / 3.1      1.27 / 0.77 / 17.6
     16    0.28 / 0.20 / 1.3      0.27 / 0.20 / 1.1      1.04 / 0.66 / 4.9
     64    0.18 / 0.15 / 0.47     0.27 / 0.20 / 0.53     1.01 / 0.67 / 2.5
    256    0.22 / 0.16 / 0.34     0.26 / 0.19 / 0.38     1.12 / 0.93 / 1.8
    512    0.23 / 0.21 / 0.31     0.29 / 0.18 / 0.32     1.03 / 0.90 / 1.6

(an earlier, quieter run: 8960x1536 x8r4 0.13-0.16 at 4-512 rows). x8r4 beats the tiles at every row
count measured, so ``MAX_ROWS`` is 512 (a whole default ubatch; the plain kernels' switch point,
``matvec_max_rows("Q4_K")``, stays 256): prompts of 257-512 rows now round their activations to Q8_K for
the Q4_K weights as llama.cpp does, where they kept float activations. Whole model,
``benchmarks/pp_profile.py MODEL 2 64 [512]`` (2 threads, CPU s, the old hook / this one on the same
build, runs interleaved, load 5-7): Qwen2.5-1.5B-shaped Q4_K_M pp64 3.04, 2.71, 3.12, 2.60 / 2.69, 2.73,
2.42, 2.49 (Q4_K mat-muls 1.98-2.23 / 1.73-1.83), pp512 20.7, 23.1 / 11.8, 13.7 (Q4_K: tiles 15.1 sgemm +
1.6 dequantize / x8r4 7.5); 7B-shaped pp64 8.63, 9.38 / 7.98, 7.67 (Q4_K 6.98, 7.68 / 6.20, 5.97).

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
from .repack import Cache, anonymous, copy_rows, mapped_source, repacked, x8_step

__all__ = ["ENABLED", "MAX_ROWS", "repack", "mapped_source", "mul_mat_step", "kernel"]

#: repack Q4_K weights for the 8-row kernel (``LLAMAPY_Q4K_X8=0``: no)
ENABLED = os.environ.get("LLAMAPY_Q4K_X8", "1") not in ("0", "false", "no", "off")
#: the most activation rows the 8-row kernels take (more: dequantized tiles + sgemm)
MAX_ROWS = 512
#: from this many rows, four rows per pass (``mm_q4_k_x8r4``)
R4_MIN_ROWS = 4

_cache: Cache = weakref.WeakKeyDictionary()


def repack(A: np.ndarray, t: GGMLType = GGMLType.Q4_K) -> np.ndarray:
    """The repacked copy of the Q4_K rows ``A`` (uint8[N, row bytes], N a multiple of 8; or [E, N, row
    bytes], experts)."""
    from .q4k_x8_kernels import X8_BYTES, repack_x8

    N, rb = A.shape[-2:]
    gb = rb // 144 * X8_BYTES
    if A.ndim == 2:
        return copy_rows(A, gb, repack_x8)
    R = anonymous(A.shape[0] * (N // 8) * gb).reshape(A.shape[0], N // 8, gb)
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
    R: np.ndarray | None = None,
) -> Callable[[], None] | None:
    """The ``mul_mat`` step for the weight ``a`` (bytes ``A``) on the repacked layout, or None where it
    is not repacked (not Q4_K, rows not a multiple of 8, not a mapped file unless ``any_memory``)."""
    if R is None:  # (given: a block of several weights' rows, ``matvec_groups``)
        R = _repacked(a, A, any_memory)
    if R is None:
        return None
    from .q4k_x8_kernels import unpack_x8_rows

    return x8_step(be, a, A, x, out2, pre, R, kernel(x.shape[0]), unpack_x8_rows, unpack_x8_rows, "x8_q")


def kernel(M: int) -> Any:
    """The kernel for ``M`` activation rows: ``mm_q4_k_x8`` (1-3 rows), ``mm_q4_k_x8r4`` (up to
    ``MAX_ROWS``), or None (dequantized tiles + sgemm)."""
    from .q4k_x8_kernels import mm_q4_k_x8, mm_q4_k_x8r4

    return None if M > MAX_ROWS else mm_q4_k_x8r4 if M >= R4_MIN_ROWS else mm_q4_k_x8
