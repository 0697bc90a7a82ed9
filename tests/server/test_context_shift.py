"""Context shift in the server (``llamapy serve --context-shift``, ``n_keep``/``n_discard``): a full slot
drops tokens after the first ``n_keep`` and continues, a too long prompt is truncated, bad values are
400s and out-of-range ones never reach the KV cache; over the fake model (whose KV keeps real positions)
and the real SmolLM2."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from llamapy.generation import context_shift_plan, truncate_prompt
from llamapy.server.app import ServerSettings
from llamapy.server.engine import Engine, GenParams, Task
from tests.server.conftest import LiveServer, start_live, stop_live, wait_ready
from tests.server.fake_backend import BOS, EOS, FakeBackend, next_token
from tests.server.test_engine import GREEDY, Collector


def shift_reference(prompt: list[int], n: int, n_ctx: int, n_keep: int, n_discard: int = 0) -> list[int]:
    """What the fake model gives with context shift: the engine's order (sample, shift if the next token
    has no cell, then decode it)."""
    seq, out = list(prompt), []
    for _ in range(n):
        t = next_token(seq)
        out.append(t)
        if t == EOS:
            break
        if len(seq) + 1 > n_ctx:
            k, d = context_shift_plan(len(seq), n_keep, n_discard)
            del seq[k : k + d]
        seq.append(t)
    return out


@pytest.fixture
def shifting() -> Iterator[tuple[Engine, FakeBackend]]:
    b = FakeBackend(n_ctx=64, n_seq_max=1, n_batch=16)
    e = Engine(b, context_shift=True)
    e.start()
    yield e, b
    e.stop()


def run(e: Engine, prompt: list[int], **kw) -> tuple[list[int], object]:
    c = Collector()
    e.submit(Task(list(prompt), GenParams(sampling=GREEDY, **kw), c))
    _, ev, toks = c.wait()
    return toks, ev


PROMPT = [BOS, *b"the quick brown fox"]  # 20 tokens, no "!" (EOS)


def test_generation_past_the_slot_shifts_and_keeps_n_keep(shifting):
    e, b = shifting
    toks, ev = run(e, PROMPT, n_predict=150, n_keep=4)
    # n_keep counts prompt tokens after BOS, as llama-server: 1 + 4 kept
    assert toks == shift_reference(PROMPT, 150, 64, 5)
    assert (ev.finish_reason, ev.n_predicted) == ("length", 150) and ev.n_shifted > 0
    s = e.slots[0]
    assert s.cache == b.kv[0] and b.pos[0] == list(range(len(s.cache))) and b.n_seq_add > 0
    assert s.cache[:5] == PROMPT[:5] and len(s.cache) <= 64
    # the engine keeps serving, from the shifted cache's prefix
    toks, ev = run(e, [BOS, *b"another one"], n_predict=8)
    assert toks == shift_reference([BOS, *b"another one"], 8, 64, 0) and ev.finish_reason == "length"


def test_n_discard_and_n_keep_minus_one(shifting):
    e, b = shifting
    toks, ev = run(e, PROMPT, n_predict=100, n_keep=2, n_discard=10)
    assert toks == shift_reference(PROMPT, 100, 64, 3, 10) and ev.n_shifted % 10 == 0
    toks, ev = run(e, PROMPT, n_predict=100, n_keep=-1)  # the whole prompt
    assert toks == shift_reference(PROMPT, 100, 64, len(PROMPT)) and e.slots[0].cache[:20] == PROMPT


def test_out_of_range_values_are_clamped_in_the_engine(shifting):
    e, b = shifting
    # values the HTTP layer refuses, given straight to the engine: clamped, never out of bounds
    toks, ev = run(e, PROMPT, n_predict=80, n_keep=10**9, n_discard=10**9)
    assert ev.error is None and ev.n_predicted == 80 and ev.n_shifted > 0
    s = e.slots[0]
    assert s.cache == b.kv[0] and s.cache[:20] == PROMPT and len(s.cache) <= 64
    toks, ev = run(e, PROMPT, n_predict=80, n_discard=-5)  # <= 0: half of the rest
    assert toks == shift_reference(PROMPT, 80, 64, 0)


def test_too_long_prompt_is_truncated(shifting):
    e, b = shifting
    long = [BOS, *(b"abcdefghij" * 10)]  # 101 tokens > 64
    toks, ev = run(e, long, n_predict=30, n_keep=3)
    cut = truncate_prompt(long, 64, 4)
    assert len(cut) < 64 and cut[:4] == long[:4] and cut[-10:] == long[-10:]
    assert ev.truncated and ev.n_prompt == len(cut)
    assert toks == shift_reference(cut, 30, 64, 4)


def test_truncate_prompt_and_plan_bounds():
    for n_ctx in (4, 5, 16, 64):
        for n_prompt in (n_ctx, n_ctx + 1, 3 * n_ctx + 7):
            for n_keep in (-3, 0, 1, n_ctx - 1, n_ctx, 10**6):
                p = list(range(n_prompt))
                cut = truncate_prompt(p, n_ctx, n_keep)
                k = max(0, min(n_keep, n_ctx - 4))
                assert len(cut) < n_ctx and cut[:k] == p[:k] and cut[-1] == p[-1]
    for n_past in range(0, 20):
        for n_keep in (-5, 0, 3, 19, 50):
            for n_discard in (-1, 0, 1, 7, 100):
                try:
                    k, d = context_shift_plan(n_past, n_keep, n_discard)
                except Exception:
                    assert n_past - min(max(n_keep, 0), n_past) <= 1 or n_discard <= 0
                    continue
                assert 0 <= k <= n_past and 1 <= d <= n_past - k


def test_without_the_flag_a_full_slot_ends_with_length():
    b = FakeBackend(n_ctx=64, n_seq_max=1, n_batch=16)
    e = Engine(b)
    e.start()
    try:
        toks, ev = run(e, PROMPT, n_predict=-1, n_keep=4)
        assert ev.finish_reason == "length" and len(PROMPT) + len(toks) == 65 and b.n_seq_add == 0
        c = Collector()
        e.submit(Task([BOS] * 70, GenParams(sampling=GREEDY), c))
        with pytest.raises(Exception, match="70 tokens but a slot's context holds 64"):
            c.wait()
    finally:
        e.stop()


# -- over HTTP ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def live_shift() -> Iterator[LiveServer]:
    settings = ServerSettings(model_path="/models/fake.gguf", context_shift=True, slots_verbose=True)
    srv, thread = start_live(settings, FakeBackend(n_ctx=128, n_seq_max=2, n_batch=32))
    wait_ready(srv.base_url)
    yield srv
    stop_live(srv, thread)


def test_streamed_chat_longer_than_the_slot(live_shift):
    client = openai.OpenAI(base_url=live_shift.base_url + "/v1", api_key="x", max_retries=0, timeout=20)
    msgs = [{"role": "user", "content": "tell me a long story"}]
    chunks = list(
        client.chat.completions.create(
            model="m", messages=msgs, max_tokens=200, temperature=0, stream=True, extra_body={"n_keep": 6}
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason == "length" and len(text) == 200  # one byte per token
    prompt = list(b"<user>tell me a long story\n<assistant>")
    assert text == bytes(shift_reference([BOS, *prompt], 200, 64, 7)).decode()
    slots = httpx.get(live_shift.base_url + "/slots").json()
    (s,) = [s for s in slots if s["n_cached_tokens"] > 0]
    assert s["cache_text"].startswith("<user>") and s["n_cached_tokens"] <= 64
    kv = live_shift.backend.kv[s["id"]]
    assert kv[:7] == [BOS, *prompt[:6]] and live_shift.backend.pos[s["id"]] == list(range(len(kv)))
    # the engine keeps serving
    r = client.chat.completions.create(model="m", messages=msgs, max_tokens=5, temperature=0)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5


@pytest.mark.parametrize(
    "field",
    [{"n_keep": -2}, {"n_keep": 64}, {"n_keep": 10**12}, {"n_discard": -1}, {"n_discard": 64},
     {"n_discard": 10**12}, {"n_keep": "a"}],
)  # fmt: skip
def test_bad_n_keep_and_n_discard_are_400s(live_shift, field):
    body = {"prompt": "hello", "n_predict": 4} | field
    r = httpx.post(live_shift.base_url + "/completion", json=body)
    assert r.status_code == 400, r.text
    r = httpx.post(
        live_shift.base_url + "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4} | field,
    )
    assert r.status_code == 400, r.text
    assert httpx.get(live_shift.base_url + "/health").status_code == 200


def test_long_prompt_and_n_choices_over_http(live_shift):
    r = httpx.post(
        live_shift.base_url + "/completion",
        json={"prompt": "abcdefghij" * 10, "n_predict": 10, "n_keep": 2, "temperature": 0},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["tokens_evaluated"] < 64 and body["tokens_predicted"] == 10
    b = live_shift.backend
    n_cp = b.n_seq_cp
    r = httpx.post(
        live_shift.base_url + "/v1/completions",
        json={"prompt": "shared prompt", "max_tokens": 100, "temperature": 0, "n": 2},
    )
    assert r.status_code == 200, r.text
    texts = [c["text"] for c in r.json()["choices"]]
    want = bytes(shift_reference([BOS, *b"shared prompt"], 100, 64, 0)).decode()
    assert texts == [want, want] and b.n_seq_cp == n_cp  # no shared cells under context shift


def test_n_predict_beyond_the_slot_is_clamped_without_the_flag(live):
    """As llama-server: without a context shift a limit past the slot is the slot's context."""
    r = httpx.post(live.base_url + "/completion", json={"prompt": "x", "n_predict": 10**6})
    assert (
        r.status_code == 200
        and r.json()["generation_settings"]["n_predict"] == live.backend.n_ctx // live.backend.n_seq_max
    )


