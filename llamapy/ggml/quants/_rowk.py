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
from ._rowq import GROUP_MAX_EPS, _f16r, _finish, _nearest_int, _prep, _qx_lanes, _weights

F = np.float32


# ---- Q3_K -------------------------------------------------------------------------------------------


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


@njit(cache=True, inline="always")
def _q3_lanes(xt, G, Lt, scale, st):
    """``make_q3_quants(16, 4, x, L, true)`` of ``G`` groups at once (``xt[i, g]``, see the lanes note
    below): ``scale[g]``, ``Lt[i, g]`` (l + 4; 0 for a group with max |x| < GROUP_MAX_EPS, as C).
    A lane whose pass changes nothing would change nothing in the next passes either, so running
    every lane until no lane changes gives each lane's C result. ``st`` float32[4, G] scratch."""
    n = xt.shape[0]
    amax = st[0]
    mx = st[1]
    sumlx = st[2]
    suml2 = st[3]
    for g in range(G):
        amax[g] = F(0)
        mx[g] = F(0)
    for i in range(n):
        for g in range(G):
            ax = abs(xt[i, g])
            c = ax > amax[g]
            amax[g] = ax if c else amax[g]
            mx[g] = xt[i, g] if c else mx[g]
    for g in range(G):
        mx[g] = F(-4) / (mx[g] if amax[g] >= GROUP_MAX_EPS else F(1))  # iscale
        sumlx[g] = F(0)
        suml2[g] = F(0)
    for i in range(n):
        for g in range(G):
            xi = xt[i, g]
            li = max(-4, min(3, _nearest_int(mx[g] * xi)))
            Lt[i, g] = li
            w = xi * xi
            lf = F(li)
            sumlx[g] += w * xi * lf
            suml2[g] += w * lf * lf
    for _ in range(5):
        changed = False
        for i in range(n):
            for g in range(G):
                xi = xt[i, g]
                w = xi * xi
                lf = F(Lt[i, g])
                slx = sumlx[g] - w * xi * lf
                sl2 = suml2[g] - w * lf * lf
                new_l = max(-4, min(3, _nearest_int(xi * sl2 / slx)))
                nl = F(new_l)
                slx2 = slx + w * xi * nl
                sl22 = sl2 + w * nl * nl
                upd = (
                    slx > F(0)
                    and new_l != Lt[i, g]
                    and sl22 > F(0)
                    and slx2 * slx2 * suml2[g] > sumlx[g] * sumlx[g] * sl22
                )
                Lt[i, g] = new_l if upd else Lt[i, g]
                sumlx[g] = slx2 if upd else sumlx[g]
                suml2[g] = sl22 if upd else suml2[g]
                changed |= upd
        if not changed:
            break
    for g in range(G):
        z = amax[g] < GROUP_MAX_EPS
        scale[g] = F(0) if z or not suml2[g] > F(0) else sumlx[g] / suml2[g]
        for i in range(n):
            Lt[i, g] = 0 if z else Lt[i, g] + 4


@njit(cache=True, nogil=True, error_model="numpy")
def q3_k_kernel(x, qw, has_qw, out, dd):
    L = np.empty(256, np.int32)
    scales = np.empty(16, np.float32)
    xt = np.empty((16, 16), np.float32)
    wt = np.empty((16, 16), np.float32)
    Lt = np.empty((16, 16), np.int32)
    bisc = np.empty(16, np.float32)
    st = np.empty((6, 16), np.float32)
    sw = np.empty(16, np.float32)
    Ls = np.empty(16, np.int32)
    for b in range(x.shape[0]):
        for i in range(12):
            out[b, 96 + i] = 0
        if has_qw:
            sumx2 = F(0)
            for j in range(256):
                sumx2 += x[b, j] * x[b, j]
            sigma2 = F(2) * sumx2 / F(256)
            for j in range(16):
                sumw = F(0)
                for l in range(16):
                    xi = x[b, 16 * j + l]
                    wv = qw[b, 16 * j + l] * np.float32(np.sqrt(sigma2 + xi * xi))
                    xt[l, j] = xi
                    wt[l, j] = wv
                    sumw += wv
                sw[j] = sumw
            _qx_lanes(xt, wt, 16, 4, scales, bisc, st)
            for j in range(16):
                z = st[0, j] < GROUP_MAX_EPS
                for l in range(16):
                    L[16 * j + l] = 0 if z else 4 + max(-4, min(3, _nearest_int(bisc[j] * xt[l, j])))
            d = _qx_search(scales, 0, 16, 32, sw, Ls)
            for j in range(16):
                _q3_pack_scales(out, b, j, Ls[j])
        else:
            for j in range(16):
                for l in range(16):
                    xt[l, j] = x[b, 16 * j + l]
            _q3_lanes(xt, 16, Lt, scales, st)
            max_scale = F(0)
            amax = F(0)
            for j in range(16):
                s = scales[j]
                if abs(s) > amax:
                    amax = abs(s)
                    max_scale = s
                for l in range(16):
                    L[16 * j + l] = Lt[l, j]
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


