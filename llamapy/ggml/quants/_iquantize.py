"""Quantizers of IQ4_NL, IQ4_XS (llama.cpp's ``quantize_row_iq4_nl_impl`` as called by
``quantize_iq4_nl``/``quantize_iq4_xs``, i.e. what ``ggml_quantize_chunk`` and llama-quantize do),
TQ1_0, TQ2_0 and MXFP4 (``quantize_row_*_ref``). Vectorized over blocks, float32 operations in C order.
"""

from __future__ import annotations

import numpy as np

from . import iq_tables as T
from ._search import _safe_div, _seq, nearest_int
from .base import roundf, to_f16_bytes

F = np.float32
_U8 = np.uint8
_IQ4_VALUES = T.KVALUES_IQ4NL.astype(np.int32)
_IQ4_VALUES_F = T.KVALUES_IQ4NL.astype(F)
GROUP_MAX_EPS = F(1e-15)


def best_index_int8(values: np.ndarray, vf: np.ndarray, x: np.ndarray) -> np.ndarray:
    """ggml's ``best_index_int8``: the index of the value nearest to x (ties to the upper one), int64."""
    n = values.shape[0]
    mu = np.clip(np.searchsorted(vf, x, side="right"), 1, n - 1)
    lo = vf[mu - 1]
    hi = vf[mu]
    idx = np.where(x - lo < hi - x, mu - 1, mu)
    idx = np.where(x <= vf[0], 0, idx)
    idx = np.where(x >= vf[n - 1], n - 1, idx)
    return np.where(np.isnan(x), n - 1, idx)


def _iq4_sub_scales(xb: np.ndarray, w: np.ndarray, ntry: int) -> np.ndarray:
    """The per-32 scale search of ``quantize_row_iq4_nl_impl``; ``xb, w: float32[ng, 32]`` -> ``d[ng, 1]``."""
    vals, vf = _IQ4_VALUES, _IQ4_VALUES_F
    ax = np.abs(xb)
    imax = ax.argmax(axis=-1)[:, None]
    mx = np.take_along_axis(xb, imax, axis=-1)
    zero = np.take_along_axis(ax, imax, axis=-1) < GROUP_MAX_EPS
    mx = np.where(zero, F(1), mx).astype(F)
    d = _safe_div(-mx if ntry > 0 else mx, F(vals[0]))
    idv = _safe_div(F(1), d)

    def sums(idv):
        q = vf[best_index_int8(vals, vf, idv * xb)]
        return _seq(w * q * xb), _seq(w * q * q)

    sumqx, sumq2 = sums(idv)
    d = np.where(sumq2 > 0, _safe_div(sumqx, sumq2), F(0)).astype(F)
    best = d * sumqx
    for itry in range(-ntry, ntry + 1):
        sqx, sq2 = sums(_safe_div(F(itry + int(vals[0])), mx))
        with np.errstate(over="ignore", invalid="ignore"):
            upd = (sq2 > 0) & (sqx * sqx > best * sq2)
        d = np.where(upd, _safe_div(sqx, sq2), d).astype(F)
        best = np.where(upd, d * sqx, best).astype(F)
    return np.where(zero, F(0), d).astype(F)


def _iq4_weights(x: np.ndarray, qw: np.ndarray | None) -> np.ndarray:
    """Per super-block: ``qw * sqrtf(sigma2 + x*x)`` with ``sigma2 = 2 * sum(x*x) / n``, or ``x*x``."""
    if qw is None:
        return x * x
    sigma2 = _seq(x * x) * (F(2) / F(x.shape[-1]))
    return (qw * np.sqrt(sigma2 + x * x)).astype(F)


def _pack_iq4(L: np.ndarray) -> np.ndarray:
    """uint8[nb, n] indices -> uint8[nb, n/2]: per 32, element j low nibble, j+16 high nibble."""
    nb = L.shape[0]
    L = L.reshape((nb, -1, 2, 16)).astype(_U8)
    return (L[:, :, 0] | (L[:, :, 1] << _U8(4))).reshape((nb, -1))


def quantize_iq4_nl(x: np.ndarray, qw: np.ndarray | None = None, sigma2=None) -> np.ndarray:
    """IQ4_NL blocks of 32, as ``quantize_iq4_nl`` (ntry = 7; llama.cpp's row ``_ref`` uses -1)."""
    x = x.astype(F, copy=False)
    d = _iq4_sub_scales(x, _iq4_weights(x, qw), 7)
    # the indices are recomputed with the final scale: ``id = d ? 1/d : 0``
    idv = np.where(d != 0, _safe_div(F(1), np.where(d != 0, d, F(1))), F(0)).astype(F)
    L = best_index_int8(_IQ4_VALUES, _IQ4_VALUES_F, idv * x)
    return np.concatenate([to_f16_bytes(d), _pack_iq4(L)], axis=-1)


