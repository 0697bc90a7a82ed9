"""The 8-row mat-vec kernels' prefetch distance, chosen per model and weight type by measuring its decode.

Every 8-row kernel (``*_x8_kernels``, ``q40_x8_rows``, the MoE kernels) takes the distance ahead of
the block it reads at which it prefetches the weight, in bytes, as its fourth argument (0: two groups
of eight rows ahead; the Q8_0 kernel 64 KiB; ``rowgroups.x8_prefetch_from``; negative: that distance
into L1, ``prefetcht0``, where positive ones prefetch into L2: ``rowgroups.x8_prefetch``). No distance
suits every case (``benchmarks/results/stop49_intel_prefetch.md``). On an Intel Xeon VM (2 threads,
haswell target) 2048 made the decode of files streamed from DRAM 10-19 % faster (1.5B-shaped Q4_K_M,
Q4_0, Q5_K_M, Q8_0; the MoE shape +5 %) and SmolLM2-135M, whose 92 MB that VM's L3 holds, 17 % slower.
On an AMD EPYC (Zen 4) VM two groups ahead already read as fast as a plain streaming read. On the Intel
VM, into L1 made the kernels of the 32-element types faster and the k-quants' not (``rowgroups.x8_prefetch``,
``benchmarks/results/stop55_prefetch_l1.md``); on the AMD VM the one-row kernels wanted L2
(``results/prefetch_locality.md``). Whether a model's weights stream from DRAM, and which level suits a
type, depends on the model, the CPU's caches and what else runs, so the backend measures instead of
guessing: a ``PrefetchTuner`` per weight type (``PrefetchTuners``); the types of 32-element blocks
measure 2048 into L1 as well (``L1_TYPES``).

The tuner times the decode steps (one activation row) of the first tokens, each distance in turn
(every step alternates, so each pair of tokens compares the distances on the same weights), and from
then on uses the fastest by the median over those pairs (a VM's bursts of noise move a sum), or the
default where none is ``MARGIN`` faster. The distance changes no
result: the kernels' arithmetic does not depend on it. ``LLAMAPY_X8_PREFETCH=<bytes>`` fixes the
distance of every type (no measuring; ``-<bytes>``: into L1); ``auto`` or unset: measure."""

from __future__ import annotations

import logging
import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")
log = logging.getLogger("llamapy.ggml")

#: the distances measured; the first is the default (two row groups ahead)
CANDIDATES = (0, 2048)
#: the weight types that also measure 2048 bytes ahead into L1 (``L1_CANDIDATES``): those of 32-element
#: blocks, whose kernels gained from it on the Intel VM (``rowgroups.x8_prefetch``); the k-quants' did not
#: (in the model, the tuning's tokens at -2048 cost a 3B Q4_K_M file's tg32 5 %), so they measure the two
#: L2 distances only
L1_TYPES = frozenset({"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"})
L1_CANDIDATES = (0, 2048, -2048)
#: calls of each step before measuring (the first token reads cold pages)
WARMUP_CALLS = 2
#: rounds (one token per distance) measured at least, and at most
ROUNDS = 4
MAX_ROUNDS = 40
#: measuring goes on (up to ``MAX_ROUNDS``) until each distance has run this many seconds of kernels:
#: a small model's token is ~5 ms, where a VM's noise moves four tokens by more than ``MARGIN``
#: (SmolLM2-135M on the Intel VM: 4 rounds took 2048 once in three runs, 8-10 rounds never)
MIN_SECONDS = 0.04
#: a distance other than the default is taken only when the median over rounds of its time over the
#: default's is below ``1 - MARGIN``
MARGIN = 0.04


def distance_from_env() -> int | None:
    """``LLAMAPY_X8_PREFETCH``: a byte count (0: two row groups ahead; negative: that many bytes ahead,
    into L1), or None (unset or ``auto``: measure)."""
    env = os.environ.get("LLAMAPY_X8_PREFETCH", "").strip().lower()
    if env in ("", "auto"):
        return None
    if not env.removeprefix("-").isdigit():
        raise ValueError(f"LLAMAPY_X8_PREFETCH={env!r}: expected a byte count (negative: into L1) or 'auto'")
    return int(env)


