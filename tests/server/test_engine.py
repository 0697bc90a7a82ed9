"""The engine's slots, continuous batching and prompt cache, driven by a deterministic fake model."""

from __future__ import annotations

import math
import queue
import threading
import time

import pytest

from llamapy.sampling import SamplingParams
from llamapy.server.engine import Engine, Event, GenParams, Task
from tests.server.fake_backend import BOS, EOS, FAIL_BYTE, FakeBackend, reference

GREEDY = SamplingParams(temp=0.0)


def params(n: int = 8, **kw) -> GenParams:
    return GenParams(n_predict=n, sampling=GREEDY, **kw)


class Collector:
    def __init__(self) -> None:
        self.q: queue.Queue[Event] = queue.Queue()

    def __call__(self, ev: Event) -> None:
        self.q.put(ev)

    def wait(self, timeout: float = 10.0) -> tuple[str, Event, list[int]]:
        text, toks = "", []
        while True:
            ev = self.q.get(timeout=timeout)
            if ev.error is not None:
                raise ev.error
            text += ev.text
            toks += ev.tokens
            if ev.done:
                return text, ev, toks


@pytest.fixture
def engine_factory():
    engines = []

    def make(**kw) -> tuple[Engine, FakeBackend]:
        n_batch = kw.pop("step_batch", None)
        b = FakeBackend(**kw)
        e = Engine(b, n_batch=n_batch)
        e.start()
        engines.append(e)
        return e, b

    yield make
    for e in engines:
        e.stop()


def run(engine: Engine, prompt: bytes, p: GenParams) -> tuple[str, Event, list[int]]:
    c = Collector()
    engine.submit(Task([BOS, *prompt], p, c))
    return c.wait()


def expected_text(prompt: bytes, n: int) -> str:
    return bytes(t for t in reference([BOS, *prompt], n) if t < 256).decode("utf-8", "replace")


def test_greedy_matches_the_model(engine_factory):
    e, b = engine_factory()
    text, ev, toks = run(e, b"hello world", params(10))
    assert toks == reference([BOS, *b"hello world"], 10)
    assert text == expected_text(b"hello world", 10)
    assert (ev.finish_reason, ev.stop_type, ev.n_predicted, ev.n_prompt) == ("length", "limit", 10, 12)
    assert b.thread_ids == {e._thread.ident}  # only the engine thread touches the model


def test_end_of_generation_and_stop_strings(engine_factory):
    e, _ = engine_factory()
    text, ev, _ = run(e, b"hi!", params(10))
    assert (text, ev.finish_reason, ev.stop_type, ev.n_predicted) == ("", "stop", "eos", 1)
    full = expected_text(b"abcdefgh", 12)
    stop = full[4:6]
    text, ev, _ = run(e, b"abcdefgh", params(12, stop=[stop]))
    assert text == full[: full.index(stop)]
    assert (ev.finish_reason, ev.stop_type, ev.stopping_word) == ("stop", "word", stop)


def test_slot_context_is_split_and_full_slot_stops_with_length(engine_factory):
    e, _ = engine_factory(n_ctx=64, n_seq_max=2)
    assert e.n_ctx_slot == 32
    text, ev, toks = run(e, b"x" * 20, params(-1))
    assert ev.finish_reason == "length" and 20 + 1 + len(toks) == 32 + 1  # the last token needs no cell
    c = Collector()
    e.submit(Task([BOS, *b"y" * 31], params(4), c))
    with pytest.raises(Exception, match="32 tokens but a slot's context holds 32"):
        c.wait()


