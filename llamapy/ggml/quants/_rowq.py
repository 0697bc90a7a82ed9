"""Numba row quantizers of the types llama-quantize spends its time in: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1
(``quantize_row_*_ref``, no importance weights), Q6_K (``quantize_row_q6_K_ref`` / ``_impl``) and
IQ4_NL / IQ4_XS (``quantize_row_iq4_nl_impl`` as ``quantize_iq4_nl`` / ``quantize_iq4_xs`` call it).

One block at a time, the C loops in float32 in C's order, so the bytes equal llama.cpp's (tests/ggml/
test_quants_quantize.py and tests/quantize compare). The kernels are serial and release the GIL
(``nogil``): ``quantize_file`` runs row chunks on a pool of threads, as llama-quantize does. Measured on
the loaded 2-core box, ``parallel=True`` kernels lost to this: every chunk's OpenMP team waits (spinning)
for a descheduled thread, 4-5x the CPU time of the serial kernels.
Each kernel writes a block's bytes except its half-float fields: it returns those values as float32
(``dd``) and ``finish`` stores them with NumPy's float16 conversion (round to nearest even, as ggml's).
Where C reads a half back (Q6_K's ``GGML_FP16_TO_FP32(y->d)``), ``_f16r`` rounds the same way.
"""

from __future__ import annotations

import math

import numpy as np

from ..._numba import njit
from ..cpu.simd import vh8, vstore
from . import iq_tables as T

F = np.float32
GROUP_MAX_EPS = F(1e-15)
_IQ4_VALUES = T.KVALUES_IQ4NL.astype(np.float32)


@njit(cache=True, inline="always")
def _nearest_int(v):  # ggml's nearest_int (float32 add-magic: round half to even)
    return np.int32(v + F(12582912.0)) - 12582912


@njit(cache=True, inline="always")
def _roundf(v):  # C's roundf: half away from zero (exact in float64 for float32 input)
    r = math.floor(abs(np.float64(v)) + 0.5)
    return np.int32(-r if v < 0 else r)


@njit(cache=True, inline="always")
def _f16r(v):
    """float32 -> nearest half (ties to even; overflow to inf) -> float32."""
    a = abs(np.float64(v))
    if a == 0.0 or a != a or a == np.inf:
        return v
    m, e = math.frexp(a)
    q = e - 11
    if q < -24:
        q = -24
    r = np.rint(math.ldexp(a, -q))
    r = math.ldexp(r, q)
    if r > 65504.0:
        r = np.inf
    return F(-r if v < 0 else r)


# ---- legacy types (no importance weights) -------------------------------------------------------------


@njit(cache=True, nogil=True)
def q8_0_kernel(x, out, dd):
    for b in range(x.shape[0]):
        amax = F(0)
        for j in range(32):
            a = abs(x[b, j])
            amax = amax if amax > a else a
        d = amax / F(127)
        idv = F(1) / d if d != 0 else F(0)
        dd[b, 0] = d
        for j in range(32):
            out[b, 2 + j] = np.uint8(_roundf(x[b, j] * idv) & 255)


@njit(cache=True, nogil=True)
def q4_0_kernel(x, out, dd, nmax5):
    """Q4_0 (``nmax5`` False) or Q5_0 (True)."""
    for b in range(x.shape[0]):
        amax = F(0)
        mx = F(0)
        for j in range(32):
            v = x[b, j]
            if amax < abs(v):
                amax = abs(v)
                mx = v
        d = mx / F(-16) if nmax5 else mx / F(-8)
        idv = F(1) / d if d != 0 else F(0)
        dd[b, 0] = d
        qh = 0
        for j in range(16):
            x0 = x[b, j] * idv
            x1 = x[b, 16 + j] * idv
            if nmax5:
                xi0 = min(31, np.int32(x0 + F(16.5))) & 255
                xi1 = min(31, np.int32(x1 + F(16.5))) & 255
                out[b, 6 + j] = np.uint8((xi0 & 15) | ((xi1 & 15) << 4))
                qh |= ((xi0 & 16) >> 4) << j
                qh |= ((xi1 & 16) >> 4) << (j + 16)
            else:
                xi0 = min(15, np.int32(x0 + F(8.5))) & 255
                xi1 = min(15, np.int32(x1 + F(8.5))) & 255
                out[b, 2 + j] = np.uint8(xi0 | (xi1 << 4))
        if nmax5:
            for k in range(4):
                out[b, 2 + k] = np.uint8((qh >> (8 * k)) & 255)


