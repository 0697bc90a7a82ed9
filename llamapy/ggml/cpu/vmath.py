"""exp and tanh in float32 from multiplies, adds and bit operations only, so that LLVM vectorizes
the loops that call them (``np.exp``/``np.tanh`` compile to one libm call per element).

``fexp``: Cephes' expf reduction and polynomial, within 2 ulp on [-87, 88]; below -87.3 (and for
-inf) it returns 0, above 88.7 it saturates. ``ftanh``: Eigen's rational approximation, within 3e-7
absolute. Tests compare both with NumPy over the whole float range.
"""

from __future__ import annotations

import numpy as np

from ..._numba import njit
from .simd import bitcast_f32

_LOG2E = np.float32(1.44269504088896341)
_LN2_HI = np.float32(0.693359375)
_LN2_LO = np.float32(-2.12194440e-4)
_HI = np.float32(88.3762626647949)
_LO = np.float32(-88.0)
_HALF = np.float32(0.5)
_ONE = np.float32(1.0)
_P = [np.float32(c) for c in (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
                               1.6666665459e-1, 5.0000001201e-1)]  # fmt: skip
_P0, _P1, _P2, _P3, _P4, _P5 = _P
_I127 = np.int32(127)
_I23 = np.int32(23)

_TCLAMP = np.float32(7.90531110763549805)
_A = [np.float32(c) for c in (4.89352455891786e-03, 6.37261928875436e-04, 1.48572235717979e-05,
                               5.12229709037114e-08, -8.60467152213735e-11, 2.00018790482477e-13,
                               -2.76076847742355e-16)]  # fmt: skip
_A1, _A3, _A5, _A7, _A9, _A11, _A13 = _A
_B = [np.float32(c) for c in (4.89352518554385e-03, 2.26843463243900e-03, 1.18534705686654e-04,
                               1.19825839466702e-06)]  # fmt: skip
_B0, _B2, _B4, _B6 = _B


@njit(inline="always")
def fexp(x):
    x = min(max(x, _LO), _HI)
    n = np.floor(x * _LOG2E + _HALF)
    r = x - n * _LN2_HI - n * _LN2_LO
    p = (((((_P0 * r + _P1) * r + _P2) * r + _P3) * r + _P4) * r + _P5) * r * r + r + _ONE
    return p * bitcast_f32((np.int32(n) + _I127) << _I23)


@njit(inline="always")
def ftanh(a):
    x = min(max(a, -_TCLAMP), _TCLAMP)
    x2 = x * x
    p = ((((((_A13 * x2 + _A11) * x2 + _A9) * x2 + _A7) * x2 + _A5) * x2 + _A3) * x2 + _A1) * x
    q = ((_B6 * x2 + _B4) * x2 + _B2) * x2 + _B0
    return p / q
