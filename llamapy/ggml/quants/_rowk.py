"""Numba row quantizers of the k-quants Q2_K, Q3_K, Q4_K and Q5_K: llama.cpp's ``quantize_row_q*_K_ref``
(no importance weights) and ``quantize_row_q*_K_impl`` (with them), one super-block at a time, the C
loops in float32 in C's order, so the bytes equal llama.cpp's and the NumPy versions in ``_kquantize``
(tests/quantize/test_rowk.py compares them). Serial and ``nogil``, as the kernels of ``_rowq``: the
callers run row chunks on a thread pool. The half-float fields come back as float32 in ``dd`` and
``_rowq._finish`` stores them; where C reads a half back, ``_f16r`` rounds the same way.
"""

from __future__ import annotations

import numpy as np

from ..._numba import njit
from ._rowq import GROUP_MAX_EPS, _f16r, _finish, _nearest_int, _prep, _weights

F = np.float32


# ---- Q3_K -------------------------------------------------------------------------------------------


@njit(cache=True, inline="always")
def _q3_search(x, b, o, L):
    """``make_q3_quants(16, 4, x + o, L + o, true)`` (L holds l + 4)."""
    nmax = 4
    mx = F(0)
    amax = F(0)
    for i in range(16):
        ax = abs(x[b, o + i])
        if ax > amax:
            amax = ax
            mx = x[b, o + i]
    if amax < GROUP_MAX_EPS:
        for i in range(16):
            L[o + i] = 0
        return F(0)
    iscale = -F(nmax) / mx
    sumlx = F(0)
    suml2 = F(0)
    for i in range(16):
        xi = x[b, o + i]
        li = max(-nmax, min(nmax - 1, _nearest_int(iscale * xi)))
        L[o + i] = li
        w = xi * xi
        lf = F(li)
        sumlx += w * xi * lf
        suml2 += w * lf * lf
    for _ in range(5):
        n_changed = 0
        for i in range(16):
            xi = x[b, o + i]
            w = xi * xi
            lf = F(L[o + i])
            slx = sumlx - w * xi * lf
            if slx > F(0):
                sl2 = suml2 - w * lf * lf
                new_l = max(-nmax, min(nmax - 1, _nearest_int(xi * sl2 / slx)))
                if new_l != L[o + i]:
                    nl = F(new_l)
                    slx += w * xi * nl
                    sl2 += w * nl * nl
                    if sl2 > F(0) and slx * slx * suml2 > sumlx * sumlx * sl2:
                        L[o + i] = new_l
                        sumlx = slx
                        suml2 = sl2
                        n_changed += 1
        if n_changed == 0:
            break
    for i in range(16):
        L[o + i] += nmax
    return sumlx / suml2 if suml2 > F(0) else F(0)


@njit(cache=True, inline="always")
def _qx_search(x, o, n, nmax, w, L):
    """``make_qx_quants(n, nmax, x + o, L + o, 1, w + o)`` on 1-D ``x`` (L holds l + nmax)."""
    mx = F(0)
    amax = F(0)
    for i in range(n):
        ax = abs(x[o + i])
        if ax > amax:
            amax = ax
            mx = x[o + i]
    if amax < GROUP_MAX_EPS:
        for i in range(n):
            L[o + i] = 0
        return F(0)
    fmax = F(nmax)
    iscale = -fmax / mx
    sumlx = F(0)
    suml2 = F(0)
    for i in range(n):
        xi = x[o + i]
        li = max(-nmax, min(nmax - 1, _nearest_int(iscale * xi)))
        L[o + i] = li + nmax
        lf = F(li)
        wi = w[o + i]
        sumlx += wi * xi * lf
        suml2 += wi * lf * lf
    scale = sumlx / suml2 if suml2 != F(0) else F(0)
    best = scale * sumlx
    for k in range(-9, 10):
        if k == 0:
            continue
        isc = -(fmax + F(0.1) * F(k)) / mx
        sumlx = F(0)
        suml2 = F(0)
        for i in range(n):
            xi = x[o + i]
            li = max(-nmax, min(nmax - 1, _nearest_int(isc * xi)))
            lf = F(li)
            wi = w[o + i]
            sumlx += wi * xi * lf
            suml2 += wi * lf * lf
        if suml2 > F(0) and sumlx * sumlx > best * suml2:
            for i in range(n):
                L[o + i] = nmax + max(-nmax, min(nmax - 1, _nearest_int(isc * x[o + i])))
            scale = sumlx / suml2
            best = scale * sumlx
    return scale


