"""The Numba k-quant row quantizers (llamapy/ggml/quants/_rowk.py, _rowq.py) give the bytes of the NumPy
versions (llamapy/ggml/quants/_kquantize.py, themselves checked against llama.cpp's bytes in
tests/ggml/test_quants_quantize.py), with and without importance weights, on blocks that take every
branch: all zero, one non-zero sub-block, constant, sparse, tiny, integer-valued, a huge outlier."""

from __future__ import annotations

import numpy as np
import pytest

from llamapy.ggml.quants import _iquantize, _kquantize, _rowk, _rowq

TYPES = {
    "Q2_K": _rowk.quantize_q2_k,
    "Q3_K": _rowk.quantize_q3_k,
    "Q4_K": _rowk.quantize_q4_k,
    "Q5_K": _rowk.quantize_q5_k,
    "Q6_K": _rowq.quantize_q6_k,
    "IQ4_XS": _rowq.quantize_iq4_xs,
}


def _blocks(n: int = 600, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 256)).astype(np.float32)
    x[1] = 0
    x[2, 16:] = 0
    x[3] = 1.5
    x[4, ::3] = 0
    x[5] *= np.float32(1e-20)
    x[6] = np.round(x[6] * 3)
    x[7, 100] = 1e4
    x[8] = np.abs(x[8])
    x[9] = -np.abs(x[9])
    x[10, :128] = 0
    x[11] *= np.float32(1e-3)
    qw = (rng.random((n, 256)) * 3).astype(np.float32)
    qw[12] = 0
    qw[13, :40] = 0
    return x, qw


@pytest.mark.parametrize("name", list(TYPES))
@pytest.mark.parametrize("weighted", [False, True])
def test_numba_kquant_equals_numpy(name: str, weighted: bool):
    x, qw = _blocks()
    w = qw if weighted else None
    got = TYPES[name](x, w)
    ref = _iquantize if name.startswith("IQ") else _kquantize
    want = getattr(ref, f"quantize_{name.lower()}")(x, w)
    bad = np.flatnonzero((got != want).any(axis=1))
    assert got.shape == want.shape and bad.size == 0, f"{name}: blocks {bad[:10].tolist()} differ"


@pytest.mark.parametrize("weighted", [False, True])
def test_numba_iq4_nl_equals_numpy(weighted: bool):
    x, qw = _blocks(123)  # 984 blocks of 32: the last pass of 16 lanes is short
    x, qw = x.reshape((-1, 32)), qw.reshape((-1, 32))
    w = qw if weighted else None
    got = _rowq.quantize_iq4_nl(x, w)
    want = _iquantize.quantize_iq4_nl(x, w)
    bad = np.flatnonzero((got != want).any(axis=1))
    assert bad.size == 0, f"blocks {bad[:10].tolist()} differ"
