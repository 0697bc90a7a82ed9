"""Numba versions of the two scale searches the k-quants spend their time in (``make_qkx2_quants`` /
``make_qkx3_quants`` and ``make_qx_quants``): llama.cpp's C loops one group at a time, in float32, in
the same order, so results are bit-identical to the NumPy versions in ``_search`` (tests check that);
serial and GIL-free (``nogil``: quantize_file runs row chunks on a thread pool). ``_search`` calls these
for large inputs.
"""

from __future__ import annotations

import numpy as np

from ..._numba import njit
from ._rowk import _qkx_lanes
from ._rowq import GROUP_MAX_EPS, _nearest_int, _qx_lanes

F = np.float32
LANES = 16


@njit(cache=True, nogil=True, error_model="numpy")
def qkx_lanes_kernel(x, w, nmax, rmin, rdelta, nstep, use_mad, version, scale_out, min_out, L):  # noqa: ANN001
    """``qkx_kernel`` for ``nstep >= 1``, 16 groups per pass, one per SIMD lane (``_rowk._qkx_lanes``)."""
    ng, n = x.shape
    xt = np.empty((n, LANES), np.float32)
    wt = np.empty((n, LANES), np.float32)
    Lt = np.empty((n, LANES), np.int32)
    la = np.empty((n, LANES), np.int32)
    sc = np.empty(LANES, np.float32)
    mn = np.empty(LANES, np.float32)
    st = np.empty((8, LANES), np.float32)
    for c0 in range(0, ng, LANES):
        for g in range(LANES):
            gi = min(c0 + g, ng - 1)  # a short last pass repeats its last group
            for i in range(n):
                xt[i, g] = x[gi, i]
                wt[i, g] = w[gi, i]
        _qkx_lanes(xt, wt, LANES, nmax, rmin, rdelta, nstep, version == 3, Lt, la, sc, mn, st, use_mad)
        for g in range(min(LANES, ng - c0)):
            scale_out[c0 + g] = sc[g]
            min_out[c0 + g] = -mn[g]
            for i in range(n):
                L[c0 + g, i] = Lt[i, g]


@njit(cache=True, nogil=True, error_model="numpy")
def qx_lanes_kernel(x, w, nmax, scale_out, L):  # noqa: ANN001
    """``qx_kernel`` for ``rmse_type >= 1`` (weights ``w`` given or made by the caller), 16 groups per
    pass, one per SIMD lane (``_rowq._qx_lanes``)."""
    ng, n = x.shape
    xt = np.empty((n, LANES), np.float32)
    wt = np.empty((n, LANES), np.float32)
    sc = np.empty(LANES, np.float32)
    bisc = np.empty(LANES, np.float32)
    st = np.empty((6, LANES), np.float32)
    for c0 in range(0, ng, LANES):
        for g in range(LANES):
            gi = min(c0 + g, ng - 1)
            for i in range(n):
                xt[i, g] = x[gi, i]
                wt[i, g] = w[gi, i]
        _qx_lanes(xt, wt, LANES, nmax, sc, bisc, st)
        for g in range(min(LANES, ng - c0)):
            scale_out[c0 + g] = sc[g]
            z = st[0, g] < GROUP_MAX_EPS
            for i in range(n):
                li = max(-nmax, min(nmax - 1, _nearest_int(bisc[g] * xt[i, g])))
                L[c0 + g, i] = 0 if z else li + nmax


@njit(cache=True, nogil=True)
def qkx_kernel(x, w, nmax, rmin, rdelta, nstep, use_mad, version, scale_out, min_out, L):  # noqa: ANN001
    ng, n = x.shape
    fmax = F(nmax)
    laux = np.empty(n, np.uint8)
    for g in range(ng):
        xg = x[g]
        wg = w[g]
        Lg = L[g]
        mn = xg[0]
        mx = xg[0]
        sum_w = wg[0]
        sum_x = sum_w * xg[0]
        for i in range(1, n):
            xi = xg[i]
            if xi < mn:
                mn = xi
            if xi > mx:
                mx = xi
            wi = wg[i]
            sum_w += wi
            sum_x += wi * xi
        if mn > F(0):
            mn = F(0)
        flat = (mx == mn) if version == 2 else (mx <= mn)
        if flat:
            for i in range(n):
                Lg[i] = 0
            min_out[g] = -mn
            scale_out[g] = F(0)
            continue
        iscale = fmax / (mx - mn)
        scale = F(1) / iscale
        best = F(0)
        for i in range(n):
            li = _nearest_int(iscale * (xg[i] - mn))
            li = max(0, min(nmax, li))
            Lg[i] = li
            diff = scale * F(li) + mn - xg[i]
            diff = abs(diff) if use_mad else diff * diff
            best += wg[i] * diff
        if nstep >= 1:
            for step in range(nstep + 1):
                iscale = (rmin + rdelta * F(step) + fmax) / (mx - mn)
                sum_l = F(0)
                sum_l2 = F(0)
                sum_xl = F(0)
                for i in range(n):
                    li = _nearest_int(iscale * (xg[i] - mn))
                    li = max(0, min(nmax, li))
                    laux[i] = li
                    wi = wg[i]
                    lf = F(li)
                    sum_l += wi * lf
                    sum_l2 += wi * lf * lf
                    sum_xl += wi * lf * xg[i]
                D = sum_w * sum_l2 - sum_l * sum_l
                if D > F(0):
                    this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
                    this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
                    if this_min > F(0):
                        this_min = F(0)
                        this_scale = sum_xl / sum_l2
                    cur = F(0)
                    for i in range(n):
                        diff = this_scale * F(laux[i]) + this_min - xg[i]
                        diff = abs(diff) if use_mad else diff * diff
                        cur += wg[i] * diff
                    if cur < best:
                        for i in range(n):
                            Lg[i] = laux[i]
                        best = cur
                        scale = this_scale
                        mn = this_min
        min_out[g] = -mn
        scale_out[g] = scale


