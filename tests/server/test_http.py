"""The HTTP layer over a real socket with the fake model: OpenAI client semantics, llama.cpp endpoints,
error bodies, limits. (The same client calls against the real model: test_openai_real.py.)"""

from __future__ import annotations

import base64
import json
import threading
import time

import httpx
import numpy as np
import openai
import pytest

from llamapy.server.app import ServerSettings
from tests.server.conftest import start_live, stop_live, wait_ready
from tests.server.fake_backend import BOS, FAIL_BYTE, FakeBackend, reference


def expected(prompt_text: str, n: int) -> str:
    toks = reference([BOS, *prompt_text.encode()], n)
    return bytes(t for t in toks if t < 256).decode("utf-8", "replace")


def chat_prompt(*msgs: tuple[str, str]) -> str:
    return "".join(f"<{r}>{c}\n" for r, c in msgs) + "<assistant>"


@pytest.fixture
def client(live) -> openai.OpenAI:
    return openai.OpenAI(base_url=live.base_url + "/v1", api_key="none", max_retries=0, timeout=20)


def test_models_and_health(live, client):
    (m,) = client.models.list().data
    assert m.id == "fake.gguf" and m.owned_by == "llamacpp"
    assert httpx.get(live.base_url + "/health").json() == {"status": "ok"}


