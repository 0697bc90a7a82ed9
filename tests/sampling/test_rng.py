"""MT19937 and its distributions against libstdc++ (tests/data/sampling/mt19937_libstdcxx.cpp, g++ 12)."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from llamapy.sampling import MT19937
from tests.util import DATA

REF = json.loads((DATA / "sampling" / "mt19937_libstdcxx.json").read_text())
WEIGHTS = np.array([0.1, 0.2, 0.3, 0.4, 0.0, 1e-3], dtype=np.float32)


def test_mt19937_10000th_output():
    rng = MT19937()  # default seed 5489
    for _ in range(9999):
        rng()
    assert rng() == 4123659995  # the C++ standard's check value


@pytest.mark.parametrize("seed", sorted(REF))
def test_matches_libstdcxx(seed):
    ref = REF[seed]
    rng = MT19937(int(seed))
    assert [rng() for _ in range(8)] == ref["raw"]
    rng.seed(int(seed))
    assert [rng.uniform_double() for _ in range(8)] == ref["double"]
    rng.seed(int(seed))
    np.testing.assert_array_equal(
        np.array([rng.uniform_float() for _ in range(8)], dtype=np.float32),
        np.array(ref["float"], np.float32),
    )
    rng.seed(int(seed))
    assert [rng.discrete(WEIGHTS) for _ in range(16)] == ref["discrete"]


def test_discrete_single_weight_draws_nothing():
    a, b = MT19937(7), MT19937(7)
    assert a.discrete(np.array([0.3], np.float32)) == 0
    assert a() == b()


def test_copy_continues_the_stream():
    a = MT19937(99)
    a()
    b = copy.deepcopy(a)
    assert [a() for _ in range(5)] == [b() for _ in range(5)]