@njit(cache=True, nogil=True)
def qx_kernel(x, qw, has_qw, nmax, rmse_type, scale_out, L):  # noqa: ANN001
    ng, n = x.shape
    fmax = F(nmax)
    lt = np.empty(n, np.int32)
    for g in range(ng):
        xg = x[g]
        Lg = L[g]
        mx = F(0)
        amax = F(0)
        for i in range(n):
            ax = abs(xg[i])
            if ax > amax:
                amax = ax
                mx = xg[i]
        if amax < F(1e-15):
            for i in range(n):
                Lg[i] = 0
            scale_out[g] = F(0)
            continue
        iscale = -fmax / mx
        if rmse_type == 0:
            for i in range(n):
                li = _nearest_int(iscale * xg[i])
                Lg[i] = nmax + max(-nmax, min(nmax - 1, li))
            scale_out[g] = F(1) / iscale
            continue
        early = rmse_type < 0
        rt = -rmse_type if early else rmse_type
        sumlx = F(0)
        suml2 = F(0)
        for i in range(n):
            xi = xg[i]
            li = max(-nmax, min(nmax - 1, _nearest_int(iscale * xi)))
            Lg[i] = li + nmax
            if has_qw:
                wi = qw[g, i]
            elif rt == 1:
                wi = xi * xi
            elif rt == 2:
                wi = F(1)
            elif rt == 3:
                wi = abs(xi)
            else:
                wi = np.sqrt(abs(xi))
            lf = F(li)
            sumlx += wi * xi * lf
            suml2 += wi * lf * lf
        scale = sumlx / suml2 if suml2 != F(0) else F(0)
        if early:
            scale_out[g] = F(0.5) * (scale + F(1) / iscale) if suml2 > F(0) else F(1) / iscale
            continue
        best = scale * sumlx
        for k in range(-9, 10):
            if k == 0:
                continue
            isc = -(fmax + F(0.1) * F(k)) / mx
            sumlx = F(0)
            suml2 = F(0)
            for i in range(n):
                xi = xg[i]
                li = max(-nmax, min(nmax - 1, _nearest_int(isc * xi)))
                lt[i] = li
                if has_qw:
                    wi = qw[g, i]
                elif rt == 1:
                    wi = xi * xi
                elif rt == 2:
                    wi = F(1)
                elif rt == 3:
                    wi = abs(xi)
                else:
                    wi = np.sqrt(abs(xi))
                lf = F(li)
                sumlx += wi * xi * lf
                suml2 += wi * lf * lf
            if suml2 > F(0) and sumlx * sumlx > best * suml2:
                for i in range(n):
                    Lg[i] = lt[i] + nmax
                scale = sumlx / suml2
                best = scale * sumlx
        scale_out[g] = scale


def make_qkx_quants(
    x: np.ndarray, nmax: int, weights: np.ndarray | None, rmin: float, rdelta: float, nstep: int, use_mad: bool,
    version: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """As ``_search.make_qkx_quants``: ``(scale[ng, 1], the_min[ng, 1], L uint8[ng, n])``."""
    x = np.ascontiguousarray(x, dtype=F)
    w = np.ascontiguousarray(x * x if weights is None else weights, dtype=F)
    ng = x.shape[0]
    sc = np.empty(ng, F)
    mn = np.empty(ng, F)
    L = np.empty(x.shape, np.uint8)
    kern = qkx_lanes_kernel if nstep >= 1 else qkx_kernel
    kern(x, w, int(nmax), F(rmin), F(rdelta), int(nstep), bool(use_mad), int(version), sc, mn, L)
    return sc[:, None], mn[:, None], L


def make_qx_quants(
    x: np.ndarray, nmax: int, qw: np.ndarray | None, rmse_type: int
) -> tuple[np.ndarray, np.ndarray]:
    """As ``_search.make_qx_quants``: ``(scale float32[ng, 1], L int8[ng, n])`` with L = l + nmax."""
    x = np.ascontiguousarray(x, dtype=F)
    q = np.ascontiguousarray(qw, dtype=F) if qw is not None else x[:1]
    ng = x.shape[0]
    sc = np.empty(ng, F)
    L = np.empty(x.shape, np.int8)
    if rmse_type >= 1:
        if qw is not None:
            w = q
        elif rmse_type == 1:
            w = x * x
        elif rmse_type == 2:
            w = np.ones_like(x)
        elif rmse_type == 3:
            w = np.abs(x)
        else:
            w = np.sqrt(np.abs(x))
        qx_lanes_kernel(x, np.ascontiguousarray(w, dtype=F), int(nmax), sc, L)
    else:
        qx_kernel(x, q, qw is not None, int(nmax), int(rmse_type), sc, L)
    return sc[:, None], L
