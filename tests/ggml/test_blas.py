"""sgemm through NumPy's OpenBLAS inside Numba's thread pool (llamapy.ggml.cpu.blas)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from llamapy.ggml.cpu import blas


def test_found_with_numpy_wheel_openblas():
    # NumPy's wheels bundle scipy-openblas; CI installs them, so the shared thread pool must be in use
    if os.environ.get("CI") or blas._candidates():
        assert blas.AVAILABLE, f"no usable sgemm in {blas._candidates()}"


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize(("m", "k", "n"), [(1, 32, 5), (37, 64, 130), (512, 96, 257)])
def test_gemm_nt_into_a_column_slice(threads, m, k, n):
    rng = np.random.default_rng(m * n)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((n + 3, k)).astype(np.float32)[2 : n + 2]  # a row slice: offset data pointer
    wide = np.full((m, n + 11), 7.0, np.float32)
    out = wide[:, 5 : 5 + n]  # row stride wider than the row
    blas.gemm_nt(x, w, out, threads)
    np.testing.assert_allclose(out, x.astype(np.float64) @ w.T.astype(np.float64), rtol=1e-4, atol=1e-4)
    assert np.all(wide[:, :5] == 7.0) and np.all(wide[:, 5 + n :] == 7.0)  # nothing written outside


def test_attention_matches_numpy_reference():
    if not blas.AVAILABLE:
        pytest.skip("no BLAS found")
    rng = np.random.default_rng(1)
    T, H, Hkv, D, KV = 70, 4, 2, 16, 90
    q = rng.standard_normal((T, H, D)).astype(np.float32)
    k = rng.standard_normal((KV, Hkv, D)).astype(np.float32)
    v = rng.standard_normal((KV, Hkv, D)).astype(np.float32)
    mask = np.zeros((T, KV), np.float32)
    mask[np.arange(KV)[None, :] > np.arange(T)[:, None] + 20] = -np.inf  # causal
    mask[np.arange(KV)[None, :] < np.arange(T)[:, None] - 40] = -np.inf  # sliding window
    mask[64:, :] = np.where(np.arange(KV)[None, :] % 3 == 0, -np.inf, mask[64:, :])  # holes in the band
    mask[3] = -np.inf  # a row with every key masked gives zeros
    out = np.empty((T, H, D), np.float32)
    scores = np.empty((2, blas.ATTN_CHUNK, KV), np.float32)
    blas.attention(q, k, v, mask, 0.25, 0.0, np.ones(H, np.float32), scores, out)
    kk = np.repeat(k, H // Hkv, axis=1).astype(np.float64)
    vv = np.repeat(v, H // Hkv, axis=1).astype(np.float64)
    s = np.einsum("thd,khd->htk", q.astype(np.float64), kk) * 0.25 + mask
    mx = s.max(-1, keepdims=True)
    mx[~np.isfinite(mx)] = 0
    p = np.exp(s - mx)
    den = p.sum(-1, keepdims=True)
    den[den == 0] = 1
    ref = np.einsum("htk,khd->thd", p / den, vv)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)
    assert np.all(out[3] == 0)
