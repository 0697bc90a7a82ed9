"""sgemm from NumPy's own OpenBLAS, called inside Numba's thread pool.

Why: NumPy's ``matmul`` runs OpenBLAS on OpenBLAS's threads, and our kernels run on Numba's OpenMP
threads. Each pool spins for a while after its work; when the two alternate (dequantize a tile, then
matmul it) on a machine with few cores, each spends its slices waiting on the other's spinners
(measured on 2 cores, Gemma 3 pp512: 188 t/s alternating, 346 t/s with OpenMP told to sleep, which in
turn halves decode speed). Here OpenBLAS is told to use one thread and Numba's ``prange`` splits each
product into column chunks, one sgemm per chunk, so every thread in play belongs to one pool.

Works with the OpenBLAS that NumPy wheels bundle (``scipy_openblas``, 64- or 32-bit integers, or a
classic ``openblas``); anywhere else ``gemm_nt`` falls back to ``np.matmul``. ``AVAILABLE`` says which.
Side effect: when found, NumPy's OpenBLAS runs on one thread in this process.
"""

from __future__ import annotations

import ctypes
import glob
import os
from collections.abc import Callable

import numpy as np

__all__ = ["AVAILABLE", "ATTN_CHUNK", "attention", "attention_supported", "gemm_nt", "set_blas_threads"]

#: query rows per attention work item (scores scratch: n_threads x ATTN_CHUNK x n_kv floats)
ATTN_CHUNK = 64

# (sgemm symbol, set-threads symbol, 64-bit integers)
_SYMBOLS = [
    ("scipy_cblas_sgemm64_", "scipy_openblas_set_num_threads64_", True),
    ("scipy_cblas_sgemm", "scipy_openblas_set_num_threads", False),
    ("cblas_sgemm64_", "openblas_set_num_threads64_", True),
]


def _candidates() -> list[str]:
    root = os.path.dirname(os.path.abspath(np.__file__))
    pats = [os.path.join(root, "..", "numpy.libs", "*openblas*"), os.path.join(root, ".dylibs", "*openblas*")]
    return sorted(p for pat in pats for p in glob.glob(pat))


def set_blas_threads(n: int) -> bool:
    """Let NumPy's OpenBLAS use ``n`` threads of its own again (for comparisons with plain NumPy, e.g.
    in benchmarks; llamapy's kernels assume 1). False where that OpenBLAS was not found."""
    if _FOUND is None:
        return False
    path, _, set_threads, _ = _FOUND
    getattr(ctypes.CDLL(path), set_threads)(int(n))
    return True


def _find() -> tuple[str, str, str, bool] | None:
    """(library path, sgemm symbol, set-threads symbol, 64-bit integers) of NumPy's OpenBLAS, which is
    left on one thread; None where not found."""
    if os.environ.get("LLAMAPY_NO_BLAS_POOL"):
        return None
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for sgemm, set_threads, ilp64 in _SYMBOLS:
            if hasattr(lib, sgemm) and hasattr(lib, set_threads):
                getattr(lib, set_threads)(1)
                return path, sgemm, set_threads, ilp64
    return None