@njit(cache=True, inline="always")
def _q3_pack_scales(out, b, j, l):
    """Put 6-bit scale ``l`` (0..63) of sub-block ``j`` into the 12 scale bytes at 96."""
    if j < 8:
        out[b, 96 + j] = np.uint8(l & 15)
    else:
        out[b, 96 + j - 8] |= np.uint8((l & 15) << 4)
    out[b, 96 + 8 + j % 4] |= np.uint8((l >> 4) << (2 * (j // 4)))


@njit(cache=True, nogil=True)
def q3_k_kernel(x, qw, has_qw, out, dd):
    L = np.empty(256, np.int32)
    scales = np.empty(16, np.float32)
    xb = np.empty(256, np.float32)
    wt = np.empty(256, np.float32)
    sw = np.empty(16, np.float32)
    Ls = np.empty(16, np.int32)
    for b in range(x.shape[0]):
        for i in range(12):
            out[b, 96 + i] = 0
        if has_qw:
            sumx2 = F(0)
            for j in range(256):
                xb[j] = x[b, j]
                sumx2 += x[b, j] * x[b, j]
            sigma2 = F(2) * sumx2 / F(256)
            for j in range(16):
                sumw = F(0)
                for l in range(16):
                    xi = xb[16 * j + l]
                    wv = qw[b, 16 * j + l] * np.float32(np.sqrt(sigma2 + xi * xi))
                    wt[16 * j + l] = wv
                    sumw += wv
                sw[j] = sumw
                scales[j] = _qx_search(xb, 16 * j, 16, 4, wt, L)
            d = _qx_search(scales, 0, 16, 32, sw, Ls)
            for j in range(16):
                _q3_pack_scales(out, b, j, Ls[j])
        else:
            max_scale = F(0)
            amax = F(0)
            for j in range(16):
                s = _q3_search(x, b, 16 * j, L)
                scales[j] = s
                if abs(s) > amax:
                    amax = abs(s)
                    max_scale = s
            if max_scale != F(0):
                iscale = F(-32) / max_scale
                for j in range(16):
                    l = max(-32, min(31, _nearest_int(iscale * scales[j]))) + 32
                    _q3_pack_scales(out, b, j, l)
                d = F(1) / iscale
            else:
                d = F(0)
        dd[b, 0] = d
        dh = _f16r(d)
        for j in range(16):
            if j < 8:
                sc = np.int32(out[b, 96 + j]) & 15
            else:
                sc = np.int32(out[b, 96 + j - 8]) >> 4
            sc = (sc | (((np.int32(out[b, 96 + 8 + j % 4]) >> (2 * (j // 4))) & 3) << 4)) - 32
            dj = dh * F(sc)
            if dj == F(0):
                continue
            for ii in range(16):
                l = _nearest_int(x[b, 16 * j + ii] / dj)
                L[16 * j + ii] = max(-4, min(3, l)) + 4
        for m in range(32):
            h = 0
            for k in range(8):
                if L[32 * k + m] > 3:
                    h |= 1 << k
            out[b, m] = np.uint8(h)
        for j in range(256):
            if L[j] > 3:
                L[j] -= 4
        for h in range(2):
            for l in range(32):
                j = 128 * h + l
                out[b, 32 + 32 * h + l] = np.uint8(
                    L[j] | (L[j + 32] << 2) | (L[j + 64] << 4) | (L[j + 96] << 6)
                )


def quantize_q3_k(x: np.ndarray, qw: np.ndarray | None) -> np.ndarray:
    x, out, dd = _prep(x, 110, 1)
    w, has = _weights(qw, x)
    q3_k_kernel(x, w, has, out, dd)
    return _finish(out, dd, (108,))
