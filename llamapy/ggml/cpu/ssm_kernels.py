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

from .op_kernels import _silu


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
def ssm_conv_rows(sx, ct, out, silu):
    """``sx [S, K-1+T, C]``, the kernel transposed ``ct [K, C]`` -> ``out [S, T, C]`` (causal depthwise
    conv; then SiLU when ``silu``: the fused ``silu(ssm_conv(...))``). Channels innermost (vectorized);
    each output sums its K taps in order, as one channel at a time would."""
    n_s, n_t, n_c = out.shape
    k = ct.shape[0]
    for s in range(n_s):
        for t in range(n_t):
            o = out[s, t]
            x0 = sx[s, t]
            w0 = ct[0]
            for ch in range(n_c):
                o[ch] = np.float32(0.0) + x0[ch] * w0[ch]
            for j in range(1, k):
                xj = sx[s, t + j]
                wj = ct[j]
                for ch in range(n_c):
                    o[ch] += xj[ch] * wj[ch]
            if silu:
                for ch in range(n_c):
                    o[ch] = _silu(o[ch])


@njit(cache=True, fastmath=True, error_model="numpy")
def conv_state_silu(state, x, ct, out, dst):
    """``silu(ssm_conv(concat(state, x)))`` without the concatenation, then the new conv state (the last
    K-1 rows of ``[state; x]``) into ``dst`` (which may be ``state``: rows move forward only): ``state,
    dst [S, K-1, C]``, ``x [S, T, C]``, the kernel transposed ``ct [K, C]`` -> ``out [S, T, C]`` (as
    ``ssm_conv_rows``)."""
    n_s, n_t, n_c = out.shape
    k = ct.shape[0]
    km = k - 1
    for s in range(n_s):
        for t in range(n_t):
            o = out[s, t]
            x0 = state[s, t] if t < km else x[s, t - km]
            w0 = ct[0]
            for ch in range(n_c):
                o[ch] = np.float32(0.0) + x0[ch] * w0[ch]
            for j in range(1, k):
                xj = state[s, t + j] if t + j < km else x[s, t + j - km]
                wj = ct[j]
                for ch in range(n_c):
                    o[ch] += xj[ch] * wj[ch]
            for ch in range(n_c):
                o[ch] = _silu(o[ch])
        for r in range(km):
            src = state[s, r + n_t] if r + n_t < km else x[s, r + n_t - km]
            d = dst[s, r]
            for ch in range(n_c):
                d[ch] = src[ch]


@njit(cache=True, fastmath=True, error_model="numpy")
def silu_mul_rows(z, a, out):
    """``out = a * silu(z)`` over rows (``mul(a, silu(z))``): silu rounded to float32 first, as the two ops
    (one expression would let fastmath reassociate the division and the product)."""
    n, d = z.shape
    for i in range(n):
        for j in range(d):
            out[i, j] = _silu(z[i, j])
        for j in range(d):
            out[i, j] = a[i, j] * out[i, j]


@njit(cache=True, fastmath=True, error_model="numpy")
def gdn_prep(conv, hk, dk, hv, eps_q, sq, eps_k, alpha, bias, a, b, q, k, v, g, beta):
    """The inputs of a Qwen3.5 delta-rule step from the conv output ``conv [T, 2 hk dk + hv dv]`` (q | k | v
    per token) and the projections ``alpha, b [T, hv]``: ``q = l2_norm(q) * sq``, ``k = l2_norm(k)``,
    ``v`` copied, ``g = softplus(alpha + bias) * a``, ``beta = sigmoid(b)`` into ``q, k [T, hk, dk]``,
    ``v [T, hv, dv]``, ``g, beta [T, hv]`` (the same float operations as the ops one by one)."""
    n_t = conv.shape[0]
    dv = v.shape[2]
    for t in range(n_t):
        x = conv[t]
        for h in range(hk):
            _l2_row(x[h * dk : (h + 1) * dk], eps_q, q[t, h])
            for j in range(dk):
                q[t, h, j] = q[t, h, j] * sq
            _l2_row(x[(hk + h) * dk : (hk + h + 1) * dk], eps_k, k[t, h])
        o = 2 * hk * dk
        for h in range(hv):
            for j in range(dv):
                v[t, h, j] = x[o + h * dv + j]
        for h in range(hv):
            u = alpha[t, h] + bias[h]
            sp = u if u > 20.0 else np.float32(math.log1p(math.exp(u)))
            g[t, h] = sp * a[h]
            beta[t, h] = np.float32(1.0) / (np.float32(1.0) + np.float32(math.exp(-b[t, h])))


@njit(inline="always", fastmath=True, error_model="numpy")
def _l2_row(x, eps, out):
    s = 0.0
    for j in range(x.shape[0]):
        u = np.float64(x[j])
        s += u * u
    sc = np.float32(1.0 / max(math.sqrt(s), eps))
    for j in range(x.shape[0]):
        out[j] = x[j] * sc


@njit(inline="always", fastmath=True, error_model="numpy")
def _gdn_token(src, m, q, k, v, dec, b, y, kv, ya):
    """One token of one head: ``m = src * dec + k (x) ((v - (src * dec)^T k) * b)``, ``y = m^T q``. Two passes
    over the state: the first only reads it (``kv``), the second writes ``m`` (``src`` may be ``m``)."""
    d = kv.shape[0]
    for j in range(d):
        kv[j] = 0.0
    for i in range(d):
        ki = k[i]
        for j in range(d):
            kv[j] += (src[i, j] * dec) * ki
    for j in range(d):
        kv[j] = (v[j] - kv[j]) * b
        ya[j] = 0.0
    for i in range(d):
        ki = k[i]
        qi = q[i]
        for j in range(d):
            mij = src[i, j] * dec
            mij += ki * kv[j]
            m[i, j] = mij
            ya[j] += mij * qi
    for j in range(d):
        y[j] = ya[j]


@njit(parallel=True, cache=True, fastmath=True, error_model="numpy")
def gdn_recurrent(q, k, v, g, beta, state, y, sout):
    """The gated delta rule token by token: ``q, k [S, T, Hk, D]``, ``v [S, T, H, D]``, ``g, beta [S, T, H]``,
    ``state [S, H, D, D]`` (key, value) -> ``y [S, T, H, D]``, ``sout [S, H, D, D]``. ``sout`` may be
    ``state`` (updated in place): the loops then read and write one array, which LLVM vectorizes without
    the overlap check that sends two aliased arrays down its scalar path (2x at decode)."""
    n_s, n_t, n_h, d = v.shape
    hk = q.shape[2]
    for sh in prange(n_s * n_h):
        s = sh // n_h
        h = sh % n_h
        kh = h % hk
        m = sout[s, h]
        m0 = state[s, h]
        if n_t == 0:
            m[:, :] = m0
        kv = np.empty(d, dtype=np.float32)
        ya = np.empty(d, dtype=np.float32)
        same = m0.ctypes.data == m.ctypes.data
        for t in range(n_t):
            dec = np.float32(math.exp(g[s, t, h]))
            b = beta[s, t, h]
            if t == 0 and not same:
                _gdn_token(m0, m, q[s, t, kh], k[s, t, kh], v[s, t, h], dec, b, y[s, t, h], kv, ya)
            else:
                _gdn_token(m, m, q[s, t, kh], k[s, t, kh], v[s, t, h], dec, b, y[s, t, h], kv, ya)


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
