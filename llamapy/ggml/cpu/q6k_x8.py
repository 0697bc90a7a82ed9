"""``mul_mat`` on Q6_K weights repacked eight rows at a time (``q6k_x8_kernels``).

The Q6_K counterpart of ``q4k_x8`` / ``q5k_x8`` (same rules, ``repack``'s helpers): a 2-D Q6_K weight
whose row count is a multiple of 8 and whose bytes are a view of a memory-mapped model file is repacked
once, the first time a ``mul_mat`` step is compiled for it, into anonymous memory of the same size (only
bits move), and the mapped source pages are dropped from this process. Up to ``MAX_ROWS`` activation
rows run the 8-row kernels (``mm_q6_k_x8`` for 1-3 rows, ``mm_q6_k_x8r4``, four rows per pass and each
row bit for bit the one-row kernel's, for more); more rows convert a tile of rows back to plain Q6_K
(``unpack_x8_rows``, bit for bit) for the dequantize + sgemm path, as before.

Measured on the shared 2-core AVX2-target VM (CPU time, ``NUMBA_CPU_NAME=haswell``, load 3-7, so medians
of interleaved runs): the one-row kernel computes at 36 GB per CPU-second where the plain ``mm_q6_k`` does
22 (1024x1536, in L2); streaming from DRAM (ten copies of 8960x1536 in turn) 25.1 vs 19.2 at one thread,
the same as ``mm_q4_k_x8`` (25.3), and 22.1 vs 14.7 at two (wall 19.2 vs 13.3 GB/s); the 151936x1536
output matrix at one thread 22.1 vs 21.1 (bound by the one core's reads). Prompt rows, one thread, CPU ms
per activation row, 8960x1536 / 1536x8960: 64 rows x8r4 0.24 / 0.16, plain batch kernel 0.30 / 0.30,
tiles 0.74 / 0.62; 256 rows 0.18 / 0.17 vs tiles 0.36 / 0.37; 512 rows 0.18 / 0.16 vs tiles 0.31 / 0.33.
So the x8r4 kernel also beats the tiles at 512 rows: ``MAX_ROWS`` is 512, as Q4_K's (past it, prompt
rows keep float activations, as the rest of the model's weights do).
Qwen2.5-1.5B-shaped Q4_K_M (Q6_K: the tied output, half of ffn_down and attn_v; 354 of 980 MB a token),
one thread, off / on in pairs: ``benchmarks/tg_cputime.py`` 54.9 / 50.8, 52.0 / 49.3, 68.7 / 64.1 CPU
ms per token; ``llamapy bench -p 0 -n 16 -t 1 --profile`` (wall, load 5-8) Q6_K 6.6 / 9.1 and 5.1 / 6.6 GB/s
next to ``mm_q4_k_x8``'s 7.1 / 7.6 and 5.8 / 6.4; ``benchmarks/pp_cputime.py`` pp64 1.39 / 1.30 and
1.55 / 1.44 CPU s.

``LLAMAPY_Q6K_X8=0`` in the environment, or ``ENABLED = False`` here, turns repacking off (for A/B).
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

__all__ = ["ENABLED", "MAX_ROWS", "repack", "mul_mat_step"]

#: repack Q6_K weights for the 8-row kernels (``LLAMAPY_Q6K_X8=0``: no)
ENABLED = os.environ.get("LLAMAPY_Q6K_X8", "1") not in ("0", "false", "no", "off")
#: the most activation rows the 8-row kernels take (more: dequantized tiles + sgemm)
MAX_ROWS = 512

_cache: Cache = weakref.WeakKeyDictionary()


def repack(A: np.ndarray, t: GGMLType = GGMLType.Q6_K) -> np.ndarray:
    """The repacked copy of the Q6_K rows ``A`` (uint8[N, row bytes], N a multiple of 8), made in chunks
    (``repack.copy_rows``): Q6_K is the type of the largest matrix (the output, 191 MB at 1.5B, 447 MB
    at 7B)."""
    from .q6k_x8_kernels import X8_BYTES, repack_x8

    _, rb = A.shape
    return copy_rows(A, rb // 210 * X8_BYTES, repack_x8)


def _repacked(a: Tensor, A: np.ndarray, any_memory: bool) -> np.ndarray | None:
    """The cached repacked copy of the 2-D weight ``a`` (bytes ``A``), made on first use; None where it
    is not repacked."""
    return repacked(a, A, any_memory, ENABLED, (GGMLType.Q6_K,), _cache, repack)


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
    is not repacked (not Q6_K, rows not a multiple of 8, not a mapped file unless ``any_memory``)."""
    if R is None:  # (given: a block of several weights' rows, ``matvec_groups``)
        R = _repacked(a, A, any_memory)
    if R is None:
        return None
    from .q6k_x8_kernels import mm_q6_k_x8, mm_q6_k_x8r4, unpack_x8_rows

    M = x.shape[0]
    kern = None if M > MAX_ROWS else mm_q6_k_x8r4 if M >= 4 else mm_q6_k_x8
    return x8_step(be, a, A, x, out2, pre, R, kern, unpack_x8_rows, unpack_x8_rows, "x8_q6")
