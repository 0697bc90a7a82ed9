"""``n > 1`` on /v1/chat/completions and /v1/completions with the official openai client (fake model, a
real socket): indexes, summed usage, greedy choices equal to n=1, seeded sampled choices differing."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.server.fake_backend import BOS, reference

MSGS = [{"role": "user", "content": "tell me things"}]
SAMPLED = {"temperature": 5.0, "top_p": 1.0, "extra_body": {"top_k": 0, "min_p": 0.0}}


@pytest.fixture
def client(live) -> openai.OpenAI:
    return openai.OpenAI(base_url=live.base_url + "/v1", api_key="none", max_retries=0, timeout=30)


def test_chat_n3(client):
    one = client.chat.completions.create(model="m", messages=MSGS, max_tokens=6, temperature=0)
    r = client.chat.completions.create(model="m", messages=MSGS, max_tokens=6, temperature=0, n=3)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert all(c.message.content == one.choices[0].message.content for c in r.choices)
    assert r.usage.prompt_tokens == one.usage.prompt_tokens
    assert r.usage.completion_tokens == 3 * one.usage.completion_tokens
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_n3_stream(client):
    one = client.chat.completions.create(model="m", messages=MSGS, max_tokens=6, temperature=0)
    texts, finish, usage, ids = {}, {}, None, set()
    for ch in client.chat.completions.create(
        model="m",
        messages=MSGS,
        max_tokens=6,
        temperature=0,
        n=3,
        stream=True,
        stream_options={"include_usage": True},
    ):
        ids.add(ch.id)
        if ch.usage is not None:
            usage = ch.usage
        for c in ch.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    assert len(ids) == 1
    assert sorted(texts) == [0, 1, 2] and sorted(finish) == [0, 1, 2]
    assert all(t == one.choices[0].message.content for t in texts.values())
    assert usage.completion_tokens == 3 * one.usage.completion_tokens
    assert usage.prompt_tokens == one.usage.prompt_tokens


def test_completions_n3_and_stream(client):
    want = bytes(t for t in reference([BOS, *b"count:"], 5) if t < 256).decode()
    r = client.completions.create(model="m", prompt="count:", max_tokens=5, temperature=0, n=3)
    assert [c.index for c in r.choices] == [0, 1, 2] and all(c.text == want for c in r.choices)
    assert r.usage.completion_tokens == 15 and r.usage.prompt_tokens == 7
    texts: dict[int, str] = {}
    stream = client.completions.create(
        model="m", prompt="count:", max_tokens=5, temperature=0, n=3, stream=True
    )
    for ch in stream:
        for c in ch.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
    assert texts == {0: want, 1: want, 2: want}


def test_greedy_n2_equals_n1(client):
    one = client.completions.create(model="m", prompt="greedy", max_tokens=8, temperature=0)
    two = client.completions.create(model="m", prompt="greedy", max_tokens=8, temperature=0, n=2)
    assert [c.text for c in two.choices] == [one.choices[0].text] * 2


def test_seeded_sampling_differs_per_choice_and_repeats(client):
    def run() -> list[str]:
        r = client.completions.create(model="m", prompt="sample", max_tokens=12, seed=42, n=3, **SAMPLED)
        return [c.text for c in r.choices]

    a = run()
    assert len(set(a)) > 1, a  # seed + i per choice: not three identical answers
    assert run() == a  # and the same seed gives the same choices again
    chat = client.chat.completions.create(model="m", messages=MSGS, max_tokens=12, seed=7, n=3, **SAMPLED)
    assert len({c.message.content for c in chat.choices}) > 1


@pytest.mark.parametrize("n", [0, -1, 1000, "3", 2.5, True])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_bad_n(live, path, n):
    body = {"prompt": "x"} if path == "/v1/completions" else {"messages": MSGS}
    r = httpx.post(live.base_url + path, json=body | {"n": n, "max_tokens": 2})
    assert r.status_code == 400, r.text
    assert r.json()["error"].get("param") == "n", r.text


def test_n_refused_where_not_supported(live):
    r = httpx.post(live.base_url + "/completion", json={"prompt": "x", "n": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"
    # the engine keeps serving
    assert httpx.post(live.base_url + "/completion", json={"prompt": "x", "n_predict": 2}).status_code == 200


def test_choices_share_the_prompt_kv(live, client):
    one = client.completions.create(model="m", prompt="shared prompt", max_tokens=6, temperature=0)
    before = live.backend.n_seq_cp
    two = client.completions.create(model="m", prompt="shared prompt", max_tokens=6, temperature=0, n=2)
    assert live.backend.n_seq_cp == before + 1  # the second choice started from the first one's prompt
    assert [c.text for c in two.choices] == [one.choices[0].text] * 2
    # the shared cells are really there: the follower's slot continues from them
    slots = httpx.get(live.base_url + "/slots").json()
    assert all(s["n_cached_tokens"] > 0 for s in slots)


def test_real_model_n_choices(real_server):
    # SmolLM2 with 2 slots: the second choice starts from the first one's prompt cells (seq_cp)
    c = openai.OpenAI(
        base_url=real_server.base_url + "/v1", api_key=real_server.api_key, max_retries=0, timeout=300
    )
    prompt = "The three primary colors are"
    one = c.completions.create(model="m", prompt=prompt, max_tokens=12, temperature=0)
    two = c.completions.create(model="m", prompt=prompt, max_tokens=12, temperature=0, n=2)
    assert [ch.text for ch in two.choices] == [one.choices[0].text] * 2
    assert two.usage.prompt_tokens == one.usage.prompt_tokens
    assert two.usage.completion_tokens == 2 * one.usage.completion_tokens
    msgs = [{"role": "user", "content": "Name a fruit."}]
    r = c.chat.completions.create(model="m", messages=msgs, max_tokens=12, temperature=1.5, seed=3, n=3)
    assert [ch.index for ch in r.choices] == [0, 1, 2]
    assert len({ch.message.content for ch in r.choices}) > 1
