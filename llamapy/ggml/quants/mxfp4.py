"""MXFP4 (ggml type 39, gpt-oss's expert weights): the Numba dequantize kernel and the tables the CPU
kernels share. The NumPy codec (``iquants.MXFP4``) and the reference quantizer
(``_iquantize.quantize_mxfp4``, llama.cpp's ``quantize_row_mxfp4_ref``) live with the other i-quants.

Block of 32 (``block_mxfp4``, ggml-common.h), 17 bytes: ``uint8 e`` (an E8M0 exponent) then
``uint8 qs[16]``; element ``j < 16`` is the low nibble of ``qs[j]``, element ``j + 16`` its high
nibble. A nibble is an E2M1 value (sign, 2 exponent bits, 1 mantissa bit); ggml stores them doubled
(``kvalues_mxfp4``: 0, 1, 2, 3, 4, 6, 8, 12 and their negatives) and halves the scale instead:
``x = kvalues_mxfp4[nibble] * 2**(e - 128)`` (``GGML_E8M0_TO_FP32_HALF``).

This module imports Numba; ``fast`` imports it on first use.
"""

from __future__ import annotations

import numpy as np

from ..._numba import njit, prange
from .iq_tables import KVALUES_FP4
from .iquants import e8m0_to_fp32_half

__all__ = ["E8M0_HALF", "KVALUES_MXFP4_F32", "dequantize_mxfp4_rows"]

F32 = np.float32
#: ``GGML_E8M0_TO_FP32_HALF(e)`` for every byte ``e``
E8M0_HALF = e8m0_to_fp32_half(np.arange(256, dtype=np.uint8))
#: the 16 doubled E2M1 values as float32
KVALUES_MXFP4_F32 = KVALUES_FP4.astype(np.float32)


@njit(parallel=True, cache=True)
def _mxfp4(raw, out, e8, kv):
    nb = raw.shape[1] // 17
    for r in prange(raw.shape[0]):
        src = raw[r]
        dst = out[r]
        for b in range(nb):
            o = b * 17
            d = e8[src[o]]
            y = b * 32
            for j in range(16):
                v = np.int32(src[o + 1 + j])
                dst[y + j] = kv[v & 15] * d
                dst[y + j + 16] = kv[v >> 4] * d


def dequantize_mxfp4_rows(raw2d: np.ndarray, out: np.ndarray) -> None:
    """``fast.KERNELS`` entry: ``uint8[rows, 17 * nb]`` -> ``float32[rows, 32 * nb]`` (bit-identical to
    the NumPy codec: one float32 product per element, as ggml's ``dequantize_row_mxfp4``)."""
    _mxfp4(raw2d, out, E8M0_HALF, KVALUES_MXFP4_F32)


dequantize_mxfp4_rows.kernel = _mxfp4  # type: ignore[attr-defined]
