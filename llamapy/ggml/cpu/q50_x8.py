"""``mul_mat`` on Q5_0 weights repacked eight rows at a time (``q50_x8_kernels``).

As ``q40_x8`` for Q4_0: a 2-D Q5_0 weight whose row count is a multiple of 8 and whose bytes are a view
of a memory-mapped model file is repacked once, the first time a ``mul_mat`` step is compiled for it,
into anonymous memory (the same size: only the bytes move), and the mapped source pages are dropped
from this process. Weights read into memory (``use_mmap=False``) are not repacked.

llama-quantize's Q4_K_M mix for a model whose ``n_embd`` is not a multiple of 256 (Qwen2.5-0.5B: 896)
makes most matrices Q5_0: there the plain ``q16_kernels.mm16_q5_0`` read ~11 GB/s in decode, the other
repacked kernels ~30.

The activations are quantized exactly as the plain kernels do (16 bits per 32 elements), so the
integer sums are the plain kernel's and results differ only in the order of float additions. 1-3
activation rows run ``mm_q5_0_x8`` (one row per pass over a group of eight weight rows, which stays in
L1), ``MIN_ROWS_R4`` up to ``MAX_ROWS`` ``mm_q5_0_x8r4`` (four rows per pass, each row's result bit for
bit the one-row kernel's); more convert a tile of rows back to plain Q5_0 (``unpack_x8_rows``, bit for
bit) for the dequantize + sgemm path, as before.

Measured on the shared 2-vCPU Zen 4 (AVX2 target: ``NUMBA_CPU_NAME=haswell``), CPU time (user + sys of
the process; the machine was loaded 4-7 by other jobs, so wall times are not comparable):

- one row, one thread, CPU ms per call (min of 3 rounds of 400 calls), weights cycling through > 96 MB
  of copies (from DRAM, as in decode), plain ``mm16_q5_0`` vs x8, three runs at different loads (the
  last with the final kernel, ``q50_x8_kernels.q5pair``): 896x896 0.065 / 0.087 / 0.082 vs 0.037 /
  0.051 / 0.037, 4864x896 0.60 / 0.45 / 0.37 vs 0.42 / 0.26 / 0.20, 896x4864 0.67 / 0.45 / - vs 0.37 /
  0.27 / 0.21 (1.4-2.2x). Two threads: too noisy under that load to quote (spin-waits count as CPU).
- several rows, one thread, CPU ms per activation row (min of 3), plain / x8 / x8r4 / tiles (unpacked,
  dequantized, sgemm): 4864x896 at 4 rows 0.355 / 0.224 / 0.143 / 1.69, 16 rows 0.298 / 0.161 / 0.096 /
  0.470, 64 rows - / 0.178 / 0.104 / 0.185, 256 rows - / 0.214 / 0.120 / 0.116; 896x4864 4 rows 0.331 /
  0.194 / 0.143 / 1.52, 16: 0.373 / 0.170 / 0.109 / 0.425, 64: - / 0.229 / 0.122 / 0.219, 256: - / 0.200
  / 0.160 / 0.102. Hence ``MAX_ROWS`` 128 (the plain kernel stopped at 16).
- whole decode, the Qwen2.5-0.5B-shaped Q4_K_M file (Q5_0 173 MB of ~390 MB per token),
  ``benchmarks/tg_cputime.py --threads 1 --tokens 32``, three rounds alternating with
  ``LLAMAPY_Q50_X8=0``: 40.4 / 42.3 / 43.5 vs 28.9 / 29.6 / 30.6 CPU ms per token (1.42x); again with
  the final kernel: 46.9 / 42.4 / 42.0 vs 31.1 / 30.5 / 31.8 (1.37x). ``--threads 2``: most runs were
  wrecked by the load (131-1314 CPU ms per token either way); the calm ones: 51.5 and 55.6 vs 40.2 CPU
  ms (25.7 and 28.0 vs 20.2 ms wall) per token. ``python -m llamapy bench -p 0 -n 32 -t 1 --profile``
  (wall, loaded machine; first kernel): Q5_0 82.1 ms/token (``mm16_q5_0``, 2.1 GB/s) vs 29.6
  (``mm_q5_0_x8``, 5.8 GB/s); the unchanged Q8_0 kernel in the same runs 29.2 vs 17.3 ms: relative to
  it, Q5_0 per byte went from 0.42x to 0.69x of Q8_0 x8's rate.
- prompt, ``benchmarks/pp_cputime.py new MODEL 1 64`` (first kernel), two rounds: 0.722 / 0.714 vs 0.648 /
  0.694 CPU s; ``benchmarks/pp_profile.py``: Q5_0 0.547 CPU s (dequantize 0.065 + sgemm 0.482) vs 0.495
  (``mm_q5_0_x8r4``).

The kernel does ~5 vector operations per 16 products (Q4_0's: ~3.5; ``q50_x8_kernels``), so one thread
is compute-bound (the weights from L2/L3 cost ~90 % of the CPU time they cost from DRAM).

Q5_1 has the same one-row kernel (``mm_q5_1_x8``, tested) but is not in ``TYPES``: not measured on a
model.

``LLAMAPY_Q50_X8=0`` in the environment, or ``ENABLED = False`` here, turns repacking off (for A/B).
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

__all__ = ["ENABLED", "MAX_ROWS", "MIN_ROWS_R4", "TYPES", "mul_mat_step", "repack", "unpack_rows"]

#: repack Q5_0 weights for the 8-row kernel (``LLAMAPY_Q50_X8=0``: no)
ENABLED = os.environ.get("LLAMAPY_Q50_X8", "1") not in ("0", "false", "no", "off")
#: the types repacked
TYPES = frozenset({GGMLType.Q5_0})
#: the most activation rows the 8-row kernels take (more: dequantized tiles + sgemm)
MAX_ROWS = 128
#: the fewest activation rows that run four rows per pass (``mm_q5_0_x8r4``)
MIN_ROWS_R4 = 4

_cache: Cache = weakref.WeakKeyDictionary()


def repack(A: np.ndarray, t: GGMLType = GGMLType.Q5_0) -> np.ndarray:
    """The repacked copy of the rows ``A`` of type ``t`` (uint8[N, row bytes], N a multiple of 8)."""
    from .q50_x8_kernels import LAYOUT, repack_x8

    _, rb = A.shape
    lay = LAYOUT[t.name]
    return copy_rows(A, rb * 8, lambda a, r: repack_x8(a, r, lay))


def unpack_rows(R: np.ndarray, r0: int, r1: int, dst: np.ndarray, t: GGMLType = GGMLType.Q5_0) -> None:
    """Rows ``r0`` .. ``r1`` of the repacked ``R`` in plain bytes into ``dst`` (bit for bit)."""
    from .q50_x8_kernels import LAYOUT, unpack_x8_rows

    unpack_x8_rows(R, r0, r1, dst, LAYOUT[t.name])


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
    from .q50_x8_kernels import KERNELS, mm_q5_0_x8r4, unpack_x8_rows

    t = a.type
    M = x.shape[0]
    kern = None
    if M <= MAX_ROWS:
        kern = mm_q5_0_x8r4 if M >= MIN_ROWS_R4 and t == GGMLType.Q5_0 else KERNELS[t.name]

    def unpack(R: np.ndarray, r0: int, r1: int, q: np.ndarray) -> None:
        unpack_rows(R, r0, r1, q, t)

    return x8_step(be, a, A, x, out2, pre, R, kern, unpack, unpack_x8_rows, "x8_q")