# ---- lanes: one group per SIMD lane ---------------------------------------------------------------------
# The searches below run the C loop of every group at once, ``xt[i, g]`` holding element ``i`` of group
# ``g``: each lane does the C code's float32 operations in the C code's order (so the same bits), and the
# loops over ``g`` vectorize; data-dependent branches become per-lane selects.


@njit(cache=True, inline="always")
def _qkx_lanes(xt, wt, G, nmax, rmin, rdelta, nstep, v3, Lt, la, scale, mn, st, mad=False):
    """``make_qkx2_quants`` (``v3`` False) / ``make_qkx3_quants`` (True) of ``G`` groups of ``xt.shape[0]``
    with weights ``wt`` (``nstep >= 1``; ``mad``: C's ``use_mad``): ``scale[g]``, ``mn[g]`` (the min, not
    negated: C's ``*the_min = -min``) and ``Lt[i, g]``. ``la`` is scratch like ``Lt``; ``st`` float32[8, G]
    scratch."""
    n = xt.shape[0]
    fmax = F(nmax)
    mx = st[0]
    sw = st[1]
    sx = st[2]
    best = st[3]
    isc = st[4]
    sl = st[5]
    sl2 = st[6]
    sxl = st[7]
    for g in range(G):
        v = xt[0, g]
        mn[g] = v
        mx[g] = v
        w = wt[0, g]
        sw[g] = w
        sx[g] = w * v
    for i in range(1, n):
        for g in range(G):
            v = xt[i, g]
            mn[g] = v if v < mn[g] else mn[g]
            mx[g] = v if v > mx[g] else mx[g]
            w = wt[i, g]
            sw[g] += w
            sx[g] += w * v
    for g in range(G):
        m = mn[g] if mn[g] <= F(0) else F(0)
        mn[g] = m
        flat = mx[g] <= m if v3 else mx[g] == m
        # a flat group keeps scale 0 and L 0: mx = mn + 1 keeps its arithmetic finite, st[0] marks it
        mx[g] = m + F(1) if flat else mx[g]
        isc[g] = fmax / (mx[g] - m)
        scale[g] = F(1) / isc[g]
        best[g] = F(0)
        sl[g] = F(1) if flat else F(0)  # flat flag until the steps start
    for i in range(n):
        for g in range(G):
            v = xt[i, g]
            l = max(0, min(nmax, _nearest_int(isc[g] * (v - mn[g]))))
            Lt[i, g] = l
            diff = scale[g] * F(l) + mn[g] - v
            best[g] += wt[i, g] * (abs(diff) if mad else diff * diff)
    for g in range(G):
        sw[g] = sw[g] if sl[g] == F(0) else F(np.nan)  # a flat group never updates: D is nan
    for step in range(nstep + 1):
        for g in range(G):
            isc[g] = (rmin + rdelta * F(step) + fmax) / (mx[g] - mn[g])
            sl[g] = F(0)
            sl2[g] = F(0)
            sxl[g] = F(0)
        for i in range(n):
            for g in range(G):
                v = xt[i, g]
                l = max(0, min(nmax, _nearest_int(isc[g] * (v - mn[g]))))
                la[i, g] = l
                w = wt[i, g]
                lf = F(l)
                sl[g] += w * lf
                sl2[g] += w * lf * lf
                sxl[g] += w * lf * v
        for g in range(G):
            D = sw[g] * sl2[g] - sl[g] * sl[g]
            ts = (sw[g] * sxl[g] - sx[g] * sl[g]) / D
            tm = (sl2[g] * sx[g] - sl[g] * sxl[g]) / D
            pos = tm > F(0)
            tm = F(0) if pos else tm
            ts = sxl[g] / sl2[g] if pos else ts
            sl[g] = ts
            sxl[g] = tm
            isc[g] = F(1) if D > F(0) else F(0)  # D > 0 flag
            sl2[g] = F(0)
        for i in range(n):
            for g in range(G):
                diff = sl[g] * F(la[i, g]) + sxl[g] - xt[i, g]
                sl2[g] += wt[i, g] * (abs(diff) if mad else diff * diff)
        any_upd = False
        for g in range(G):
            upd = isc[g] != F(0) and sl2[g] < best[g]
            isc[g] = F(1) if upd else F(0)
            best[g] = sl2[g] if upd else best[g]
            scale[g] = sl[g] if upd else scale[g]
            mn[g] = sxl[g] if upd else mn[g]
            any_upd |= upd
        if any_upd:
            for i in range(n):
                for g in range(G):
                    Lt[i, g] = la[i, g] if isc[g] != F(0) else Lt[i, g]
    for g in range(G):
        if sw[g] != sw[g]:  # flat
            scale[g] = F(0)
            for i in range(n):
                Lt[i, g] = 0


