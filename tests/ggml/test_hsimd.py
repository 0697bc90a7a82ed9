"""The 16-bit activation quantizer of the 32-element types (``hsimd.quantize_rows_q16``) and the vector
helpers it and the x8 kernels' activation permutation use, against NumPy definitions."""

from __future__ import annotations

import numpy as np
import pytest

from llamapy._numba import njit
from llamapy.ggml.cpu.hsimd import Q16_MAX, quantize_rows_q16
from llamapy.ggml.cpu.q40_x8_kernels import _src_q4, permute_rows_q4
from llamapy.ggml.cpu.simd import absmax_bits32
from llamapy.ggml.quants._rowq import _nearest_int


@njit(cache=False)
def _nearest_ints(v):
    out = np.empty_like(v)
    for i in range(v.size):
        out[i] = _nearest_int(v[i])
    return out


@njit(cache=False)
def _absmax(b):
    out = np.empty(b.size // 32, np.int32)
    for k in range(out.size):
        out[k] = absmax_bits32(b, np.uint64(32 * k))
    return out


def test_nearest_int_is_rint():
    rng = np.random.default_rng(0)
    v = np.concatenate(
        [
            (rng.standard_normal(20000) * 40000).astype(np.float32),
            np.arange(-300, 300, dtype=np.float32) + np.float32(0.5),  # ties: to even
            np.float32([0.0, -0.0, 0.49999997, -0.49999997, 2.0**22 - 0.5, -(2.0**22) + 0.5, 1e-30]),
        ]
    )
    assert np.array_equal(_nearest_ints(v), np.rint(v))


def test_absmax_bits32():
    rng = np.random.default_rng(1)
    bits = rng.integers(0, 2**32, size=32 * 200, dtype=np.uint64).astype(np.uint32)
    bits[: 32 * 50] &= 0x807FFFFF  # subnormals and zeros
    b = bits.view(np.int32)
    want = (bits.reshape(-1, 32) & 0x7FFFFFFF).max(axis=1).astype(np.int32)
    assert np.array_equal(_absmax(b), want)


def q16_reference(x: np.ndarray, nb: int) -> tuple[np.ndarray, ...]:
    """The definition: per block d = max|x| / 32767, q = rint(x * (32767 / max|x|)) in float32, xs = d *
    sum(q); a block with an inf or NaN is zeros and its row not ok; a block whose 32767 / max|x| is not
    finite (all zero, or below ~1e-34) is zeros."""
    M, K = x.shape
    xq = np.zeros((M, K), np.int16)
    xd = np.zeros((M, nb), np.float32)
    xs = np.zeros((M, nb), np.float32)
    ok = np.ones(M, bool)
    with np.errstate(all="ignore"):
        for m in range(M):
            for b in range(nb):
                blk = x[m, 32 * b : 32 * b + 32]
                if not np.isfinite(blk).all():
                    ok[m] = False
                    continue
                amax = np.abs(blk).max()
                inv = np.float32(Q16_MAX) / amax
                if not np.isfinite(inv):
                    continue
                d = amax / np.float32(Q16_MAX)
                q = np.rint(blk * inv).astype(np.int16)
                xq[m, 32 * b : 32 * b + 32] = q
                xd[m, b] = d
                xs[m, b] = d * np.float32(q.astype(np.int32).sum())
    return xq, xd, xs, ok


@pytest.mark.parametrize("kind", ["normal", "scales", "anybits", "subnormal", "ties", "inf_nan", "zeros"])
def test_quantize_rows_q16_matches_definition(kind):
    rng = np.random.default_rng(hash(kind) % 2**32)
    M, nb = 3, 24
    K = 32 * nb + 32  # x may be longer than the weight's blocks
    if kind == "normal":
        x = rng.standard_normal((M, K)).astype(np.float32)
    elif kind == "scales":
        x = (rng.standard_normal((M, K)) * 10.0 ** rng.integers(-36, 37, size=(M, K))).astype(np.float32)
    elif kind == "anybits":
        x = rng.integers(0, 2**32, size=(M, K), dtype=np.uint64).astype(np.uint32).view(np.float32)
    elif kind == "subnormal":
        x = (rng.standard_normal((M, K)) * 1e-39).astype(np.float32)
    elif kind == "ties":  # max 32767: the scale is 1 and every k + 0.5 is a tie
        x = (rng.integers(-300, 300, size=(M, K)) + 0.5).astype(np.float32)
        x[:, ::32] = 32767
    elif kind == "inf_nan":
        x = rng.standard_normal((M, K)).astype(np.float32)
        x[1, 40] = np.inf
        x[2, 7] = np.nan
    else:
        x = np.zeros((M, K), np.float32)
        x[0, 100] = -0.0
        x[1, 5] = 1e-35
    xq = np.full((M, K), 77, np.int16)
    xd = np.full((M, nb), 7, np.float32)
    xs = np.full((M, nb), 7, np.float32)
    ok = quantize_rows_q16(x, xq, xd, xs)
    rq, rd, rs, rok = q16_reference(x, nb)
    assert np.array_equal(ok, rok)
    assert np.array_equal(xq[:, : 32 * nb], rq[:, : 32 * nb])
    assert (xq[:, 32 * nb :] == 77).all()  # past the weight's blocks: untouched
    assert np.array_equal(xd.view(np.int32), rd.view(np.int32))
    assert np.array_equal(xs.view(np.int32), rs.view(np.int32))


@njit(cache=False)
def _permute(xq, nb, off):
    xp = np.empty_like(xq)
    cor = np.empty((xq.shape[0], nb), np.int32)
    for m in range(xq.shape[0]):
        permute_rows_q4(xq, xp, cor, m, nb, off)
    return xp, cor


@pytest.mark.parametrize("off", [-8, -16])
def test_permute_rows_q4(off):
    rng = np.random.default_rng(off + 100)
    nb = 9
    xq = rng.integers(-32767, 32768, size=(2, 32 * nb)).astype(np.int16)
    xp, cor = _permute(xq, nb, off)
    src = np.array([_src_q4.py_func(p) for p in range(32)])
    assert sorted(src) == list(range(32))
    blocks = xq.reshape(2, nb, 32)
    assert np.array_equal(xp.reshape(2, nb, 32), blocks[:, :, src])
    assert np.array_equal(cor, off * blocks.astype(np.int64).sum(axis=2))
