"""IQ3_XXS and IQ3_S quantization: llama.cpp's ``iq3xs_init_impl`` (grid, map and neighbour lists) and
``quantize_row_iq3_xxs_impl`` / ``quantize_row_iq3_s_impl``, ported to Numba (serial: a quick compile matters more here than speed) one block at a time with
the C code's float32 operations in its order (a lattice search does not vectorize over blocks).
"""

from __future__ import annotations

from functools import cache

import numpy as np

from ..._numba import njit
from . import iq_tables as T
from .base import to_f16_bytes

F32 = np.float32
FLT_MAX = np.float32(3.4028234663852886e38)


@cache
def iq3_data(grid_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(grid int8[g, 4] of 2l+1 values, kmap int32[4096], neighbours uint16[m])`` as ``iq3xs_init_impl``
    builds them: ``kmap[u] >= 0`` is the grid index of point ``u``; otherwise ``neighbours[-kmap[u]-1]``
    counts the grid indices that follow, the points at the ``nwant`` smallest distances, by (d2, index)."""
    kgrid = T.KGRID_IQ3_256 if grid_size == 256 else T.KGRID_IQ3_512
    nwant = 2 if grid_size == 256 else 3
    l = (kgrid.astype(np.int32)[:, None] >> (3 * np.arange(4))) & 7
    grid = (2 * l + 1).astype(np.int8)
    kmap = np.full(4096, -1, dtype=np.int32)
    kmap[kgrid.astype(np.int64)] = np.arange(grid_size, dtype=np.int32)
    missing = np.flatnonzero(kmap < 0)
    pos = 2 * ((missing[:, None] >> (3 * np.arange(4))) & 7) + 1  # [m, 4]
    d2 = ((grid[None, :, :].astype(np.int32) - pos[:, None, :]) ** 2).sum(axis=-1)  # [m, g]
    neigh: list[int] = []
    for r, i in enumerate(missing):
        order = np.lexsort((np.arange(grid_size), d2[r]))  # by distance, then index (like the qsort)
        ds = d2[r][order]
        distinct = np.unique(ds)[:nwant]
        n = int(np.count_nonzero(ds <= distinct[-1]))
        kmap[i] = -(len(neigh) + 1)
        neigh.append(n)
        neigh.extend(order[:n].tolist())
    return grid, kmap, np.array(neigh, dtype=np.uint16)


@njit(cache=True, inline="always")
def _nearest_int(v):
    return np.int32(np.rint(v))


@njit(cache=True)
def _best_neighbour(neigh, start, grid, xval, waux, off, scale, L):
    n = np.int64(neigh[start])
    best_d2 = FLT_MAX
    gi = -1
    for j in range(1, n + 1):
        idx = np.int64(neigh[start + j])
        d2 = F32(0)
        for i in range(4):
            diff = scale * F32(grid[idx, i]) - xval[off + i]
            d2 += waux[off + i] * diff * diff
        if d2 < best_d2:
            best_d2 = d2
            gi = idx
    for i in range(4):
        L[off + i] = (grid[gi, i] - 1) // 2
    return gi


@njit(cache=True)
def _point(L, off):
    u = 0
    for i in range(4):
        u |= np.int64(L[off + i]) << (3 * i)
    return u


@njit(cache=True, nogil=True)
def _iq3_blocks(x, qw, has_qw, grid, kmap, neigh, qidx, sas, dout):
    """Per super-block: grid indices ``qidx[nb, 64]`` (uint16), ``sas[nb, 8]`` (signs | scale << 28),
    and the stored scale ``dout[nb]`` (0 for an all-zero block)."""
    kmaxq = 8
    for ibl in range(x.shape[0]):
        xbl = x[ibl]
        weight = np.empty(32, np.float32)
        waux = np.empty(32, np.float32)
        xval = np.empty(32, np.float32)
        L = np.zeros(32, np.int32)
        Laux = np.zeros(32, np.int32)
        on_grid = np.ones(8, np.bool_)
        on_grid_aux = np.ones(8, np.bool_)
        bsigns = np.zeros(4, np.int64)
        scales = np.zeros(8, np.float32)
        sumx2 = F32(0)
        for i in range(256):
            sumx2 += xbl[i] * xbl[i]
        sigma2 = F32(2) * sumx2 / F32(256)
        max_scale = F32(0)
        for ib in range(8):
            o = 32 * ib
            for i in range(32):
                if has_qw:
                    weight[i] = qw[ibl, o + i] * np.sqrt(sigma2 + xbl[o + i] * xbl[o + i])
                else:
                    weight[i] = xbl[o + i] * xbl[o + i]
            for i in range(32):
                waux[i] = np.sqrt(weight[i])
            for k in range(4):
                nflip = 0
                s = 0
                for i in range(8):
                    v = xbl[o + 8 * k + i]
                    if v >= 0:
                        xval[8 * k + i] = v
                    else:
                        xval[8 * k + i] = -v
                        nflip += 1
                        s |= 1 << i
                if nflip % 2:
                    imin = 0
                    v0 = xbl[o + 8 * k]
                    mn = weight[8 * k] * v0 * v0
                    for i in range(1, 8):
                        v = xbl[o + 8 * k + i]
                        ax = weight[8 * k + i] * v * v
                        if ax < mn:
                            mn = ax
                            imin = i
                    xval[8 * k + imin] = -xval[8 * k + imin]
                    s ^= 1 << imin
                bsigns[k] = s & 127
            mx = xval[0]
            for i in range(1, 32):
                mx = xval[i] if xval[i] > mx else mx
            for i in range(32):
                L[i] = 0
            if mx < F32(1e-8):
                scales[ib] = F32(0)
                continue
            best = F32(0)
            scale = mx / F32(2 * kmaxq - 1)
            for k in range(8):
                on_grid[k] = True
            for is_ in range(-15, 16):
                idv = (F32(2 * kmaxq - 1) + F32(is_) * F32(0.2)) / mx
                this_scale = F32(1) / idv
                for k in range(8):
                    for i in range(4):
                        l = _nearest_int(F32(0.5) * (idv * xval[4 * k + i] - F32(1)))
                        Laux[4 * k + i] = max(0, min(kmaxq - 1, l))
                    u = _point(Laux, 4 * k)
                    on_grid_aux[k] = True
                    if kmap[u] < 0:
                        on_grid_aux[k] = False
                        _best_neighbour(neigh, -kmap[u] - 1, grid, xval, waux, 4 * k, this_scale, Laux)
                sumqx = F32(0)
                sumq2 = F32(0)
                for i in range(32):
                    w = weight[i]
                    q = F32(2 * Laux[i] + 1)
                    sumqx += w * xval[i] * q
                    sumq2 += w * q * q
                if sumq2 > 0 and sumqx * sumqx > best * sumq2:
                    scale = sumqx / sumq2
                    best = scale * sumqx
                    for i in range(32):
                        L[i] = Laux[i]
                    for k in range(8):
                        on_grid[k] = on_grid_aux[k]
            n_not = 0
            for k in range(8):
                if not on_grid[k]:
                    n_not += 1
            if n_not > 0 and scale > 0:
                idv = F32(1) / scale
                for k in range(8):
                    if on_grid[k]:
                        continue
                    u = 0
                    for i in range(4):
                        l = _nearest_int(F32(0.5) * (idv * xval[4 * k + i] - F32(1)))
                        l = max(0, min(kmaxq - 1, l))
                        u |= np.int64(l) << (3 * i)
                    gi = np.int64(kmap[u])
                    if gi < 0:
                        gi = _best_neighbour(neigh, -kmap[u] - 1, grid, xval, waux, 4 * k, scale, L)
                    for i in range(4):
                        L[4 * k + i] = (grid[gi, i] - 1) // 2
                sumqx = F32(0)
                sumq2 = F32(0)
                for i in range(32):
                    w = weight[i]
                    q = F32(2 * L[i] + 1)
                    sumqx += w * xval[i] * q
                    sumq2 += w * q * q
                if sumq2 > 0:
                    scale = sumqx / sumq2
            if scale < 0:
                scale = -scale
                for k in range(4):
                    bsigns[k] = (~bsigns[k]) & 127
            for k in range(8):
                qidx[ibl, 8 * ib + k] = kmap[_point(L, 4 * k)]
            sas[ibl, ib] = bsigns[0] | (bsigns[1] << 7) | (bsigns[2] << 14) | (bsigns[3] << 21)
            scales[ib] = scale
            max_scale = scale if scale > max_scale else max_scale
        if max_scale == 0:
            dout[ibl] = F32(0)
            for i in range(64):
                qidx[ibl, i] = 0
            for ib in range(8):
                sas[ibl, ib] = 0
            continue
        d = max_scale / F32(31)
        dout[ibl] = d * F32(1.0125)
        idv = F32(1) / d
        for ib in range(8):
            l = _nearest_int(F32(0.5) * (idv * scales[ib] - F32(1)))
            l = max(0, min(15, l))
            sas[ibl, ib] |= np.int64(l) << 28


def _search(x: np.ndarray, qw: np.ndarray | None, grid_size: int):
    grid, kmap, neigh = iq3_data(grid_size)
    nb = x.shape[0]
    x = np.ascontiguousarray(x, dtype=np.float32)
    qwa = np.ascontiguousarray(qw, dtype=np.float32) if qw is not None else np.zeros((1, 1), np.float32)
    qidx = np.zeros((nb, 64), np.int32)
    sas = np.zeros((nb, 8), np.int64)
    d = np.zeros(nb, np.float32)
    _iq3_blocks(x, qwa, qw is not None, grid, kmap, neigh, qidx, sas, d)
    return qidx, sas, d


def quantize_iq3_xxs(x: np.ndarray, qw: np.ndarray | None = None, sigma2=None) -> np.ndarray:
    qidx, sas, d = _search(x, qw, 256)
    return np.concatenate(
        [to_f16_bytes(d[:, None]), qidx.astype(np.uint8), sas.astype("<u4").view(np.uint8)], axis=-1
    )


@njit(cache=True, nogil=True)
def _iq3s_blocks(x, qw, has_qw, grid, kmap, neigh, qs, qh, signs, scl, dout):
    """Per super-block of IQ3_S: ``qs[nb, 64]``, ``qh[nb, 8]``, ``signs[nb, 32]``, ``scl[nb, 4]`` (all
    zero on entry) and the stored scale ``dout[nb]``. Like llama.cpp, a sub-block of zeros is skipped
    without advancing the qs/signs write positions."""
    kmaxq = 8
    for ibl in range(x.shape[0]):
        xbl = x[ibl]
        weight = np.empty(32, np.float32)
        waux = np.empty(32, np.float32)
        xval = np.empty(32, np.float32)
        L = np.zeros(32, np.int32)
        Laux = np.zeros(32, np.int32)
        on_grid = np.zeros(8, np.bool_)
        on_grid_aux = np.zeros(8, np.bool_)
        bsigns = np.zeros(4, np.int64)
        scales = np.zeros(8, np.float32)
        sumx2 = F32(0)
        for i in range(256):
            sumx2 += xbl[i] * xbl[i]
        sigma2 = F32(2) * sumx2 / F32(256)
        max_scale = F32(0)
        qpos = 0
        spos = 0
        for ib in range(8):
            o = 32 * ib
            for i in range(32):
                if has_qw:
                    weight[i] = qw[ibl, o + i] * np.sqrt(sigma2 + xbl[o + i] * xbl[o + i])
                else:
                    weight[i] = xbl[o + i] * xbl[o + i]
            for i in range(32):
                waux[i] = np.sqrt(weight[i])
            for k in range(4):
                s = 0
                for i in range(8):
                    v = xbl[o + 8 * k + i]
                    if v >= 0:
                        xval[8 * k + i] = v
                    else:
                        xval[8 * k + i] = -v
                        s |= 1 << i
                bsigns[k] = s
            mx = xval[0]
            for i in range(1, 32):
                mx = xval[i] if xval[i] > mx else mx
            for i in range(32):
                L[i] = 0
            if mx == 0:
                scales[ib] = F32(0)
                continue
            best = F32(0)
            scale = mx / F32(2 * kmaxq - 1)
            for k in range(8):
                on_grid[k] = False
            for is_ in range(-9, 10):
                idv = (F32(2 * kmaxq - 1) + F32(is_) * F32(0.2)) / mx
                this_scale = F32(1) / idv
                for k in range(8):
                    for i in range(4):
                        l = _nearest_int(F32(0.5) * (idv * xval[4 * k + i] - F32(1)))
                        Laux[4 * k + i] = max(0, min(kmaxq - 1, l))
                    u = _point(Laux, 4 * k)
                    on_grid_aux[k] = True
                    if kmap[u] < 0:
                        on_grid_aux[k] = False
                        _best_neighbour(neigh, -kmap[u] - 1, grid, xval, waux, 4 * k, this_scale, Laux)
                sumqx = F32(0)
                sumq2 = F32(0)
                for i in range(32):
                    w = weight[i]
                    q = F32(2 * Laux[i] + 1)
                    sumqx += w * xval[i] * q
                    sumq2 += w * q * q
                if sumq2 > 0 and sumqx * sumqx > best * sumq2:
                    scale = sumqx / sumq2
                    best = scale * sumqx
                    for i in range(32):
                        L[i] = Laux[i]
                    for k in range(8):
                        on_grid[k] = on_grid_aux[k]
            n_not = 0
            for k in range(8):
                if not on_grid[k]:
                    n_not += 1
            if n_not > 0 and scale > 0:
                idv = F32(1) / scale
                for k in range(8):  # every group, on the grid or not (as in llama.cpp)
                    u = 0
                    for i in range(4):
                        l = _nearest_int(F32(0.5) * (idv * xval[4 * k + i] - F32(1)))
                        l = max(0, min(kmaxq - 1, l))
                        u |= np.int64(l) << (3 * i)
                    gi = np.int64(kmap[u])
                    if gi < 0:
                        gi = _best_neighbour(neigh, -kmap[u] - 1, grid, xval, waux, 4 * k, scale, L)
                    for i in range(4):
                        L[4 * k + i] = (grid[gi, i] - 1) // 2
                sumqx = F32(0)
                sumq2 = F32(0)
                for i in range(32):
                    w = weight[i]
                    q = F32(2 * L[i] + 1)
                    sumqx += w * xval[i] * q
                    sumq2 += w * q * q
                if sumq2 > 0:
                    scale = sumqx / sumq2
            if scale < 0:
                scale = -scale
                for k in range(4):
                    bsigns[k] = (~bsigns[k]) & 255
            for k in range(8):
                gi = np.int64(kmap[_point(L, 4 * k)])
                qs[ibl, qpos + k] = gi & 255
                qh[ibl, (ib * 8 + k) // 8] |= (gi >> 8) << ((ib * 8 + k) % 8)
            qpos += 8
            for k in range(4):
                signs[ibl, spos + k] = bsigns[k]
            spos += 4
            scales[ib] = scale
            max_scale = scale if scale > max_scale else max_scale
        if max_scale == 0:
            dout[ibl] = F32(0)
            continue
        d = max_scale / F32(31)
        dout[ibl] = d * F32(1.033)
        idv = F32(1) / d
        for ib in range(0, 8, 2):
            l1 = _nearest_int(F32(0.5) * (idv * scales[ib] - F32(1)))
            l1 = max(0, min(15, l1))
            l2 = _nearest_int(F32(0.5) * (idv * scales[ib + 1] - F32(1)))
            l2 = max(0, min(15, l2))
            scl[ibl, ib // 2] = l1 | (l2 << 4)


def quantize_iq3_s(x: np.ndarray, qw: np.ndarray | None = None, sigma2=None) -> np.ndarray:
    grid, kmap, neigh = iq3_data(512)
    nb = x.shape[0]
    x = np.ascontiguousarray(x, dtype=np.float32)
    qwa = np.ascontiguousarray(qw, dtype=np.float32) if qw is not None else np.zeros((1, 1), np.float32)
    qs = np.zeros((nb, 64), np.int64)
    qh = np.zeros((nb, 8), np.int64)
    signs = np.zeros((nb, 32), np.int64)
    scl = np.zeros((nb, 4), np.int64)
    d = np.zeros(nb, np.float32)
    _iq3s_blocks(x, qwa, qw is not None, grid, kmap, neigh, qs, qh, signs, scl, d)
    parts = [qs, qh, signs, scl]
    return np.concatenate([to_f16_bytes(d[:, None])] + [p.astype(np.uint8) for p in parts], axis=-1)
