"""The small-batch mat-vec kernels, one per type and row count: each is a loop of ``batch_template``
specialized (inlined) for the type's block functions (``blocks32``: float runs of 32 weights;
``kquant_blocks``: the k-quants' 256-weight blocks against 8-bit activations). Each weight block is
decoded once into registers and used for several activation rows, instead of once per row as the one-row
kernels of ``matmul_kernels.MATVEC`` do.

- ``mmb_*`` (2 to 4 rows, ``matmul_kernels.MATVEC_BATCH``): the one-row kernels' order (products of the
  unscaled quants, then scale and offset per block): all types with a kernel;
- ``mmb8_*`` (5 to ``MATVEC_MAX_TOKENS`` rows, ``MATVEC_BATCH8``): the weights scaled first, then four
  FMAs per row and run; the float-activation types. With few rows the first order is faster, with many
  this one (bench_matvec, 576x1536 Q4_1, one thread: 8 rows 190 us against 290; 2 rows 100 against 80).

A row's result does not depend on the other rows in the batch (tested bit for bit); against the one-row
kernels it differs in float rounding only (~1e-6 relative). Each wrapper is two lines because Numba
caches a kernel only as a function of its own; the flags (``fastmath``) are the kernel's.
Call as ``MATVEC``: ``kern(w, x, out, f16)``.
"""

from __future__ import annotations

import numpy as np

from ..._numba import njit
from ..quants.layouts import (
    IQ4_NL_BYTES,
    IQ4_XS_BYTES,
    Q2_K_BYTES,
    Q3_K_BYTES,
    Q4_0_BYTES,
    Q4_1_BYTES,
    Q4_K_BYTES,
    Q5_0_BYTES,
    Q5_1_BYTES,
    Q5_K_BYTES,
    Q6_K_BYTES,
    Q8_0_BYTES,
)
from ..quants.mxfp4 import E8M0_HALF
from . import blocks32 as b32
from . import kquant_blocks as kb
from .batch_template import batch4, batch8, kbatch4

_MXFP4_BYTES = 17


# -- 2 to 4 rows, float activations: batch4(..., table, load, row, block bytes, runs per block, sums) --
@njit(parallel=True, cache=True, fastmath=True)
def mmb_q4_0(w, x, out, f16):
    batch4(w, x, out, f16, f16, b32.q4_0, b32.row_off, Q4_0_BYTES, 1, True)


@njit(parallel=True, cache=True, fastmath=True)
def mmb_q4_1(w, x, out, f16):
    batch4(w, x, out, f16, f16, b32.q4_1, b32.row_min, Q4_1_BYTES, 1, True)


@njit(parallel=True, cache=True, fastmath=True)
def mmb_q5_0(w, x, out, f16):
    batch4(w, x, out, f16, b32.BITS16, b32.q5_0, b32.row_off5, Q5_0_BYTES, 1, True)


@njit(parallel=True, cache=True, fastmath=True)
def mmb_q5_1(w, x, out, f16):
    batch4(w, x, out, f16, b32.BITS16, b32.q5_1, b32.row_min5, Q5_1_BYTES, 1, True)


@njit(parallel=True, cache=True, fastmath=True)
def mmb_q8_0(w, x, out, f16):
    batch4(w, x, out, f16, f16, b32.q8_0, b32.row_scale, Q8_0_BYTES, 1, False)


@njit(parallel=True, cache=True, fastmath=True)
def mmb_mxfp4(w, x, out, f16):
    batch4(w, x, out, f16, E8M0_HALF, b32.mxfp4, b32.row_scale, _MXFP4_BYTES, 1, False)


@njit(parallel=True, cache=True)
def mmb_iq4_nl(w, x, out, f16):
    batch4(w, x, out, f16, f16, b32.iq4_nl, b32.row_scale, IQ4_NL_BYTES, 1, False)


@njit(parallel=True, cache=True)
def mmb_iq4_xs(w, x, out, f16):
    batch4(w, x, out, f16, f16, b32.iq4_xs, b32.row_scale, IQ4_XS_BYTES, 8, False)


# -- 2 to 4 rows, k-quants: kbatch4(..., head, runs, tail, fin, block bytes, byte-sum width) --
@njit(parallel=True, cache=True)
def mmb_q2_k(w, x, out, f16):
    kbatch4(w, x, out, f16, kb.no_head, kb.q2_k_runs, kb.q2_k_tail, kb.q2_k_fin, Q2_K_BYTES, 16)


@njit(parallel=True, cache=True)
def mmb_q3_k(w, x, out, f16):
    kbatch4(w, x, out, f16, kb.q3_k_head, kb.q3_k_runs, kb.q3_k_tail, kb.q3_k_fin, Q3_K_BYTES, 16)


@njit(parallel=True, cache=True)
def mmb_q4_k(w, x, out, f16):
    kbatch4(w, x, out, f16, kb.q4_k_head, kb.q4_k_runs, kb.tail_mins, kb.fin_mins, Q4_K_BYTES, 32)


@njit(parallel=True, cache=True)
def mmb_q5_k(w, x, out, f16):
    kbatch4(w, x, out, f16, kb.q5_k_head, kb.q5_k_runs, kb.tail_mins, kb.fin_mins, Q5_K_BYTES, 32)


@njit(parallel=True, cache=True)
def mmb_q6_k(w, x, out, f16):
    kbatch4(w.view(np.int8), x, out, f16, kb.no_head, kb.q6_k_runs, kb.q6_k_tail, kb.q6_k_fin, Q6_K_BYTES, 16)


# -- 5 to 8 rows, float activations: batch8(..., table, load, scaled, block bytes, runs per block) --
@njit(parallel=True, cache=True, fastmath=True)
def mmb8_q4_0(w, x, out, f16):
    batch8(w, x, out, f16, f16, b32.q4_0, b32.scaled_off, Q4_0_BYTES, 1)


@njit(parallel=True, cache=True, fastmath=True)
def mmb8_q4_1(w, x, out, f16):
    batch8(w, x, out, f16, f16, b32.q4_1, b32.scaled_min, Q4_1_BYTES, 1)


@njit(parallel=True, cache=True, fastmath=True)
def mmb8_q5_0(w, x, out, f16):
    batch8(w, x, out, f16, b32.BITS16, b32.q5_0, b32.scaled_off5, Q5_0_BYTES, 1)


@njit(parallel=True, cache=True, fastmath=True)
def mmb8_q5_1(w, x, out, f16):
    batch8(w, x, out, f16, b32.BITS16, b32.q5_1, b32.scaled_min5, Q5_1_BYTES, 1)


@njit(parallel=True, cache=True, fastmath=True)
def mmb8_q8_0(w, x, out, f16):
    batch8(w, x, out, f16, f16, b32.q8_0, b32.scaled_strict, Q8_0_BYTES, 1)


@njit(parallel=True, cache=True, fastmath=True)
def mmb8_mxfp4(w, x, out, f16):
    batch8(w, x, out, f16, E8M0_HALF, b32.mxfp4, b32.scaled_strict, _MXFP4_BYTES, 1)


@njit(parallel=True, cache=True, fastmath=True)
def mmb8_iq4_nl(w, x, out, f16):
    batch8(w, x, out, f16, f16, b32.iq4_nl, b32.scaled, IQ4_NL_BYTES, 1)


@njit(parallel=True, cache=True, fastmath=True)
def mmb8_iq4_xs(w, x, out, f16):
    batch8(w, x, out, f16, f16, b32.iq4_xs, b32.scaled, IQ4_XS_BYTES, 8)
