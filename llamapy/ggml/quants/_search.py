"""llama.cpp's scale searches (``make_qx_quants``, ``make_q3_quants``, ``make_qkx2_quants``,
``make_qkx3_quants``, ``make_qp_quants`` from ggml-quants.c), vectorized over groups.

Each function takes ``x: float32[ng, n]`` (one group of ``n`` values per row) and works on all groups
at once. Bytes must equal llama.cpp's, so every step keeps the C code's float32 operations in the same
order: sums are accumulated element by element (``_seq``), never pairwise, and a data-dependent branch
becomes a mask that selects, per group, what the C code would have kept.
"""

from __future__ import annotations

import numpy as np

F = np.float32
GROUP_MAX_EPS = F(1e-15)


# groups from which the searches run in Numba (``_search_fast``); smaller inputs stay in NumPy
FAST_MIN_GROUPS = 512


def _seq(v: np.ndarray) -> np.ndarray:
    """Sum over the last axis in order (like a C ``for`` loop), float32, keepdims."""
    return np.cumsum(v, axis=-1, dtype=F)[..., -1:]


def nearest_int(v: np.ndarray) -> np.ndarray:
    """ggml's ``nearest_int``: round half to even, as int32 (inf/nan map to 0)."""
    with np.errstate(invalid="ignore"):
        r = np.rint(np.nan_to_num(v, nan=0.0, posinf=0.0, neginf=0.0))
    return r.astype(np.int32)


def _safe_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return (a / b).astype(F)


