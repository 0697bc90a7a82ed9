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
default where none is ``MARGIN`` faster. Past ``ROUNDS`` rounds it measures on (up to ``MAX_ROUNDS``)
while a distance has run less than ``MIN_SECONDS``, unless the default was the fastest in every round.
The distance changes no result: the kernels' arithmetic does not depend on it.

A decision is kept (``PrefetchStore``: ``<llamapy cache>/tune/prefetch.json``) for the model file, the
CPU, the kernels' target and the thread count that the context binds (``PrefetchTuners.bind``): a later
process on the same model and machine starts with it and measures nothing. Measuring costs the first
tokens of a process: on an AMD EPYC (Zen 4) VM, haswell target, the MoE shape's small Q6_K experts took
80 tokens, half of them at a distance 4-28 % slower (``benchmarks/results/stop57_amd.md``).

``LLAMAPY_X8_PREFETCH=<bytes>`` fixes the distance of every type (no measuring; ``-<bytes>``: into L1);
unset: the kept decision, else measure (and keep it); ``auto``: measure anew (and keep it)."""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from ..._cpuload import cpu_model
from ...errors import LlamapyError

T = TypeVar("T")
log = logging.getLogger("llamapy.ggml")

#: a candidate: a distance (each thread reading its row groups as two streams, ``rowgroups.x8_rows``), or
#: (distance, streams) where streams 1 is one row group after the other (``x8_rows`` with ``nth`` 0; the MoE
#: kernels' one-item loop: a negative thread count). Two streams made the kernels read 5-30 % faster from
#: DRAM on the Intel VM and one stream 2-20 % faster on the AMD (Zen 4) VM (Q6_K: 34 against 28.6 GB/s;
#: ``benchmarks/results/stop57_amd.md``), so the tuner measures both
Choice = int | tuple[int, int]
#: one stream per thread at the default distance
ONE_STREAM = (0, 1)
#: the candidates measured; the first is the default (two row groups ahead, two streams a thread)
CANDIDATES: tuple[Choice, ...] = (0, 2048, ONE_STREAM)
#: the weight types that also measure 2048 bytes ahead into L1 (``L1_CANDIDATES``): those of 32-element
#: blocks, whose kernels gained from it on the Intel VM (``rowgroups.x8_prefetch``); the k-quants' did not
#: (in the model, the tuning's tokens at -2048 cost a 3B Q4_K_M file's tg32 5 %), so they measure the two
#: L2 distances only
L1_TYPES = frozenset({"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"})
L1_CANDIDATES: tuple[Choice, ...] = (0, 2048, -2048, ONE_STREAM)
#: calls of each step before measuring (the first token reads cold pages)
WARMUP_CALLS = 2
#: rounds (one token per candidate) measured at least, and at most (with four candidates, 64 tokens: a
#: decision is kept, ``PrefetchStore``, so a model file pays them once on a machine)
ROUNDS = 4
MAX_ROUNDS = 16
#: measuring goes on (up to ``MAX_ROUNDS``) until each distance has run this many seconds of kernels:
#: a small model's token is ~5 ms, where a VM's noise moves four tokens by more than ``MARGIN``
#: (SmolLM2-135M on the Intel VM: 4 rounds took 2048 once in three runs, 8-10 rounds never)
MIN_SECONDS = 0.04
#: a distance other than the default is taken only when the median over rounds of its time over the
#: default's is below ``1 - MARGIN``
MARGIN = 0.04


def distance_of(c: Choice) -> int:
    """The prefetch distance of the candidate ``c``."""
    return c if isinstance(c, int) else int(c[0])


def streams_of(c: Choice) -> int:
    """The streams a thread reads in the candidate ``c`` (2, or 1: one row group after the other)."""
    return 2 if isinstance(c, int) else int(c[1])


def remeasure_from_env() -> bool:
    """``LLAMAPY_X8_PREFETCH=auto``: measure even where a decision is kept (``PrefetchStore``)."""
    return os.environ.get("LLAMAPY_X8_PREFETCH", "").strip().lower() == "auto"


class PrefetchEnvError(LlamapyError, ValueError):
    """``LLAMAPY_X8_PREFETCH`` is set to something that is neither a byte count nor ``auto``."""


def distance_from_env() -> int | None:
    """``LLAMAPY_X8_PREFETCH``: a byte count (0: two row groups ahead; negative: that many bytes ahead,
    into L1), or None (unset or ``auto``: measure). Anything else: ``PrefetchEnvError`` (the CLI's one-line
    ``error:``)."""
    env = os.environ.get("LLAMAPY_X8_PREFETCH", "").strip().lower()
    if env in ("", "auto"):
        return None
    if not env.removeprefix("-").isdigit():
        raise PrefetchEnvError(
            f"LLAMAPY_X8_PREFETCH={env!r}: expected a byte count (negative: into L1) or 'auto'"
        )
    return int(env)


class PrefetchTuner:
    """The candidate (``Choice``) the 8-row kernels of one weight type use (``choice``: its ``distance``
    and ``streams``), measured on its first decode tokens unless ``fixed``. A step calls ``run`` with its
    own state (``counter()``)."""

    def __init__(
        self,
        fixed: Choice | None = None,
        candidates: Sequence[Choice] = CANDIDATES,
        warmup: int = WARMUP_CALLS,
        rounds: int = ROUNDS,
        margin: float = MARGIN,
        clock: Callable[[], float] = time.perf_counter,
        min_seconds: float = MIN_SECONDS,
        max_rounds: int = MAX_ROUNDS,
    ) -> None:
        self.candidates = tuple(candidates)
        self.choice: Choice = self.candidates[0] if fixed is None else fixed
        self.tuning = fixed is None and len(self.candidates) > 1
        self.warmup, self.rounds, self.margin, self.clock = warmup, rounds, margin, clock
        self.min_seconds, self.max_rounds = min_seconds, max(max_rounds, rounds)
        #: round -> each distance's seconds, summed over the steps that completed that round
        self.by_round: list[list[float]] = []
        #: what it tunes (``PrefetchTuners``: the weight type), for the log
        self.name = ""
        #: called with the choice once measuring has decided (``PrefetchTuners``: to keep it)
        self.on_decide: Callable[[Choice], None] | None = None

    @classmethod
    def from_env(cls) -> PrefetchTuner:
        return cls(distance_from_env())

    @property
    def distance(self) -> int:
        """The prefetch distance of the current choice."""
        return distance_of(self.choice)

    @property
    def streams(self) -> int:
        """The streams a thread reads in the current choice (2, or 1)."""
        return streams_of(self.choice)

    @property
    def totals(self) -> list[float]:
        """Each distance's measured seconds over complete rounds."""
        return [sum(r[j] for r in self.by_round) for j in range(len(self.candidates))]

    def counter(self) -> list[float]:
        """A step's state: [its calls so far, then the seconds of its current round, one per distance]."""
        return [0.0] * (1 + len(self.candidates))

    def run(self, call: Callable[[Choice], T], state: list[float]) -> T:
        """``call(choice)`` for one decode step whose state is ``state``. While tuning, past the
        warm-up, each call takes the next distance in turn (so every step runs one token at each) and
        is timed; a round's times count once the step completed it (a step that stops being called
        mid-round adds nothing). The first call of a step past the last round decides (every step of
        the token before has completed its rounds), or, where the distances have not run
        ``min_seconds`` each yet, adds a round, unless the default was the fastest in every round."""
        if not self.tuning:
            return call(self.choice)
        n = int(state[0])
        state[0] = n + 1
        k = n - self.warmup
        if k < 0:
            return call(self.choice)
        c = len(self.candidates)
        r, i = divmod(k, c)
        if r >= self.rounds:
            if r < self.max_rounds and min(self.totals) < self.min_seconds and not self._default_clear():
                self.rounds = r + 1
            else:
                self._decide()
                return call(self.choice)
        t0 = self.clock()
        out = call(self.candidates[i])
        state[1 + i] = self.clock() - t0
        if i == c - 1:
            while len(self.by_round) <= r:
                self.by_round.append([0.0] * c)
            for j in range(c):
                self.by_round[r][j] += state[1 + j]
        return out

    def _default_clear(self) -> bool:
        """Whether every complete round has the default faster than each other distance."""
        rows = [r for r in self.by_round if r[0] > 0.0]
        return bool(rows) and all(r[0] < r[j] for r in rows for j in range(1, len(r)))

    def _decide(self) -> None:
        """The distance whose median (over rounds) time relative to the default's is lowest, where that
        is below ``1 - margin``; else the default."""
        self.tuning = False
        rows = [r for r in self.by_round if r[0] > 0.0]
        self.choice = self.candidates[0]
        if rows:
            import statistics  # here, not at import: it imports fractions and decimal (~2 ms of each run)

            rel = [statistics.median(r[j] / r[0] for r in rows) for j in range(len(self.candidates))]
            best = min(range(len(rel)), key=rel.__getitem__)
            if rel[best] < 1.0 - self.margin:
                self.choice = self.candidates[best]
        ms = ", ".join(f"{d}: {t * 1e3:.1f} ms" for d, t in zip(self.candidates, self.totals, strict=True))
        log.debug(
            "%s 8-row kernels' prefetch choice %s (%d rounds: %s)", self.name, self.choice, len(rows), ms
        )
        if self.on_decide is not None and rows:
            self.on_decide(self.choice)