@njit(cache=True, nogil=True)
def q4_1_kernel(x, out, dd, nmax5):
    """Q4_1 (``nmax5`` False) or Q5_1 (True)."""
    for b in range(x.shape[0]):
        mn = F(3.4028234663852886e38)
        mx = F(-3.4028234663852886e38)
        for j in range(32):
            v = x[b, j]
            if v < mn:
                mn = v
            if v > mx:
                mx = v
        d = (mx - mn) / F(31) if nmax5 else (mx - mn) / F(15)
        idv = F(1) / d if d != 0 else F(0)
        dd[b, 0] = d
        dd[b, 1] = mn
        qh = 0
        for j in range(16):
            x0 = (x[b, j] - mn) * idv
            x1 = (x[b, 16 + j] - mn) * idv
            if nmax5:
                xi0 = np.int32(x0 + F(0.5)) & 255
                xi1 = np.int32(x1 + F(0.5)) & 255
                out[b, 8 + j] = np.uint8((xi0 & 15) | ((xi1 & 15) << 4))
                qh |= ((xi0 & 16) >> 4) << j
                qh |= ((xi1 & 16) >> 4) << (j + 16)
            else:
                xi0 = min(15, np.int32(x0 + F(0.5))) & 255
                xi1 = min(15, np.int32(x1 + F(0.5))) & 255
                out[b, 4 + j] = np.uint8(xi0 | (xi1 << 4))
        if nmax5:
            for k in range(4):
                out[b, 4 + k] = np.uint8((qh >> (8 * k)) & 255)


# ---- Q6_K -------------------------------------------------------------------------------------------


@njit(cache=True, inline="always")
def _qx_lanes(xt, wt, G, nmax, scale, bisc, st):
    """``make_qx_quants(n, nmax, x, L, 1, w)`` of ``G`` groups at once, one per SIMD lane (``xt[i, g]``
    element ``i`` of group ``g``; each lane does the C loop's float32 operations in its order, so the
    same bits): ``scale[g]`` and ``bisc[g]``, the iscale whose levels
    ``nmax + clamp(nearest_int(bisc * x))`` C leaves in L. A group with max |x| < GROUP_MAX_EPS gets
    scale 0 (C leaves its levels 0: the caller checks ``st[0, g]``, its max |x|, against GROUP_MAX_EPS).
    ``st`` float32[6, G] scratch."""
    n = xt.shape[0]
    fmax = F(nmax)
    amax = st[0]
    mx = st[1]
    sumlx = st[2]
    suml2 = st[3]
    best = st[4]
    isc = st[5]
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
        mx[g] = mx[g] if amax[g] >= GROUP_MAX_EPS else F(1)
        bisc[g] = -fmax / mx[g]
        sumlx[g] = F(0)
        suml2[g] = F(0)
    for i in range(n):
        for g in range(G):
            xi = xt[i, g]
            lf = F(max(-nmax, min(nmax - 1, _nearest_int(bisc[g] * xi))))
            wi = wt[i, g]
            sumlx[g] += wi * xi * lf
            suml2[g] += wi * lf * lf
    for g in range(G):
        s = sumlx[g] / suml2[g] if suml2[g] != F(0) else F(0)
        scale[g] = s
        best[g] = s * sumlx[g]
    for k in range(-9, 10):
        if k == 0:
            continue
        for g in range(G):
            isc[g] = -(fmax + F(0.1) * F(k)) / mx[g]
            sumlx[g] = F(0)
            suml2[g] = F(0)
        for i in range(n):
            for g in range(G):
                xi = xt[i, g]
                lf = F(max(-nmax, min(nmax - 1, _nearest_int(isc[g] * xi))))
                wi = wt[i, g]
                sumlx[g] += wi * xi * lf
                suml2[g] += wi * lf * lf
        for g in range(G):
            upd = suml2[g] > F(0) and sumlx[g] * sumlx[g] > best[g] * suml2[g]
            s = sumlx[g] / suml2[g]
            scale[g] = s if upd else scale[g]
            best[g] = s * sumlx[g] if upd else best[g]
            bisc[g] = isc[g] if upd else bisc[g]
    for g in range(G):
        scale[g] = F(0) if amax[g] < GROUP_MAX_EPS else scale[g]


