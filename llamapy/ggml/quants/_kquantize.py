"""k-quant quantizers: llama.cpp's ``quantize_row_q*_K_ref`` (no importance weights) and
``quantize_row_q*_K_impl`` (with them), vectorized over super-blocks of 256, float32 in C order.

Each ``quantize_qN_k(x float32[nb, 256], qw float32[nb, 256] | None) -> uint8[nb, type_size]``.
"""

from __future__ import annotations

import numpy as np

from ._search import (
    _safe_div,
    _seq,
    make_q3_quants,
    make_qkx2_quants,
    make_qkx3_quants,
    make_qp_quants,
    make_qx_quants,
    nearest_int,
)
from .base import to_f16_bytes

F = np.float32
_U8 = np.uint8
QK_K = 256


def _h(d: np.ndarray) -> np.ndarray:
    """Round-trip through half (``GGML_FP16_TO_FP32(GGML_FP32_TO_FP16(d))``)."""
    return d.astype(np.float16).astype(F)


def _first_absmax(v: np.ndarray) -> np.ndarray:
    """The value of largest |v| per row (first one; 0 when all are 0), keepdims."""
    return np.take_along_axis(v, np.abs(v).argmax(axis=-1)[:, None], axis=-1)


def _requant(
    x: np.ndarray, d: np.ndarray, dm: np.ndarray | None, lo: int, hi: int, L: np.ndarray
) -> np.ndarray:
    """``L = clamp(nearest_int((x + dm) / d))`` for each group whose ``d != 0`` (the others keep L)."""
    nz = d != 0
    num = x if dm is None else x + dm
    q = np.clip(nearest_int(_safe_div(num, np.where(nz, d, F(1)))), lo, hi)
    return np.where(nz, q, L)


def _pack_2bit(L: np.ndarray) -> np.ndarray:
    """uint8[nb, 256] of 2-bit values -> uint8[nb, 64]: byte 32h + l holds elements 128h + l + 32k."""
    nb = L.shape[0]
    q = L.reshape((nb, 2, 4, 32)).astype(_U8) << (2 * np.arange(4, dtype=_U8))[:, None]
    return np.bitwise_or.reduce(q, axis=2).reshape((nb, 64))