def _build(found: tuple[str, str, str, bool]) -> tuple[Callable[..., None], Callable[..., None]]:
    from ..._numba import FAST_KEEP_INF, njit, prange  # first: it sets NUMBA_CACHE_DIR before Numba

    # isort: split
    import llvmlite.binding as llb
    from numba import types

    # sgemm, fexp and ftanh are module globals, not closure cells: Numba's cache index key pickles a
    # kernel's closure, and dispatchers and ExternalFunction types pickle differently in every process
    # (with them in the closure both kernels missed the cache each time: 3-5 s on a server's first prompt)
    global fexp, ftanh, sgemm
    from .vmath import fexp, ftanh

    path, name, _, ilp64 = found
    llb.load_library_permanently(path)
    it = types.int64 if ilp64 else types.int32
    i32, f32, ptr = types.int32, types.float32, types.intp
    sgemm = types.ExternalFunction(
        name, types.void(i32, i32, i32, it, it, it, f32, ptr, it, ptr, it, f32, ptr, it)
    )

    @njit(parallel=True, cache=True)
    def _gemm_nt(x, w, out, chunk):
        # out[M, N] (row stride ldo) = x[M, K] @ w[N, K].T; chunks of `chunk` rows of w, one per thread
        M, K = x.shape
        N = w.shape[0]
        ldx = x.strides[0] // 4
        ldw = w.strides[0] // 4
        ldo = out.strides[0] // 4
        for c in prange((N + chunk - 1) // chunk):
            r0 = c * chunk
            n = min(chunk, N - r0)
            sgemm(np.int32(101), np.int32(111), np.int32(112), it(M), it(n), it(K), np.float32(1.0),
                  x.ctypes.data, it(ldx), w.ctypes.data + r0 * ldw * 4, it(ldw), np.float32(0.0),
                  out.ctypes.data + r0 * 4, it(ldo))  # fmt: skip

    @njit(parallel=True, cache=True, fastmath=FAST_KEEP_INF, error_model="numpy")
    def _attn(q, k, v, mask, has_mask, scale, cap, slopes, S, out, chunk):
        # q[T, H, D], k[KV, Hkv, D], v[KV, Hkv, Dv], out[T, H, Dv]: unit last stride, row strides free;
        # mask[T, KV] (0 / -inf, times the head's ALiBi slope); S[n_threads, chunk, KV] scratch.
        # Work items are (query head, chunk of query rows), dealt round robin to the threads.
        T, H, D = q.shape
        KV, Hkv, _ = k.shape
        Dv = v.shape[2]
        g = H // Hkv
        nth = S.shape[0]
        nch = (T + chunk - 1) // chunk
        items = H * nch
        ninf = -np.inf
        for th in prange(nth):
            s = S[th]
            for item in range(th, items, nth):  # round robin: causal chunks cost more the later they are
                h = item // nch
                t0 = (item % nch) * chunk
                n = min(chunk, T - t0)
                hk = h // g
                # only the keys some row of this chunk sees (causal / sliding-window masks: a band)
                j0 = 0
                j1 = KV
                if has_mask:
                    j0 = KV
                    j1 = 0
                    for i in range(n):
                        for j in range(KV):
                            if mask[t0 + i, j] != ninf:
                                j0 = min(j0, j)
                                break
                        for j in range(KV - 1, -1, -1):
                            if mask[t0 + i, j] != ninf:
                                j1 = max(j1, j + 1)
                                break
                if j1 <= j0:  # every key masked for every row: zeros
                    for i in range(n):
                        for c in range(Dv):
                            out[t0 + i, h, c] = 0.0
                    continue
                nk = j1 - j0
                sgemm(np.int32(101), np.int32(111), np.int32(112), it(n), it(nk), it(D), np.float32(1.0),
                      q.ctypes.data + t0 * q.strides[0] + h * q.strides[1], it(q.strides[0] // 4),
                      k.ctypes.data + j0 * k.strides[0] + hk * k.strides[1], it(k.strides[0] // 4),
                      np.float32(0.0), s.ctypes.data, it(KV))  # fmt: skip
                sl = slopes[h]
                for i in range(n):
                    row = s[i]
                    mx = ninf
                    for j in range(nk):
                        x = row[j] * scale
                        if cap > 0:
                            x = cap * ftanh(x / cap)
                        if has_mask:
                            x += sl * mask[t0 + i, j0 + j]
                        row[j] = x
                        mx = max(mx, x)
                    if mx == ninf:
                        for j in range(nk):
                            row[j] = 0.0
                        continue
                    tot = np.float32(0.0)
                    for j in range(nk):
                        e = fexp(row[j] - mx)
                        row[j] = e
                        tot += e
                    inv = np.float32(1.0) / tot
                    for j in range(nk):
                        row[j] *= inv
                sgemm(np.int32(101), np.int32(111), np.int32(111), it(n), it(Dv), it(nk), np.float32(1.0),
                      s.ctypes.data, it(KV), v.ctypes.data + j0 * v.strides[0] + hk * v.strides[1],
                      it(v.strides[0] // 4), np.float32(0.0),
                      out.ctypes.data + t0 * out.strides[0] + h * out.strides[1], it(out.strides[0] // 4))  # fmt: skip

    return _gemm_nt, _attn


_NO_MASK = np.zeros((1, 1), np.float32)  # a typed placeholder when there is no mask
_FOUND = _find()
AVAILABLE = _FOUND is not None
_kernel, _attn_kernel = _build(_FOUND) if _FOUND is not None else (None, None)


def gemm_nt(x: np.ndarray, w: np.ndarray, out: np.ndarray, n_threads: int) -> None:
    """``out = x @ w.T`` in float32: x[M, K], w[N, K] and out[M, N], each with unit stride along its
    rows (the row strides may be anything, e.g. a column slice of a wider ``out``)."""
    if (
        _kernel is None
        or x.strides[1] != 4
        or w.strides[1] != 4
        or out.strides[1] != 4
        or x.dtype != np.float32
        or w.dtype != np.float32
        or out.dtype != np.float32
    ):
        np.matmul(x, w.T, out=out)
        return
    N = w.shape[0]
    chunk = max(16, -(-N // max(1, n_threads)))
    _kernel(x, w, out, chunk)


def _f32_unit(*arrays: np.ndarray) -> bool:
    return all(
        a.dtype == np.float32 and a.strides[-1] == 4 and all(st % 4 == 0 for st in a.strides) for a in arrays
    )


def attention_supported(q: np.ndarray, k: np.ndarray, v: np.ndarray, out: np.ndarray) -> bool:
    """Whether ``attention`` can run these arrays (else use a NumPy path)."""
    return _attn_kernel is not None and _f32_unit(q, k, v, out)


def attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    mask: np.ndarray | None,
    scale: float,
    cap: float,
    slopes: np.ndarray,
    scores: np.ndarray,
    out: np.ndarray,
) -> None:
    """``out[T, H, Dv] = softmax(scale * q k^T (soft-capped by ``cap`` when > 0) + slope * mask) v`` per
    query head, K/V heads shared by ``H // Hkv`` query heads; ``scores`` is float32 scratch of shape
    ``[n_threads, ATTN_CHUNK, n_kv]``. Rows whose keys are all masked give zeros."""
    has_mask = mask is not None
    m = mask if has_mask else _NO_MASK
    _attn_kernel(q, k, v, m, has_mask, np.float32(scale), np.float32(cap), slopes, scores, out, ATTN_CHUNK)
