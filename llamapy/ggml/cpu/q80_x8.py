"""``mul_mat`` on Q8_0 weights repacked eight rows at a time (``q80_x8_kernels``).

As ``q40_x8`` for Q4_0: a 2-D Q8_0 weight whose row count is a multiple of 8 and whose bytes are a view
of a memory-mapped model file is repacked once, the first time a ``mul_mat`` step is compiled for it,
into anonymous memory (the same size: only the bytes move), and the mapped source pages are dropped
from this process. Weights read into memory (``use_mmap=False``) are not repacked.

The activations are quantized exactly as the plain one-row kernel does (``mm16_q8_0``: 16 bits per 32
elements), so the integer sums are its own and results differ only in the order of float additions.
The plain path multiplies float activations from 2 rows on (``mmb_q8_0`` / ``mmb8_q8_0`` up to 32 rows,
then dequantized tiles + sgemm); here up to ``MAX_ROWS`` rows multiply 16-bit activations (1/32767 of
each block's largest value, about float16's precision: llama.cpp's prompt path rounds them to 8 bits).

Up to ``MAX_ROWS`` activation rows run the 8-row kernels: ``mm_q8_0_x8`` for 1-2 rows, ``mm_q8_0_x8r4``
(four rows per pass, each row's result bit for bit the one-row kernel's) from ``R4_MIN_ROWS``; more rows
convert a tile of rows back to plain Q8_0 in a scratch buffer (``unpack_x8_rows``, bit for bit) for the
dequantize + sgemm path.

Measured (2026-12-03 06:47-07:25 UTC, AMD EPYC KVM, 2 vCPUs shared with other jobs at load 3-8, Numba
target haswell (AVX2), CPU time, best of 3-5; per matrix 4 copies so that they come from DRAM). One
thread, CPU ms per activation row, x8 (``mm_q8_0_x8`` below 4 rows, else ``x8r4``) vs tiles (unpacked,
dequantized, sgemm) vs the plain kernels (``mm16_q8_0`` / ``mmb_q8_0`` / ``mmb8_q8_0``), two runs:

- 8960x1536: 1 row 0.56-0.62 (plain 0.51-0.73); 16 rows 0.22-0.25 (tiles 1.06-1.15, plain 0.57-0.58);
  64 rows 0.22 vs tiles 0.48-0.49; 256 rows 0.22-0.25 vs 0.31-0.36; 512 rows 0.26-0.28 vs 0.29-0.31;
- 1536x8960: 1 row 0.62-0.78 (plain 0.52-0.70); 16 rows 0.26 (tiles 0.94-1.11, plain 0.55-0.64);
  64 rows 0.25-0.32 vs 0.45-0.46; 256 rows 0.24-0.27 vs 0.33-0.34; 512 rows 0.25-0.30 vs 0.31;
- 1536x1536: 1 row 0.14 (plain 0.12); 16 rows 0.058 (tiles 0.22, plain 0.11); 64 rows 0.047 vs 0.085;
  256 rows 0.042 vs 0.056; 512 rows 0.044 vs 0.056;
- 256x1536: 1 row 0.020 (plain 0.026); 16 rows 0.012 (tiles 0.030, plain 0.020); 64 rows 0.012 vs
  0.018; 256 rows 0.011 vs 0.010; 512 rows 0.012 vs 0.010.

(3 rows: ``x8r4`` 0.32-0.34 vs ``mm_q8_0_x8`` 0.35-0.41 on 8960x1536, hence ``R4_MIN_ROWS`` 3.) In
cache (one 1536x1536 copy) the one-row kernel takes 0.08 ms against the plain kernel's 0.12; from DRAM
the two are within this machine's noise (medians of 15 alternating rounds: 0.73 vs 0.67 and 0.63 vs
0.66). Whole models, ``benchmarks/tg_cputime.py --threads 1``, CPU ms/token, on / off alternating:
gemma-3-270m Q4_K_M (its tied 262144x640 Q8_0 output and Q8_0 ``attn_v``) 17.2, 18.8 / 31.1, 23.5;
SmolLM2-135M Q4_1 (tied 49152x576 Q8_0 output) 11.1, 10.5 / 12.1, 11.8. Prompt, Qwen2.5-1.5B-shaped
Q8_0 (``benchmarks/pp_cputime.py new FILE THREADS N``, CPU s, best of 3): pp64, 1 thread 1.69 / 2.79;
2 threads 4.49, 4.46 / 5.60, 5.95 (CPU time at 2 threads on this loaded machine counts waiting
threads); after the prefetch change below, at load 2-4: pp64 1 thread 1.61 / 2.90, 2 threads 3.23 / 4.85;
pp512, 1 thread 16.6 / 16.3 and 15.7 / 17.5 (the tiles' sgemm is nearly as fast at 512 rows).

Exactness: the 16-bit activations are those the plain one-row kernel already multiplies. On random
data (512x2048, 64 rows) the relative RMS error against float64 ``W @ x`` is 2.1e-5 (normal x) / 4.5e-5
(Student t, 2 degrees of freedom), against 2.9e-7 / 2.8e-7 for the plain batch kernels' float
activations and 5.4e-3 / 1.1e-2 for llama.cpp's 8-bit (Q8_0) activations. Prompt logits (every
position, one batch) against the NumPy backend (float activations, dequantized weights): SmolLM2 pp64
largest error 2.98e-4 of the largest logit on / 3.04e-4 off, mean 1.24e-3 / 1.21e-3, argmax agreement
1.0 both; gemma-3-270m pp256 (its Q4_K weights' 8-bit activations dominate) 6.55e-2 / 7.19e-2, mean
0.655 / 0.671, agreement 0.836 both.

On by default (``LLAMAPY_Q80_X8=0`` in the environment, or ``ENABLED = False`` here, turns it off). With it
on, ``tests/model/test_reference.py::test_gemma3_matches_llama_cpp`` (greedy 8 tokens equal to llama.cpp's)
gives 3/6 prompts and batch max |dlogit| 1.999 / mean 0.267 (off: 4/6, 1.87, 0.19): gemma-3-270m's ten
Q8_0 tensors' prompt rows move from float to 16-bit activations, and that model's greedy output is chaotic
at small margins. Against the exact float64 computation (``benchmarks/exactness.py --models gemma3``,
results/exactness_stop41_gemma3{,_q80x8}.md) on and off are alike: greedy equal to exact's on 15/24
prompts both (llama.cpp 11/24), decode error smaller than llama.cpp's on 18/23 / 17/23 prompts, rms logit
error step 0 0.28 / 0.31, decode 0.29 / 0.27, prompt path every position 0.53 / 0.47. It is on as the faster
choice side by side with llama.cpp (``benchmarks/vs_llamacpp.py --avx2 --mid --only Q8_0``, 2 threads,
quiet machine, 2026-12-03): Qwen2.5-1.5B-shaped Q8_0 pp64 1.37x / tg16 1.28x llama.cpp with it on,
against 0.81x / 1.18x off (``results/vs_llamacpp_mid_avx2_q80x8.md``); SmolLM2 (its tied Q8_0 output) tg64 98.8 t/s on against
85.0 off (0.93x / 0.84x llama.cpp), ``run -p Hello`` 0.76 / 0.79 s. ``llamapy bench -p 0 -n 16 -t 2 -r 3``
on the 1.5B Q8_0 file, off / on interleaved: 16.74 / 15.90 and 16.11 / 15.67 t/s. The decode loss on the
model where Q8_0 is every weight, measured by CPU time at one thread: Qwen2.5-1.5B-shaped
Q8_0, ``tg_cputime.py --threads 1 --tokens 16``, CPU ms/token on / off, seven alternating pairs (load
3-8): 88.7 / 72.7, 92.6 / 84.7, 90.3 / 98.0, 84.5 / 91.7, 100.9 / 81.4, 83.4 / 81.0, 84.3 / 82.5
(medians 88.7 / 82.5: ~7 % slower); ``llamapy bench -p 0 -n 16 -t 1 --profile``: ``mm_q8_0_x8`` 3.54 s
against ``mm16_q8_0`` 2.87 s wall for the same 3349 calls. Outside the model, a sweep over the same 196
matrices (1.4 GB, one thread, alternating in one process) showed the one-row kernel 10-15 % behind
(56.4 / 59.4 vs 49.5 / 51.4 CPU ms min / median) until its prefetch went to each line once, 64 KiB ahead
(``q80_x8_kernels.X8_PREFETCH_BYTES``: 49.8 / 52.1 and 52.4 / 55.8 vs 50.0 / 58.3, parity); in the
model it is still behind after that (tg, 3 pairs at load 3-4: 76.9, 78.7, 75.6 / 63.8, 69.4, 70.5):
not understood yet. A repacked weight cannot fall back to the plain one-row kernel without
a second resident copy, so this needs either a one-row kernel that streams the repacked rows as fast, or
a prompt kernel on the plain layout (not tried: e.g. two weight rows by four activation rows per pass
with ``q16_kernels``' block function, no repack, the one-row kernel's integer sums).
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

__all__ = ["ENABLED", "MAX_ROWS", "TYPES", "mul_mat_step", "repack", "unpack_rows"]

#: repack Q8_0 weights for the 8-row kernels (``LLAMAPY_Q80_X8=0``: no)
ENABLED = os.environ.get("LLAMAPY_Q80_X8", "1") not in ("0", "false", "no", "off")
#: the types repacked
TYPES = frozenset({GGMLType.Q8_0})
#: the most activation rows the 8-row kernels take (more: dequantized tiles + sgemm)
MAX_ROWS = 512
#: from this many activation rows on, the four-rows-per-pass kernel
R4_MIN_ROWS = 3

_cache: Cache = weakref.WeakKeyDictionary()


def repack(A: np.ndarray, t: GGMLType = GGMLType.Q8_0) -> np.ndarray:
    """The repacked copy of the Q8_0 rows ``A`` (uint8[N, row bytes], N a multiple of 8)."""
    from .q80_x8_kernels import SRC_BYTES, X8_BYTES, repack_x8

    _, rb = A.shape
    return copy_rows(A, rb // SRC_BYTES * X8_BYTES, repack_x8)


def unpack_rows(R: np.ndarray, r0: int, r1: int, dst: np.ndarray) -> None:
    """Rows ``r0`` .. ``r1`` of the repacked ``R`` in plain bytes into ``dst`` (bit for bit)."""
    from .q80_x8_kernels import unpack_x8_rows

    unpack_x8_rows(R, r0, r1, dst)


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
    is not repacked (not Q8_0, rows not a multiple of 8, not a mapped file unless ``any_memory``)."""
    if R is None:  # (given: a block of several weights' rows, ``matvec_groups``)
        R = _repacked(a, A, any_memory)
    if R is None:
        return None
    from .q80_x8_kernels import mm_q8_0_x8, mm_q8_0_x8r4, unpack_x8_rows

    M = x.shape[0]
    kern = None
    if M <= MAX_ROWS:
        kern = mm_q8_0_x8r4 if M >= R4_MIN_ROWS else mm_q8_0_x8
    return x8_step(be, a, A, x, out2, pre, R, kern, unpack_rows, unpack_x8_rows, "x8_q")