def test_chat_plain_and_streamed(client):
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
    want = expected(chat_prompt(("system", "be brief"), ("user", "hello there")), 6)
    r = client.chat.completions.create(model="x", messages=msgs, max_tokens=6, temperature=0)
    assert r.choices[0].message.content == want and r.choices[0].finish_reason == "length"
    assert r.id.startswith("chatcmpl-") and r.created > 0 and r.object == "chat.completion"
    assert (r.usage.completion_tokens, r.usage.prompt_tokens) == (
        6,
        len(chat_prompt(*[(m["role"], m["content"]) for m in msgs])) + 1,
    )
    chunks = list(
        client.chat.completions.create(
            model="x",
            messages=msgs,
            max_tokens=6,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        "length"
    ]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    assert len({c.id for c in chunks}) == 1


def test_stop_and_logprobs(client):
    full = expected(chat_prompt(("user", "abcdefghij")), 10)
    stop = full[3:5]
    r = client.chat.completions.create(
        model="x",
        messages=[{"role": "user", "content": "abcdefghij"}],
        max_tokens=10,
        temperature=0,
        stop=[stop],
        logprobs=True,
        top_logprobs=2,
    )
    assert r.choices[0].message.content == full[: full.index(stop)] and r.choices[0].finish_reason == "stop"
    lp = r.choices[0].logprobs.content
    assert lp[0].token == full[0] and len(lp[0].top_logprobs) == 2 and lp[0].logprob > -0.1


def test_completions(client, live):
    r = client.completions.create(model="x", prompt="the cat sat", max_tokens=5, temperature=0, logprobs=1)
    assert r.choices[0].text == expected("the cat sat", 5) and r.choices[0].finish_reason == "length"
    assert len(r.choices[0].logprobs.tokens) == 5
    r = client.completions.create(model="x", prompt="the cat sat", max_tokens=5, temperature=0, echo=True)
    assert r.choices[0].text == "the cat sat" + expected("the cat sat", 5)
    text = "".join(
        c.choices[0].text
        for c in client.completions.create(model="x", prompt="hi!", max_tokens=5, stream=True)
        if c.choices
    )
    assert text == ""  # "!" is followed by end of generation
    # the last chunk has the finish reason and, as llama-server's, the usage (no stream_options asked)
    chunks = list(
        client.completions.create(model="x", prompt="the cat sat", max_tokens=5, temperature=0, stream=True)
    )
    assert "".join(c.choices[0].text for c in chunks) == expected("the cat sat", 5)
    assert [c.usage is not None for c in chunks] == [False] * (len(chunks) - 1) + [True]
    last = chunks[-1]
    assert last.choices[0].finish_reason == "length" and last.usage.completion_tokens == 5
    assert (
        last.usage.prompt_tokens == r.usage.prompt_tokens and last.usage.total_tokens == r.usage.total_tokens
    )


def test_native_completion_and_stream(live):
    body = {"prompt": "native prompt", "n_predict": 4, "temperature": 0, "n_probs": 2}
    r = httpx.post(live.base_url + "/completion", json=body).json()
    assert r["content"] == expected("native prompt", 4) and r["stop"] is True and r["stop_type"] == "limit"
    assert r["tokens_predicted"] == 4 and len(r["completion_probabilities"]) == 4
    with httpx.stream("POST", live.base_url + "/completion", json=body | {"stream": True}) as resp:
        lines = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: ")]
    assert "".join(c["content"] for c in lines) == expected("native prompt", 4)
    assert [c["stop"] for c in lines][-1] is True and not any(c["stop"] for c in lines[:-1])


def test_tokenize_detokenize_template_props_slots_metrics(live):
    base = live.base_url
    assert httpx.post(base + "/tokenize", json={"content": "ab"}).json() == {"tokens": [97, 98]}
    pieces = httpx.post(base + "/tokenize", json={"content": "é", "with_pieces": True}).json()["tokens"]
    assert pieces == [{"id": 0xC3, "piece": [0xC3]}, {"id": 0xA9, "piece": [0xA9]}]
    assert httpx.post(base + "/detokenize", json={"tokens": [104, 105]}).json() == {"content": "hi"}
    r = httpx.post(base + "/apply-template", json={"messages": [{"role": "user", "content": "q"}]}).json()
    assert r == {"prompt": "<user>q\n<assistant>"}
    props = httpx.get(base + "/props").json()
    assert props["total_slots"] == 2 and props["default_generation_settings"]["n_ctx"] == 256
    slots = httpx.get(base + "/slots").json()
    assert [s["id"] for s in slots] == [0, 1] and "prompt_tokens" not in slots[0]
    metrics = httpx.get(base + "/metrics").text
    assert "llamacpp:tokens_predicted_total" in metrics and "llamacpp:kv_cache_usage_ratio" in metrics


def err(resp: httpx.Response) -> tuple[int, str]:
    body = resp.json()
    assert set(body) == {"error"} and {"message", "type", "code"} <= set(body["error"]), body
    return resp.status_code, body["error"]["message"]


@pytest.mark.parametrize(
    "body, status, fragment",
    [
        (b"{not json", 400, "not valid JSON"),
        (b"[1, 2]", 400, "must be a JSON object"),
        (b'{"messages": [{"role": "wizard", "content": "x"}]}', 400, "messages.0.role"),
        (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": "5"}', 400, "max_tokens"),
        (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": -3}', 400, "at least 1"),
        (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 6.5}', 400, "must be an integer"),
        (b'{"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}', 400, "temperature"),
        (b'{"messages": []}', 400, "messages"),
        (
            b'{"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}, "grammar": "root ::= \\"a\\""}',
            400,
            "not both",
        ),
        (
            b'{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}}',
            400,
            "not in 'tools'",
        ),
        (
            b'{"messages": [{"role": "user", "content": "x"}], "grammar": "root ::= undefined_rule"}',
            400,
            "invalid grammar",
        ),
        (b'{"messages": [{"role": "user", "content": "x"}], "n": 1000}', 400, "between 1 and 16"),
        (
            b'{"messages": [{"role": "user", "content": "x"}], "logit_bias": {"999999": 5}}',
            400,
            "out of range",
        ),
        (
            b'{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}',
            400,
            "not supported yet",
        ),
        (
            b'{"messages": [{"role": "user", "content": "' + b"x" * 300 + b'"}]}',
            400,
            "a slot's context holds 256",
        ),
    ],
)
def test_bad_chat_requests(live, body, status, fragment):
    r = httpx.post(
        live.base_url + "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
    )
    code, msg = err(r)
    assert code == status and fragment in msg


def test_openai_client_raises_typed_errors(client):
    with pytest.raises(openai.BadRequestError, match="messages.0.role"):
        client.chat.completions.create(model="x", messages=[{"role": "wizard", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match="not in 'tools'"):
        client.chat.completions.create(
            model="x",
            messages=[{"role": "user", "content": "x"}],
            tools=[{"type": "function", "function": {"name": "f"}}],
            tool_choice={"type": "function", "function": {"name": "g"}},
        )
    with pytest.raises(openai.NotFoundError):
        client.get("/nope", cast_to=object)
    with pytest.raises(openai.InternalServerError, match="--embeddings"):  # 501
        client.embeddings.create(model="x", input="hello")


def test_404_405_413(live):
    assert err(httpx.get(live.base_url + "/v1/nothing-here"))[0] == 404
    assert err(httpx.get(live.base_url + "/v1/chat/completions"))[0] == 405
    code, msg = err(httpx.post(live.base_url + "/v1/completions", content=b"x" * (65 << 10)))
    assert code == 413 and "limit is 65536" in msg

    def chunked():  # no Content-Length: counted while it streams in
        for _ in range(70):
            yield b"x" * 1024

    code, _ = err(httpx.post(live.base_url + "/v1/completions", content=chunked()))
    assert code == 413


def test_api_key():
    settings = ServerSettings(model_path="/m/fake.gguf", api_keys=["sekrit"])
    srv, thread = start_live(settings, FakeBackend())
    try:
        wait_ready(srv.base_url)  # /health needs no key
        bad = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError, match="invalid API key"):
            bad.models.list()
        assert err(httpx.get(srv.base_url + "/v1/models"))[0] == 401
        good = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="sekrit", max_retries=0)
        assert good.models.list().data[0].id == "fake.gguf"
    finally:
        stop_live(srv, thread)


def test_health_503_while_loading_then_200():
    gate = threading.Event()
    srv, thread = start_live(ServerSettings(model_path="/m/fake.gguf"), FakeBackend(), load_gate=gate)
    try:
        r = httpx.get(srv.base_url + "/health")
        assert r.status_code == 503 and r.json()["error"]["message"] == "Loading model"
        assert httpx.post(srv.base_url + "/v1/completions", json={"prompt": "x"}).status_code == 503
        gate.set()
        wait_ready(srv.base_url)
    finally:
        stop_live(srv, thread)


def test_concurrent_requests_and_disconnect_frees_the_slot(live, client):
    results: dict[int, str] = {}

    def one(i: int) -> None:
        r = client.completions.create(model="x", prompt=f"request number {i}", max_tokens=20, temperature=0)
        results[i] = r.choices[0].text

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == {i: expected(f"request number {i}", 20) for i in range(6)}

    # a streaming client that goes away mid-answer: its slot is idle again right after
    body = {"prompt": "abc", "max_tokens": 200, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", live.base_url + "/v1/completions", json=body) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: "):
                break
    deadline = time.monotonic() + 2
    while any(s["is_processing"] for s in httpx.get(live.base_url + "/slots").json()):
        assert time.monotonic() < deadline, "the slot stayed busy after the client left"
        time.sleep(0.01)
    # it was stopped early: no slot holds anything near the 4 + 200 tokens it would have reached
    assert max(s["n_cached_tokens"] for s in httpx.get(live.base_url + "/slots").json()) < 120


def test_sampling_seed_and_native_extras(live, client):
    kw = dict(
        model="x",
        prompt="seeded sampling",
        max_tokens=12,
        temperature=3.0,
        top_p=1.0,
        logit_bias={str(FAIL_BYTE): -100},
        extra_body={"top_k": 0, "min_p": 0.0},
    )
    a = client.completions.create(seed=7, **kw).choices[0].text
    assert a == client.completions.create(seed=7, **kw).choices[0].text
    assert len({client.completions.create(seed=s, **kw).choices[0].text for s in range(8, 12)} | {a}) > 1
    r = httpx.post(live.base_url + "/completion", json={"prompt": "warm the cache", "n_predict": 0})
    assert r.json()["content"] == "" and r.json()["tokens_predicted"] == 0
    r = httpx.post(live.base_url + "/completion", json={"prompt": "x", "samplers": ["top_k", "bogus"]})
    assert err(r)[0] == 400 and "unknown sampler" in r.json()["error"]["message"]


def test_cors_and_verbose_slots():
    settings = ServerSettings(
        model_path="/m/fake.gguf", cors_origins=["http://example.test"], slots_verbose=True
    )
    srv, thread = start_live(settings, FakeBackend())
    try:
        wait_ready(srv.base_url)
        pre = httpx.options(
            srv.base_url + "/v1/chat/completions",
            headers={"Origin": "http://example.test", "Access-Control-Request-Method": "POST"},
        )
        assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "http://example.test"
        r = httpx.get(srv.base_url + "/v1/models", headers={"Origin": "http://example.test"})
        assert r.headers["access-control-allow-origin"] == "http://example.test"
        httpx.post(srv.base_url + "/completion", json={"prompt": "remember me", "n_predict": 2})
        slots = httpx.get(srv.base_url + "/slots").json()
        assert any(s["cache_text"].startswith("remember me") for s in slots)
    finally:
        stop_live(srv, thread)


def test_non_streaming_client_that_gives_up_frees_the_slot(live):
    httpx.post(live.base_url + "/v1/completions", json={"prompt": "warm-up", "max_tokens": 2})  # JIT first
    body = {"prompt": "patience", "max_tokens": 250, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(live.base_url + "/v1/completions", json=body, timeout=0.2)
    deadline = time.monotonic() + 2
    while any(s["is_processing"] for s in httpx.get(live.base_url + "/slots").json()):
        assert time.monotonic() < deadline, "the slot stayed busy after the client left"
        time.sleep(0.01)
    assert max(s["n_cached_tokens"] for s in httpx.get(live.base_url + "/slots").json()) < 200


def test_embeddings_server():
    backend = FakeBackend()
    backend.embeddings = True
    srv, thread = start_live(ServerSettings(model_path="/m/fake.gguf"), backend)
    try:
        wait_ready(srv.base_url)
        client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0)
        r = client.embeddings.create(model="x", input=["abc", "hello world"])
        assert [d.index for d in r.data] == [0, 1] and r.usage.prompt_tokens == 4 + 12
        v = r.data[0].embedding
        assert len(v) == 8 and abs(sum(x * x for x in v) - 1) < 1e-5
        assert r.data[0].embedding != r.data[1].embedding
        b64 = client.embeddings.create(model="x", input="abc", encoding_format="base64").data[0].embedding
        assert list(np.frombuffer(base64.b64decode(b64), "<f4")) == pytest.approx(v, abs=1e-6)
        with pytest.raises(openai.InternalServerError, match="without --embeddings"):
            client.completions.create(model="x", prompt="x")
        with pytest.raises(openai.BadRequestError, match="input"):
            client.embeddings.create(model="x", input="x" * 100)
    finally:
        stop_live(srv, thread)


def test_streamed_logprobs(client):
    chunks = list(
        client.chat.completions.create(
            model="x",
            messages=[{"role": "user", "content": "abc"}],
            max_tokens=4,
            temperature=0,
            stream=True,
            logprobs=True,
            top_logprobs=1,
        )
    )
    entries = [
        e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content
    ]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(entries) == 4 and "".join(e.token for e in entries) == text
    assert all(len(e.top_logprobs) == 1 and e.top_logprobs[0].token == e.token for e in entries)


def test_pathological_grammars_are_quick_400s(live):
    import time

    deep = "root ::= " + "(" * 30000 + '"a"' + ")" * 30000  # (the test server's body limit is 64 KiB)
    schema = {"type": "object"}
    for _ in range(300):
        schema = {"type": "object", "properties": {"x": schema}}
    for path, body in [
        ("/completion", {"prompt": "x", "grammar": deep}),
        ("/v1/completions", {"prompt": "x", "grammar": deep}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "grammar": deep}),
        (
            "/v1/completions",
            {"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"schema": schema}}},
        ),
    ]:
        t = time.perf_counter()
        r = httpx.post(live.base_url + path, json=body, timeout=60)
        code, msg = err(r)
        assert code == 400 and any(w in msg for w in ("grammar", "response_format", "deep")), (path, msg)
        assert time.perf_counter() - t < 10
