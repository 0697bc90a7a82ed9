"""The vectorizable exp / tanh / half->float helpers against NumPy over their whole input range."""

from __future__ import annotations

import numpy as np

from llamapy._numba import njit
from llamapy.ggml.cpu.op_kernels import h2f
from llamapy.ggml.cpu.vmath import fexp, ftanh


@njit(fastmath=True, error_model="numpy")
def _apply(kind, x, out):
    for i in range(x.shape[0]):
        if kind == 0:
            out[i] = fexp(x[i])
        elif kind == 1:
            out[i] = ftanh(x[i])
        else:
            out[i] = h2f(np.int32(x[i]))


def _run(kind: int, x: np.ndarray) -> np.ndarray:
    out = np.empty(x.shape[0], np.float32)
    _apply(kind, x.astype(np.float32), out)
    return out


def test_fexp_relative_error_and_limits():
    x = np.linspace(-87.0, 88.3, 2_000_001, dtype=np.float32)
    got = _run(0, x).astype(np.float64)
    ref = np.exp(x.astype(np.float64))
    assert np.max(np.abs(got - ref) / ref) < 5e-7
    edge = _run(0, np.array([-np.inf, -1e30, -200.0, 0.0], np.float32))
    assert edge.tolist() == [0.0, 0.0, 0.0, 1.0]
    assert np.all(np.isfinite(_run(0, np.array([100.0, 1e30, np.inf], np.float32))))


def test_ftanh_absolute_error():
    x = np.concatenate([np.linspace(-12, 12, 1_000_001), [-np.inf, np.inf, 1e-30, -1e-30, 0.0]]).astype(
        np.float32
    )
    got = _run(1, x).astype(np.float64)
    assert np.max(np.abs(got - np.tanh(x.astype(np.float64)))) < 5e-7
    assert got[-3] > 0 > got[-2] and got[-1] == 0.0


def test_h2f_matches_numpy_for_every_finite_half():
    bits = np.arange(1 << 16, dtype=np.uint32)
    halves = bits.astype(np.uint16).view(np.float16)
    finite = np.isfinite(halves)
    got = _run(2, bits[finite].astype(np.float32))
    ref = halves[finite].astype(np.float32)
    assert np.array_equal(got.view(np.uint32), ref.view(np.uint32))
