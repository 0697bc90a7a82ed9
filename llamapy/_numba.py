"""The one place llamapy imports Numba: kernels compile lazily with ``cache=True`` into a writable
per-user cache (``$NUMBA_CACHE_DIR``, else ``<llamapy cache>/numba``), and the thread count is set here.

Use ``from llamapy._numba import njit, prange, set_num_threads`` in kernel modules.
"""

from __future__ import annotations

import os

if "NUMBA_CACHE_DIR" not in os.environ:
    from .hub import cache_dir

    os.environ["NUMBA_CACHE_DIR"] = str(cache_dir() / "numba")

# OMP_WAIT_POLICY is left to the user. GNU OpenMP's default (spin briefly, then sleep; less spinning when
# oversubscribed) measured best on a quiet 2-core machine: SmolLM2 tg 44 t/s with 2 threads, against 22 t/s
# with PASSIVE (every kernel launch then pays a thread wake-up). On a machine busy with other work,
# OMP_WAIT_POLICY=PASSIVE avoids spinning against the other processes.
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