@njit(cache=True, inline="always")
def _qp(x, n, nmax, w, L):
    """``make_qp_quants(n, nmax, x, L, w)`` (L as C's uint8: values wrap modulo 256)."""
    mx = F(0)
    for i in range(n):
        mx = max(mx, x[i])
    if mx < GROUP_MAX_EPS:
        for i in range(n):
            L[i] = 0
        return F(0)
    iscale = F(nmax) / mx
    for i in range(n):
        L[i] = _nearest_int(iscale * x[i]) & 255
    scale = F(1) / iscale
    best = F(0)
    for i in range(n):
        diff = x[i] - scale * F(L[i])
        best += w[i] * diff * diff
    for k in range(-4, 5):
        if k == 0:
            continue
        isk = (F(0.1) * F(k) + F(nmax)) / mx
        sk = F(1) / isk
        mse = F(0)
        for i in range(n):
            l = min(nmax, _nearest_int(isk * x[i]))
            diff = x[i] - sk * F(l)
            mse += w[i] * diff * diff
        if mse < best:
            best = mse
            iscale = isk
    sumlx = F(0)
    suml2 = F(0)
    for i in range(n):
        l = min(nmax, _nearest_int(iscale * x[i])) & 255
        L[i] = l
        lf = F(l)
        sumlx += w[i] * x[i] * lf
        suml2 += w[i] * lf * lf
    for _ in range(5):
        n_changed = 0
        for i in range(n):
            wi = w[i]
            lf = F(L[i])
            slx = sumlx - wi * x[i] * lf
            sl2 = suml2 - wi * lf * lf
            if slx > F(0) and sl2 > F(0):
                new_l = min(nmax, _nearest_int(x[i] * sl2 / slx))
                if new_l != L[i]:
                    nl = F(new_l)
                    slx += wi * x[i] * nl
                    sl2 += wi * nl * nl
                    if slx * slx * suml2 > sumlx * sumlx * sl2:
                        L[i] = new_l & 255
                        sumlx = slx
                        suml2 = sl2
                        n_changed += 1
        if n_changed == 0:
            break
    return sumlx / suml2 if suml2 > F(0) else F(0)


