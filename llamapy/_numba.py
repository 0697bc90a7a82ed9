"""The one place llamapy imports Numba: kernels compile lazily with ``cache=True`` into a writable
per-user cache (``$NUMBA_CACHE_DIR``, else ``<llamapy cache>/numba``), and the thread count is set here.

Use ``from llamapy._numba import njit, prange, set_num_threads`` in kernel modules.
"""

from __future__ import annotations

import os

if "NUMBA_CACHE_DIR" not in os.environ:
    from .hub import cache_dir

    os.environ["NUMBA_CACHE_DIR"] = str(cache_dir() / "numba")

# Numba's OpenMP workers otherwise spin after each kernel and starve BLAS threads and other processes
# (measured on a loaded 2-core machine: a 2-thread mat-vec took 12-17 ms instead of 0.8 ms). Must be set
# before the OpenMP runtime starts; the user's setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numba  # noqa: E402
from numba import njit, prange  # noqa: E402

__all__ = ["numba", "njit", "prange", "set_num_threads", "max_threads"]


def max_threads() -> int:
    return numba.config.NUMBA_NUM_THREADS


def set_num_threads(n: int | None) -> int:
    """Use ``n`` threads in parallel kernels (None or <= 0: all cores); returns the count in effect."""
    n = max_threads() if not n or n <= 0 else min(int(n), max_threads())
    numba.set_num_threads(n)
    return n