@njit(cache=True, nogil=True, error_model="numpy")
def q6_k_kernel(x, qw, has_qw, out, dd):
    L = np.empty(256, np.int32)
    xt = np.empty((16, 16), np.float32)
    wt = np.empty((16, 16), np.float32)
    scales = np.empty(16, np.float32)
    bisc = np.empty(16, np.float32)
    st = np.empty((6, 16), np.float32)
    for b in range(x.shape[0]):
        for g in range(16):
            for i in range(16):
                v = x[b, 16 * g + i]
                xt[i, g] = v
                wt[i, g] = qw[b, 16 * g + i] if has_qw else v * v
        _qx_lanes(xt, wt, 16, 32, scales, bisc, st)
        max_scale = F(0)
        max_abs = F(0)
        for ib in range(16):
            s = scales[ib]
            if abs(s) > max_abs:
                max_abs = abs(s)
                max_scale = s
        if max_abs < GROUP_MAX_EPS:
            for i in range(210):
                out[b, i] = 0
            dd[b, 0] = F(0)
            continue
        for g in range(16):
            z = st[0, g] < GROUP_MAX_EPS
            for i in range(16):
                L[16 * g + i] = 0 if z else 32 + max(-32, min(31, _nearest_int(bisc[g] * xt[i, g])))
        iscale = F(-128) / max_scale
        d = F(1) / iscale
        dd[b, 0] = d
        dh = _f16r(d)
        for ib in range(16):
            sc = min(127, _nearest_int(iscale * scales[ib]))
            out[b, 192 + ib] = np.uint8(sc & 255)
            dj = dh * F(sc)
            if dj == 0:
                continue
            for ii in range(16):
                l = _nearest_int(x[b, 16 * ib + ii] / dj)
                L[16 * ib + ii] = max(-32, min(31, l)) + 32
        for h in range(2):
            j = 128 * h
            for l in range(32):
                q1 = L[j + l] & 15
                q2 = L[j + l + 32] & 15
                q3 = L[j + l + 64] & 15
                q4 = L[j + l + 96] & 15
                out[b, 64 * h + l] = np.uint8(q1 | (q3 << 4))
                out[b, 64 * h + l + 32] = np.uint8(q2 | (q4 << 4))
                out[b, 128 + 32 * h + l] = np.uint8(
                    (L[j + l] >> 4)
                    | ((L[j + l + 32] >> 4) << 2)
                    | ((L[j + l + 64] >> 4) << 4)
                    | ((L[j + l + 96] >> 4) << 6)
                )


# ---- IQ4_NL / IQ4_XS --------------------------------------------------------------------------------


@njit(cache=True, inline="always")
def _best_index(vf, al):
    """ggml's ``best_index_int8(16, values, al)`` as (index, value), without branches: the values are
    sorted, so the binary search's upper bound is the first value above ``al``; then C's nearer-of-two
    test in float32. ``vf``: the 16 values as float32."""
    lo = vf[0]
    hi = vf[1]
    idx = 0
    for k in range(1, 15):
        c = vf[k] <= al
        lo = vf[k] if c else lo
        hi = vf[k + 1] if c else hi
        idx += 1 if c else 0
    if al - lo < hi - al:
        return idx, lo
    return idx + 1, hi


