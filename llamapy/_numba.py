"""The one place llamapy imports Numba: kernels compile lazily with ``cache=True`` into a writable
per-user cache (``$NUMBA_CACHE_DIR``, else ``<llamapy cache>/numba/<digest>``), and the thread count
is set here.

The digest covers the source of every kernel module. Numba invalidates a cached function only when
its own file changes, not when an inlined helper or intrinsic from another file does (measured: a
changed ``simd.py`` kept running the old mat-vec kernels), so each version of the kernel sources gets
its own directory.

Use ``from llamapy._numba import njit, prange, set_num_threads`` in kernel modules. The LLVM-level
helpers of the CPU kernels (vector type, prefetch, bit casts) are Numba extensions in
``llamapy.ggml.cpu.simd``.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def kernel_sources_digest() -> str:
    """Short hash of the files whose code ends up in cached kernels."""
    root = Path(__file__).resolve().parent
    files = [
        root / "_numba.py",
        *(root / "ggml" / "cpu").glob("*.py"),
        *(root / "ggml" / "quants").glob("*.py"),
    ]
    h = hashlib.sha256()
    for f in sorted(files):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


if "NUMBA_CACHE_DIR" not in os.environ:
    from .hub import cache_dir

    os.environ["NUMBA_CACHE_DIR"] = str(cache_dir() / "numba" / kernel_sources_digest())

# OMP_WAIT_POLICY is left to the user. GNU OpenMP's default (spin briefly, then sleep; less spinning when
# oversubscribed) measured best on a quiet 2-core machine: SmolLM2 tg 44 t/s with 2 threads, against 22 t/s
# with PASSIVE (every kernel launch then pays a thread wake-up). On a machine busy with other work,
# OMP_WAIT_POLICY=PASSIVE avoids spinning against the other processes.
import numba  # noqa: E402
from numba import njit, prange  # noqa: E402

__all__ = [
    "numba",
    "njit",
    "prange",
    "set_num_threads",
    "max_threads",
    "kernel_sources_digest",
    "FAST_KEEP_INF",
]

#: ``fastmath`` flags for kernels that test values against -inf (masked attention scores): all of
#: ``fastmath=True`` (reassociation for vectorized sums, contraction to FMA, fast reciprocals) except
#: ``ninf``/``nnan``, under which LLVM may fold a compare with -inf to false
FAST_KEEP_INF = {"nsz", "arcp", "contract", "afn", "reassoc"}


def max_threads() -> int:
    return numba.config.NUMBA_NUM_THREADS


def set_num_threads(n: int | None) -> int:
    """Use ``n`` threads in parallel kernels (None or <= 0: all cores); returns the count in effect."""
    n = max_threads() if not n or n <= 0 else min(int(n), max_threads())
    numba.set_num_threads(n)
    return n