def machine_key(threads: int) -> str:
    """The CPU (its model name), the kernels' target (``NUMBA_CPU_NAME``/``NUMBA_CPU_FEATURES`` or the
    host's) and ``threads``: what a kept decision holds for."""
    target = os.environ.get("NUMBA_CPU_NAME", "host") + "/" + os.environ.get("NUMBA_CPU_FEATURES", "")
    return f"{cpu_model()}|{target}|t{threads}"


def _when(v: object) -> float:
    """The time of a kept entry ``[choice, unix time]`` (0 for anything else)."""
    if isinstance(v, list) and len(v) == 2 and isinstance(v[1], (int, float)):
        return float(v[1])
    return 0.0


class PrefetchStore:
    """Decisions kept across processes: ``path`` (JSON: key -> [choice, unix time]), each key the
    ``scope`` a context binds (its model file and ``machine_key``), the weight type and its candidates.
    Entries older than ``MAX_AGE_S`` are ignored; past ``MAX_ENTRIES`` the oldest go. Written whole to a
    temporary file and renamed (a concurrent writer's decision may be lost, then measured again); an
    unreadable file reads as empty and an unwritable one keeps nothing."""

    MAX_ENTRIES = 256
    MAX_AGE_S = 30 * 86400.0

    def __init__(self, path: str | os.PathLike[str], scope: str) -> None:
        self.path = Path(path)
        self.scope = scope

    def _key(self, type_key: str, candidates: Sequence[Choice]) -> str:
        return f"{self.scope}|{type_key}|{','.join(map(str, candidates))}"

    def _read(self) -> dict[str, list[float]]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def get(self, type_key: str, candidates: Sequence[Choice]) -> Choice | None:
        """The kept choice of ``type_key`` (measured among ``candidates``), or None."""
        v = self._read().get(self._key(type_key, candidates))
        when = _when(v)
        if not when:
            return None
        c = v[0]  # type: ignore[index]
        if isinstance(c, list) and len(c) == 2 and all(type(x) is int for x in c):
            c = (c[0], c[1])
        if not isinstance(c, (int, tuple)) or isinstance(c, bool) or c not in candidates:
            return None
        if not 0 <= time.time() - when < self.MAX_AGE_S:
            return None
        return c

    def put(self, type_key: str, candidates: Sequence[Choice], choice: Choice) -> None:
        data = self._read()
        data[self._key(type_key, candidates)] = [
            list(choice) if isinstance(choice, tuple) else choice,
            time.time(),
        ]
        if len(data) > self.MAX_ENTRIES:
            data = dict(sorted(data.items(), key=lambda kv: -_when(kv[1]))[: self.MAX_ENTRIES])
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".prefetch-", suffix=".tmp")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump(data, f)
                os.replace(tmp, self.path)
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError as e:
            log.debug("prefetch decisions not kept (%s): %s", self.path, e)