@njit(cache=True, inline="always")
def _iq4_lanes(xt, wt, G, vf, ntry, dv, st):
    """The per-32 scale search of ``quantize_row_iq4_nl_impl`` for ``G`` groups at once, one per SIMD
    lane (``xt[i, g]``; each lane the C loop's float32 operations in order): ``dv[g]``, 0 for a group
    with max |x| < GROUP_MAX_EPS. ``st`` float32[6, G] scratch."""
    amax = st[0]
    mx = st[1]
    sumqx = st[2]
    sumq2 = st[3]
    best = st[4]
    idv = st[5]
    for g in range(G):
        amax[g] = F(0)
        mx[g] = F(0)
    for i in range(32):
        for g in range(G):
            ax = abs(xt[i, g])
            c = ax > amax[g]
            amax[g] = ax if c else amax[g]
            mx[g] = xt[i, g] if c else mx[g]
    for g in range(G):
        mx[g] = mx[g] if amax[g] >= GROUP_MAX_EPS else F(1)
        d = -mx[g] / vf[0] if ntry > 0 else mx[g] / vf[0]
        idv[g] = F(1) / d
        sumqx[g] = F(0)
        sumq2[g] = F(0)
    for i in range(32):
        for g in range(G):
            xj = xt[i, g]
            q = _best_index(vf, idv[g] * xj)[1]
            w = wt[i, g]
            sumqx[g] += w * q * xj
            sumq2[g] += w * q * q
    for g in range(G):
        d = sumqx[g] / sumq2[g] if sumq2[g] > F(0) else F(0)
        dv[g] = d
        best[g] = d * sumqx[g]
    for itry in range(-ntry, ntry + 1):
        for g in range(G):
            idv[g] = (F(itry) + vf[0]) / mx[g]
            sumqx[g] = F(0)
            sumq2[g] = F(0)
        for i in range(32):
            for g in range(G):
                xj = xt[i, g]
                q = _best_index(vf, idv[g] * xj)[1]
                w = wt[i, g]
                sumqx[g] += w * q * xj
                sumq2[g] += w * q * q
        for g in range(G):
            upd = sumq2[g] > F(0) and sumqx[g] * sumqx[g] > best[g] * sumq2[g]
            d = sumqx[g] / sumq2[g]
            dv[g] = d if upd else dv[g]
            best[g] = d * sumqx[g] if upd else best[g]
    for g in range(G):
        dv[g] = F(0) if amax[g] < GROUP_MAX_EPS else dv[g]


