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
import threading
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
    # and NumPy's version: blas.py's cached kernels call the OpenBLAS symbol of the NumPy wheel
    import numpy

    h.update(numpy.__version__.encode())
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


def _skip_scipy_blas_probe() -> None:
    """Numba's ``numba.np.arraymath`` (imported by the first kernel call of every process) imports
    ``scipy.linalg`` only to decide whether ``np.correlate``/``np.convolve`` inner products call BLAS:
    0.2-0.3 s of each start-up. No llamapy kernel uses those; answer the probe "no BLAS" instead (the
    loops then run in plain code) and leave every other use of ``ensure_blas`` (np.dot, np.linalg in
    anyone's jitted code) as it was. Skipped with LLAMAPY_NUMBA_BLAS_PROBE=1 or a newer Numba."""
    import sys

    if os.environ.get("LLAMAPY_NUMBA_BLAS_PROBE") or "numba.np.arraymath" in sys.modules:
        return
    try:
        import numba.np.linalg as nl

        orig = nl.ensure_blas
    except (ImportError, AttributeError):  # pragma: no cover - Numba internals moved
        return

    def ensure_blas() -> None:
        if sys._getframe(1).f_globals.get("__name__") != "numba.np.arraymath":
            return orig()
        nl.ensure_blas = orig  # one shot: arraymath's import-time probe
        raise ImportError("llamapy: Numba's BLAS probe for np.correlate skipped")

    nl.ensure_blas = ensure_blas


_skip_scipy_blas_probe()

__all__ = [
    "numba",
    "njit",
    "prange",
    "set_num_threads",
    "max_threads",
    "cap_threads",
    "kernel_sources_digest",
    "FAST_KEEP_INF",
]

#: ``fastmath`` flags for kernels that test values against -inf (masked attention scores): all of
#: ``fastmath=True`` (reassociation for vectorized sums, contraction to FMA, fast reciprocals) except
#: ``ninf``/``nnan``, under which LLVM may fold a compare with -inf to false
FAST_KEEP_INF = {"nsz", "arcp", "contract", "afn", "reassoc"}


def max_threads() -> int:
    return numba.config.NUMBA_NUM_THREADS


_cap = threading.local()


def cap_threads(n: int) -> None:
    """Run parallel kernels launched from this thread on at most ``n`` threads (0: no cap), whatever
    :func:`set_num_threads` is asked later (the busy-machine policy of llamapy/_cpuload.py)."""
    _cap.n = max(0, int(n))
    if _cap.n:
        numba.set_num_threads(min(_cap.n, numba.get_num_threads()))


def set_num_threads(n: int | None) -> int:
    """Use ``n`` threads in parallel kernels (None or <= 0: all cores), or this thread's cap when
    lower; returns the count asked for."""
    n = max_threads() if not n or n <= 0 else min(int(n), max_threads())
    cap = getattr(_cap, "n", 0)
    numba.set_num_threads(min(n, cap) if cap else n)
    return n
