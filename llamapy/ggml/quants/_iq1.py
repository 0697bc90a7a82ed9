"""IQ1_S quantization: llama.cpp's ``quantize_row_iq1_s_impl`` (exhaustive split search over sorted
values, then the 2048-point grid) ported to Numba block by block, float32 operations in C order.
Needs importance weights, as in llama.cpp.
"""

from __future__ import annotations

import numpy as np

from ..._numba import njit
from ._iq2 import _inputs, _point8, iq2_data
from ._iq3 import _nearest_int
from .base import to_f16_bytes

F32 = np.float32
FLT_MAX = np.float32(3.4028234663852886e38)
IQ1S_DELTA = np.float32(0.125)


@njit(cache=True)
def _best_neighbour2(neigh, start, grid, xb, xo, weight, scale, xg, L, lo):
    """``iq1_find_best_neighbour2``: the listed grid point closest to ``xb`` with values ``xg``."""
    n = np.int64(neigh[start])
    best = FLT_MAX
    gi = -1
    for j in range(1, n + 1):
        idx = np.int64(neigh[start + j])
        d2 = F32(0)
        for i in range(8):
            q = xg[(grid[idx, i] - 1) // 2]
            diff = scale * q - xb[xo + i]
            d2 += weight[lo + i] * diff * diff
        if d2 < best:
            best = d2
            gi = idx
    if gi < 0:  # only for non-finite inputs: search the whole grid
        for idx in range(grid.shape[0]):
            d2 = F32(0)
            for i in range(8):
                q = xg[(grid[idx, i] - 1) // 2]
                diff = scale * q - xb[xo + i]
                d2 += weight[lo + i] * diff * diff
            if d2 < best:
                best = d2
                gi = idx
        if gi < 0:
            gi = 0
    for i in range(8):
        L[lo + i] = (grid[gi, i] - 1) // 2
    return gi


@njit(cache=True, nogil=True)
def _iq1s_blocks(x, qw, grid, kmap, neigh, qs, qh, dout):
    x_p = np.array([F32(-1) + IQ1S_DELTA, IQ1S_DELTA, F32(1) + IQ1S_DELTA], dtype=np.float32)
    x_m = np.array([F32(-1) - IQ1S_DELTA, -IQ1S_DELTA, F32(1) - IQ1S_DELTA], dtype=np.float32)
    for ibl in range(x.shape[0]):
        xbl = x[ibl]
        weight = np.empty(32, np.float32)
        sumx = np.zeros(33, np.float32)
        sumw = np.zeros(33, np.float32)
        L = np.zeros(32, np.int64)
        index = np.zeros(4, np.int64)
        scales = np.zeros(8, np.float32)
        shifts = np.zeros(8, np.int64)
        sumx2 = F32(0)
        for i in range(256):
            sumx2 += xbl[i] * xbl[i]
        sigma2 = F32(2) * sumx2 / F32(256)
        max_scale = F32(0)
        for ib in range(8):
            o = 32 * ib
            for i in range(32):
                weight[i] = qw[ibl, o + i] * np.sqrt(sigma2 + xbl[o + i] * xbl[o + i])
            mx = np.abs(xbl[o])
            for i in range(1, 32):
                a = np.abs(xbl[o + i])
                mx = a if a > mx else mx
            if mx < F32(1e-12):
                scales[ib] = F32(0)
                shifts[ib] = 1
                continue
            idx = np.argsort(xbl[o : o + 32], kind="mergesort")  # glibc's qsort here is a stable merge sort
            sumx[0] = F32(0)
            sumw[0] = F32(0)
            for j in range(32):
                i = idx[j]
                sumx[j + 1] = sumx[j] + weight[i] * xbl[o + i]
                sumw[j + 1] = sumw[j] + weight[i]
            best_score = -FLT_MAX
            scale = mx
            besti1 = -1
            besti2 = -1
            best_shift = 0
            for i1 in range(33):
                for i2 in range(i1, 33):
                    a0 = sumx[i1] - sumx[0]
                    a1 = sumx[i2] - sumx[i1]
                    a2 = sumx[32] - sumx[i2]
                    w0 = sumw[i1] - sumw[0]
                    w1 = sumw[i2] - sumw[i1]
                    w2 = sumw[32] - sumw[i2]
                    sumqx = a0 * x_p[0] + a1 * x_p[1] + a2 * x_p[2]
                    sumq2 = w0 * x_p[0] * x_p[0] + w1 * x_p[1] * x_p[1] + w2 * x_p[2] * x_p[2]
                    if sumq2 > 0 and sumqx * sumqx > best_score * sumq2:
                        scale = sumqx / sumq2
                        best_score = scale * sumqx
                        besti1 = i1
                        besti2 = i2
                        best_shift = 1
                    sumqx = a0 * x_m[0] + a1 * x_m[1] + a2 * x_m[2]
                    sumq2 = w0 * x_m[0] * x_m[0] + w1 * x_m[1] * x_m[1] + w2 * x_m[2] * x_m[2]
                    if sumq2 > 0 and sumqx * sumqx > best_score * sumq2:
                        scale = sumqx / sumq2
                        best_score = scale * sumqx
                        besti1 = i1
                        besti2 = i2
                        best_shift = -1
            if besti1 < 0 or besti2 < 0 or best_shift == 0:
                scales[ib] = F32(0)
                shifts[ib] = 1
                continue
            for j in range(32):
                L[idx[j]] = 0 if j < besti1 else (1 if j < besti2 else 2)
            if scale < 0:
                for j in range(32):
                    L[j] = 2 - L[j]
                scale = -scale
                best_shift = -best_shift
            xx = x_p if best_shift == 1 else x_m
            all_on_grid = True
            for k in range(4):
                u = _point8(L, 8 * k)
                gi = np.int64(kmap[u])
                if gi < 0:
                    all_on_grid = False
                    gi = _best_neighbour2(
                        neigh, -kmap[u] - 1, grid, xbl, o + 8 * k, weight, scale, xx, L, 8 * k
                    )
                index[k] = gi
            if not all_on_grid:
                sumqx = F32(0)
                sumq2 = F32(0)
                for k in range(4):
                    for j in range(8):
                        w = weight[8 * k + j]
                        q = xx[(grid[index[k], j] - 1) // 2]
                        sumqx += w * q * xbl[o + 8 * k + j]
                        sumq2 += w * q * q
                if sumqx > 0 and sumq2 > 0:
                    scale = sumqx / sumq2
            h = 0
            for k in range(4):
                qs[ibl, 4 * ib + k] = index[k] & 255
                h |= (index[k] >> 8) << (3 * k)
            qh[ibl, ib] = h
            scales[ib] = scale
            shifts[ib] = best_shift
            max_scale = scale if scale > max_scale else max_scale
        if max_scale == 0:
            dout[ibl] = F32(0)
            continue
        d = max_scale / F32(15)
        dout[ibl] = d * F32(1.125)
        idv = F32(1) / d
        for ib in range(8):
            l = _nearest_int(F32(0.5) * (idv * scales[ib] - F32(1)))
            l = max(0, min(7, l))
            if shifts[ib] == -1:
                l |= 8
            qh[ibl, ib] |= l << 12


def quantize_iq1_s(x: np.ndarray, qw: np.ndarray | None = None, sigma2=None) -> np.ndarray:
    x, qw = _inputs(x, qw, "IQ1_S")
    grid, kmap, neigh = iq2_data(2048)
    nb = x.shape[0]
    qs = np.zeros((nb, 32), np.int64)
    qh = np.zeros((nb, 8), np.int64)
    d = np.zeros(nb, np.float32)
    _iq1s_blocks(x, qw, grid, kmap, neigh, qs, qh, d)
    return np.concatenate(
        [to_f16_bytes(d[:, None]), qs.astype(np.uint8), qh.astype("<u2").view(np.uint8)], axis=-1
    )


@njit(cache=True, inline="always")
def _iq1m_xx(best_k, k, x_p, x_m):
    if k == 0:
        return x_p if best_k < 2 else x_m
    return x_p if best_k % 2 == 0 else x_m


@njit(cache=True, nogil=True)
def _iq1m_blocks(x, qw, has_qw, grid, kmap, neigh, qs, qh, sc, dout):
    """IQ1_M per super-block: ``qs[nb, 32]``, ``qh[nb, 16]``, the 3-bit scales in ``sc[nb, 4]`` (uint16
    words, top nibbles left for the half-float scale) and that scale ``dout[nb]`` (before rounding)."""
    x_p = np.array([F32(-1) + IQ1S_DELTA, IQ1S_DELTA, F32(1) + IQ1S_DELTA], dtype=np.float32)
    x_m = np.array([F32(-1) - IQ1S_DELTA, -IQ1S_DELTA, F32(1) - IQ1S_DELTA], dtype=np.float32)
    masks = np.array([0x00, 0x80, 0x08, 0x88], dtype=np.int64)
    p2 = x_p[2]
    m2 = x_m[2]
    cp1 = x_p[0] * x_p[0] - x_p[1] * x_p[1]
    cp2 = x_p[1] * x_p[1] - x_p[2] * x_p[2]
    cm1 = x_m[0] * x_m[0] - x_m[1] * x_m[1]
    cm2 = x_m[1] * x_m[1] - x_m[2] * x_m[2]
    for ibl in range(x.shape[0]):
        xbl = x[ibl]
        weight = np.empty(16, np.float32)
        px = np.zeros((2, 17), np.float32)
        pw = np.zeros((2, 17), np.float32)
        sumqx = np.zeros(4, np.float32)
        sumq2 = np.zeros(4, np.float32)
        L = np.zeros(16, np.int64)
        index = np.zeros(2, np.int64)
        scales = np.zeros(16, np.float32)
        shifts = np.zeros(16, np.int64)
        sumx2 = F32(0)
        for i in range(256):
            sumx2 += xbl[i] * xbl[i]
        sigma2 = F32(2) * sumx2 / F32(256)
        max_scale = F32(0)
        for ib in range(16):
            o = 16 * ib
            for i in range(16):
                if has_qw:
                    weight[i] = qw[ibl, o + i] * np.sqrt(sigma2 + xbl[o + i] * xbl[o + i])
                else:
                    weight[i] = xbl[o + i] * xbl[o + i]
            mx = np.abs(xbl[o])
            for i in range(1, 16):
                a = np.abs(xbl[o + i])
                mx = a if a > mx else mx
            if mx < F32(1e-7):
                scales[ib] = F32(0)
                shifts[ib] = 0
                continue
            idx = np.argsort(xbl[o : o + 16], kind="mergesort")
            for h in range(2):
                px[h, 0] = F32(0)
                pw[h, 0] = F32(0)
            for j in range(16):
                i = idx[j]
                h = 0 if i < 8 else 1
                px[h, j + 1] = px[h, j] + weight[i] * xbl[o + i]
                px[1 - h, j + 1] = px[1 - h, j]
                pw[h, j + 1] = pw[h, j] + weight[i]
                pw[1 - h, j + 1] = pw[1 - h, j]
            txs0 = px[0, 16]
            txs1 = px[1, 16]
            tws0 = pw[0, 16]
            tws1 = pw[1, 16]
            best_score = -FLT_MAX
            scale = mx
            besti1 = -1
            besti2 = -1
            best_k = -1
            for i1 in range(17):
                for i2 in range(i1, 17):
                    sx0 = px[0, i1] + px[0, i2]
                    sx1 = px[1, i1] + px[1, i2]
                    qxp0 = txs0 * p2 - sx0
                    qxm0 = txs0 * m2 - sx0
                    qxp1 = txs1 * p2 - sx1
                    qxm1 = txs1 * m2 - sx1
                    q2p0 = tws0 * p2 * p2 + pw[0, i1] * cp1 + pw[0, i2] * cp2
                    q2m0 = tws0 * m2 * m2 + pw[0, i1] * cm1 + pw[0, i2] * cm2
                    q2p1 = tws1 * p2 * p2 + pw[1, i1] * cp1 + pw[1, i2] * cp2
                    q2m1 = tws1 * m2 * m2 + pw[1, i1] * cm1 + pw[1, i2] * cm2
                    sumqx[0] = qxp0 + qxp1
                    sumqx[1] = qxp0 + qxm1
                    sumqx[2] = qxm0 + qxp1
                    sumqx[3] = qxm0 + qxm1
                    sumq2[0] = q2p0 + q2p1
                    sumq2[1] = q2p0 + q2m1
                    sumq2[2] = q2m0 + q2p1
                    sumq2[3] = q2m0 + q2m1
                    for k in range(4):
                        if sumq2[k] > 0 and sumqx[k] * sumqx[k] > best_score * sumq2[k]:
                            scale = sumqx[k] / sumq2[k]
                            best_score = scale * sumqx[k]
                            besti1 = i1
                            besti2 = i2
                            best_k = k
            if besti1 < 0 or besti2 < 0 or best_k < 0:
                scales[ib] = F32(0)
                shifts[ib] = 0
                continue
            for j in range(16):
                L[idx[j]] = 0 if j < besti1 else (1 if j < besti2 else 2)
            if scale < 0:
                for j in range(16):
                    L[j] = 2 - L[j]
                scale = -scale
                best_k = 3 - best_k
            all_on_grid = True
            for k in range(2):
                xx = _iq1m_xx(best_k, k, x_p, x_m)
                u = _point8(L, 8 * k)
                gi = np.int64(kmap[u])
                if gi < 0:
                    all_on_grid = False
                    gi = _best_neighbour2(
                        neigh, -kmap[u] - 1, grid, xbl, o + 8 * k, weight, scale, xx, L, 8 * k
                    )
                index[k] = gi
            if not all_on_grid:
                sqx = F32(0)
                sq2 = F32(0)
                for k in range(2):
                    xx = _iq1m_xx(best_k, k, x_p, x_m)
                    for j in range(8):
                        w = weight[8 * k + j]
                        q = xx[(grid[index[k], j] - 1) // 2]
                        sqx += w * q * xbl[o + 8 * k + j]
                        sq2 += w * q * q
                if sqx > 0 and sq2 > 0:
                    scale = sqx / sq2
            qs[ibl, 2 * ib] = index[0] & 255
            qs[ibl, 2 * ib + 1] = index[1] & 255
            qh[ibl, ib] = (index[0] >> 8) | ((index[1] >> 8) << 4)
            scales[ib] = scale
            shifts[ib] = best_k
            max_scale = scale if scale > max_scale else max_scale
        if max_scale == 0:
            dout[ibl] = F32(0)
            continue
        d = max_scale / F32(15)
        idv = F32(1) / d
        sqx = F32(0)
        sq2 = F32(0)
        for ib in range(16):
            l = _nearest_int(F32(0.5) * (idv * scales[ib] - F32(1)))
            l = max(0, min(7, l))
            sc[ibl, ib // 4] |= np.int64(l) << (3 * (ib % 4))
            qh[ibl, ib] |= masks[shifts[ib]]
            o = 16 * ib
            for i in range(16):
                if has_qw:
                    weight[i] = qw[ibl, o + i] * np.sqrt(sigma2 + xbl[o + i] * xbl[o + i])
                else:
                    weight[i] = xbl[o + i] * xbl[o + i]
            for k in range(2):
                xx = _iq1m_xx(shifts[ib], k, x_p, x_m)
                gi = qs[ibl, 2 * ib + k] + ((qh[ibl, ib] << (8 - 4 * k)) & 0x700)
                for j in range(8):
                    w = weight[8 * k + j]
                    q = xx[(grid[gi, j] - 1) // 2] * F32(2 * l + 1)
                    sqx += w * q * xbl[o + 8 * k + j]
                    sq2 += w * q * q
        if sq2 > 0:
            d = sqx / sq2
        dout[ibl] = d * F32(1.1125)


def quantize_iq1_m(x: np.ndarray, qw: np.ndarray | None = None, sigma2=None) -> np.ndarray:
    """IQ1_M (importance weights optional in this llama.cpp version)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    grid, kmap, neigh = iq2_data(2048)
    nb = x.shape[0]
    qwa = np.ascontiguousarray(qw, dtype=np.float32) if qw is not None else np.zeros((1, 1), np.float32)
    qs = np.zeros((nb, 32), np.int64)
    qh = np.zeros((nb, 16), np.int64)
    sc = np.zeros((nb, 4), np.int64)
    d = np.zeros(nb, np.float32)
    _iq1m_blocks(x, qwa, qw is not None, grid, kmap, neigh, qs, qh, sc, d)
    # the half-float scale goes, a nibble each, into the top of the four scale words
    bits = np.where(d != 0, d, np.float32(0)).astype("<f2").view("<u2").astype(np.int64)[:, None]
    bits = np.where((d != 0)[:, None], bits, 0)
    sc |= ((bits >> (4 * np.arange(4))) & 0xF) << 12
    return np.concatenate(
        [qs.astype(np.uint8), qh.astype(np.uint8), sc.astype("<u2").view(np.uint8)], axis=-1
    )
