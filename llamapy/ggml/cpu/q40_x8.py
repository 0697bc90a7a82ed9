"""``mul_mat`` on Q4_0 weights repacked eight rows at a time (``q40_x8_kernels``).

As ``q4k_x8`` for Q4_K: a 2-D Q4_0 weight whose row count is a multiple of 8 and whose bytes are a view
of a memory-mapped model file is repacked once, the first time a ``mul_mat`` step is compiled for it,
into anonymous memory (the same size: only the bytes move), and the mapped source pages are dropped
from this process. Weights read into memory (``use_mmap=False``) are not repacked.

The activations are quantized exactly as the plain kernels do (16 bits per 32 elements), so the
integer sums are the plain kernels' and results differ only in the order of float additions.

Up to ``MAX_ROWS`` activation rows run the 8-row kernels: ``mm_q4_0_x8`` for 1-3 rows, ``mm_q4_0_x8r4``
(four rows per pass over the weight, each row's result bit for bit the one-row kernel's) for more. They
beat dequantized tiles + sgemm well past the plain kernels' ``matvec_max_rows("Q4_0")`` (32): one
thread, CPU ms per activation row, x8r4 vs tiles (unpacked from the repacked rows, dequantized, sgemm):
8960x1536 0.35 vs 0.76 at 64 rows, 0.27 vs 0.39 at 256, 0.32 vs 0.34 at 512; 1536x8960 0.33 vs 0.71,
0.32 vs 0.40, 0.39 vs 0.35 (benchmarks/results/q40_repack.md). So prompts of up to 256 rows multiply
16-bit activations (1/32767 of each block's largest value) instead of floats. More rows convert a tile
of rows back to plain Q4_0 in a scratch buffer (``unpack_x8_rows``, bit for bit) for the dequantize +
sgemm path, as before.

``LLAMAPY_Q40_X8=0`` in the environment, or ``ENABLED = False`` here, turns repacking off (for A/B).
Q4_1 has the same kernel (``mm_q4_1_x8``, tested) but is not in ``TYPES`` yet: not measured on the
models that use it (SmolLM2's Q4_1 file is small enough for the plain kernels' L1 prefetch variant).
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

__all__ = ["ENABLED", "TYPES", "repack", "mul_mat_step"]

#: repack Q4_0 weights for the 8-row kernel (``LLAMAPY_Q40_X8=0``: no)
ENABLED = os.environ.get("LLAMAPY_Q40_X8", "1") not in ("0", "false", "no", "off")
#: the types repacked
TYPES = frozenset({GGMLType.Q4_0})
#: the most activation rows the 8-row kernels take (more: dequantized tiles + sgemm)
MAX_ROWS = 256

_lock = threading.Lock()
_cache: weakref.WeakKeyDictionary[Tensor, tuple[int, np.ndarray]] = weakref.WeakKeyDictionary()


def _layout(t: GGMLType) -> tuple[int, int, int, int]:
    """(plain block bytes, repacked 8-row block bytes, bytes of halves, quant bytes) of the type."""
    from .q40_x8_kernels import LAYOUT, SRC_BYTES, X8_BYTES

    hb, qb = LAYOUT[t.name]
    return SRC_BYTES[t.name], X8_BYTES[t.name], hb, qb


def repack(A: np.ndarray, t: GGMLType = GGMLType.Q4_0) -> np.ndarray:
    """The repacked copy of the rows ``A`` of type ``t`` (uint8[N, row bytes], N a multiple of 8)."""
    from .q40_x8_kernels import repack_x8

    sb, xb, hb, qb = _layout(t)
    N, rb = A.shape
    R = _anonymous(N // 8 * (rb // sb * xb)).reshape(N // 8, rb // sb * xb)
    repack_x8(A, R, sb, hb, qb)
    return R


def unpack_rows(R: np.ndarray, r0: int, r1: int, dst: np.ndarray, t: GGMLType = GGMLType.Q4_0) -> None:
    """Rows ``r0`` .. ``r1`` of the repacked ``R`` in plain bytes into ``dst`` (bit for bit)."""
    from .q40_x8_kernels import unpack_x8_rows

    sb, _, hb, qb = _layout(t)
    unpack_x8_rows(R, r0, r1, dst, sb, hb, qb)


def _repacked(a: Tensor, A: np.ndarray, any_memory: bool) -> np.ndarray | None:
    if not ENABLED or a.type not in TYPES or A.ndim != 2 or A.dtype != np.uint8:
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
        R = repack(A, a.type)
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
    is not repacked (not in ``TYPES``, rows not a multiple of 8, not a mapped file unless ``any_memory``)."""
    R = _repacked(a, A, any_memory)
    if R is None:
        return None
    from .backend import TILE_FLOATS, _kernels, _threads
    from .q40_x8_kernels import KERNELS, KERNELS_R4, unpack_x8_rows

    t = a.type
    mk, _ = _kernels()
    f16 = mk.F16_TABLE
    M = x.shape[0]
    N, rb = A.shape
    K = a.shape[-1]
    if M <= MAX_ROWS:
        kern = KERNELS_R4[t.name] if M >= 4 and t.name in KERNELS_R4 else KERNELS[t.name]
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
            unpack_rows(R, r0, r0 + n, q, t)
            dequantize_rows_into(q, t, W)
            gemm_nt(x, W, out2[:, r0 : r0 + n], threads)

    return step_tiles