# -- the real model ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_real_model_chat_longer_than_the_slot(smollm2_path):
    from llamapy.server.backend import ContextBackend
    from llamapy.server.params import chat_tokens

    backend = ContextBackend(smollm2_path, n_ctx=256, n_seq_max=1, n_batch=64)
    assert backend.n_ctx == 256
    settings = ServerSettings(model_path=str(smollm2_path), context_shift=True)
    srv, thread = start_live(settings, backend)
    try:
        wait_ready(srv.base_url, timeout=60)
        client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0, timeout=120)
        msgs = [{"role": "user", "content": "Count from one to one hundred."}]
        stream = client.chat.completions.create(
            model="m", messages=msgs, max_tokens=300, temperature=0, stream=True, stream_options={"include_usage": True},
            extra_body={"n_keep": 8, "ignore_eos": True},
        )  # fmt: skip
        chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length" and text
        assert chunks[-1].usage.completion_tokens == 300
        usage = httpx.post(srv.base_url + "/apply-template", json={"messages": msgs}).json()
        prompt = chat_tokens(usage["prompt"], backend)
        slot = srv.app.state.server.engine.slots[0]
        slots = httpx.get(srv.base_url + "/slots").json()
        n = slots[0]["n_cached_tokens"]
        assert 0 < n == len(slot.cache) <= 256 and len(prompt) + 300 > 256  # it did not fit: it shifted
        assert slot.cache[:8] == prompt[:8]  # n_keep (plus BOS when the model adds one)
        mem = backend.ctx.memory
        assert (mem.seq_pos_min(0), mem.seq_pos_max(0)) == (0, n - 1)  # the KV holds exactly the cache
        r = client.chat.completions.create(model="m", messages=msgs, max_tokens=4, temperature=0)
        assert r.choices[0].finish_reason == "length"
    finally:
        stop_live(srv, thread)


def test_serve_flags():
    from llamapy.cli import build_parser

    a = build_parser().parse_args(["serve", "--context-shift", "--keep", "-1"])
    assert a.context_shift is True and a.keep == -1
    a = build_parser().parse_args(["serve"])
    assert a.context_shift is False and a.keep == 0
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--keep", "-2"])