@njit(cache=True, nogil=True, error_model="numpy")
def q45_k_kernel(x, qw, has_qw, out, dd, q5):
    """Q4_K (``q5`` False) or Q5_K blocks, two super-blocks (16 groups of 32) per lane pass."""
    nmax = 31 if q5 else 15
    G = 16
    xt = np.empty((32, G), np.float32)
    wt = np.empty((32, G), np.float32)
    Lt = np.empty((32, G), np.int32)
    la = np.empty((32, G), np.int32)
    scale = np.empty(G, np.float32)
    mn = np.empty(G, np.float32)
    st = np.empty((8, G), np.float32)
    sw = np.empty(8, np.float32)
    mins = np.empty(8, np.float32)
    Ls = np.empty(8, np.int32)
    Lm = np.empty(8, np.int32)
    L = np.empty(256, np.int32)
    sc_off = 4
    nb = x.shape[0]
    for b0 in range(0, nb, 2):
        for p in range(2):
            b = min(b0 + p, nb - 1)  # an odd tail repeats its last block in the second half of the lanes
            if has_qw:
                sum_x2 = F(0)
                for l in range(256):
                    sum_x2 += x[b, l] * x[b, l]
                sigma2 = F(2) * sum_x2 / F(256)
                for j in range(8):
                    for i in range(32):
                        v = x[b, 32 * j + i]
                        xt[i, 8 * p + j] = v
                        wt[i, 8 * p + j] = qw[b, 32 * j + i] * np.float32(np.sqrt(sigma2 + v * v))
            else:
                for j in range(8):
                    for i in range(32):
                        xt[i, 8 * p + j] = x[b, 32 * j + i]
        if not has_qw:
            for g in range(G):
                st[0, g] = F(0)
            for i in range(32):
                for g in range(G):
                    st[0, g] += xt[i, g] * xt[i, g]
            for g in range(G):
                st[0, g] = np.float32(np.sqrt(st[0, g] / F(32)))
            for i in range(32):
                for g in range(G):
                    wt[i, g] = st[0, g] + abs(xt[i, g])
            if q5:
                _qkx_lanes(xt, wt, G, nmax, F(-0.5), F(0.1), 15, False, Lt, la, scale, mn, st)
            else:
                _qkx_lanes(xt, wt, G, nmax, F(-1.0), F(0.1), 20, False, Lt, la, scale, mn, st)
        else:
            _qkx_lanes(xt, wt, G, nmax, F(-0.9), F(0.05), 36, True, Lt, la, scale, mn, st)
        for p in range(2):
            b = b0 + p
            if b >= nb:
                break
            for j in range(8):
                mins[j] = -mn[8 * p + j]
                for i in range(32):
                    L[32 * j + i] = Lt[i, 8 * p + j]
            if has_qw:
                for j in range(8):
                    s = F(0)
                    for i in range(32):
                        s += wt[i, 8 * p + j]
                    sw[j] = s
                d = _qp(scale[8 * p : 8 * p + 8], 8, 63, sw, Ls)
                dm = _qp(mins, 8, 63, sw, Lm)
            else:
                max_scale = F(0)
                max_min = F(0)
                for j in range(8):
                    if scale[8 * p + j] > max_scale:
                        max_scale = scale[8 * p + j]
                    if mins[j] > max_min:
                        max_min = mins[j]
                inv_s = F(63) / max_scale if max_scale > F(0) else F(0)
                inv_m = F(63) / max_min if max_min > F(0) else F(0)
                for j in range(8):
                    Ls[j] = min(63, _nearest_int(inv_s * scale[8 * p + j]) & 255)
                    Lm[j] = min(63, _nearest_int(inv_m * mins[j]) & 255)
                d = max_scale / F(63)
                dm = max_min / F(63)
            for j in range(8):
                ls = Ls[j]
                lm = Lm[j]
                if j < 4:
                    out[b, sc_off + j] = np.uint8(ls & 255)
                    out[b, sc_off + j + 4] = np.uint8(lm & 255)
                else:
                    out[b, sc_off + j + 4] = np.uint8(((ls & 15) | ((lm & 15) << 4)) & 255)
                    out[b, sc_off + j - 4] |= np.uint8(((ls >> 4) << 6) & 255)
                    out[b, sc_off + j] |= np.uint8(((lm >> 4) << 6) & 255)
            dd[b, 0] = d
            dd[b, 1] = dm
            dh = _f16r(d)
            mh = _f16r(dm)
            for j in range(8):
                if j < 4:
                    sc = np.int32(out[b, sc_off + j]) & 63
                    m = np.int32(out[b, sc_off + j + 4]) & 63
                else:
                    sc = (np.int32(out[b, sc_off + j + 4]) & 15) | (
                        (np.int32(out[b, sc_off + j - 4]) >> 6) << 4
                    )
                    m = (np.int32(out[b, sc_off + j + 4]) >> 4) | ((np.int32(out[b, sc_off + j]) >> 6) << 4)
                dj = dh * F(sc)
                if dj == F(0):
                    continue
                dmj = mh * F(m)
                for i in range(32):
                    l = _nearest_int((x[b, 32 * j + i] + dmj) / dj)
                    L[32 * j + i] = max(0, min(nmax, l))
            if q5:
                for j in range(32):
                    qh = 0
                    for k in range(4):
                        l1 = L[64 * k + j]
                        l2 = L[64 * k + j + 32]
                        if l1 > 15:
                            l1 -= 16
                            qh |= 1 << (2 * k)
                        if l2 > 15:
                            l2 -= 16
                            qh |= 2 << (2 * k)
                        out[b, 48 + 32 * k + j] = np.uint8(l1 | (l2 << 4))
                    out[b, 16 + j] = np.uint8(qh)
            else:
                for k in range(4):
                    for j in range(32):
                        out[b, 16 + 32 * k + j] = np.uint8(L[64 * k + j] | (L[64 * k + j + 32] << 4))


