"""A port of ``std::mt19937`` and the libstdc++ distributions llama.cpp's samplers draw from.

Seeded the way ``std::mt19937(seed)`` is (``init_genrand``), so a given seed gives the same stream on
every platform and the same draws as llama.cpp built with GCC's standard library. The 32-bit outputs
come from NumPy's MT19937 bit generator (the same algorithm), whose state we set ourselves.
"""

from __future__ import annotations

import math
import os

import numpy as np

LLAMA_DEFAULT_SEED = 0xFFFFFFFF

_N = 624
_TWO32 = 4294967296.0
_TWO64 = 18446744073709551616.0
_BELOW_ONE = math.nextafter(1.0, 0.0)
_BELOW_ONE_F32 = np.nextafter(np.float32(1.0), np.float32(0.0))


def resolve_seed(seed: int | None) -> int:
    """``LLAMA_DEFAULT_SEED`` (or None) means a random seed, as in llama.cpp; otherwise ``seed`` mod 2**32."""
    if seed is None or seed == LLAMA_DEFAULT_SEED:
        return int.from_bytes(os.urandom(4), "little")
    return int(seed) & 0xFFFFFFFF


def _init_genrand(seed: int) -> np.ndarray:
    key = [0] * _N
    key[0] = seed & 0xFFFFFFFF
    for i in range(1, _N):
        prev = key[i - 1]
        key[i] = (1812433253 * (prev ^ (prev >> 30)) + i) & 0xFFFFFFFF
    return np.array(key, dtype=np.uint32)


class MT19937:
    """``std::mt19937`` with ``std::uniform_real_distribution`` and ``std::discrete_distribution``
    as libstdc++ implements them (``generate_canonical`` from one or two 32-bit draws)."""

    def __init__(self, seed: int = 5489) -> None:
        self._bitgen = np.random.MT19937(0)
        self.seed(seed)

    def seed(self, seed: int) -> None:
        state = self._bitgen.state
        state["state"] = {"key": _init_genrand(int(seed) & 0xFFFFFFFF), "pos": _N}
        self._bitgen.state = state

    def __call__(self) -> int:
        """The next 32-bit output."""
        return int(self._bitgen.random_raw())

    def uniform_double(self) -> float:
        """``std::uniform_real_distribution<double>(0, 1)``: two draws, low word first."""
        lo, hi = self._bitgen.random_raw(2)
        r = (float(lo) + float(hi) * _TWO32) / _TWO64
        return _BELOW_ONE if r >= 1.0 else r

    def uniform_float(self) -> float:
        """``std::uniform_real_distribution<float>(0, 1)``: one draw, float arithmetic."""
        r = np.float32(np.float32(self._bitgen.random_raw()) / np.float32(_TWO32))
        return float(_BELOW_ONE_F32 if r >= 1.0 else r)

    def discrete(self, probs: np.ndarray) -> int:
        """``std::discrete_distribution<int>(probs)(rng)``: fewer than two weights draw nothing."""
        n = len(probs)
        if n < 2:
            return 0
        w = np.asarray(probs, dtype=np.float64)
        total = float(np.cumsum(w)[-1])  # sequential sum, as std::accumulate
        if not total > 0.0 or not math.isfinite(total):
            from .errors import SamplingError

            raise SamplingError(f"discrete distribution over {n} candidates has total weight {total}")
        cp = np.cumsum(w / total)
        cp[-1] = 1.0
        return int(np.searchsorted(cp, self.uniform_double(), side="left"))

    def getstate(self) -> dict:
        return self._bitgen.state

    def setstate(self, state: dict) -> None:
        self._bitgen.state = state

    def __deepcopy__(self, memo: dict) -> MT19937:
        other = MT19937.__new__(MT19937)
        other._bitgen = np.random.MT19937(0)
        other._bitgen.state = self._bitgen.state
        return other
