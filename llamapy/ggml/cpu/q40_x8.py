"""``mul_mat`` on Q4_0 and Q4_1 weights repacked eight rows at a time (``q40_x8_kernels``,
``q40_x8_rows``).

As ``q4k_x8`` for Q4_K: a 2-D Q4_0 / Q4_1 weight whose row count is a multiple of 8 and whose bytes are
a view of a memory-mapped model file is repacked once, the first time a ``mul_mat`` step is compiled for
it, into anonymous memory (the same size: only the bytes move), and the mapped source pages are dropped
from this process. Weights read into memory (``use_mmap=False``) are not repacked.

The activations are quantized exactly as the plain kernels do (16 bits per 32 elements), so the
integer sums are the plain kernels' and results differ only in the order of float additions.

Up to ``MAX_ROWS`` activation rows run the 8-row kernels: ``mm_q4_0_x8`` for 1-3 rows, ``mm_q4_0_x8r4``
(four rows per pass over the weight, each row's result bit for bit the one-row kernel's) for more. They
beat dequantized tiles + sgemm well past the plain kernels' ``matvec_max_rows("Q4_0")`` (32): one
thread, CPU ms per activation row, x8r4 vs tiles (unpacked from the repacked rows, dequantized, sgemm):
8960x1536 0.35 vs 0.76 at 64 rows, 0.27 vs 0.39 at 256, 0.32 vs 0.34 at 512; 1536x8960 0.33 vs 0.71,
0.32 vs 0.40, 0.39 vs 0.35 (benchmarks/results/q40_repack.md). So prompts of up to 512 rows (a default
ubatch; past ``CHUNK_ROWS`` = 256 as even chunks, one call each, which keeps a call's activations small)
multiply 16-bit activations (1/32767 of each block's largest value) instead of floats. More rows convert a tile
of rows back to plain bytes in a scratch buffer (``unpack_x8_rows``, bit for bit) for the dequantize +
sgemm path, as before. From ``R8_MIN_ROWS`` rows, eight rows per pass (``mm_q4_0_x8r8``: each decoded
weight vector serves eight rows, the last ``M % 8`` rows four at a time), and the activations are
quantized one row per thread. The 1.5B-shaped Q4_0 file, pp64, one thread, CPU s (best of 5 per run,
kernels loaded from Numba's cache), load 2.4-3.8: r4 1.79 / 2.03, r8 1.70 / 1.58, the previous r4
(serial quantization) 2.20 / 2.02; load 6: r4 2.12 / 2.66 / 2.38, r8 2.21 / 2.13 / 2.17, previous 2.00 /
1.95 / 2.14. So r8 beat r4 in 4 of 5 pairs and is within this machine's noise of the previous kernel in
CPU time; the quantization in parallel is for 2-thread wall time (serial, it was ~4 % of the CPU time).
Per matrix r8 and r4 measured within noise of each other (0.23-0.25 CPU ms per row at 64 and 256 rows
on 8960x1536 and 1536x8960): the kernels are bound by the ``pmaddwd`` and its ``vpaddd`` (one each per
16 products), not by decoding the nibbles nor by the broadcasts (the same loop with the activations
loaded once per block instead of broadcast per pair measured no faster).

Q4_1 (SmolLM2-135M's file: every matrix but the Q8_0 token embedding) runs the same kernels
(``mm_q4_1_x8``, ``mm_q4_1_x8r4``). One thread, one row, CPU ms per call with the weights cycling
through > 64 MB of copies (from DRAM, as in decode), plain ``mm16_q4_1`` / its L1-prefetch variant /
x8: 576x576 0.031 / 0.032 / 0.017, 1536x576 0.052 / 0.061 / 0.030, 576x1536 0.053 / 0.060 / 0.033,
49152x576 1.46 / 1.74 / 0.76 (1.7-1.9x). Whole decode (``benchmarks/tg_cputime.py``, 4 runs each,
alternating with ``LLAMAPY_Q40_X8=0``): one thread 9.3 vs 11.6 CPU ms per token (median; 1.25x), two
threads 5.3-8.5 vs 7.1-10.5 ms wall per token. A second series (load average 5: 2-thread wall not
meaningful), one thread, 3 runs: 9.7 / 8.8 / 7.2 vs 13.8 / 14.0 / 12.1 CPU ms per token, llama.cpp's
``llama-bench`` in the same runs 15.5 / 16.4 / 12.6; pp64, one thread, CPU s best of 5: 0.30 / 0.17 /
0.16 vs 0.25 / 0.24 / 0.29.

``LLAMAPY_Q40_X8=0`` in the environment, or ``ENABLED = False`` here, turns repacking off (for A/B).
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

__all__ = ["CHUNK_ROWS", "ENABLED", "MAX_ROWS", "TYPES", "mul_mat_step", "repack", "rows_kernel"]

#: repack Q4_0 / Q4_1 weights for the 8-row kernels (``LLAMAPY_Q40_X8=0``: no)
ENABLED = os.environ.get("LLAMAPY_Q40_X8", "1") not in ("0", "false", "no", "off")
#: the types repacked
TYPES = frozenset({GGMLType.Q4_0, GGMLType.Q4_1})
#: the most activation rows the 8-row kernels take (more: dequantized tiles + sgemm)
MAX_ROWS = 512
#: more activation rows than this run as even chunks of at most this many, one kernel call each (512 rows
#: in one call, 2 threads, wall ms: 8960x1536 98.8, 1536x8960 115.4 (the activations outgrow L2); chunks
#: of 256: 92.8, 94.1; dequantized tiles + sgemm: 102.1, 101.4; median of 7, haswell target, stop 46)
CHUNK_ROWS = 256
#: the fewest activation rows that run eight rows per pass (``mm_q4_0_x8r8``; None: four rows per pass)
R8_MIN_ROWS: int | None = 8

_cache: Cache = weakref.WeakKeyDictionary()


def _layout(t: GGMLType) -> tuple[int, int, int, int]:
    """(plain block bytes, repacked 8-row block bytes, bytes of halves, quant bytes) of the type."""
    from .q40_x8_kernels import LAYOUT, SRC_BYTES, X8_BYTES

    hb, qb = LAYOUT[t.name]
    return SRC_BYTES[t.name], X8_BYTES[t.name], hb, qb


def repack(A: np.ndarray, t: GGMLType = GGMLType.Q4_0) -> np.ndarray:
    """The repacked copy of the rows ``A`` of type ``t`` (uint8[N, row bytes], N a multiple of 8)."""
    from .q40_x8_kernels import repack_x8

    sb, xb, hb, qb = _layout(t)
    _, rb = A.shape
    return copy_rows(A, rb // sb * xb, lambda a, r: repack_x8(a, r, sb, hb, qb))


def unpack_rows(R: np.ndarray, r0: int, r1: int, dst: np.ndarray, t: GGMLType = GGMLType.Q4_0) -> None:
    """Rows ``r0`` .. ``r1`` of the repacked ``R`` in plain bytes into ``dst`` (bit for bit)."""
    from .q40_x8_kernels import unpack_x8_rows

    sb, _, hb, qb = _layout(t)
    unpack_x8_rows(R, r0, r1, dst, sb, hb, qb)


def rows_kernel(t: GGMLType, M: int) -> Any:
    """The several-rows-per-pass kernel for ``M`` (at least 4) activation rows of type ``t``: eight rows per
    pass from ``R8_MIN_ROWS`` rows (None: never), else four."""
    from .q40_x8_rows import KERNELS_R4, KERNELS_R8

    if R8_MIN_ROWS is not None and M >= R8_MIN_ROWS:
        return KERNELS_R8[t.name]
    return KERNELS_R4[t.name]


def _repacked(a: Tensor, A: np.ndarray, any_memory: bool) -> np.ndarray | None:
    return repacked(a, A, any_memory, ENABLED, TYPES, _cache, repack)


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
    is not repacked (not in ``TYPES``, rows not a multiple of 8, not a mapped file unless ``any_memory``)."""
    if R is None:  # (given: a block of several weights' rows, ``matvec_groups``)
        R = _repacked(a, A, any_memory)
    if R is None:
        return None
    from .q40_x8_kernels import KERNELS, unpack_x8_rows

    t = a.type
    M = x.shape[0]
    kern = None
    if M <= MAX_ROWS:
        kern = rows_kernel(t, M) if M >= 4 else KERNELS[t.name]

    def unpack(R: np.ndarray, r0: int, r1: int, q: np.ndarray) -> None:
        unpack_rows(R, r0, r1, q, t)

    return x8_step(be, a, A, x, out2, pre, R, kern, unpack, unpack_x8_rows, "x8_q", CHUNK_ROWS)
