"""Numba mat-vec kernels for quantized weights: dot products of a few activation rows with the
weight, decoding its blocks in registers and never writing a float copy of it.

Every kernel is compiled on first use (``cache=True``), so a model only pays for its own types.
Call: ``MATVEC[type](w, x, out, f16)`` with ``w`` the raw weight ``uint8[N, row_bytes]``
(C-contiguous), ``x`` the activations ``float32[M, K]`` (C-contiguous), ``out`` ``float32[M, N]``
and ``f16`` the 65536-entry half -> float table; ``out[m, r] = sum_k W[r, k] * x[m, k]``.

``MATVEC`` kernels take any number of rows but decode the weight again for each; for 2 or more rows
``MATVEC_BATCH`` (``batch_kernels.mmb_*``) decodes each weight block once for up to four rows, and from
``BATCH8_MIN_ROWS`` rows ``MATVEC_BATCH8`` (``batch_kernels.mmb8_*``, the float-activation types) once
for up to eight. ``matvec_kernel(name, M)`` picks one.

The one-row kernels of the 32-element block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) quantize the activations
to 16 bits per block and multiply in integers (``q16_kernels``: as close to the float product as float
activations, with half the vector operations); their batch kernels multiply the float activations. The
k-quants (``kquant_kernels``; Q2_K and Q3_K in ``kquant_lo_kernels``) multiply activations quantized to
8 bits, as llama.cpp does; IQ4_NL and IQ4_XS (``iq4_kernels``) the floats, through a table lookup;
F16 and BF16 (``f16_kernels``) the floats, each weight element widened in registers.
``MATVEC`` holds all; a type without a batch kernel runs its ``MATVEC`` kernel for any number of rows
(each weight block decoded again per row). This file holds the one table (``KERNELS``, its columns
``MATVEC`` / ``MATVEC_BATCH`` / ``MATVEC_BATCH8``) and ``matvec_kernel``.

Each kernel is a loop template specialized for one type's block function, so a loop is written once:
``q16_kernels._matvec`` (16-bit activations), ``kquant_kernels.matvec_k`` (8-bit activations, the
k-quants), ``rowgroups.matvec_float`` (float activations, IQ4 and MXFP4), and ``batch_template``'s
``batch4`` / ``batch8`` / ``kbatch4`` for the batches (block decoders in ``blocks32`` and ``kquant_blocks``).

How the kernels are built (numbers: AVX2 VM, ``benchmarks/bench_matvec.py``):
- values are ``simd.F32x8`` vectors: each row keeps eight partial sums in a register across all its
  blocks, each block's scale multiplies the whole vector, and the row is summed horizontally once at
  the end (scalar loops end every 32-element block in a horizontal sum: 1.35x slower on Q4_0);
- four rows per pass share the loaded activations;
- software prefetch of the rows ``rowgroups.PREFETCH_ROWS`` ahead: 2.2x on a 178 MB Q8_0 matrix;
- ``prange`` over groups of four rows (``rowgroups``).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, MutableMapping
from typing import Any

from ..quants.fast import F16_TABLE  # noqa: F401  (re-exported: the kernels' ``f16`` argument)
from ..types import GGMLType

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


#: the types whose ``MATVEC`` kernel quantizes the activations to 16 bits per 32 elements first
#: (``q16_kernels``; their batch kernels multiply the float activations)
Q16_TYPES = frozenset({"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"})

#: from this many rows on, the float-activation types decode each block once per 8 rows, scaled (mmb8_*)
BATCH8_MIN_ROWS = 5

#: the one dispatch table: type -> its kernel for one activation row (``MATVEC``: one-row loops of
#: ``q16_kernels``, ``kquant_kernels``, ``kquant_lo_kernels``, ``iq4_kernels``, ``mxfp4_kernels``), for
#: 2 to 4 rows per pass (``MATVEC_BATCH``) and for 8 rows per pass from ``BATCH8_MIN_ROWS`` rows
#: (``MATVEC_BATCH8``; None: the 4-row kernel goes on); the batch kernels are ``batch_kernels``' wrappers
#: of the ``batch_template`` loops. Entries are ``module:name``, imported on first use.
KERNELS: dict[str, tuple[str, str, str | None]] = {
    "Q4_0": ("q40_r8_kernels:mm_q4_0_r8", "batch_kernels:mmb_q4_0", "batch_kernels:mmb8_q4_0"),
    "Q4_1": ("q40_r8_kernels:mm_q4_1_r8", "batch_kernels:mmb_q4_1", "batch_kernels:mmb8_q4_1"),
    "Q5_0": ("q16_kernels:mm16_q5_0", "batch_kernels:mmb_q5_0", "batch_kernels:mmb8_q5_0"),
    "Q5_1": ("q16_kernels:mm16_q5_1", "batch_kernels:mmb_q5_1", "batch_kernels:mmb8_q5_1"),
    "Q8_0": ("q16_kernels:mm16_q8_0", "batch_kernels:mmb_q8_0", "batch_kernels:mmb8_q8_0"),
    "Q2_K": ("kquant_lo_kernels:mm_q2_k", "batch_kernels:mmb_q2_k", None),
    "Q3_K": ("kquant_lo_kernels:mm_q3_k", "batch_kernels:mmb_q3_k", None),
    "Q4_K": ("kquant_kernels:mm_q4_k", "batch_kernels:mmb_q4_k", None),
    "Q5_K": ("kquant_kernels:mm_q5_k", "batch_kernels:mmb_q5_k", None),
    "Q6_K": ("kquant_kernels:mm_q6_k", "batch_kernels:mmb_q6_k", None),
    "IQ4_NL": ("iq4_kernels:mm_iq4_nl", "batch_kernels:mmb_iq4_nl", "batch_kernels:mmb8_iq4_nl"),
    "IQ4_XS": ("iq4_kernels:mm_iq4_xs", "batch_kernels:mmb_iq4_xs", "batch_kernels:mmb8_iq4_xs"),
    "MXFP4": ("mxfp4_kernels:mm_mxfp4", "batch_kernels:mmb_mxfp4", "batch_kernels:mmb8_mxfp4"),
    "F16": ("f16_kernels:mm_f16", None, None),
    "BF16": ("f16_kernels:mm_bf16", None, None),
}

#: the table's columns, by row count (views that import on lookup)
MATVEC = KernelTable({t: k[0] for t, k in KERNELS.items()})
MATVEC_BATCH = KernelTable({t: k[1] for t, k in KERNELS.items() if k[1] is not None})
MATVEC_BATCH8 = KernelTable({t: k[2] for t, k in KERNELS.items() if k[2] is not None})


def matvec_kernel(name: str, m: int):  # type: ignore[no-untyped-def]
    """The mat-vec kernel for ``m`` activation rows of a weight of type ``name`` (None: no kernel)."""
    if m >= BATCH8_MIN_ROWS and name in MATVEC_BATCH8:
        return MATVEC_BATCH8[name]
    if m > 1 and name in MATVEC_BATCH:
        return MATVEC_BATCH[name]
    return MATVEC.get(name)
