"""``--cache-reuse N``: chunks of a new prompt found further on in a slot's cache are shifted into place
(seq_rm of the gap, seq_add of the chunk) instead of evaluated again; the output is a cold run's."""

from __future__ import annotations

import pytest

from llamapy.server.engine import Engine, Task
from tests.server.fake_backend import BOS, FakeBackend, reference
from tests.server.test_engine import Collector, params

SYSTEM = b"You are a helpful assistant. "
DOC = b"The quick brown fox jumps over the lazy dog, again and again and again. "


def _run(e: Engine, prompt: list[int], n: int = 8):
    c = Collector()
    e.submit(Task(prompt, params(n), c))
    return c.wait()


@pytest.mark.parametrize("reuse", [0, 8])
def test_shifted_chunk_is_reused(reuse):
    b = FakeBackend(n_seq_max=1, n_ctx=512)
    e = Engine(b, cache_reuse=reuse)
    e.start()
    try:
        first = [BOS, *SYSTEM, *b"Question one? ", *DOC]
        _run(e, first)
        second = [BOS, *SYSTEM, *DOC, *b"Summarize."]  # the question is gone: DOC moved left
        _, ev, toks = _run(e, second)
        assert toks == reference(second, 8)
        n_prefix = 1 + len(SYSTEM)
        if reuse:
            assert ev.n_cached == n_prefix + len(DOC) and b.n_seq_add >= 1
        else:
            assert ev.n_cached == n_prefix
        assert b.kv[0] == e.slots[0].cache
        # and a third prompt sharing everything still works (no holes left behind)
        third = [*second, *b" Thanks."]
        assert _run(e, third)[2] == reference(third, 8)
    finally:
        e.stop()


def test_short_matches_are_not_reused():
    b = FakeBackend(n_seq_max=1, n_ctx=512)
    e = Engine(b, cache_reuse=32)  # DOC's runs are shorter than 32 after the gap
    e.start()
    try:
        _run(e, [BOS, *SYSTEM, *b"Q? ", *DOC[:20]])
        second = [BOS, *SYSTEM, *DOC[:20], *b"!"]
        _, ev, toks = _run(e, second)
        assert toks == reference(second, 8) and ev.n_cached == 1 + len(SYSTEM)
    finally:
        e.stop()
