"""IQ2_XXS and IQ2_XS quantization: llama.cpp's ``iq2xs_init_impl`` (grid, map, neighbour lists) and
``quantize_row_iq2_xxs_impl`` / ``quantize_row_iq2_xs_impl`` ported to Numba block by block, with
the C code's float32 operations in its order. Both need importance weights (an imatrix), as in
llama.cpp.
"""

from __future__ import annotations

from functools import cache

import numpy as np

from ..._numba import njit
from . import iq_tables as T
from ._iq3 import _nearest_int
from .base import to_f16_bytes

F32 = np.float32
FLT_MAX = np.float32(3.4028234663852886e38)
GROUP_MAX_EPS = np.float32(1e-15)
KMAP_SIZE = 43692


@cache
def iq2_data(grid_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(grid int8[g, 8] of 2l+1 values, kmap int32[43692], neighbours uint16[m])`` like
    ``iq2xs_init_impl``. Neighbour lists are built only for the points a quantizer can ask for
    (coordinates 0..2, as kMaxQ = 3), which does not change any list."""
    if grid_size == 2048:  # IQ1_S / IQ1_M: kgrid_1bit_2048 is iq1s_grid + 1 per coordinate
        l = T.IQ1S_GRID.astype("<u8").view(np.int8).reshape((-1, 8)).astype(np.int64) + 1
        kgrid = (l << (2 * np.arange(8))).sum(axis=-1)
    else:
        kgrid = {256: T.KGRID_IQ2_256, 512: T.KGRID_IQ2_512, 1024: T.KGRID_IQ2_1024}[grid_size]
        l = (kgrid.astype(np.int64)[:, None] >> (2 * np.arange(8))) & 3
    nwant = {256: 2, 512: 2, 1024: 1, 2048: 3}[grid_size]
    grid = (2 * l + 1).astype(np.int8)
    kmap = np.full(KMAP_SIZE, -1, dtype=np.int32)
    kmap[kgrid.astype(np.int64)] = np.arange(grid_size, dtype=np.int32)
    digits = np.stack(np.meshgrid(*([np.arange(3)] * 8), indexing="ij"), axis=-1).reshape((-1, 8))
    pts = (digits << (2 * np.arange(8))).sum(axis=-1)
    missing = np.sort(pts[kmap[pts] < 0])
    neigh: list[int] = []
    gi = grid.astype(np.int32)
    for c in range(0, missing.size, 512):
        part = missing[c : c + 512]
        pos = 2 * ((part[:, None] >> (2 * np.arange(8))) & 3) + 1
        d2 = ((gi[None] - pos[:, None, :]) ** 2).sum(axis=-1)  # [p, g]
        key = d2.astype(np.int64) * grid_size + np.arange(grid_size)  # by distance, then index
        order = np.argsort(key, axis=-1)
        for r, i in enumerate(part):
            ds = d2[r][order[r]]
            distinct = np.unique(ds)[:nwant]
            n = int(np.count_nonzero(ds <= distinct[-1]))
            kmap[i] = -(len(neigh) + 1)
            neigh.append(n)
            neigh.extend(order[r, :n].tolist())
    return grid, kmap, np.array(neigh, dtype=np.uint16)


@njit(cache=True)
def _best_neighbour8(neigh, start, grid, xval, waux, off, scale, L):
    n = np.int64(neigh[start])
    best_d2 = FLT_MAX
    gi = -1
    for j in range(1, n + 1):
        idx = np.int64(neigh[start + j])
        d2 = F32(0)
        for i in range(8):
            diff = scale * F32(grid[idx, i]) - xval[off + i]
            d2 += waux[off + i] * diff * diff
        if d2 < best_d2:
            best_d2 = d2
            gi = idx
    for i in range(8):
        L[off + i] = (grid[gi, i] - 1) // 2
    return gi


@njit(cache=True)
def _point8(L, off):
    u = 0
    for i in range(8):
        u |= np.int64(L[off + i]) << (2 * i)
    return u


@njit(cache=True)
def _make_qp_quants(n, nmax, x, L, qw):
    """``make_qp_quants`` of ggml-quants.c (scalar)."""
    mx = F32(0)
    for i in range(n):
        mx = x[i] if x[i] > mx else mx
    if mx < GROUP_MAX_EPS:
        for i in range(n):
            L[i] = 0
        return F32(0)
    iscale = F32(nmax) / mx
    for i in range(n):
        L[i] = _nearest_int(iscale * x[i]) & 255
    scale = F32(1) / iscale
    best_mse = F32(0)
    for i in range(n):
        diff = x[i] - scale * F32(L[i])
        best_mse += qw[i] * diff * diff
    for is_ in range(-4, 5):
        if is_ == 0:
            continue
        iscale_is = (F32(0.1) * F32(is_) + F32(nmax)) / mx
        scale_is = F32(1) / iscale_is
        mse = F32(0)
        for i in range(n):
            l = min(nmax, _nearest_int(iscale_is * x[i]))
            diff = x[i] - scale_is * F32(l)
            mse += qw[i] * diff * diff
        if mse < best_mse:
            best_mse = mse
            iscale = iscale_is
    sumlx = F32(0)
    suml2 = F32(0)
    for i in range(n):
        l = min(nmax, _nearest_int(iscale * x[i]))
        L[i] = l & 255
        w = qw[i]
        sumlx += w * x[i] * F32(l)
        suml2 += w * F32(l) * F32(l)
    for _ in range(5):
        n_changed = 0
        for i in range(n):
            w = qw[i]
            li = F32(L[i])
            slx = sumlx - w * x[i] * li
            sl2 = suml2 - w * li * li
            if slx > 0 and sl2 > 0:
                new_l = min(nmax, _nearest_int(x[i] * sl2 / slx))
                if new_l != L[i]:
                    slx += w * x[i] * F32(new_l)
                    sl2 += w * F32(new_l) * F32(new_l)
                    if slx * slx * suml2 > sumlx * sumlx * sl2:
                        L[i] = new_l & 255  # C's L is uint8_t: -1 is kept as 255 (xval can be < 0)
                        sumlx = slx
                        suml2 = sl2
                        n_changed += 1
        if n_changed == 0:
            break
    return sumlx / suml2 if suml2 > 0 else F32(0)


@njit(cache=True, inline="always")
def _signs(xbl, o, weight, xval, k, wo):
    """xval = |x| for 8 values with an even number of sign flips (flip the cheapest one back)."""
    nflip = 0
    s = 0
    for i in range(8):
        v = xbl[o + 8 * k + i]
        if v >= 0:
            xval[wo + i] = v
        else:
            xval[wo + i] = -v
            nflip += 1
            s |= 1 << i
    if nflip % 2:
        imin = 0
        v0 = xbl[o + 8 * k]
        mn = weight[wo] * v0 * v0
        for i in range(1, 8):
            v = xbl[o + 8 * k + i]
            ax = weight[wo + i] * v * v
            if ax < mn:
                mn = ax
                imin = i
        xval[wo + imin] = -xval[wo + imin]
        s ^= 1 << imin
    return s & 127


@njit(cache=True, nogil=True)
def _iq2xxs_blocks(x, qw, grid, kmap, neigh, q2, dout):
    kmaxq = 3
    for ibl in range(x.shape[0]):
        xbl = x[ibl]
        weight = np.empty(32, np.float32)
        waux = np.empty(32, np.float32)
        xval = np.empty(32, np.float32)
        L = np.zeros(32, np.int64)
        Laux = np.zeros(32, np.int64)
        bsigns = np.zeros(4, np.int64)
        scales = np.zeros(8, np.float32)
        sumx2 = F32(0)
        for i in range(256):
            sumx2 += xbl[i] * xbl[i]
        sigma2 = sumx2 / F32(256)
        max_scale = F32(0)
        for ib in range(8):
            o = 32 * ib
            for i in range(32):
                weight[i] = qw[ibl, o + i] * np.sqrt(sigma2 + xbl[o + i] * xbl[o + i])
            for i in range(32):
                waux[i] = np.sqrt(weight[i])
            for k in range(4):
                bsigns[k] = _signs(xbl, o, weight, xval, k, 8 * k)
            mx = xval[0]
            for i in range(1, 32):
                mx = xval[i] if xval[i] > mx else mx
            if mx < GROUP_MAX_EPS:
                scales[ib] = F32(0)
                continue
            scale = _make_qp_quants(32, kmaxq + 1, xval, L, weight)
            eff_max = scale * F32(kmaxq)
            if eff_max <= 0:
                scales[ib] = F32(0)
                continue
            best = F32(0)
            for is_ in range(-6, 7):
                idv = (F32(2 * kmaxq - 1) + F32(is_) * F32(0.1)) / eff_max
                this_scale = F32(1) / idv
                for k in range(4):
                    for i in range(8):
                        l = _nearest_int(F32(0.5) * (idv * xval[8 * k + i] - F32(1)))
                        Laux[8 * k + i] = max(0, min(kmaxq - 1, l))
                    u = _point8(Laux, 8 * k)
                    if kmap[u] < 0:
                        _best_neighbour8(neigh, -kmap[u] - 1, grid, xval, waux, 8 * k, this_scale, Laux)
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
            if scale > 0:
                idv = F32(1) / scale
                for k in range(4):
                    u = 0
                    for i in range(8):
                        l = _nearest_int(F32(0.5) * (idv * xval[8 * k + i] - F32(1)))
                        l = max(0, min(kmaxq - 1, l))
                        u |= np.int64(l) << (2 * i)
                    gi = np.int64(kmap[u])
                    if gi < 0:
                        gi = _best_neighbour8(neigh, -kmap[u] - 1, grid, xval, waux, 8 * k, scale, L)
                    for i in range(8):
                        L[8 * k + i] = (grid[gi, i] - 1) // 2
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
            for k in range(4):
                q2[ibl, 2 * ib] |= np.int64(kmap[_point8(L, 8 * k)]) << (8 * k)
                q2[ibl, 2 * ib + 1] |= bsigns[k] << (7 * k)
            scales[ib] = scale
            max_scale = scale if scale > max_scale else max_scale
        if max_scale == 0:
            dout[ibl] = F32(0)
            for i in range(16):
                q2[ibl, i] = 0
            continue
        d = max_scale / F32(31)
        dout[ibl] = d
        idv = F32(1) / d
        for ib in range(8):
            l = _nearest_int(F32(0.5) * (idv * scales[ib] - F32(1)))
            l = max(0, min(15, l))
            q2[ibl, 2 * ib + 1] |= np.int64(l) << 28


@njit(cache=True, nogil=True)
def _iq2xs_blocks(x, qw, has_qw, is_s, grid, kmap, neigh, gidx, sgn, ls, dout):
    """IQ2_XS (``is_s`` False) or IQ2_S (True) per super-block: grid index ``gidx[nb, 32]`` and sign
    byte ``sgn[nb, 32]`` of each 8 values, 4-bit scales ``ls[nb, 16]`` and the stored scale ``dout``."""
    kmaxq = 3
    eps = F32(1e-8) if is_s else GROUP_MAX_EPS
    for ibl in range(x.shape[0]):
        xbl = x[ibl]
        weight = np.empty(16, np.float32)
        waux = np.empty(16, np.float32)
        xval = np.empty(16, np.float32)
        L = np.zeros(16, np.int64)
        Laux = np.zeros(16, np.int64)
        on_grid = np.ones(2, np.bool_)
        on_grid_aux = np.ones(2, np.bool_)
        bsigns = np.zeros(2, np.int64)
        scales = np.zeros(16, np.float32)
        sumx2 = F32(0)
        for i in range(256):
            sumx2 += xbl[i] * xbl[i]
        sigma2 = (F32(2) * sumx2 if is_s else sumx2) / F32(256)
        max_scale = F32(0)
        for ib in range(16):
            o = 16 * ib
            for i in range(16):
                if has_qw:
                    weight[i] = qw[ibl, o + i] * np.sqrt(sigma2 + xbl[o + i] * xbl[o + i])
                else:
                    weight[i] = F32(0.25) * sigma2 + xbl[o + i] * xbl[o + i]
            for i in range(16):
                waux[i] = np.sqrt(weight[i])
            for k in range(2):
                if is_s:  # plain signs
                    sb = 0
                    for i in range(8):
                        v = xbl[o + 8 * k + i]
                        if v >= 0:
                            xval[8 * k + i] = v
                        else:
                            xval[8 * k + i] = -v
                            sb |= 1 << i
                    bsigns[k] = sb
                else:
                    bsigns[k] = _signs(xbl, o, weight, xval, k, 8 * k)
            mx = xval[0]
            for i in range(1, 16):
                mx = xval[i] if xval[i] > mx else mx
            for i in range(16):
                L[i] = 0
            if mx < eps:
                scales[ib] = F32(0)
                continue
            best = F32(0)
            scale = mx / F32(2 * kmaxq - 1)
            on_grid[0] = True
            on_grid[1] = True
            for is_ in range(-9, 10):
                idv = (F32(2 * kmaxq - 1) + F32(is_) * F32(0.1)) / mx
                this_scale = F32(1) / idv
                for k in range(2):
                    for i in range(8):
                        l = _nearest_int(F32(0.5) * (idv * xval[8 * k + i] - F32(1)))
                        Laux[8 * k + i] = max(0, min(kmaxq - 1, l))
                    u = _point8(Laux, 8 * k)
                    on_grid_aux[k] = True
                    if kmap[u] < 0:
                        on_grid_aux[k] = False
                        _best_neighbour8(neigh, -kmap[u] - 1, grid, xval, waux, 8 * k, this_scale, Laux)
                sumqx = F32(0)
                sumq2 = F32(0)
                for i in range(16):
                    w = weight[i]
                    q = F32(2 * Laux[i] + 1)
                    sumqx += w * xval[i] * q
                    sumq2 += w * q * q
                if sumq2 > 0 and sumqx * sumqx > best * sumq2:
                    scale = sumqx / sumq2
                    best = scale * sumqx
                    for i in range(16):
                        L[i] = Laux[i]
                    for k in range(2):
                        on_grid[k] = on_grid_aux[k]
            n_not = 0
            for k in range(2):
                if not on_grid[k]:
                    n_not += 1
            if n_not > 0 and scale > 0:
                idv = F32(1) / scale
                for k in range(2):
                    if on_grid[k]:
                        continue
                    u = 0
                    for i in range(8):
                        l = _nearest_int(F32(0.5) * (idv * xval[8 * k + i] - F32(1)))
                        l = max(0, min(kmaxq - 1, l))
                        u |= np.int64(l) << (2 * i)
                        L[8 * k + i] = l
                    if kmap[u] < 0:
                        _best_neighbour8(neigh, -kmap[u] - 1, grid, xval, waux, 8 * k, scale, L)
                sumqx = F32(0)
                sumq2 = F32(0)
                for i in range(16):
                    w = weight[i]
                    q = F32(2 * L[i] + 1)
                    sumqx += w * xval[i] * q
                    sumq2 += w * q * q
                if sumq2 > 0:
                    scale = sumqx / sumq2
            if scale < 0:
                scale = -scale
                for k in range(2):
                    bsigns[k] = (~bsigns[k]) & (255 if is_s else 127)
            for k in range(2):
                gidx[ibl, 2 * ib + k] = kmap[_point8(L, 8 * k)]
                sgn[ibl, 2 * ib + k] = bsigns[k]
            scales[ib] = scale
            max_scale = scale if scale > max_scale else max_scale
        if max_scale == 0:
            dout[ibl] = F32(0)
            continue
        d = max_scale / F32(31)
        dout[ibl] = d * F32(0.9875) if is_s else d
        idv = F32(1) / d
        for ib in range(16):
            l = _nearest_int(F32(0.5) * (idv * scales[ib] - F32(1)))
            ls[ibl, ib] = max(0, min(15, l))


def _iq2xs_search(x: np.ndarray, qw: np.ndarray | None, is_s: bool):
    grid, kmap, neigh = iq2_data(1024 if is_s else 512)
    nb = x.shape[0]
    qwa = qw if qw is not None else np.zeros((1, 1), np.float32)
    gidx = np.zeros((nb, 32), np.int64)
    sgn = np.zeros((nb, 32), np.int64)
    ls = np.zeros((nb, 16), np.int64)
    d = np.zeros(nb, np.float32)
    _iq2xs_blocks(x, qwa, qw is not None, is_s, grid, kmap, neigh, gidx, sgn, ls, d)
    scl = (ls[:, 0::2] | (ls[:, 1::2] << 4)).astype(np.uint8)
    return gidx, sgn, scl, d


def _inputs(x: np.ndarray, qw: np.ndarray | None, name: str):
    from .base import QuantError

    if qw is None:
        raise QuantError(
            f"quantize {name}: this type needs importance weights (imatrix=...), as in llama.cpp"
        )
    return np.ascontiguousarray(x, dtype=np.float32), np.ascontiguousarray(qw, dtype=np.float32)


def quantize_iq2_xxs(x: np.ndarray, qw: np.ndarray | None = None, sigma2=None) -> np.ndarray:
    x, qw = _inputs(x, qw, "IQ2_XXS")
    grid, kmap, neigh = iq2_data(256)
    q2 = np.zeros((x.shape[0], 16), np.int64)
    d = np.zeros(x.shape[0], np.float32)
    _iq2xxs_blocks(x, qw, grid, kmap, neigh, q2, d)
    return np.concatenate([to_f16_bytes(d[:, None]), q2.astype("<u4").view(np.uint8)], axis=-1)


def quantize_iq2_xs(x: np.ndarray, qw: np.ndarray | None = None, sigma2=None) -> np.ndarray:
    x, qw = _inputs(x, qw, "IQ2_XS")
    gidx, sgn, scl, d = _iq2xs_search(x, qw, False)
    q2 = (gidx | (sgn << 9)) * (d[:, None] != 0)  # an all-zero block keeps no indices
    return np.concatenate([to_f16_bytes(d[:, None]), q2.astype("<u2").view(np.uint8), scl], axis=-1)


def quantize_iq2_s(x: np.ndarray, qw: np.ndarray | None = None, sigma2=None) -> np.ndarray:
    """IQ2_S (importance weights optional). As in llama.cpp, a block whose scales are all zero keeps
    the indices and signs already written."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    qw = None if qw is None else np.ascontiguousarray(qw, dtype=np.float32)
    gidx, sgn, scl, d = _iq2xs_search(x, qw, True)
    qh = ((gidx >> 8).reshape((-1, 8, 4)) << (2 * np.arange(4))).sum(axis=-1)
    return np.concatenate(
        [
            to_f16_bytes(d[:, None]),
            (gidx & 255).astype(np.uint8),
            sgn.astype(np.uint8),
            qh.astype(np.uint8),
            scl,
        ],
        axis=-1,
    )