def quantize_iq4_xs(x: np.ndarray, qw: np.ndarray | None = None, sigma2=None) -> np.ndarray:
    """IQ4_XS super-blocks of 256, as ``quantize_iq4_xs`` (ntry = 7)."""
    x = x.astype(F, copy=False)
    nb = x.shape[0]
    w = _iq4_weights(x, qw)
    scales = _iq4_sub_scales(x.reshape((-1, 32)), w.reshape((-1, 32)), 7).reshape((nb, 8))
    ia = np.abs(scales).argmax(axis=-1)[:, None]
    max_scale = np.take_along_axis(scales, ia, axis=-1)  # first largest |d| (0 when all are 0)
    d = (-max_scale / F(32)).astype(F)
    idv = np.where(d != 0, _safe_div(F(1), np.where(d != 0, d, F(1))), F(0)).astype(F)
    ls = np.clip(nearest_int(idv * scales), -32, 31)
    dl = (d * ls.astype(F)).astype(F)
    idl = np.where(dl != 0, _safe_div(F(1), np.where(dl != 0, dl, F(1))), F(0)).astype(F)
    L = best_index_int8(_IQ4_VALUES, _IQ4_VALUES_F, idl[:, :, None] * x.reshape((nb, 8, 32)))
    lu = (ls + 32).astype(np.uint32)
    sl = ((lu[:, 0::2] & 0xF) | ((lu[:, 1::2] & 0xF) << 4)).astype(_U8)
    sh = np.bitwise_or.reduce((lu >> 4) << (2 * np.arange(8, dtype=np.uint32)), axis=-1).astype("<u2")
    return np.concatenate(
        [to_f16_bytes(d), sh.reshape((nb, 1)).view(_U8), sl, _pack_iq4(L.reshape((nb, 256)))], axis=-1
    )


def _lround(v: np.ndarray) -> np.ndarray:
    return roundf(v).astype(np.int32)


def _ternary(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    amax = np.abs(x).max(axis=-1, keepdims=True)
    d = amax.astype(F)
    idv = np.where(d != 0, _safe_div(F(1), np.where(d != 0, d, F(1))), F(0)).astype(F)
    return d, (_lround(x * idv) + 1)


def quantize_tq1_0(x: np.ndarray) -> np.ndarray:
    nb = x.shape[0]
    d, xi = _ternary(x.astype(F, copy=False))
    pw5 = np.array([81, 27, 9, 3, 1], dtype=np.int32)
    # byte m of the first 32 holds elements m + 32n (n < 5, the first one most significant)
    q0 = (xi[:, :160].reshape((nb, 5, 32)) * pw5[:, None]).sum(axis=1)
    q1 = (xi[:, 160:240].reshape((nb, 5, 16)) * pw5[:, None]).sum(axis=1)
    qh = (xi[:, 240:256].reshape((nb, 4, 4)) * pw5[:4, None]).sum(axis=1)  # then "q *= 3" in C
    q = np.concatenate([q0, q1, qh], axis=-1) & 0xFF
    q = ((q * 256 + 242) // 243).astype(_U8)
    return np.concatenate([q, to_f16_bytes(d)], axis=-1)


def quantize_tq2_0(x: np.ndarray) -> np.ndarray:
    nb = x.shape[0]
    d, xi = _ternary(x.astype(F, copy=False))
    q = (xi.reshape((nb, 2, 4, 32)) & 3) << (2 * np.arange(4, dtype=np.int32))[:, None]
    q = q.sum(axis=2).reshape((nb, 64)).astype(_U8)
    return np.concatenate([q, to_f16_bytes(d)], axis=-1)


def quantize_mxfp4(x: np.ndarray) -> np.ndarray:
    from .iquants import KVALUES_FP4, e8m0_to_fp32_half

    x = x.astype(F, copy=False)
    amax = np.abs(x).max(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        lg = np.floor(np.log2(np.where(amax > 0, amax, F(1)).astype(F)))
    e = np.where(amax > 0, lg - F(2) + F(127), F(0)).astype(np.int32).astype(_U8)
    d = e8m0_to_fp32_half(e)
    err = np.abs(KVALUES_FP4 * d[:, :, None] - x[:, :, None])  # [nb, 32, 16]
    q = err.argmin(axis=-1).astype(_U8)
    return np.concatenate([e, q[:, :16] | (q[:, 16:] << _U8(4))], axis=-1)
