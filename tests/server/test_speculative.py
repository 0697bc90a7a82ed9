"""Speculative decoding in the server engine (``-md``): a slot's guesses are verified in the same batch
as the other slots' tokens; the output is what generation without a draft gives, whether the guesses are
right, half right or wrong; the cache holds exactly the kept tokens; timings and metrics count them."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from llamapy.server.engine import Engine, Task
from tests.server.fake_backend import BOS, FakeBackend, next_token, reference
from tests.server.test_engine import Collector, params


class Oracle:
    """A draft that knows the fake model's rule, wrong every ``wrong_every``-th guess (0: never)."""

    def __init__(self, n: int = 4, wrong_every: int = 0) -> None:
        self.n, self.wrong_every, self.calls = n, wrong_every, 0

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        self.calls += 1
        seq, out = list(ids), []
        for i in range(self.n):
            t = next_token(seq)
            if self.wrong_every and (i + 1) % self.wrong_every == 0:
                t = (t + 1) % 256
            out.append(t)
            seq.append(t)
        return np.array(out)


class DraftBackend(FakeBackend):
    def __init__(self, draft, **kw) -> None:
        super().__init__(**kw)
        self._draft = draft

    def make_draft(self):
        return self._draft


def _engine(draft, **kw) -> tuple[Engine, DraftBackend]:
    b = DraftBackend(draft, **kw)
    e = Engine(b)
    e.start()
    return e, b


@pytest.mark.parametrize("wrong_every", [0, 2, 1], ids=["right", "half", "wrong"])
def test_same_tokens_as_without_a_draft(wrong_every):
    draft = Oracle(4, wrong_every)
    e, b = _engine(draft, n_seq_max=2, n_ctx=256)
    try:
        prompts = [b"hello world, this is a test", b"abcabcabcabc!xyz"]
        cs = [Collector() for _ in prompts]
        for p, c in zip(prompts, cs, strict=True):
            e.submit(Task([BOS, *p], params(20), c))
        for p, c in zip(prompts, cs, strict=True):
            _, ev, toks = c.wait()
            assert toks == reference([BOS, *p], 20)
            kept = {0: ev.draft_n, 2: ev.draft_n // 4, 1: 0}[wrong_every]
            assert ev.draft_n > 0 and ev.draft_n_accepted >= kept, (ev.draft_n, ev.draft_n_accepted)
            if wrong_every == 1:
                assert ev.draft_n_accepted == 0
        for s in e.slots:  # the cache holds exactly the kept tokens
            assert b.kv[s.id] == s.cache
        assert e.metrics.n_draft_total > 0
    finally:
        e.stop()


def test_draft_respects_n_predict_and_the_slot():
    draft = Oracle(16)
    e, b = _engine(draft, n_seq_max=1, n_ctx=40)
    try:
        c = Collector()
        e.submit(Task([BOS, *b"hello"], params(5), c))
        _, ev, toks = c.wait()
        assert toks == reference([BOS, *b"hello"], 5) and ev.n_predicted == 5
        c = Collector()
        e.submit(Task([BOS, *b"hello world"], params(-1), c))  # until the slot is full
        _, ev, toks = c.wait()
        assert toks == reference([BOS, *b"hello world"], len(toks)) and ev.finish_reason == "length"
        assert len(e.slots[0].cache) <= 40
    finally:
        e.stop()


def test_a_failing_draft_is_ignored():
    def bad(ids):
        raise RuntimeError("boom")

    e, _ = _engine(bad)
    try:
        c = Collector()
        e.submit(Task([BOS, *b"hello"], params(6), c))
        _, ev, toks = c.wait()
        assert toks == reference([BOS, *b"hello"], 6) and ev.draft_n == 0
    finally:
        e.stop()


@pytest.mark.slow
def test_real_self_draft_greedy_identical(smollm2_path):
    from llamapy.sampling import SamplingParams
    from llamapy.server.backend import ContextBackend
    from llamapy.server.engine import GenParams

    out = {}
    for name, draft in (("plain", None), ("spec", dict(model=str(smollm2_path), n_draft=6, p_min=0.5))):
        backend = ContextBackend(smollm2_path, n_ctx=512, n_seq_max=2, n_batch=64, n_ubatch=64, draft=draft)
        e = Engine(backend)
        e.start()
        try:
            done, events = threading.Event(), []

            def sink(ev, events=events, done=done):
                events.append(ev)
                if ev.done:
                    done.set()

            prompt = backend.tokenize("def add(a, b):\n    return a + b\n\ndef sub(a, b):\n", True)
            e.submit(Task(prompt, GenParams(n_predict=24, sampling=SamplingParams(temp=0.0)), sink))
            assert done.wait(300)
            out[name] = ([t for ev in events for t in ev.tokens], events[-1])
        finally:
            e.stop()
    assert out["spec"][0] == out["plain"][0]
    assert out["spec"][1].draft_n_accepted > 0
