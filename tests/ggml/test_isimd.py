"""``isimd``: the barrier ``ibar4`` hands its four vectors back unchanged (the empty ``asm`` on AVX2, the
identity elsewhere); ``isra`` shifts right arithmetically, lane by lane."""

from __future__ import annotations

import numpy as np

from llamapy._numba import njit
from llamapy.ggml.cpu.isimd import iadd, ibar4, iload, isra, itof
from llamapy.ggml.cpu.simd import vstore


@njit(cache=False)
def _through_ibar4(a: np.ndarray, out: np.ndarray) -> None:
    s0, s1, s2, s3 = iload(a, 0), iload(a, 8), iload(a, 16), iload(a, 24)
    s0, s1, s2, s3 = ibar4(s0, s1, s2, s3)
    s0, s1, s2, s3 = ibar4(iadd(s0, s1), s1, s2, iadd(s3, s3))  # values computed between barriers
    vstore(out, 0, itof(s0))
    vstore(out, 8, itof(s1))
    vstore(out, 16, itof(s2))
    vstore(out, 24, itof(s3))


def test_ibar4_is_the_identity() -> None:
    a = np.random.default_rng(0).integers(-(2**20), 2**20, 32).astype(np.int32)
    out = np.zeros(32, np.float32)
    _through_ibar4(a, out)
    want = np.concatenate([a[:8] + a[8:16], a[8:16], a[16:24], 2 * a[24:]]).astype(np.float32)
    np.testing.assert_array_equal(out, want)


@njit(cache=False)
def _shifted(a: np.ndarray, out: np.ndarray) -> None:
    v = iload(a, 0)
    vstore(out, 0, itof(isra(v, 4)))
    vstore(out, 8, itof(isra(v, 8)))
    vstore(out, 16, itof(isra(v, 0)))


def test_isra_is_an_arithmetic_shift() -> None:
    a = np.array([256, -256, 4096 * 3, -(2**30), 2**30, -1, 15, -17], np.int32)
    out = np.zeros(24, np.float32)
    _shifted(a, out)
    want = np.concatenate([a >> 4, a >> 8, a]).astype(np.float32)  # NumPy's >> on int32 is arithmetic
    np.testing.assert_array_equal(out, want)