def _signed_absmax(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ax = np.abs(x)
    i = ax.argmax(axis=-1)[:, None]  # first maximum, like the strict ``>`` of the C loop
    return np.take_along_axis(x, i, axis=-1), np.take_along_axis(ax, i, axis=-1)


def make_qx_quants(
    x: np.ndarray, nmax: int, qw: np.ndarray | None = None, rmse_type: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric quantization to ``[-nmax, nmax-1]`` with a scale search; returns
    ``(scale float32[ng, 1], L int8[ng, n])`` where L holds ``l + nmax``."""
    if len(x) >= FAST_MIN_GROUPS:  # the same loops in Numba (bit-identical, parallel)
        from . import _search_fast

        return _search_fast.make_qx_quants(x, nmax, qw, rmse_type)
    x = x.astype(F, copy=False)
    mx, amax = _signed_absmax(x)
    zero = amax < GROUP_MAX_EPS
    mx_safe = np.where(zero, F(1), mx).astype(F)
    iscale = _safe_div(F(-nmax), mx_safe)

    def levels(isc: np.ndarray) -> np.ndarray:
        return np.clip(nearest_int(isc * x), -nmax, nmax - 1)

    l0 = levels(iscale)
    if rmse_type == 0:
        L = (l0 + nmax).astype(np.int8)
        scale = _safe_div(F(1), iscale)
        return np.where(zero, F(0), scale), np.where(zero, np.int8(0), L)
    return_early = rmse_type < 0
    rmse_type = abs(rmse_type)
    if qw is not None:
        w = qw.astype(F, copy=False)
    elif rmse_type == 1:
        w = x * x
    elif rmse_type == 2:
        w = np.ones_like(x)
    elif rmse_type == 3:
        w = np.abs(x)
    else:
        w = np.sqrt(np.abs(x))
    lf = l0.astype(F)
    sumlx = _seq(w * x * lf)
    suml2 = _seq(w * lf * lf)
    scale = np.where(suml2 != 0, _safe_div(sumlx, suml2), F(0)).astype(F)
    L = l0
    if return_early:
        inv = _safe_div(F(1), iscale)
        scale = np.where(suml2 > 0, F(0.5) * (scale + inv), inv).astype(F)
    else:
        best = scale * sumlx
        for i in range(-9, 10):
            if i == 0:
                continue
            isc = _safe_div(-(F(nmax) + F(0.1) * F(i)), mx_safe)
            li = levels(isc)
            lf = li.astype(F)
            slx = _seq(w * x * lf)
            sl2 = _seq(w * lf * lf)
            upd = (sl2 > 0) & (slx * slx > best * sl2)
            L = np.where(upd, li, L)
            scale = np.where(upd, _safe_div(slx, sl2), scale).astype(F)
            best = np.where(upd, scale * slx, best).astype(F)
    L = (L + nmax).astype(np.int8)
    return np.where(zero, F(0), scale).astype(F), np.where(zero, np.int8(0), L)


def make_q3_quants(x: np.ndarray, nmax: int, do_rmse: bool) -> tuple[np.ndarray, np.ndarray]:
    """Returns ``(scale float32[ng, 1], L int8[ng, n])`` with L in ``[0, 2*nmax)``."""
    x = x.astype(F, copy=False)
    mx, amax = _signed_absmax(x)
    zero = amax < GROUP_MAX_EPS
    mx_safe = np.where(zero, F(1), mx).astype(F)
    iscale = _safe_div(F(-nmax), mx_safe)
    L = np.clip(nearest_int(iscale * x), -nmax, nmax - 1)
    if do_rmse:
        w = x * x
        lf = L.astype(F)
        sumlx = _seq(w * x * lf)[:, 0]
        suml2 = _seq(w * lf * lf)[:, 0]
        for _ in range(5):
            for i in range(x.shape[1]):
                wi, xi, li = w[:, i], x[:, i], L[:, i].astype(F)
                slx = sumlx - wi * xi * li
                sl2 = suml2 - wi * li * li
                new_l = np.clip(nearest_int(_safe_div(xi * sl2, slx)), -nmax, nmax - 1)
                nl = new_l.astype(F)
                slx2 = slx + wi * xi * nl
                sl22 = sl2 + wi * nl * nl
                with np.errstate(over="ignore", invalid="ignore"):
                    better = slx2 * slx2 * suml2 > sumlx * sumlx * sl22
                upd = (slx > 0) & (new_l != L[:, i]) & (sl22 > 0) & better
                L[:, i] = np.where(upd, new_l, L[:, i])
                sumlx = np.where(upd, slx2, sumlx).astype(F)
                suml2 = np.where(upd, sl22, suml2).astype(F)
        scale = np.where(suml2 > 0, _safe_div(sumlx, suml2), F(0)).astype(F)[:, None]
    else:
        scale = _safe_div(F(1), iscale)
    L = (L + nmax).astype(np.int8)
    return np.where(zero, F(0), scale).astype(F), np.where(zero, np.int8(0), L)


def make_qkx_quants(
    x: np.ndarray,
    nmax: int,
    weights: np.ndarray | None,
    rmin: float,
    rdelta: float,
    nstep: int,
    use_mad: bool,
    version: int = 2,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``make_qkx2_quants`` (version 2, weights required) or ``make_qkx3_quants`` (version 3, weights
    default to x*x): asymmetric quantization to ``[0, nmax]``. Returns ``(scale, the_min, L uint8)``
    with ``x ~= scale * L - the_min``."""
    if len(x) >= FAST_MIN_GROUPS:
        from . import _search_fast

        return _search_fast.make_qkx_quants(x, nmax, weights, rmin, rdelta, nstep, use_mad, version)
    x = x.astype(F, copy=False)
    w = (x * x) if weights is None else weights.astype(F, copy=False)
    mn = np.minimum(x.min(axis=-1, keepdims=True), F(0)).astype(F)
    mx = x.max(axis=-1, keepdims=True)
    sum_w = _seq(w)
    sum_x = _seq(w * x)
    flat = (mx == mn) if version == 2 else (mx <= mn)
    rng = np.where(flat, F(1), mx - mn).astype(F)

    def err(scale: np.ndarray, mnv: np.ndarray, lf: np.ndarray) -> np.ndarray:
        diff = scale * lf + mnv - x
        diff = np.abs(diff) if use_mad else diff * diff
        return _seq(w * diff)

    iscale = _safe_div(F(nmax), rng)
    scale = _safe_div(F(1), iscale)
    L = np.clip(nearest_int(iscale * (x - mn)), 0, nmax)
    best = err(scale, mn, L.astype(F))
    for i in range(nstep + 1 if nstep >= 1 else 0):
        # the C code updates ``min`` as it goes, and both the range and the offset follow it
        rng = np.where(flat, F(1), mx - mn).astype(F)
        isc = _safe_div(F(rmin) + F(rdelta) * F(i) + F(nmax), rng)
        la = np.clip(nearest_int(isc * (x - mn)), 0, nmax)
        lf = la.astype(F)
        sum_l = _seq(w * lf)
        sum_l2 = _seq(w * lf * lf)
        sum_xl = _seq(w * lf * x)
        with np.errstate(over="ignore", invalid="ignore"):
            D = sum_w * sum_l2 - sum_l * sum_l
            this_scale = _safe_div(sum_w * sum_xl - sum_x * sum_l, D)
            this_min = _safe_div(sum_l2 * sum_x - sum_l * sum_xl, D)
        pos = this_min > 0
        this_scale = np.where(pos, _safe_div(sum_xl, sum_l2), this_scale).astype(F)
        this_min = np.where(pos, F(0), this_min).astype(F)
        cur = err(this_scale, this_min, lf)
        upd = (D > 0) & (cur < best)
        L = np.where(upd, la, L)
        best = np.where(upd, cur, best).astype(F)
        scale = np.where(upd, this_scale, scale).astype(F)
        mn = np.where(upd, this_min, mn).astype(F)
    scale = np.where(flat, F(0), scale).astype(F)
    L = np.where(flat, 0, L).astype(np.uint8)
    return scale, (-mn).astype(F), L


def make_qkx2_quants(x, nmax, weights, rmin, rdelta, nstep, use_mad):
    return make_qkx_quants(x, nmax, weights, rmin, rdelta, nstep, use_mad, version=2)


def make_qkx3_quants(x, nmax, weights, rmin, rdelta, nstep, use_mad):
    """Returns ``(scale, the_min, L)``; note the legacy impl quantizers store ``m = -the_min``."""
    return make_qkx_quants(x, nmax, weights, rmin, rdelta, nstep, use_mad, version=3)


def make_qp_quants(x: np.ndarray, nmax: int, qw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Quantize non-negative values (the sub-block scales) to ``[0, nmax]`` with weights."""
    x = x.astype(F, copy=False)
    w = qw.astype(F, copy=False)
    mx = np.maximum(x.max(axis=-1, keepdims=True), F(0)).astype(F)
    zero = mx < GROUP_MAX_EPS
    mx_safe = np.where(zero, F(1), mx).astype(F)
    iscale = _safe_div(F(nmax), mx_safe)
    L = nearest_int(iscale * x)
    scale = _safe_div(F(1), iscale)
    diff = x - scale * L.astype(F)
    best = _seq(w * diff * diff)
    for i in range(-4, 5):
        if i == 0:
            continue
        isc = _safe_div(F(0.1) * F(i) + F(nmax), mx_safe)
        sc = _safe_div(F(1), isc)
        li = np.minimum(nmax, nearest_int(isc * x))
        d = x - sc * li.astype(F)
        mse = _seq(w * d * d)
        upd = mse < best
        best = np.where(upd, mse, best).astype(F)
        iscale = np.where(upd, isc, iscale).astype(F)
    L = np.minimum(nmax, nearest_int(iscale * x))
    lf = L.astype(F)
    sumlx = _seq(w * x * lf)[:, 0]
    suml2 = _seq(w * lf * lf)[:, 0]
    for _ in range(5):
        for i in range(x.shape[1]):
            wi, xi, li = w[:, i], x[:, i], L[:, i].astype(F)
            slx = sumlx - wi * xi * li
            sl2 = suml2 - wi * li * li
            new_l = np.minimum(nmax, nearest_int(_safe_div(xi * sl2, slx)))
            nl = new_l.astype(F)
            slx2 = slx + wi * xi * nl
            sl22 = sl2 + wi * nl * nl
            with np.errstate(over="ignore", invalid="ignore"):
                better = slx2 * slx2 * suml2 > sumlx * sumlx * sl22
            upd = (slx > 0) & (sl2 > 0) & (new_l != L[:, i]) & better
            L[:, i] = np.where(upd, new_l, L[:, i])
            sumlx = np.where(upd, slx2, sumlx).astype(F)
            suml2 = np.where(upd, sl22, suml2).astype(F)
    scale = np.where(suml2 > 0, _safe_div(sumlx, suml2), F(0)).astype(F)[:, None]
    return np.where(zero, F(0), scale).astype(F), np.where(zero, 0, L).astype(np.uint8)
