"""``attn_group_f16x8``: decode attention over an F16 cache with the query heads of a kv group together
(each cached row widened once per group), against a float64 reference."""

from __future__ import annotations

import numpy as np
import pytest

from llamapy.ggml.cpu import attn_decode as ad


def _reference(q, k, v, mask, scale, cap, slopes):
    T, H, _ = q.shape
    g = H // k.shape[1]
    ref = np.zeros(q.shape[:2] + (v.shape[2],))
    for t in range(T):
        for h in range(H):
            keep = mask[t] != -np.inf
            if not keep.any():
                continue
            kk, vv = k[keep, h // g].astype(np.float64), v[keep, h // g].astype(np.float64)
            sc = (kk @ q[t, h].astype(np.float64)) * scale
            if cap:
                sc = cap * np.tanh(sc / cap)
            sc = sc + slopes[h] * mask[t, keep]
            e = np.exp(sc - sc.max())
            ref[t, h] = (e / e.sum()) @ vv
    return ref


def _run(q, k, v, mask, has_mask, scale, cap, slopes, n_chunks):
    T, H, D = q.shape
    out = np.full((T, H, D), np.nan, np.float32)
    kf, vf = k.view(np.uint16).reshape(-1), v.view(np.uint16).reshape(-1)
    ad.attn_group_f16x8(q, kf, vf, mask, has_mask, scale, cap, slopes, out, k.shape[1], D, n_chunks)
    return out


@pytest.mark.parametrize(
    "H,Hkv,T,D,n_kv,n_chunks",
    [
        (12, 2, 1, 128, 2 * ad.SB + 37, 1),  # Qwen2.5-1.5B's groups: 6 rows, sub-blocks, a tail of 1
        (28, 4, 1, 64, ad.SB + 6, 3),  # 7 rows (an odd one after the pairs), three chunks
        (6, 2, 3, 16, 203, 2),  # three query rows with different masks
        (4, 4, 2, 8, 70, 1),  # no grouping (g = 1)
    ],
)
def test_group_kernel_against_float64(H, Hkv, T, D, n_kv, n_chunks):
    """Sliding-window masks that cut 4-key blocks in the middle, a row that sees nothing (zeros), keys no
    row sees holding NaN (never read), soft-capping and ALiBi slopes."""
    rng = np.random.default_rng(H + T + D)
    q = rng.standard_normal((T, H, D)).astype(np.float32)
    k = rng.standard_normal((n_kv, Hkv, D)).astype(np.float16)
    v = rng.standard_normal((n_kv, Hkv, D)).astype(np.float16)
    j = np.arange(n_kv)[None, :]
    pos = np.arange(n_kv - T, n_kv)[:, None] - 3  # the last 3 cells are unused
    mask = np.where((j <= pos) & (j > pos - (n_kv - 11)), 0, -np.inf).astype(np.float32)
    if T > 1:
        mask[1] = -np.inf
    unseen = (mask == -np.inf).all(0)
    k[unseen], v[unseen] = np.nan, np.nan
    slopes = np.linspace(0.25, 1.0, H).astype(np.float32)
    for scale, cap in ((np.float32(D**-0.5), np.float32(0)), (np.float32(0.3), np.float32(2.5))):
        out = _run(q, k, v, mask, True, scale, cap, slopes, n_chunks)
        ref = _reference(q, k, v, mask, scale, cap, slopes)
        assert np.abs(out - ref).max() < 1e-5
        if T > 1:
            assert (out[1] == 0).all()


@pytest.mark.parametrize("n_chunks", [1, 2, 5])
def test_group_kernel_without_mask_and_chunk_counts(n_chunks):
    """No mask at all; the result does not depend on how the keys are chunked across tasks, and a chunk count
    above the number of keys leaves empty tasks that the merge skips."""
    rng = np.random.default_rng(7)
    H, Hkv, D, n_kv = 8, 2, 32, 4 if n_chunks == 5 else 301
    q = rng.standard_normal((1, H, D)).astype(np.float32)
    k = (3 * rng.standard_normal((n_kv, Hkv, D))).astype(np.float16)  # peaked softmax
    v = rng.standard_normal((n_kv, Hkv, D)).astype(np.float16)
    ones = np.ones(H, np.float32)
    out = _run(q, k, v, np.zeros((1, 1), np.float32), False, np.float32(0.2), np.float32(0), ones, n_chunks)
    ref = _reference(q, k, v, np.zeros((1, n_kv), np.float32), 0.2, 0.0, ones)
    assert np.abs(out - ref).max() < 1e-5


def test_vstore_hsum4_lane_sums():
    """The transposed reduction writes exactly the four lane sums, in order, and nothing else."""
    from llamapy._numba import njit
    from llamapy.ggml.cpu.simd import vload

    @njit
    def sums(x, out):
        ad.vstore_hsum4(out, 1, vload(x, 0), vload(x, 8), vload(x, 16), vload(x, 24))

    x = np.arange(32, dtype=np.float32) ** 1.5
    out = np.full(6, -1.0, np.float32)
    sums(x, out)
    np.testing.assert_allclose(out[1:5], x.reshape(4, 8).sum(1), rtol=1e-6)
    assert out[0] == -1 and out[5] == -1


def test_use_group():
    """Grouped heads (two or more query heads per kv head) over at least GROUP_MIN_KEYS keys."""
    assert ad.use_group(12, 2, max(ad.GROUP_MIN_KEYS, 1))
    assert not ad.use_group(4, 4, 4096)
    assert not ad.use_group(3, 2, 4096)
