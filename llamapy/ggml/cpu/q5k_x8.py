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
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from ..tensor import Tensor
from ..types import GGMLType
from .repack import Cache, anonymous, repacked, x8_step

__all__ = ["ENABLED", "repack", "mul_mat_step"]

#: repack Q5_K weights for the 8-row kernel (``LLAMAPY_Q5K_X8=0``: no)
ENABLED = os.environ.get("LLAMAPY_Q5K_X8", "1") not in ("0", "false", "no", "off")

_cache: Cache = weakref.WeakKeyDictionary()


def repack(A: np.ndarray, t: GGMLType = GGMLType.Q5_K) -> np.ndarray:
    """The repacked copy of the Q5_K rows ``A`` (uint8[N, row bytes], N a multiple of 8)."""
    from .q5k_x8_kernels import X8_BYTES, repack_x8

    N, rb = A.shape
    R = anonymous(N // 8 * (rb // 176 * X8_BYTES)).reshape(N // 8, rb // 176 * X8_BYTES)
    repack_x8(A, R)
    return R


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
) -> Callable[[], None] | None:
    """The ``mul_mat`` step for the weight ``a`` (bytes ``A``) on the repacked layout, or None where it
    is not repacked (not Q5_K, rows not a multiple of 8, not a mapped file unless ``any_memory``)."""
    R = _repacked(a, A, any_memory)
    if R is None:
        return None
    from .backend import MATVEC_MAX_TOKENS, matvec_max_rows
    from .q5k_x8_kernels import mm_q5_k_x8, unpack_x8_rows

    kern = mm_q5_k_x8 if x.shape[0] <= matvec_max_rows("Q5_K", MATVEC_MAX_TOKENS) else None
    return x8_step(be, a, A, x, out2, pre, R, kern, unpack_x8_rows, unpack_x8_rows, "x8_q5")
