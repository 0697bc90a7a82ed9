"""Numba kernels of the recurrent ops: ``sigmoid`` / ``softplus`` / ``l2_norm`` rows, the causal
depthwise conv (``ssm_conv``), the gated delta rule token by token (``gated_delta_net``, the decode
form; prompts may take the chunked NumPy form in ``ssm_steps``) and Mamba2's scan (``ssm_scan``).

Float32 arrays, C-contiguous (the steps copy when needed); the per-(sequence, head) recurrences run
in parallel over sequences x heads, the rest serially (cheap at decode sizes).
"""

from __future__ import annotations

import math

from ..._numba import njit, prange  # first: it sets NUMBA_CACHE_DIR before Numba

# isort: split
import numpy as np


@njit(cache=True, fastmath=True, error_model="numpy")
def act_rows(x, kind, eps, out):
    """Rows of ``x [n, d]``: kind 0 sigmoid, 1 softplus (x above 20: x), 2 l2_norm (x / max(|x|, eps))."""
    n, d = x.shape
    for i in range(n):
        if kind == 2:
            s = 0.0
            for j in range(d):
                v = np.float64(x[i, j])
                s += v * v
            sc = np.float32(1.0 / max(math.sqrt(s), eps))
            for j in range(d):
                out[i, j] = x[i, j] * sc
        elif kind == 1:
            for j in range(d):
                v = x[i, j]
                out[i, j] = v if v > 20.0 else np.float32(math.log1p(math.exp(v)))
        else:
            for j in range(d):
                out[i, j] = np.float32(1.0) / (np.float32(1.0) + np.float32(math.exp(-x[i, j])))


@njit(cache=True, fastmath=True, error_model="numpy")
def ssm_conv_rows(sx, c, out):
    """``sx [S, K-1+T, C]``, ``c [C, K]`` -> ``out [S, T, C]`` (causal depthwise conv)."""
    n_s, n_t, n_c = out.shape
    k = c.shape[1]
    for s in range(n_s):
        for t in range(n_t):
            for ch in range(n_c):
                acc = np.float32(0.0)
                for j in range(k):
                    acc += sx[s, t + j, ch] * c[ch, j]
                out[s, t, ch] = acc


@njit(parallel=True, cache=True, fastmath=True, error_model="numpy")
def gdn_recurrent(q, k, v, g, beta, state, y, sout):
    """The gated delta rule token by token: ``q, k [S, T, Hk, D]``, ``v [S, T, H, D]``, ``g, beta [S, T, H]``,
    ``state [S, H, D, D]`` (key, value) -> ``y [S, T, H, D]``, ``sout [S, H, D, D]``."""
    n_s, n_t, n_h, d = v.shape
    hk = q.shape[2]
    for sh in prange(n_s * n_h):
        s = sh // n_h
        h = sh % n_h
        kh = h % hk
        m = sout[s, h]
        m0 = state[s, h]  # read by the first token's decay pass (no separate copy; may alias m)
        if n_t == 0:
            m[:, :] = m0
        kv = np.empty(d, dtype=np.float32)
        for t in range(n_t):
            dec = np.float32(math.exp(g[s, t, h]))
            b = beta[s, t, h]
            for j in range(d):
                kv[j] = 0.0
            for i in range(d):
                ki = k[s, t, kh, i]
                if t == 0:
                    for j in range(d):
                        mij = m0[i, j] * dec
                        m[i, j] = mij
                        kv[j] += mij * ki
                else:
                    for j in range(d):
                        mij = m[i, j] * dec
                        m[i, j] = mij
                        kv[j] += mij * ki
            for j in range(d):
                kv[j] = (v[s, t, h, j] - kv[j]) * b
            for j in range(d):
                y[s, t, h, j] = 0.0
            for i in range(d):
                ki = k[s, t, kh, i]
                qi = q[s, t, kh, i]
                for j in range(d):
                    m[i, j] += ki * kv[j]
                    y[s, t, h, j] += m[i, j] * qi


@njit(parallel=True, cache=True, fastmath=True, error_model="numpy")
def ssm_scan_rows(s0, x, dt, a, b, c, y, sout):
    """Mamba2's scan: ``s0 [S, H, P, N]``, ``x [S, T, H, P]``, ``dt [S, T, H]``, ``a [H, 1]`` (or ``[H, N]``:
    Mamba1), ``b, c [S, T, G, N]`` -> ``y [S, T, H, P]``, ``sout [S, H, P, N]`` (head h reads group
    h // (H // G))."""
    n_s, n_t, n_h, p = x.shape
    g = b.shape[2]
    n = b.shape[3]
    rep = n_h // g
    for sh in prange(n_s * n_h):
        s = sh // n_h
        h = sh % n_h
        gi = h // rep
        st = sout[s, h]
        st0 = s0[s, h]  # read by the first token's update (no separate copy; may alias st)
        if n_t == 0:
            st[:, :] = st0
        per_state = a.shape[1] > 1
        da = np.empty(n, dtype=np.float32)
        for t in range(n_t):
            d = dt[s, t, h]
            for j in range(n):
                da[j] = np.float32(math.exp(d * a[h, j if per_state else 0]))
            for i in range(p):
                dx = d * x[s, t, h, i]
                acc = np.float32(0.0)
                if t == 0:
                    for j in range(n):
                        st[i, j] = st0[i, j] * da[j] + dx * b[s, t, gi, j]
                        acc += st[i, j] * c[s, t, gi, j]
                else:
                    for j in range(n):
                        st[i, j] = st[i, j] * da[j] + dx * b[s, t, gi, j]
                        acc += st[i, j] * c[s, t, gi, j]
                y[s, t, h, i] = acc
