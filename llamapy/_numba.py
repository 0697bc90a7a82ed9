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
import sys
import threading
from collections.abc import Callable


def kernel_sources_digest() -> str:
    """Short hash of the files whose code ends up in cached kernels (``os.scandir`` and plain reads:
    ``pathlib``'s glob and ``read_bytes`` took twice as long, ~3 ms of each start-up)."""
    root = os.path.dirname(os.path.abspath(__file__))
    files = [("_numba.py", os.path.join(root, "_numba.py"))]
    for sub in ("cpu", "quants"):
        with os.scandir(os.path.join(root, "ggml", sub)) as it:
            files += [(e.name, e.path) for e in it if e.name.endswith(".py") and e.is_file()]
    h = hashlib.sha256()
    for name, path in sorted(files, key=lambda f: f[1]):
        h.update(name.encode())
        with open(path, "rb") as f:
            h.update(f.read())
    # and NumPy's version: blas.py's cached kernels call the OpenBLAS symbol of the NumPy wheel
    import numpy

    h.update(numpy.__version__.encode())
    return h.hexdigest()[:16]


if "NUMBA_CACHE_DIR" not in os.environ:
    from .hub.common import cache_dir

    os.environ["NUMBA_CACHE_DIR"] = str(cache_dir() / "numba" / kernel_sources_digest())
    # Numba imported before llamapy (by the user's program, or another library) has read its
    # configuration already: without this, llamapy's kernels would be cached beside their sources,
    # where a changed helper of another file does not invalidate them (see above)
    _config = sys.modules.get("numba.core.config")
    if _config is not None and not getattr(_config, "CACHE_DIR", ""):
        _config.CACHE_DIR = os.environ["NUMBA_CACHE_DIR"]

# the start-up shortcuts (``_numba_startup``) and deferred dispatchers (``_numba_defer``) live in modules of
# their own, outside the digest: they change no compiled code
from . import _numba_startup  # noqa: E402

_numba_startup.import_numba()
import numba  # noqa: E402
from numba import prange  # noqa: E402

from ._numba_defer import njit  # noqa: E402
from ._numba_startup import release_compiler_pages  # noqa: E402

_numba_startup.install()
release_compiler_pages()

__all__ = [
    "numba",
    "njit",
    "prange",
    "set_num_threads",
    "thread_count_fns",
    "on_one_thread",
    "max_threads",
    "cap_threads",
    "kernel_sources_digest",
    "release_compiler_pages",
    "FAST_KEEP_INF",
]

#: ``fastmath`` flags for kernels that test values against -inf (masked attention scores): all of
#: ``fastmath=True`` (reassociation for vectorized sums, contraction to FMA, fast reciprocals) except
#: ``ninf``/``nnan``, under which LLVM may fold a compare with -inf to false
FAST_KEEP_INF = {"nsz", "arcp", "contract", "afn", "reassoc"}


def max_threads() -> int:
    return numba.config.NUMBA_NUM_THREADS


_cap = threading.local()


def cap_threads(n: int) -> int:
    """Run parallel kernels launched from this thread on at most ``n`` threads (0: no cap), whatever
    :func:`set_num_threads` is asked later (the busy-machine policy of llamapy/_cpuload.py); returns
    the cap it replaces, for putting back (``Context.decode`` caps its own decode only)."""
    prev = getattr(_cap, "n", 0)
    _cap.n = max(0, int(n))
    if _cap.n:
        numba.set_num_threads(min(_cap.n, numba.get_num_threads()))
    return prev


def set_num_threads(n: int | None) -> int:
    """Use ``n`` threads in parallel kernels (None or <= 0: all cores), or this thread's cap when
    lower; returns the count asked for."""
    n = max_threads() if not n or n <= 0 else min(int(n), max_threads())
    cap = getattr(_cap, "n", 0)
    numba.set_num_threads(min(n, cap) if cap else n)
    return n


def thread_count_fns() -> tuple[Callable[[], int], Callable[[int], None]]:
    """(get, set) of the calling thread's Numba thread count, as the threading layer's own C entry
    points: ``numba.get_num_threads`` / ``set_num_threads`` take a process lock on each call (8-12 us
    a call on a busy 2-core VM against ~1 us here), and a decode token switched them 60-90 times. The
    set bypasses this module's cap: for putting back a count read with get, or going down to one."""
    from numba.np.ufunc import parallel

    parallel._launch_threads()
    get = getattr(parallel, "_get_num_threads", None)
    put = getattr(parallel, "_set_num_threads", None)
    if get is None or put is None:  # pragma: no cover - numba internals moved
        return numba.get_num_threads, numba.set_num_threads
    return get, put


def on_one_thread(fn: Callable[..., None]) -> Callable[..., None]:
    """``fn`` called with the calling thread's Numba thread count at one and put back afterwards
    (``thread_count_fns``; no switch when it is one already): a parallel kernel then wakes no other
    thread, and a kernel whose result does not depend on the count gives the same bits."""
    get, put = thread_count_fns()

    def call(*args: object) -> None:
        nt = get()
        if nt == 1:
            fn(*args)
            return
        put(1)
        try:
            fn(*args)
        finally:
            put(nt)

    return call