def _pack_scales_k4(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """8 six-bit scales and mins -> the 12 bytes read by ``get_scale_min_k4``."""
    ls = ls.astype(_U8)
    lm = lm.astype(_U8)
    a = ls[:, :4] | ((ls[:, 4:] >> _U8(4)) << _U8(6))
    b = lm[:, :4] | ((lm[:, 4:] >> _U8(4)) << _U8(6))
    c = (ls[:, 4:] & _U8(0x0F)) | ((lm[:, 4:] & _U8(0x0F)) << _U8(4))
    return np.concatenate([a, b, c], axis=-1)


def _scale_min_k4(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    from .kquants import scale_min_k4

    return scale_min_k4(packed)


def _sw(w: np.ndarray) -> np.ndarray:
    return _seq(w)[..., 0]


# ---- Q2_K ------------------------------------------------------------------------------------------


def quantize_q2_k(x: np.ndarray, qw: np.ndarray | None) -> np.ndarray:
    nb = x.shape[0]
    xs = x.reshape((nb * 16, 16))
    if qw is None:
        sc, mins, L = make_qkx2_quants(xs, 3, np.abs(xs), -0.5, 0.1, 15, True)
        sc, mins = sc.reshape((nb, 16)), mins.reshape((nb, 16))
        q4 = F(15)
        max_scale = np.maximum(sc.max(axis=-1, keepdims=True), F(0))
        max_min = np.maximum(mins.max(axis=-1, keepdims=True), F(0))
        ls = nearest_int(_safe_div(q4, np.where(max_scale > 0, max_scale, F(1))) * sc) & 0xFF
        ls = np.where(max_scale > 0, ls, 0)
        lm = nearest_int(_safe_div(q4, np.where(max_min > 0, max_min, F(1))) * mins)
        scales = np.where(max_min > 0, ls | ((lm << 4) & 0xFF), ls).astype(_U8)
        d = np.where(max_scale > 0, max_scale / q4, F(0)).astype(F)
        dmin = np.where(max_min > 0, max_min / q4, F(0)).astype(F)
    else:
        sigma2 = _seq(x * x) / F(QK_K)
        w = (qw * np.sqrt(sigma2 + x * x)).astype(F).reshape((nb * 16, 16))
        sw = _sw(w).reshape((nb, 16))
        sc, mins, L = make_qkx3_quants(xs, 3, w, -0.9, 0.05, 36, False)
        d, Ls = make_qp_quants(sc.reshape((nb, 16)), 15, sw)
        dmin, Lm = make_qp_quants(mins.reshape((nb, 16)), 15, sw)
        scales = (Ls | (Lm << _U8(4))).astype(_U8)
    dq = _h(d) * (scales & _U8(0x0F)).astype(F)
    mq = _h(dmin) * (scales >> _U8(4)).astype(F)
    L = _requant(x.reshape((nb, 16, 16)), dq[:, :, None], mq[:, :, None], 0, 3, L.reshape((nb, 16, 16)))
    return np.concatenate(
        [scales, _pack_2bit(L.reshape((nb, QK_K))), to_f16_bytes(d), to_f16_bytes(dmin)], axis=-1
    )


# ---- Q3_K ------------------------------------------------------------------------------------------


def _pack_q3_scales(l: np.ndarray) -> np.ndarray:
    """16 values in 0..63 -> 12 bytes (low nibbles in 0..7, high 2 bits in 8..11)."""
    l = l.astype(_U8)
    lo = (l[:, :8] & _U8(0x0F)) | ((l[:, 8:] & _U8(0x0F)) << _U8(4))
    hi = (l >> _U8(4)).reshape((-1, 4, 4)) << (2 * np.arange(4, dtype=_U8))[:, None]  # [nb, j//4, j%4]
    return np.concatenate([lo, np.bitwise_or.reduce(hi, axis=1)], axis=-1)


def quantize_q3_k(x: np.ndarray, qw: np.ndarray | None) -> np.ndarray:
    from .kquants import q3_k_scales

    nb = x.shape[0]
    xs = x.reshape((nb * 16, 16))
    if qw is None:
        sc, L = make_q3_quants(xs, 4, True)
        sc = sc.reshape((nb, 16))
        max_scale = _first_absmax(sc)
        nz = max_scale != 0
        iscale = _safe_div(F(-32), np.where(nz, max_scale, F(1)))
        l = np.clip(nearest_int(iscale * sc), -32, 31) + 32
        packed = np.where(nz, _pack_q3_scales(l), _U8(0)).astype(_U8)
        d = np.where(nz, _safe_div(F(1), iscale), F(0)).astype(F)
    else:
        sigma2 = F(2) * _seq(x * x) / F(QK_K)
        w = (qw * np.sqrt(sigma2 + x * x)).astype(F).reshape((nb * 16, 16))
        sw = _sw(w).reshape((nb, 16))
        sc, L = make_qx_quants(xs, 4, w, rmse_type=1)
        d, Ls = make_qx_quants(sc.reshape((nb, 16)), 32, sw, rmse_type=1)
        packed = _pack_q3_scales(Ls.astype(np.int32))
    dq = _h(d) * q3_k_scales(packed).astype(F)
    L = _requant(
        x.reshape((nb, 16, 16)), dq[:, :, None], None, -4, 3, L.reshape((nb, 16, 16)).astype(np.int32) - 4
    )
    L = (L + 4).reshape((nb, QK_K))
    high = L > 3
    hm = (high.reshape((nb, 8, 32)).astype(_U8) << np.arange(8, dtype=_U8)[:, None]).astype(_U8)
    hmask = np.bitwise_or.reduce(hm, axis=1)
    L = np.where(high, L - 4, L)
    return np.concatenate([hmask, _pack_2bit(L), packed, to_f16_bytes(d)], axis=-1)


# ---- Q4_K / Q5_K -----------------------------------------------------------------------------------


def _q45_scales(x: np.ndarray, qw: np.ndarray | None, nmax: int, ref: tuple[float, float, int]):
    """Sub-block search of Q4_K/Q5_K; returns (packed scales, d, dmin, L)."""
    nb = x.shape[0]
    xs = x.reshape((nb * 8, 32))
    if qw is None:
        av_x = np.sqrt(_seq(xs * xs) / F(32)).astype(F)
        w = (av_x + np.abs(xs)).astype(F)
        sc, mins, L = make_qkx2_quants(xs, nmax, w, ref[0], ref[1], ref[2], False)
        sc, mins = sc.reshape((nb, 8)), mins.reshape((nb, 8))
        max_scale = np.maximum(sc.max(axis=-1, keepdims=True), F(0))
        max_min = np.maximum(mins.max(axis=-1, keepdims=True), F(0))
        inv_s = np.where(max_scale > 0, _safe_div(F(63), np.where(max_scale > 0, max_scale, F(1))), F(0))
        inv_m = np.where(max_min > 0, _safe_div(F(63), np.where(max_min > 0, max_min, F(1))), F(0))
        ls = np.minimum(63, nearest_int(inv_s.astype(F) * sc) & 0xFF)
        lm = np.minimum(63, nearest_int(inv_m.astype(F) * mins) & 0xFF)
        d = (max_scale / F(63)).astype(F)
        dmin = (max_min / F(63)).astype(F)
    else:
        sigma2 = F(2) * _seq(x * x) / F(QK_K)
        w = (qw * np.sqrt(sigma2 + x * x)).astype(F).reshape((nb * 8, 32))
        sw = _sw(w).reshape((nb, 8))
        sc, mins, L = make_qkx3_quants(xs, nmax, w, -0.9, 0.05, 36, False)
        d, ls = make_qp_quants(sc.reshape((nb, 8)), 63, sw)
        dmin, lm = make_qp_quants(mins.reshape((nb, 8)), 63, sw)
    packed = _pack_scales_k4(ls, lm)
    s6, m6 = _scale_min_k4(packed)
    dq = _h(d) * s6.astype(F)
    mq = _h(dmin) * m6.astype(F)
    L = _requant(x.reshape((nb, 8, 32)), dq[:, :, None], mq[:, :, None], 0, nmax, L.reshape((nb, 8, 32)))
    return packed, d, dmin, L.reshape((nb, QK_K))


def _pack_nibbles64(L: np.ndarray) -> np.ndarray:
    """uint8[nb, 256] of 4-bit values -> uint8[nb, 128]: per 64, element l low, l + 32 high."""
    nb = L.shape[0]
    q = L.reshape((nb, 4, 2, 32)).astype(_U8)
    return (q[:, :, 0] | (q[:, :, 1] << _U8(4))).reshape((nb, 128))


def quantize_q4_k(x: np.ndarray, qw: np.ndarray | None) -> np.ndarray:
    packed, d, dmin, L = _q45_scales(x, qw, 15, (-1.0, 0.1, 20))
    return np.concatenate([to_f16_bytes(d), to_f16_bytes(dmin), packed, _pack_nibbles64(L)], axis=-1)


def quantize_q5_k(x: np.ndarray, qw: np.ndarray | None) -> np.ndarray:
    nb = x.shape[0]
    packed, d, dmin, L = _q45_scales(x, qw, 31, (-0.5, 0.1, 15))
    high = (L > 15).reshape((nb, 8, 32)).astype(_U8)  # bit (element // 32) of qh[element % 32]
    qh = np.bitwise_or.reduce(high << np.arange(8, dtype=_U8)[:, None], axis=1)
    return np.concatenate([to_f16_bytes(d), to_f16_bytes(dmin), packed, qh, _pack_nibbles64(L & 15)], axis=-1)


# ---- Q6_K ------------------------------------------------------------------------------------------


def quantize_q6_k(x: np.ndarray, qw: np.ndarray | None) -> np.ndarray:
    nb = x.shape[0]
    xs = x.reshape((nb * 16, 16))
    sc, L = make_qx_quants(xs, 32, None if qw is None else qw.reshape((nb * 16, 16)), rmse_type=1)
    sc = sc.reshape((nb, 16))
    max_scale = _first_absmax(sc)
    zero = np.abs(max_scale) < F(1e-15)
    iscale = _safe_div(F(-128), np.where(zero, F(1), max_scale))
    d = _safe_div(F(1), iscale)
    scales = np.minimum(127, nearest_int(iscale * sc)).astype(np.int8)
    dq = _h(d) * scales.astype(F)
    L = _requant(
        x.reshape((nb, 16, 16)), dq[:, :, None], None, -32, 31, L.reshape((nb, 16, 16)).astype(np.int32) - 32
    )
    L = (L + 32).reshape((nb, 2, 4, 32)).astype(_U8)
    lo = L & _U8(15)
    ql = np.concatenate(
        [lo[:, :, 0] | (lo[:, :, 2] << _U8(4)), lo[:, :, 1] | (lo[:, :, 3] << _U8(4))], axis=-1
    )
    ql = ql.reshape((nb, 128))
    qh = np.bitwise_or.reduce((L >> _U8(4)) << (2 * np.arange(4, dtype=_U8))[:, None], axis=2).reshape(
        (nb, 64)
    )
    out = np.concatenate([ql, qh, scales.view(_U8), to_f16_bytes(d)], axis=-1)
    out[zero[:, 0]] = 0
    return out


# ---- Q8_K ------------------------------------------------------------------------------------------


def quantize_q8_k(x: np.ndarray) -> np.ndarray:
    nb = x.shape[0]
    mx = _first_absmax(x)
    zero = mx == 0
    iscale = _safe_div(F(-127), np.where(zero, F(1), mx))
    q = np.minimum(127, nearest_int(iscale * x))
    q = np.where(zero, 0, q).astype(np.int8)
    bsums = q.reshape((nb, 16, 16)).astype(np.int16).sum(axis=-1, dtype=np.int16).astype("<i2")
    d = np.where(zero, F(0), _safe_div(F(1), iscale)).astype("<f4")
    return np.concatenate([d.view(_U8), q.view(_U8), np.ascontiguousarray(bsums).view(_U8)], axis=-1)
