"""The Numba scale searches (llamapy/ggml/quants/_search_fast.py) are bit-identical to the NumPy ones,
and whole-tensor k-quant quantization through them equals the block-wise NumPy path."""

from __future__ import annotations

import numpy as np
import pytest

from llamapy.ggml.quants import _search, _search_fast, quantize
from llamapy.ggml.types import GGMLType


def _data(ng: int, n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((ng, n)) * rng.gamma(1, 1, (ng, 1))).astype(np.float32)
    x[::7] = 0  # all-zero groups
    x[3::11] = 1.5  # constant groups
    x[5::13] = np.abs(x[5::13])  # all positive: the min clamps to 0
    x[:, ::9] *= 8  # outlier columns
    return x


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a.view(np.uint8), b.view(np.uint8))


@pytest.mark.parametrize(
    "nmax,n,rmin,rdelta,nstep,mad,version,wkind",
    [
        (15, 32, -1.0, 0.1, 20, False, 2, "av"),  # Q4_K
        (31, 32, -0.5, 0.1, 15, False, 2, "av"),  # Q5_K
        (3, 16, -0.5, 0.1, 15, True, 2, "abs"),  # Q2_K
        (15, 32, -0.9, 0.05, 36, False, 3, "rand"),  # Q4_K with an imatrix
        (3, 16, -0.9, 0.05, 36, False, 3, None),
    ],
)
def test_qkx_quants_bit_identical(nmax, n, rmin, rdelta, nstep, mad, version, wkind):
    x = _data(1500, n)
    rng = np.random.default_rng(1)
    w = {
        "av": lambda: np.abs(x) + np.sqrt((x * x).mean(1, keepdims=True)),
        "abs": lambda: np.abs(x),
        "rand": lambda: rng.random(x.shape),
        None: lambda: None,
    }[wkind]()
    w = None if w is None else w.astype(np.float32)
    ref = _search.make_qkx_quants(
        x[:400], nmax, w if w is None else w[:400], rmin, rdelta, nstep, mad, version
    )
    fast = _search_fast.make_qkx_quants(
        x[:400], nmax, w if w is None else w[:400], rmin, rdelta, nstep, mad, version
    )
    for a, b in zip(ref, fast, strict=True):
        assert _same(a, b)


@pytest.mark.parametrize("nmax,n,weighted,rmse_type", [(32, 16, False, 1), (32, 16, True, 1), (4, 32, False, 2),
                                                        (4, 16, False, -2), (4, 16, False, 0)])  # fmt: skip
def test_qx_quants_bit_identical(nmax, n, weighted, rmse_type):
    x = _data(400, n, seed=2)
    qw = np.random.default_rng(3).random(x.shape).astype(np.float32) if weighted else None
    for a, b in zip(_search.make_qx_quants(x, nmax, qw, rmse_type), _search_fast.make_qx_quants(x, nmax, qw, rmse_type),
                    strict=True):  # fmt: skip
        assert _same(a, b)


@pytest.mark.parametrize("t", ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"])
def test_kquants_through_numba_equal_numpy(t, monkeypatch):
    x = _data(64, 512, seed=4)  # 64 rows of 2 super-blocks: 1024 groups of 16 / 256 of 32 ...
    im = np.random.default_rng(5).random(512).astype(np.float32) + 0.1
    gt = GGMLType[t]
    monkeypatch.setattr(_search, "FAST_MIN_GROUPS", 1)
    fast = [quantize(x, gt), quantize(x, gt, im)]
    monkeypatch.setattr(_search, "FAST_MIN_GROUPS", 1 << 62)
    ref = [quantize(x, gt), quantize(x, gt, im)]
    for a, b in zip(ref, fast, strict=True):
        assert np.array_equal(a, b)