class PrefetchTuner:
    """The prefetch distance the 8-row kernels of one backend use (``distance``), measured on its
    first decode tokens unless ``fixed``. A step calls ``run`` with its own state (``counter()``)."""

    def __init__(
        self,
        fixed: int | None = None,
        candidates: Sequence[int] = CANDIDATES,
        warmup: int = WARMUP_CALLS,
        rounds: int = ROUNDS,
        margin: float = MARGIN,
        clock: Callable[[], float] = time.perf_counter,
        min_seconds: float = MIN_SECONDS,
        max_rounds: int = MAX_ROUNDS,
    ) -> None:
        self.candidates = tuple(candidates)
        self.distance = self.candidates[0] if fixed is None else fixed
        self.tuning = fixed is None and len(self.candidates) > 1
        self.warmup, self.rounds, self.margin, self.clock = warmup, rounds, margin, clock
        self.min_seconds, self.max_rounds = min_seconds, max(max_rounds, rounds)
        #: round -> each distance's seconds, summed over the steps that completed that round
        self.by_round: list[list[float]] = []
        #: what it tunes (``PrefetchTuners``: the weight type), for the log
        self.name = ""

    @classmethod
    def from_env(cls) -> PrefetchTuner:
        return cls(distance_from_env())

    @property
    def totals(self) -> list[float]:
        """Each distance's measured seconds over complete rounds."""
        return [sum(r[j] for r in self.by_round) for j in range(len(self.candidates))]

    def counter(self) -> list[float]:
        """A step's state: [its calls so far, then the seconds of its current round, one per distance]."""
        return [0.0] * (1 + len(self.candidates))

    def run(self, call: Callable[[int], T], state: list[float]) -> T:
        """``call(distance)`` for one decode step whose state is ``state``. While tuning, past the
        warm-up, each call takes the next distance in turn (so every step runs one token at each) and
        is timed; a round's times count once the step completed it (a step that stops being called
        mid-round adds nothing). The first call of a step past the last round decides (every step of
        the token before has completed its rounds), or, where the distances have not run
        ``min_seconds`` each yet, adds a round."""
        if not self.tuning:
            return call(self.distance)
        n = int(state[0])
        state[0] = n + 1
        k = n - self.warmup
        if k < 0:
            return call(self.distance)
        c = len(self.candidates)
        r, i = divmod(k, c)
        if r >= self.rounds:
            if r < self.max_rounds and min(self.totals) < self.min_seconds:
                self.rounds = r + 1
            else:
                self._decide()
                return call(self.distance)
        t0 = self.clock()
        out = call(self.candidates[i])
        state[1 + i] = self.clock() - t0
        if i == c - 1:
            while len(self.by_round) <= r:
                self.by_round.append([0.0] * c)
            for j in range(c):
                self.by_round[r][j] += state[1 + j]
        return out

    def _decide(self) -> None:
        """The distance whose median (over rounds) time relative to the default's is lowest, where that
        is below ``1 - margin``; else the default."""
        self.tuning = False
        rows = [r for r in self.by_round if r[0] > 0.0]
        self.distance = self.candidates[0]
        if rows:
            rel = [statistics.median(r[j] / r[0] for r in rows) for j in range(len(self.candidates))]
            best = min(range(len(rel)), key=rel.__getitem__)
            if rel[best] < 1.0 - self.margin:
                self.distance = self.candidates[best]
        ms = ", ".join(f"{d}: {t * 1e3:.1f} ms" for d, t in zip(self.candidates, self.totals, strict=True))
        log.debug(
            "%s 8-row kernels' prefetch distance %d (%d rounds: %s)", self.name, self.distance, len(rows), ms
        )


class PrefetchTuners:
    """A backend's tuners, one per weight type (``for_type``): each type's decode steps measure and
    decide on their own, since the best distance and cache level differ by type on one machine. A
    type in ``L1_TYPES`` measures ``L1_CANDIDATES``, the others ``CANDIDATES``, unless ``candidates``
    sets every type's; the other keyword arguments are every tuner's (``PrefetchTuner``)."""

    def __init__(
        self, fixed: int | None = None, candidates: Sequence[int] | None = None, **kwargs: object
    ) -> None:
        self.fixed = fixed
        self.candidates = candidates
        self._kwargs = kwargs
        self.by_type: dict[str, PrefetchTuner] = {}

    @classmethod
    def from_env(cls) -> PrefetchTuners:
        return cls(distance_from_env())

    @property
    def tuning(self) -> bool:
        """Whether a type's tuner is still measuring (its decode steps run other distances in turn)."""
        return any(tu.tuning for tu in self.by_type.values())

    def for_type(self, key: str) -> PrefetchTuner:
        """The tuner of the weight type ``key`` (one name per kernel family: ``"Q4_K"``, ``"moe Q4_K"``)."""
        tu = self.by_type.get(key)
        if tu is None:
            cands = self.candidates or (L1_CANDIDATES if key in L1_TYPES else CANDIDATES)
            tu = PrefetchTuner(self.fixed, cands, **self._kwargs)  # type: ignore[arg-type]
            tu.name = key
            self.by_type[key] = tu
        return tu