class PrefetchTuners:
    """A backend's tuners, one per weight type (``for_type``): each type's decode steps measure and
    decide on their own, since the best distance and cache level differ by type on one machine. A
    type in ``L1_TYPES`` measures ``L1_CANDIDATES``, the others ``CANDIDATES``, unless ``candidates``
    sets every type's; the other keyword arguments are every tuner's (``PrefetchTuner``). Once bound
    to a ``PrefetchStore`` (``bind``), a type starts with its kept decision, unless ``remeasure``, and
    keeps what it measures."""

    def __init__(
        self,
        fixed: int | None = None,
        candidates: Sequence[Choice] | None = None,
        remeasure: bool = False,
        **kwargs: object,
    ) -> None:
        self.fixed = fixed
        self.candidates = candidates
        self.remeasure = remeasure
        self.store: PrefetchStore | None = None
        self._kwargs = kwargs
        self.by_type: dict[str, PrefetchTuner] = {}

    @classmethod
    def from_env(cls) -> PrefetchTuners:
        return cls(distance_from_env(), remeasure=remeasure_from_env())

    def bind(self, path: str | os.PathLike[str], scope: str, threads: int) -> None:
        """Keep decisions in ``path`` for ``scope`` (what the weights are: the context's model file) on
        this machine with ``threads`` threads (``machine_key``), and start the types not yet met with
        theirs. Nothing where the distance is fixed."""
        if self.fixed is None:
            self.store = PrefetchStore(path, f"{scope}|{machine_key(threads)}")

    @property
    def tuning(self) -> bool:
        """Whether a type's tuner is still measuring (its decode steps run other distances in turn)."""
        return any(tu.tuning for tu in self.by_type.values())

    def for_type(self, key: str) -> PrefetchTuner:
        """The tuner of the weight type ``key`` (one name per kernel family: ``"Q4_K"``, ``"moe Q4_K"``)."""
        tu = self.by_type.get(key)
        if tu is None:
            cands = tuple(self.candidates or (L1_CANDIDATES if key in L1_TYPES else CANDIDATES))
            fixed, store = self.fixed, self.store
            if fixed is None and store is not None and not self.remeasure:
                fixed = store.get(key, cands)
            tu = PrefetchTuner(fixed, cands, **self._kwargs)  # type: ignore[arg-type]
            tu.name = key
            if store is not None and tu.tuning:
                tu.on_decide = lambda d, key=key, cands=cands, store=store: store.put(key, cands, d)
            self.by_type[key] = tu
        return tu