def quantize_q4_k(x: np.ndarray, qw: np.ndarray | None) -> np.ndarray:
    x, out, dd = _prep(x, 144, 2)
    w, has = _weights(qw, x)
    q45_k_kernel(x, w, has, out, dd, False)
    return _finish(out, dd, (0, 2))


def quantize_q5_k(x: np.ndarray, qw: np.ndarray | None) -> np.ndarray:
    x, out, dd = _prep(x, 176, 2)
    w, has = _weights(qw, x)
    q45_k_kernel(x, w, has, out, dd, True)
    return _finish(out, dd, (0, 2))


# ---- Q2_K -------------------------------------------------------------------------------------------


@njit(cache=True, nogil=True, error_model="numpy")
def q2_k_kernel(x, qw, has_qw, out, dd):
    xt = np.empty((16, 16), np.float32)
    wt = np.empty((16, 16), np.float32)
    Lt = np.empty((16, 16), np.int32)
    la = np.empty((16, 16), np.int32)
    scale = np.empty(16, np.float32)
    mn = np.empty(16, np.float32)
    mins = np.empty(16, np.float32)
    st = np.empty((8, 16), np.float32)
    sw = np.empty(16, np.float32)
    Ls = np.empty(16, np.int32)
    Lm = np.empty(16, np.int32)
    L = np.empty(256, np.int32)
    for b in range(x.shape[0]):
        if has_qw:
            sumx2 = F(0)
            for j in range(256):
                sumx2 += x[b, j] * x[b, j]
            sigma2 = sumx2 / F(256)
            for j in range(16):
                s = F(0)
                for i in range(16):
                    v = x[b, 16 * j + i]
                    wv = qw[b, 16 * j + i] * np.float32(np.sqrt(sigma2 + v * v))
                    xt[i, j] = v
                    wt[i, j] = wv
                    s += wv
                sw[j] = s
            _qkx_lanes(xt, wt, 16, 3, F(-0.9), F(0.05), 36, True, Lt, la, scale, mn, st, False)
        else:
            for j in range(16):
                for i in range(16):
                    v = x[b, 16 * j + i]
                    xt[i, j] = v
                    wt[i, j] = abs(v)
            _qkx_lanes(xt, wt, 16, 3, F(-0.5), F(0.1), 15, False, Lt, la, scale, mn, st, True)
        for j in range(16):
            mins[j] = -mn[j]
            for i in range(16):
                L[16 * j + i] = Lt[i, j]
        if has_qw:
            d = _qp(scale, 16, 15, sw, Ls)
            dm = _qp(mins, 16, 15, sw, Lm)
            for j in range(16):
                out[b, j] = np.uint8((Ls[j] | (Lm[j] << 4)) & 255)
        else:
            max_scale = F(0)
            max_min = F(0)
            for j in range(16):
                if scale[j] > max_scale:
                    max_scale = scale[j]
                if mins[j] > max_min:
                    max_min = mins[j]
            if max_scale > F(0):
                isc = F(15) / max_scale
                for j in range(16):
                    out[b, j] = np.uint8(_nearest_int(isc * scale[j]) & 255)
                d = max_scale / F(15)
            else:
                for j in range(16):
                    out[b, j] = 0
                d = F(0)
            if max_min > F(0):
                isc = F(15) / max_min
                for j in range(16):
                    out[b, j] |= np.uint8((_nearest_int(isc * mins[j]) << 4) & 255)
                dm = max_min / F(15)
            else:
                dm = F(0)
        dd[b, 0] = d
        dd[b, 1] = dm
        dh = _f16r(d)
        mh = _f16r(dm)
        for j in range(16):
            sc = np.int32(out[b, j])
            dj = dh * F(sc & 15)
            if dj == F(0):
                continue
            dmj = mh * F(sc >> 4)
            for i in range(16):
                l = _nearest_int((x[b, 16 * j + i] + dmj) / dj)
                L[16 * j + i] = max(0, min(3, l))
        for h in range(2):
            for l in range(32):
                j = 128 * h + l
                out[b, 16 + 32 * h + l] = np.uint8(
                    L[j] | (L[j + 32] << 2) | (L[j + 64] << 4) | (L[j + 96] << 6)
                )


def quantize_q2_k(x: np.ndarray, qw: np.ndarray | None) -> np.ndarray:
    x, out, dd = _prep(x, 84, 2)
    w, has = _weights(qw, x)
    q2_k_kernel(x, w, has, out, dd)
    return _finish(out, dd, (80, 82))