def test_concurrent_requests_share_decodes_and_stay_apart(engine_factory):
    e, b = engine_factory(n_seq_max=3, delay=0.002)
    prompts = [b"alpha beta", b"gamma delta epsilon", b"zeta", b"eta theta", b"iota kappa lambda"]
    results: dict[bytes, str] = {}

    def client(p: bytes) -> None:
        results[p] = run(e, p, params(12))[0]

    threads = [threading.Thread(target=client, args=(p,)) for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == {p: expected_text(p, 12) for p in prompts}
    assert max(len(batch) for batch in b.batches) >= 2  # several sequences in one decode


def test_long_prompt_is_chunked_between_generated_tokens(engine_factory):
    e, b = engine_factory(n_ctx=512, n_seq_max=2, n_batch=64, step_batch=8, delay=0.002)
    c1 = Collector()
    e.submit(Task([BOS, *b"short"], params(40), c1))
    while not b.batches:
        time.sleep(0.001)
    c2 = Collector()
    long_prompt = bytes(range(97, 123)) * 4
    e.submit(Task([BOS, *long_prompt], params(3), c2))
    assert c1.wait()[0] == expected_text(b"short", 40)
    assert c2.wait()[0] == expected_text(long_prompt, 3)
    mixed = [bt for bt in b.batches if len(bt) == 2]
    assert len(mixed) >= 5  # the long prompt went in chunks next to the other slot's tokens
    assert all(sum(n for _, n in bt) <= 8 for bt in b.batches)


def test_prompt_cache_reuses_the_longest_prefix(engine_factory):
    e, b = engine_factory(n_seq_max=2)
    _, ev1, _ = run(e, b"system prompt: be brief. user: one", params(4))
    _, ev2, _ = run(e, b"something else entirely", params(4))
    assert ev1.slot_id != ev2.slot_id
    text, ev3, _ = run(e, b"system prompt: be brief. user: two", params(4))
    assert ev3.slot_id == ev1.slot_id and ev3.n_cached == len(b"system prompt: be brief. user: ") + 1
    assert text == expected_text(b"system prompt: be brief. user: two", 4)
    # the same prompt again: everything but the last token comes from the cache
    _, ev4, _ = run(e, b"something else entirely", params(4))
    assert ev4.slot_id == ev2.slot_id and ev4.n_cached == ev4.n_prompt - 1
    _, ev5, _ = run(e, b"something else entirely", params(4, cache_prompt=False))
    assert ev5.n_cached == 0


def test_cancel_frees_the_slot_at_once(engine_factory):
    e, b = engine_factory(n_seq_max=1, delay=0.005)
    c = Collector()
    t = Task([BOS, *b"abc"], params(-1, ignore_eos=True), c)
    e.submit(t)
    c.q.get(timeout=5)
    e.cancel(t)
    text, ev, _ = run(e, b"next", params(3))  # would wait ~1 s for the slot (256 tokens) if not freed
    assert text == expected_text(b"next", 3)
    assert ev.prompt_ms < 500


def test_decode_failure_is_reported_and_the_engine_survives(engine_factory):
    e, b = engine_factory()
    with pytest.raises(Exception, match="fake decode failure"):
        run(e, bytes([FAIL_BYTE]) + b"boom", params(3))
    assert run(e, b"fine", params(3))[0] == expected_text(b"fine", 3)
    assert e.alive


def test_ignore_eos_and_logprobs(engine_factory):
    e, _ = engine_factory()
    text, ev, toks = run(e, b"a!", params(3, ignore_eos=True, n_probs=2, logprobs=True))
    assert EOS not in toks and ev.n_predicted == 3
    c = Collector()
    e.submit(Task([BOS, *b"abc"], params(2, n_probs=3, logprobs=True), c))
    evs = []
    while not evs or not evs[-1].done:
        evs.append(c.q.get(timeout=5))
    probs = [p for ev in evs for p in ev.probs]
    assert len(probs) == 2 and len(probs[0].top) == 3
    assert probs[0].top[0][0] == probs[0].id and probs[0].logprob == pytest.approx(probs[0].top[0][2])
    # one logit at 10, the 257 others at 0
    assert probs[0].logprob == pytest.approx(-math.log1p(257 * math.exp(-10)))
    assert probs[0].top[1][2] == pytest.approx(probs[0].logprob - 10)


def test_deferred_requests_wait_for_a_slot_in_order(engine_factory):
    e, _ = engine_factory(n_seq_max=1, delay=0.001)
    cs = [Collector() for _ in range(4)]
    for i, c in enumerate(cs):
        e.submit(Task([BOS, *f"req{i}".encode()], params(5), c))
    for i, c in enumerate(cs):
        assert c.wait()[0] == expected_text(f"req{i}".encode(), 5)
    assert e.metrics.requests_deferred == 0 and e.metrics.requests_total == 4