@njit(cache=True, nogil=True, error_model="numpy")
def iq4_kernel(x, qw, has_qw, vf, out, dd, xs):
    """IQ4_NL blocks of 32 (``xs`` False: ``x[nb, 32]``) or IQ4_XS super-blocks of 256 (``x[nb, 256]``);
    the scale searches of 16 groups of 32 at a time."""
    nsub = 8 if xs else 1
    n = 32 * nsub
    qo = 8 if xs else 2  # offset of qs in the block
    nb = x.shape[0]
    ng = nb * nsub
    G = 16
    scl = np.empty(ng, np.float32)
    sig = np.empty(nb, np.float32)
    xt = np.empty((32, G), np.float32)
    wt = np.empty((32, G), np.float32)
    dv = np.empty(G, np.float32)
    st = np.empty((6, G), np.float32)
    L = np.zeros(256, np.int32)
    if has_qw:
        for b in range(nb):
            sigma2 = F(0)
            for j in range(n):
                sigma2 += x[b, j] * x[b, j]
            sigma2 *= F(2) / F(n)
            sig[b] = sigma2
    for c0 in range(0, ng, G):
        for g in range(G):
            gi = min(c0 + g, ng - 1)  # a short last pass repeats its last group
            b = gi // nsub
            o = 32 * (gi % nsub)
            for i in range(32):
                v = x[b, o + i]
                xt[i, g] = v
                if has_qw:
                    wt[i, g] = qw[b, o + i] * np.sqrt(sig[b] + v * v)
                else:
                    wt[i, g] = v * v
        _iq4_lanes(xt, wt, G, vf, 7, dv, st)
        for g in range(min(G, ng - c0)):
            scl[c0 + g] = dv[g]
    for b in range(nb):
        if xs:
            max_scale = F(0)
            amax_scale = F(0)
            for ib in range(8):
                d = scl[8 * b + ib]
                if abs(d) > amax_scale:
                    amax_scale = abs(d)
                    max_scale = d
            d = -max_scale / F(32)
            dd[b, 0] = d
            idv = F(1) / d if d != 0 else F(0)
            sh = 0
            for ib in range(8):
                l = max(-32, min(31, _nearest_int(idv * scl[8 * b + ib])))
                dl = d * F(l)
                idl = F(1) / dl if dl != 0 else F(0)
                for j in range(32):
                    L[32 * ib + j] = _best_index(vf, idl * x[b, 32 * ib + j])[0]
                l += 32
                if ib % 2 == 0:
                    out[b, 4 + ib // 2] = np.uint8(l & 15)
                else:
                    out[b, 4 + ib // 2] |= np.uint8((l & 15) << 4)
                sh |= (l >> 4) << (2 * ib)
            out[b, 2] = np.uint8(sh & 255)
            out[b, 3] = np.uint8((sh >> 8) & 255)
        else:
            s0 = scl[b]
            dd[b, 0] = s0
            idv = F(1) / s0 if s0 != 0 else F(0)
            for j in range(32):
                L[j] = _best_index(vf, idv * x[b, j])[0]
        for i in range(nsub):
            for j in range(16):
                out[b, qo + 16 * i + j] = np.uint8(L[32 * i + j] | (L[32 * i + 16 + j] << 4))


# ---- F16 -> F32 (the usual input of llama-quantize) ------------------------------------------------------

F16_TABLE = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(F)


@njit(cache=True, nogil=True)
def f16_kernel(src, tab, out):
    for i in range(src.size):
        out[i] = tab[src[i]]


@njit(cache=True, nogil=True)
def f16_kernel_cvt(src, tab, out):
    """As ``f16_kernel`` through the CPU's half->float conversion, 8 at a time (3x faster; the same bits
    except a signaling NaN, which comes out quiet)."""
    n = src.size
    n8 = n - n % 8
    for i in range(0, n8, 8):
        vstore(out, i, vh8(src, i))
    for i in range(n8, n):
        out[i] = tab[src[i]]


def f16_to_f32(raw: np.ndarray, exact_nan: bool = True) -> np.ndarray:
    """``uint8[rows, 2n]`` (F16 bytes) -> ``float32[rows, n]`` through a 64 Ki-entry table, or
    (``exact_nan`` False: for a quantized destination, where NaN is an error anyway) the CPU's
    conversion."""
    src = np.ascontiguousarray(raw).view("<u2")
    out = np.empty(src.shape, F)
    (f16_kernel if exact_nan else f16_kernel_cvt)(src.reshape(-1), F16_TABLE, out.reshape(-1))
    return out


# ---- entry points: float32[nb, bs] blocks -> uint8[nb, type_size] ----------------------------------------


def _finish(out: np.ndarray, dd: np.ndarray, offsets: tuple[int, ...]) -> np.ndarray:
    h = dd.astype("<f2").view(np.uint8)
    for k, o in enumerate(offsets):
        out[:, o : o + 2] = h[:, 2 * k : 2 * k + 2]
    return out


def _prep(x: np.ndarray, ts: int, nd: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x = np.ascontiguousarray(x, dtype=F)
    return x, np.empty((x.shape[0], ts), np.uint8), np.empty((x.shape[0], nd), F)


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    x, out, dd = _prep(x, 34, 1)
    q8_0_kernel(x, out, dd)
    return _finish(out, dd, (0,))


def quantize_q4_0(x: np.ndarray) -> np.ndarray:
    x, out, dd = _prep(x, 18, 1)
    q4_0_kernel(x, out, dd, False)
    return _finish(out, dd, (0,))


def quantize_q5_0(x: np.ndarray) -> np.ndarray:
    x, out, dd = _prep(x, 22, 1)
    q4_0_kernel(x, out, dd, True)
    return _finish(out, dd, (0,))


def quantize_q4_1(x: np.ndarray) -> np.ndarray:
    x, out, dd = _prep(x, 20, 2)
    q4_1_kernel(x, out, dd, False)
    return _finish(out, dd, (0, 2))


def quantize_q5_1(x: np.ndarray) -> np.ndarray:
    x, out, dd = _prep(x, 24, 2)
    q4_1_kernel(x, out, dd, True)
    return _finish(out, dd, (0, 2))


def _weights(qw: np.ndarray | None, x: np.ndarray) -> tuple[np.ndarray, bool]:
    if qw is None:
        return x[:1], False
    return np.ascontiguousarray(qw, dtype=F), True


def quantize_q6_k(x: np.ndarray, qw: np.ndarray | None) -> np.ndarray:
    x, out, dd = _prep(x, 210, 1)
    w, has = _weights(qw, x)
    q6_k_kernel(x, w, has, out, dd)
    return _finish(out, dd, (208,))


def quantize_iq4_nl(x: np.ndarray, qw: np.ndarray | None = None, sigma2=None) -> np.ndarray:
    x, out, dd = _prep(x, 18, 1)
    w, has = _weights(qw, x)
    iq4_kernel(x, w, has, _IQ4_VALUES, out, dd, False)
    return _finish(out, dd, (0,))


def quantize_iq4_xs(x: np.ndarray, qw: np.ndarray | None = None, sigma2=None) -> np.ndarray:
    x, out, dd = _prep(x, 136, 1)
    w, has = _weights(qw, x)
    iq4_kernel(x, w, has, _IQ4_VALUES, out, dd, True)
    return _finish(out, dd, (0,))
