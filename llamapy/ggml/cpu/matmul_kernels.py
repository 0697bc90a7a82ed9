"""Numba mat-vec kernels for quantized weights: dot products of a few activation rows with the
weight, decoding its blocks in registers and never writing a float copy of it.

Every kernel is compiled on first use (``cache=True``), so a model only pays for its own types.
Call: ``MATVEC[type](w, x, out, f16)`` with ``w`` the raw weight ``uint8[N, row_bytes]``
(C-contiguous), ``x`` the activations ``float32[M, K]`` (C-contiguous), ``out`` ``float32[M, N]``
and ``f16`` the 65536-entry half -> float table; ``out[m, r] = sum_k W[r, k] * x[m, k]``.

``MATVEC`` kernels take any number of rows but decode the weight again for each; for 2 or more rows
``MATVEC_BATCH`` (``batch_kernels``, ``kquant_batch``, ``lo_batch_kernels``) decodes each weight block
once for up to four rows, and from ``BATCH8_MIN_ROWS`` rows ``MATVEC_BATCH8`` (``batch8_kernels``, the
32-element types; ``lo_batch8_kernels``, IQ4_NL and IQ4_XS) once for up to eight. ``matvec_kernel(name,
M)`` picks one.

This file holds the 32-element block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), which multiply the float
activations as they are. The k-quants (``kquant_kernels``; Q2_K and Q3_K in ``kquant_lo_kernels``)
multiply activations quantized to 8 bits, as llama.cpp does; IQ4_NL and IQ4_XS (``iq4_kernels``) the
floats, through a table lookup. ``MATVEC`` holds all; a type without a batch kernel runs its ``MATVEC``
kernel for any number of rows (each weight block decoded again per row).

How these are built (numbers: AVX2 VM, ``benchmarks/bench_matvec.py``):
- values are ``simd.F32x8`` vectors: each row keeps eight partial sums in a register across all its
  blocks, each block's scale multiplies the whole vector, and the row is summed horizontally once at
  the end (scalar loops end every 32-element block in a horizontal sum: 1.35x slower on Q4_0);
- four rows per pass share the loaded activations; the offsets and mins of the formats fold into
  per-block sums of ``x``, also kept as vectors;
- software prefetch of the rows ``rowgroups.PREFETCH_ROWS`` ahead: 2.2x on a 178 MB Q8_0 matrix;
- ``prange`` over groups of four rows (``rowgroups``).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, MutableMapping
from typing import Any

import numpy as np

from ..._numba import njit, prange
from ..quants.fast import F16_TABLE  # noqa: F401  (re-exported: the kernels' ``f16`` argument)
from ..quants.layouts import (
    Q4_0_BYTES,
    Q4_0_QS,
    Q4_1_BYTES,
    Q4_1_M,
    Q4_1_QS,
    Q5_0_BYTES,
    Q5_0_QH,
    Q5_0_QS,
    Q5_1_BYTES,
    Q5_1_M,
    Q5_1_QH,
    Q5_1_QS,
    Q8_0_BYTES,
    Q8_0_QS,
)
from ..types import GGMLType
from .layouts import ROWS_PER_PASS
from .rowgroups import PREFETCH_ROWS, f16at, prefetch_bytes, rows4, store4
from .simd import vadd, vfma, vi8, vload, vmul, vq4, vsplat, vsub, vzero

_F8 = np.float32(8.0)
_F16 = np.float32(16.0)


# -- 32-element blocks: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 ------------------------------------------------
@njit(inline="always")
def _nib(wr, q, x0, x1, x2, x3):
    """sum of nibble * x over a 16-byte run of quants at ``q`` (low nibbles: elements 0-15)."""
    t = vmul(vq4(wr, q, False), x0)
    t = vfma(t, vq4(wr, q + 8, False), x1)
    t = vfma(t, vq4(wr, q, True), x2)
    return vfma(t, vq4(wr, q + 8, True), x3)


#: BITS16[8 * v + j] = 16.0 if bit j of the byte v is set: the fifth bits of 8 Q5_0/Q5_1 elements
#: as one vector load (8 KiB, stays in L1), instead of four integer operations per 8 elements
BITS16 = np.array([16.0 * ((v >> j) & 1) for v in range(256) for j in range(8)], np.float32)


@njit(inline="always")
def _nib5(wr, q, qh, x0, x1, x2, x3, bits):
    """As ``_nib`` with the 32 fifth bits in the 4 bytes at ``qh`` (bit j belongs to element j)."""
    t = _nib(wr, q, x0, x1, x2, x3)
    t = vfma(t, vload(bits, np.int64(wr[qh]) * 8), x0)
    t = vfma(t, vload(bits, np.int64(wr[qh + 1]) * 8), x1)
    t = vfma(t, vload(bits, np.int64(wr[qh + 2]) * 8), x2)
    return vfma(t, vload(bits, np.int64(wr[qh + 3]) * 8), x3)


@njit(parallel=True, cache=True, fastmath=True)
def mm_q4_0(w, x, out, f16):
    N, rb = w.shape
    nb = rb // Q4_0_BYTES
    wf = w.reshape(-1)
    for g in prange((N + 3) // 4):
        w0, w1, w2, w3 = rows4(w, g, N)
        pf = (g * 4 + PREFETCH_ROWS) * rb
        for m in range(x.shape[0]):
            xm = x[m]
            a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
            for b in range(nb):
                if m == 0:
                    prefetch_bytes(
                        wf, pf + b * ROWS_PER_PASS * Q4_0_BYTES, ROWS_PER_PASS * Q4_0_BYTES, N * rb
                    )
                o = b * Q4_0_BYTES
                x0, x1, x2, x3 = (
                    vload(xm, b * 32),
                    vload(xm, b * 32 + 8),
                    vload(xm, b * 32 + 16),
                    vload(xm, b * 32 + 24),
                )
                c = vmul(vadd(vadd(x0, x1), vadd(x2, x3)), vsplat(_F8))  # the -8 offset
                a0 = vfma(a0, vsplat(f16at(w0, o, f16)), vsub(_nib(w0, o + Q4_0_QS, x0, x1, x2, x3), c))
                a1 = vfma(a1, vsplat(f16at(w1, o, f16)), vsub(_nib(w1, o + Q4_0_QS, x0, x1, x2, x3), c))
                a2 = vfma(a2, vsplat(f16at(w2, o, f16)), vsub(_nib(w2, o + Q4_0_QS, x0, x1, x2, x3), c))
                a3 = vfma(a3, vsplat(f16at(w3, o, f16)), vsub(_nib(w3, o + Q4_0_QS, x0, x1, x2, x3), c))
            store4(out, m, g, N, a0, a1, a2, a3)


@njit(inline="always")
def _q41(acc, wr, o, x0, x1, x2, x3, xsum, f16):
    acc = vfma(acc, vsplat(f16at(wr, o, f16)), _nib(wr, o + Q4_1_QS, x0, x1, x2, x3))
    return vfma(acc, vsplat(f16at(wr, o + Q4_1_M, f16)), xsum)


@njit(parallel=True, cache=True, fastmath=True)
def mm_q4_1(w, x, out, f16):
    N, rb = w.shape
    nb = rb // Q4_1_BYTES
    wf = w.reshape(-1)
    for g in prange((N + 3) // 4):
        w0, w1, w2, w3 = rows4(w, g, N)
        pf = (g * 4 + PREFETCH_ROWS) * rb
        for m in range(x.shape[0]):
            xm = x[m]
            a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
            for b in range(nb):
                if m == 0:
                    prefetch_bytes(
                        wf, pf + b * ROWS_PER_PASS * Q4_1_BYTES, ROWS_PER_PASS * Q4_1_BYTES, N * rb
                    )
                o = b * Q4_1_BYTES
                x0, x1, x2, x3 = (
                    vload(xm, b * 32),
                    vload(xm, b * 32 + 8),
                    vload(xm, b * 32 + 16),
                    vload(xm, b * 32 + 24),
                )
                s = vadd(vadd(x0, x1), vadd(x2, x3))  # times the min
                a0 = _q41(a0, w0, o, x0, x1, x2, x3, s, f16)
                a1 = _q41(a1, w1, o, x0, x1, x2, x3, s, f16)
                a2 = _q41(a2, w2, o, x0, x1, x2, x3, s, f16)
                a3 = _q41(a3, w3, o, x0, x1, x2, x3, s, f16)
            store4(out, m, g, N, a0, a1, a2, a3)


@njit(parallel=True, cache=True, fastmath=True)
def mm_q5_0(w, x, out, f16):
    N, rb = w.shape
    nb = rb // Q5_0_BYTES
    wf = w.reshape(-1)
    for g in prange((N + 3) // 4):
        w0, w1, w2, w3 = rows4(w, g, N)
        pf = (g * 4 + PREFETCH_ROWS) * rb
        for m in range(x.shape[0]):
            xm = x[m]
            a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
            for b in range(nb):
                if m == 0:
                    prefetch_bytes(
                        wf, pf + b * ROWS_PER_PASS * Q5_0_BYTES, ROWS_PER_PASS * Q5_0_BYTES, N * rb
                    )
                o, qs, qh = b * Q5_0_BYTES, b * Q5_0_BYTES + Q5_0_QS, b * Q5_0_BYTES + Q5_0_QH
                x0, x1, x2, x3 = (
                    vload(xm, b * 32),
                    vload(xm, b * 32 + 8),
                    vload(xm, b * 32 + 16),
                    vload(xm, b * 32 + 24),
                )
                c = vmul(vadd(vadd(x0, x1), vadd(x2, x3)), vsplat(_F16))  # the -16 offset
                a0 = vfma(a0, vsplat(f16at(w0, o, f16)), vsub(_nib5(w0, qs, qh, x0, x1, x2, x3, BITS16), c))
                a1 = vfma(a1, vsplat(f16at(w1, o, f16)), vsub(_nib5(w1, qs, qh, x0, x1, x2, x3, BITS16), c))
                a2 = vfma(a2, vsplat(f16at(w2, o, f16)), vsub(_nib5(w2, qs, qh, x0, x1, x2, x3, BITS16), c))
                a3 = vfma(a3, vsplat(f16at(w3, o, f16)), vsub(_nib5(w3, qs, qh, x0, x1, x2, x3, BITS16), c))
            store4(out, m, g, N, a0, a1, a2, a3)


@njit(inline="always")
def _q51(acc, wr, o, x0, x1, x2, x3, xsum, f16):
    acc = vfma(acc, vsplat(f16at(wr, o, f16)), _nib5(wr, o + Q5_1_QS, o + Q5_1_QH, x0, x1, x2, x3, BITS16))
    return vfma(acc, vsplat(f16at(wr, o + Q5_1_M, f16)), xsum)


@njit(parallel=True, cache=True, fastmath=True)
def mm_q5_1(w, x, out, f16):
    N, rb = w.shape
    nb = rb // Q5_1_BYTES
    wf = w.reshape(-1)
    for g in prange((N + 3) // 4):
        w0, w1, w2, w3 = rows4(w, g, N)
        pf = (g * 4 + PREFETCH_ROWS) * rb
        for m in range(x.shape[0]):
            xm = x[m]
            a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
            for b in range(nb):
                if m == 0:
                    prefetch_bytes(
                        wf, pf + b * ROWS_PER_PASS * Q5_1_BYTES, ROWS_PER_PASS * Q5_1_BYTES, N * rb
                    )
                o = b * Q5_1_BYTES
                x0, x1, x2, x3 = (
                    vload(xm, b * 32),
                    vload(xm, b * 32 + 8),
                    vload(xm, b * 32 + 16),
                    vload(xm, b * 32 + 24),
                )
                s = vadd(vadd(x0, x1), vadd(x2, x3))
                a0 = _q51(a0, w0, o, x0, x1, x2, x3, s, f16)
                a1 = _q51(a1, w1, o, x0, x1, x2, x3, s, f16)
                a2 = _q51(a2, w2, o, x0, x1, x2, x3, s, f16)
                a3 = _q51(a3, w3, o, x0, x1, x2, x3, s, f16)
            store4(out, m, g, N, a0, a1, a2, a3)


@njit(inline="always")
def _q80(acc, wr, o, x0, x1, x2, x3, f16):
    q = o + Q8_0_QS
    t = vmul(vi8(wr, q), x0)
    t = vfma(t, vi8(wr, q + 8), x1)
    t = vfma(t, vi8(wr, q + 16), x2)
    t = vfma(t, vi8(wr, q + 24), x3)
    return vfma(acc, vsplat(f16at(wr, o, f16)), t)


@njit(parallel=True, cache=True, fastmath=True)
def mm_q8_0(w, x, out, f16):
    N, rb = w.shape
    nb = rb // Q8_0_BYTES
    wf = w.reshape(-1)
    for g in prange((N + 3) // 4):
        w0, w1, w2, w3 = rows4(w, g, N)
        pf = (g * 4 + PREFETCH_ROWS) * rb
        for m in range(x.shape[0]):
            xm = x[m]
            a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
            for b in range(nb):
                if m == 0:
                    prefetch_bytes(
                        wf, pf + b * ROWS_PER_PASS * Q8_0_BYTES, ROWS_PER_PASS * Q8_0_BYTES, N * rb
                    )
                o = b * Q8_0_BYTES
                x0, x1, x2, x3 = (
                    vload(xm, b * 32),
                    vload(xm, b * 32 + 8),
                    vload(xm, b * 32 + 16),
                    vload(xm, b * 32 + 24),
                )
                a0 = _q80(a0, w0, o, x0, x1, x2, x3, f16)
                a1 = _q80(a1, w1, o, x0, x1, x2, x3, f16)
                a2 = _q80(a2, w2, o, x0, x1, x2, x3, f16)
                a3 = _q80(a3, w3, o, x0, x1, x2, x3, f16)
            store4(out, m, g, N, a0, a1, a2, a3)


#: the type each kernel quantizes the activations to first (llama.cpp's ``vec_dot_type``); the others
#: multiply float activations
VEC_DOT_TYPE = {
    "Q2_K": GGMLType.Q8_K, "Q3_K": GGMLType.Q8_K, "Q4_K": GGMLType.Q8_K, "Q5_K": GGMLType.Q8_K,
    "Q6_K": GGMLType.Q8_K,
}  # fmt: skip


class KernelTable(MutableMapping):
    """Type name -> kernel. An entry ``"module:name"`` (a module of this package) is imported on its
    first lookup, so a model imports, and creates the Numba dispatchers of, only its own types'
    kernel modules (importing all of them took 10-15 ms of every start-up)."""

    def __init__(self, entries: dict[str, Any]):
        self._entries = dict(entries)

    def __getitem__(self, name: str) -> Any:
        k = self._entries[name]
        if isinstance(k, str):
            module, attr = k.split(":")
            k = self._entries[name] = getattr(importlib.import_module(f"{__package__}.{module}"), attr)
        return k

    def __setitem__(self, name: str, kernel: Any) -> None:
        self._entries[name] = kernel

    def __delitem__(self, name: str) -> None:
        del self._entries[name]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


MATVEC = KernelTable({
    "Q4_0": mm_q4_0, "Q4_1": mm_q4_1, "Q5_0": mm_q5_0, "Q5_1": mm_q5_1, "Q8_0": mm_q8_0,
    "Q2_K": "kquant_lo_kernels:mm_q2_k", "Q3_K": "kquant_lo_kernels:mm_q3_k",
    "Q4_K": "kquant_kernels:mm_q4_k", "Q5_K": "kquant_kernels:mm_q5_k", "Q6_K": "kquant_kernels:mm_q6_k",
    "IQ4_NL": "iq4_kernels:mm_iq4_nl", "IQ4_XS": "iq4_kernels:mm_iq4_xs",
    "MXFP4": "mxfp4_kernels:mm_mxfp4",
})  # fmt: skip

#: small-batch kernels (2 to ``backend.MATVEC_MAX_TOKENS`` rows): each weight block decoded once per 4 rows
MATVEC_BATCH = KernelTable({
    "Q4_0": "batch_kernels:mmb_q4_0", "Q4_1": "batch_kernels:mmb_q4_1", "Q5_0": "batch_kernels:mmb_q5_0",
    "Q5_1": "batch_kernels:mmb_q5_1", "Q8_0": "batch_kernels:mmb_q8_0",
    "Q2_K": "lo_batch_kernels:mmb_q2_k", "Q3_K": "lo_batch_kernels:mmb_q3_k",
    "Q4_K": "kquant_batch:mmb_q4_k", "Q5_K": "kquant_batch:mmb_q5_k", "Q6_K": "kquant_batch:mmb_q6_k",
    "IQ4_NL": "lo_batch_kernels:mmb_iq4_nl", "IQ4_XS": "lo_batch_kernels:mmb_iq4_xs",
    "MXFP4": "batch_kernels:mmb_mxfp4",
})  # fmt: skip


#: from this many rows on, the 32-element types decode each block once per 8 rows, scaled (batch8_kernels)
BATCH8_MIN_ROWS = 5
MATVEC_BATCH8 = KernelTable({
    "Q4_0": "batch8_kernels:mmb8_q4_0", "Q4_1": "batch8_kernels:mmb8_q4_1",
    "Q5_0": "batch8_kernels:mmb8_q5_0", "Q5_1": "batch8_kernels:mmb8_q5_1",
    "Q8_0": "batch8_kernels:mmb8_q8_0",
    "IQ4_NL": "lo_batch8_kernels:mmb8_iq4_nl", "IQ4_XS": "lo_batch8_kernels:mmb8_iq4_xs",
    "MXFP4": "batch8_kernels:mmb8_mxfp4",
})  # fmt: skip


def matvec_kernel(name: str, m: int):  # type: ignore[no-untyped-def]
    """The mat-vec kernel for ``m`` activation rows of a weight of type ``name`` (None: no kernel)."""
    if m >= BATCH8_MIN_ROWS and name in MATVEC_BATCH8:
        return MATVEC_BATCH8[name]
    if m > 1 and name in MATVEC_BATCH:
        return MATVEC_BATCH[name]
    return MATVEC.get(name)
