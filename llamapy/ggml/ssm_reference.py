"""NumPy references of the recurrent ops (``ssm_conv``, ``gated_delta_net``, ``ssm_scan``) and their
element-wise helpers (``sigmoid``, ``softplus``, ``l2_norm``): the plain semantics the CPU kernels are
tested against. ``numpy_backend.REF_OPS`` takes them from ``SSM_REF_OPS``.

The gated delta rule has two forms that agree: ``delta_rule_recurrent`` (token by token, as decoding
runs it) and ``delta_rule_chunked`` (chunks of tokens with matrix products and a triangular solve, as
llama.cpp's ``delta-net-base.cpp`` and the FLA kernels compute prompts).
"""

from __future__ import annotations

import numpy as np

from .tensor import Tensor

__all__ = ["SSM_REF_OPS", "delta_rule_chunked", "delta_rule_recurrent", "ssm_scan_ref", "softplus"]


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x.astype(np.float64)))


def softplus(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def _l2_norm(node: Tensor, a: np.ndarray) -> np.ndarray:
    a = a.astype(np.float64)
    n = np.sqrt(np.sum(a * a, axis=-1, keepdims=True))
    return a / np.maximum(n, node.params["eps"])


def ssm_conv_ref(sx: np.ndarray, c: np.ndarray) -> np.ndarray:
    """``sx [S, K-1+T, C]``, ``c [C, K]`` -> ``[S, T, C]``."""
    k = c.shape[1]
    n_t = sx.shape[1] - k + 1
    out = np.zeros((sx.shape[0], n_t, sx.shape[2]), dtype=np.float64)
    for j in range(k):
        out += sx[:, j : j + n_t, :].astype(np.float64) * c[:, j].astype(np.float64)
    return out


def _expand_heads(x: np.ndarray, h: int) -> np.ndarray:
    """``[S, T, Hk, D]`` -> ``[S, T, H, D]``: value head ``i`` reads key head ``i % Hk`` (tiled)."""
    hk = x.shape[2]
    return x if hk == h else np.tile(x, (1, 1, h // hk, 1))


def delta_rule_recurrent(q, k, v, g, beta, state):  # type: ignore[no-untyped-def]
    """Token by token in float64: returns ``y [S, T, H, D]`` and the final ``state [S, H, D, D]``."""
    h = v.shape[2]
    q, k = _expand_heads(q, h).astype(np.float64), _expand_heads(k, h).astype(np.float64)
    v, g, beta = v.astype(np.float64), g.astype(np.float64), beta.astype(np.float64)
    m = state.astype(np.float64).copy()  # [S, H, Dk, Dv]
    y = np.zeros(v.shape, dtype=np.float64)
    for t in range(v.shape[1]):
        m *= np.exp(g[:, t])[:, :, None, None]
        kv = np.einsum("shij,shi->shj", m, k[:, t])
        delta = (v[:, t] - kv) * beta[:, t][:, :, None]
        m += k[:, t][:, :, :, None] * delta[:, :, None, :]
        y[:, t] = np.einsum("shij,shi->shj", m, q[:, t])
    return y, m


def delta_rule_chunked(  # type: ignore[no-untyped-def]
    q, k, v, g, beta, state, chunk: int = 64, dtype=np.float64
):
    """The same in chunks of ``chunk`` tokens. Within a chunk, with ``G`` the cumulative log-decay,
    ``Delta = (I + A)^-1 diag(beta) (V - diag(e^G) K M0)`` where ``A[t, u] = beta_t e^(G_t - G_u) k_t.k_u``
    (u < t); then ``Y = diag(e^G) Q M0 + (e^(G_t - G_u) q_t.k_u)_(u <= t) Delta`` and
    ``M = e^(G_last) M0 + K^T diag(e^(G_last - G)) Delta``."""
    h = v.shape[2]
    q, k = _expand_heads(q, h).astype(dtype), _expand_heads(k, h).astype(dtype)
    # [S, H, T, D] and [S, H, T]
    q, k, v = (np.ascontiguousarray(x.transpose(0, 2, 1, 3), dtype=dtype) for x in (q, k, v))
    g, beta = (np.ascontiguousarray(x.transpose(0, 2, 1), dtype=dtype) for x in (g, beta))
    m = state.astype(dtype).copy()
    n_t = v.shape[2]
    y = np.zeros(v.shape, dtype=dtype)
    for c0 in range(0, n_t, chunk):
        sl = slice(c0, min(n_t, c0 + chunk))
        qc, kc, vc, bc = q[:, :, sl], k[:, :, sl], v[:, :, sl], beta[:, :, sl]
        n = qc.shape[2]
        gc = np.cumsum(g[:, :, sl], axis=-1)
        diff = gc[..., :, None] - gc[..., None, :]
        low = np.tril(np.ones((n, n), dtype=bool))
        decay = np.where(low, np.exp(np.where(low, diff, 0.0)), 0.0).astype(dtype)  # [S, H, n, n], u <= t
        eg = np.exp(gc)[..., None]
        rhs = bc[..., None] * (vc - eg * (kc @ m))
        a = bc[..., None] * decay * (kc @ kc.swapaxes(-1, -2))
        a = np.where(np.tril(np.ones((n, n), dtype=bool), -1), a, 0.0)
        delta = np.empty_like(rhs)
        for t in range(n):  # forward substitution: (I + A) delta = rhs
            delta[..., t, :] = rhs[..., t, :] - np.einsum("shu,shud->shd", a[..., t, :t], delta[..., :t, :])
        y[:, :, sl] = eg * (qc @ m) + (decay * (qc @ kc.swapaxes(-1, -2))) @ delta
        last = gc[..., -1:]
        w = np.exp(last - gc)[..., None] * delta
        m = np.exp(last)[..., None] * m + kc.swapaxes(-1, -2) @ w
    return np.ascontiguousarray(y.transpose(0, 2, 1, 3)), m


def _gated_delta_net(node: Tensor, q, k, v, g, beta, state) -> np.ndarray:  # type: ignore[no-untyped-def]
    y, m = delta_rule_recurrent(q, k, v, g, beta, state)
    return np.concatenate([y.reshape(-1), m.reshape(-1)])


def ssm_scan_ref(s, x, dt, a, b, c):  # type: ignore[no-untyped-def]
    """Mamba2's scan in float64: ``y [S, T, H, P]`` and the final state ``[S, H, P, N]``."""
    n_s, h, p, n = s.shape
    g = b.shape[2]
    rep = h // g
    b = np.repeat(b.astype(np.float64), rep, axis=2)  # [S, T, H, N]: head h reads group h // rep
    c = np.repeat(c.astype(np.float64), rep, axis=2)
    st = s.astype(np.float64).copy()
    x, dt, a = x.astype(np.float64), dt.astype(np.float64), a.astype(np.float64)
    y = np.zeros(x.shape, dtype=np.float64)
    for t in range(x.shape[1]):
        if a.ndim == 1:
            da = np.exp(dt[:, t] * a[None, :])[:, :, None, None]  # [S, H, 1, 1]
        else:  # Mamba1: a decay per state
            da = np.exp(dt[:, t][:, :, None] * a[None, :, :])[:, :, None, :]  # [S, H, 1, N]
        st = st * da + (dt[:, t][:, :, None] * x[:, t])[..., None] * b[:, t][:, :, None, :]
        y[:, t] = np.einsum("shpn,shn->shp", st, c[:, t])
    return y, st


def _ssm_scan(node: Tensor, s, x, dt, a, b, c) -> np.ndarray:  # type: ignore[no-untyped-def]
    y, st = ssm_scan_ref(s, x, dt, a, b, c)
    return np.concatenate([y.reshape(-1), st.reshape(-1)])


# name -> (function, raw sources), merged into numpy_backend.REF_OPS
SSM_REF_OPS: dict[str, tuple] = {
    "sigmoid": (lambda n, a: sigmoid(a), ()),
    "softplus": (lambda n, a: softplus(a), ()),
    "l2_norm": (_l2_norm, ()),
    "ssm_conv": (lambda n, sx, c: ssm_conv_ref(sx, c), ()),
    "gated_delta_net": (_gated_delta_net, ()),
    "ssm_scan": (_ssm_scan, ()),
}
