"""mul_mat and mul_mat_id: weights stay in their GGUF type and are dequantized in registers.

``mat_vec_k``: one thread per output value, the dot product of a weight row (any ``dq`` type) with an
F32/F16 activation row; it serves decode (few tokens) and every type. ``gemm_tiled_k``: the prompt path,
a shared-memory tiled GEMM whose weight tiles are dequantized on load. ``mul_mat_id_k``: MoE, one thread
per (token, slot, output row), the expert chosen by ``ids``. On a GPU with CuPy the backend may instead
dequantize a weight to F16 and call cuBLAS (``backend._gemm_cublas``).
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .dequant import dq, idx4, off4

TILE = 16


@cuda.jit(cache=True)
def mat_vec_k(t, n, K, a8, a16, a32, ao, ash, ast, bt, b8, b16, b32, bo, bst, o, oo, osh, ost):
    """``o[i0, i1, nn, m] = sum_k a[i0', i1', m, k] * b[i0, i1, nn, k]``; a's batch axes broadcast by
    repeat (ggml: ``i02 = i12 / (ne12 / ne02)``)."""
    for e in range(cuda.grid(1), n, cuda.gridsize(1)):
        i0, i1, nn, m = idx4(e, osh)
        ra = ao + off4(i0 // (osh[0] // ash[0]), i1 // (osh[1] // ash[1]), m, 0, ast)
        rb = bo + off4(i0, i1, nn, 0, bst)
        acc = np.float32(0.0)
        for k in range(K):
            acc += dq(t, a8, a16, a32, ra, k, ast[3]) * dq(bt, b8, b16, b32, rb, k, bst[3])
        o[(oo + off4(i0, i1, nn, m, ost)) // 4] = acc


@cuda.jit(cache=True)
def gemm_tiled_k(t, M, N, K, a8, a16, a32, ao, ars, ast, b, bo, brs, bst, o, oo, ors):
    """2-D ``o[N, M] = b[N, K] @ a[M, K].T`` with TILE x TILE blocks; a's tiles dequantized on load."""
    sa = cuda.shared.array((TILE, TILE), dtype=np.float32)
    sb = cuda.shared.array((TILE, TILE), dtype=np.float32)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    m = cuda.blockIdx.x * TILE + tx
    nn = cuda.blockIdx.y * TILE + ty
    acc = np.float32(0.0)
    for k0 in range(0, K, TILE):
        ma = cuda.blockIdx.x * TILE + ty  # row of a loaded by this thread
        if ma < M and k0 + tx < K:
            sa[ty, tx] = dq(t, a8, a16, a32, ao + ma * ars, k0 + tx, ast)
        else:
            sa[ty, tx] = 0.0
        if nn < N and k0 + tx < K:
            sb[ty, tx] = b[(bo + nn * brs + (k0 + tx) * bst) // 4]
        else:
            sb[ty, tx] = 0.0
        cuda.syncthreads()
        for kk in range(TILE):
            acc += sb[ty, kk] * sa[tx, kk]
        cuda.syncthreads()
    if m < M and nn < N:
        o[(oo + nn * ors) // 4 + m] = acc


@cuda.jit(cache=True)
def mul_mat_id_k(t, n, K, E, a8, a16, a32, ao, ast, b, bo, bsh, bst, ids, io, ist, o, oo, osh, ost, err):
    """``o[tt, u, m] = a[ids[tt, u], m] . b[tt, u or 0]``."""
    for e in range(cuda.grid(1), n, cuda.gridsize(1)):
        _, tt, u, m = idx4(e, osh)
        ex = ids[(io + tt * ist[2] + u * ist[3]) // 4]
        if ex < 0 or ex >= E:
            err[0] = 2
            err[1] = ex
            continue
        ra = ao + ex * ast[1] + m * ast[2]
        rb = bo + tt * bst[1] + (u if bsh[2] > 1 else 0) * bst[2]
        acc = np.float32(0.0)
        for k in range(K):
            acc += dq(t, a8, a16, a32, ra, k, ast[3]) * b[(rb + k * bst[3]) // 4]
        o[(oo + tt * ost[1] + u * ost[2] + m * ost[3]) // 4] = acc


WARP = 32


@cuda.jit(cache=True)
def mat_vec_block_k(t, n, K, a8, a16, a32, ao, ash, ast, bt, b8, b16, b32, bo, bst, o, oo, osh, ost):
    """``mat_vec_k`` with one block of WARP threads per output: the threads stride over the row
    (neighbouring threads read neighbouring bytes) and reduce in shared memory. The GPU decode path."""
    sm = cuda.shared.array(WARP, dtype=np.float32)
    tid = cuda.threadIdx.x
    for e in range(cuda.blockIdx.x, n, cuda.gridDim.x):
        i0, i1, nn, m = idx4(e, osh)
        ra = ao + off4(i0 // (osh[0] // ash[0]), i1 // (osh[1] // ash[1]), m, 0, ast)
        rb = bo + off4(i0, i1, nn, 0, bst)
        acc = np.float32(0.0)
        for k in range(tid, K, WARP):
            acc += dq(t, a8, a16, a32, ra, k, ast[3]) * dq(bt, b8, b16, b32, rb, k, bst[3])
        sm[tid] = acc
        cuda.syncthreads()
        s = WARP // 2
        while s > 0:
            if tid < s:
                sm[tid] += sm[tid + s]
            cuda.syncthreads()
            s //= 2
        if tid == 0:
            o[(oo + off4(i0, i1, nn, m, ost)) // 4] = sm[0]
        cuda.syncthreads()


@cuda.jit(cache=True)
def dequant_rows_k(t, n, K, a8, a16, a32, ao, ars, o, oo):
    """Rows of a 2-D weight (any ``dq`` type) into a contiguous F32 ``[M, K]`` scratch (for cuBLAS)."""
    for e in range(cuda.grid(1), n, cuda.gridsize(1)):
        m = e // K
        k = e % K
        o[oo // 4 + e] = dq(t, a8, a16, a32, ao + m * ars, k, 4 if t == 0 else 2)
