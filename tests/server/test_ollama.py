"""ollama's API (/api/chat, /api/generate, /api/embed, /api/tags, /api/show, /api/ps...) with the official
``ollama`` Python client over a real socket.

Shapes, streams, errors and auth run on the fake model (fast); greedy answers are compared with
``/v1/chat/completions`` on the real SmolLM2 (``real_server``); ``tools`` and ``think`` run on SmolLM2 with
the Qwen3 template (it has tool calls and a thinking switch); embeddings on a tiny real embedder."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import jsonschema
import ollama
import pytest

from llamapy.server.app import ServerSettings
from tests.server.conftest import LiveServer, start_live, stop_live, wait_ready
from tests.server.fake_backend import FakeBackend
from tests.util import shared_path

KEY = "ollama-test-789"
AUTH = {"Authorization": f"Bearer {KEY}"}
HI = [{"role": "user", "content": "Hello there!"}]
NAME = "fake:latest"  # the fake model's file is fake.gguf


@pytest.fixture(scope="module")
def fake() -> Iterator[LiveServer]:
    settings = ServerSettings(model_path="/models/fake.gguf", api_keys=[KEY])
    srv, thread = start_live(settings, FakeBackend(n_ctx=1024, n_seq_max=2, n_batch=64))
    wait_ready(srv.base_url)
    yield srv
    stop_live(srv, thread)


def _client(base_url: str, key: str = KEY) -> ollama.Client:
    return ollama.Client(host=base_url, headers={"Authorization": f"Bearer {key}"}, timeout=120)


def _post(base_url: str, path: str, body: object, key: str = KEY) -> httpx.Response:
    return httpx.post(base_url + path, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=120)


def _healthy(base_url: str, key: str = KEY) -> None:
    assert httpx.get(base_url + "/health", timeout=5).status_code == 200
    auth = {"Authorization": f"Bearer {key}"}
    assert httpx.get(base_url + "/api/version", headers=auth, timeout=5).status_code == 200


# -- fake model ---------------------------------------------------------------------------------------


def test_version_and_root(fake):
    r = httpx.get(fake.base_url + "/api/version", headers=AUTH)
    assert r.status_code == 200 and isinstance(r.json()["version"], str)
    assert httpx.head(fake.base_url + "/", headers=AUTH).status_code == 200
    r = httpx.get(fake.base_url + "/", headers=AUTH)
    assert r.status_code == 200 and r.text == "Ollama is running"


def test_list_show_ps(fake):
    c = _client(fake.base_url)
    models = c.list().models
    assert [m.model for m in models] == [NAME]
    assert models[0].details.format == "gguf" and len(models[0].digest) == 64
    shown = c.show("fake")
    assert "completion" in shown.capabilities and shown.template == "(fake)"
    assert shown.modelinfo["general.architecture"] == "fake"
    assert c.show(NAME).details.family == "fake"
    ps = c.ps().models
    assert len(ps) == 1 and ps[0].model == NAME and ps[0].context_length > 0


def test_chat(fake):
    c = _client(fake.base_url)
    r = c.chat(model="fake", messages=HI, options={"num_predict": 8, "temperature": 0})
    assert r.done and r.done_reason in ("stop", "length") and r.message.role == "assistant"
    assert r.message.content and r.model == "fake"
    assert 0 < r.eval_count <= 8 and r.prompt_eval_count > 0 and r.total_duration > 0
    assert c.chat(model="fake", messages=HI, options={"num_predict": 2}).done_reason == "length"
    parts = list(c.chat(model="fake", messages=HI, stream=True, options={"num_predict": 8, "temperature": 0}))
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert "".join(p.message.content for p in parts) == r.message.content
    assert parts[-1].eval_count == r.eval_count and parts[-1].done_reason == r.done_reason


def test_ndjson_stream_format(fake):
    body = {"model": "fake", "messages": HI, "options": {"num_predict": 4}}
    with httpx.stream("POST", fake.base_url + "/api/chat", json=body, headers=AUTH) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(x) for x in r.iter_lines() if x]
    assert lines[-1]["done"] is True and "eval_duration" in lines[-1] and "created_at" in lines[0]
    r = _post(fake.base_url, "/api/chat", body | {"stream": False})
    assert r.headers["content-type"].startswith("application/json") and r.json()["done"] is True


def test_generate(fake):
    c = _client(fake.base_url)
    r = c.generate(model="fake", prompt="Once upon", system="be brief", options={"num_predict": 6})
    assert r.done and r.response and 0 < r.eval_count <= 6
    parts = list(c.generate(model="fake", prompt="Once upon", stream=True, options={"num_predict": 6}))
    assert parts[-1].done and "".join(p.response for p in parts)
    raw = c.generate(model="fake", prompt="Once upon", raw=True, options={"num_predict": 5})
    assert raw.done and 0 < raw.eval_count <= 5
    load = c.generate(model="fake")  # ollama: an empty prompt loads the model
    assert load.done and load.done_reason == "load" and load.response == ""


def test_options_reach_the_sampler(fake):
    """stop, num_predict; keep_alive and load-time options (num_ctx, num_thread) are accepted."""
    c = _client(fake.base_url)
    opts = {"num_predict": 4, "num_ctx": 99999, "num_thread": 3, "seed": 1, "top_k": 5, "top_p": 0.9,
            "min_p": 0.05, "typical_p": 1.0, "repeat_penalty": 1.1, "repeat_last_n": 64, "mirostat": 0,
            "presence_penalty": 0.0, "frequency_penalty": 0.0, "num_keep": 0, "stop": ["\n"]}  # fmt: skip
    r = c.chat(model="fake", messages=HI, options=opts, keep_alive="5m")
    assert r.done and r.eval_count <= 4


@pytest.mark.parametrize(
    ("path", "body", "status", "says"),
    [
        ("/api/chat", {"model": "nope", "messages": HI}, 404, "fake:latest"),
        ("/api/chat", {"messages": HI}, 400, "model"),
        (
            "/api/chat",
            {"model": "fake", "messages": HI, "options": {"temperature": "hot"}},
            400,
            "temperature",
        ),
        ("/api/chat", {"model": "fake", "messages": HI, "options": {"num_predict": "8"}}, 400, "num_predict"),
        ("/api/chat", {"model": "fake", "messages": HI, "options": "x"}, 400, "options"),
        ("/api/chat", {"model": "fake", "messages": HI, "options": {"top_p": 7}}, 400, "options.top_p"),
        (
            "/api/generate",
            {"model": "fake", "prompt": "x", "raw": True, "options": {"temperature": -1}},
            400,
            "options.temperature",
        ),
        ("/api/chat", {"model": "fake", "messages": HI, "format": "xml"}, 400, "format"),
        ("/api/chat", {"model": "fake", "messages": HI, "format": 7}, 400, "format"),
        ("/api/chat", {"model": "fake", "messages": [{"role": "bot", "content": "x"}]}, 400, "messages.0"),
        ("/api/chat", {"model": "fake", "messages": "hi"}, 400, "messages"),
        ("/api/chat", {"model": "fake", "messages": [{"role": "user", "images": ["@@"]}]}, 400, "base64"),
        ("/api/chat", {"model": "fake", "messages": HI, "think": "max"}, 400, "think"),
        ("/api/generate", {"model": "fake", "prompt": "x", "template": "{{ .Prompt }}"}, 400, "template"),
        ("/api/generate", {"model": "fake", "prompt": "x", "context": [1, 10**9]}, 400, "context"),
        ("/api/generate", {"model": "other", "prompt": "x"}, 404, "not found"),
        ("/api/show", {"model": "other"}, 404, "fake:latest"),
        ("/api/embed", {"model": "fake", "input": "x"}, 501, "--embeddings"),
        ("/api/pull", {"model": "llama3"}, 501, "one model"),
        ("/api/copy", {"source": "a", "destination": "b"}, 501, "one model"),
    ],
)
def test_bad_requests_are_ollama_errors(fake, path, body, status, says):
    r = _post(fake.base_url, path, body)
    assert r.status_code == status, r.text
    err = r.json()
    assert list(err) == ["error"] and isinstance(err["error"], str) and says in err["error"], err
    _healthy(fake.base_url)


def test_errors_through_the_client(fake):
    c = _client(fake.base_url)
    with pytest.raises(ollama.ResponseError) as e:
        c.chat(model="llama3.2", messages=HI)
    assert e.value.status_code == 404 and "fake:latest" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        c.chat(model="fake", messages=HI, options={"top_k": "many"})
    assert e.value.status_code == 400 and "top_k" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        c.delete("fake")
    assert e.value.status_code == 501
    r = httpx.delete(fake.base_url + "/api/delete", headers=AUTH)
    assert r.status_code == 501 and "error" in r.json()
    r = httpx.get(fake.base_url + "/api/nothing", headers=AUTH)
    assert r.status_code == 404 and list(r.json()) == ["error"]
    _healthy(fake.base_url)


def test_api_key_is_required(fake):
    with pytest.raises(ollama.ResponseError) as e:
        _client(fake.base_url, key="wrong").list()
    assert e.value.status_code == 401
    r = httpx.get(fake.base_url + "/api/tags")
    assert r.status_code == 401 and isinstance(r.json()["error"], str)
    big = b'{"model": "fake", "messages": [], "x": "' + b"a" * (9 << 20) + b'"}'
    r = httpx.post(fake.base_url + "/api/chat", content=big, headers=AUTH, timeout=60)
    assert r.status_code == 413 and "too large" in r.json()["error"]
    _healthy(fake.base_url)


# -- the real SmolLM2 ---------------------------------------------------------------------------------


def _openai_greedy(base_url: str, key: str, messages: list, n: int) -> str:
    body = {"messages": messages, "max_tokens": n, "temperature": 0}
    r = _post(base_url, "/v1/chat/completions", body, key)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


@pytest.mark.slow
def test_greedy_chat_equals_openai(real_server):
    c = _client(real_server.base_url, real_server.api_key)
    name = c.list().models[0].model
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a color."}]
    want = _openai_greedy(real_server.base_url, real_server.api_key, msgs, 12)
    got = c.chat(model=name, messages=msgs, options={"temperature": 0, "num_predict": 12})
    assert got.message.content == want and got.eval_count <= 12
    parts = list(
        c.chat(model=name, messages=msgs, stream=True, options={"temperature": 0, "num_predict": 12})
    )
    assert "".join(p.message.content for p in parts) == want and parts[-1].done
    gen = c.generate(model=name, prompt="Name a color.", system="You are terse.",
                     options={"temperature": 0, "num_predict": 12})  # fmt: skip
    assert gen.response == want
    lp = c.chat(model=name, messages=msgs, logprobs=True, top_logprobs=2,
                options={"temperature": 0, "num_predict": 12})  # fmt: skip
    assert lp.message.content == want and len(lp.logprobs) == lp.eval_count
    assert "".join(t.token for t in lp.logprobs) == want and all(
        len(t.top_logprobs) == 2 for t in lp.logprobs
    )
    assert lp.logprobs[0].top_logprobs[0].token == lp.logprobs[0].token  # greedy: the best is the one taken
    parts = list(c.generate(model=name, prompt="Name a color.", system="You are terse.", logprobs=True,
                            stream=True, options={"temperature": 0, "num_predict": 12}))  # fmt: skip
    assert "".join(t.token for p in parts for t in (p.logprobs or [])) == want


@pytest.mark.slow
def test_format_schema(real_server):
    c = _client(real_server.base_url, real_server.api_key)
    name = c.list().models[0].model
    schema = {"type": "object", "properties": {"color": {"type": "string", "maxLength": 12}},
              "required": ["color"], "additionalProperties": False}  # fmt: skip
    ask = [{"role": "user", "content": "Name a color as JSON."}]
    r = c.chat(model=name, messages=ask, format=schema, options={"temperature": 0, "num_predict": 40})
    jsonschema.validate(json.loads(r.message.content), schema)
    g = c.generate(
        model=name, prompt="A color as JSON:", format=schema, options={"temperature": 0, "num_predict": 40}
    )
    jsonschema.validate(json.loads(g.response), schema)
    raw = c.generate(model=name, prompt='{"color": ', raw=True, format=schema, options={"num_predict": 40})
    jsonschema.validate(json.loads(raw.response), schema)  # (raw: the /v1/completions path's grammar)
    j = c.generate(
        model=name, prompt="A color as JSON:", format="json", options={"seed": 3, "num_predict": 40}
    )
    assert j.response.lstrip().startswith("{")  # (free JSON may be cut at num_predict)
    if j.done_reason == "stop":
        assert isinstance(json.loads(j.response), dict)
    body = {"model": name, "messages": ask, "format": {"type": 5}}
    bad = _post(real_server.base_url, "/api/chat", body, real_server.api_key)
    assert bad.status_code == 400 and list(bad.json()) == ["error"], bad.text
    _healthy(real_server.base_url, real_server.api_key)


@pytest.mark.slow
def test_think_on_a_model_without_thinking(real_server):
    """SmolLM2's template has no thinking switch: think=true is a 400 (as ollama's), think=false works."""
    c = _client(real_server.base_url, real_server.api_key)
    name = c.list().models[0].model
    assert "thinking" not in c.show(name).capabilities
    with pytest.raises(ollama.ResponseError) as e:
        c.chat(model=name, messages=HI, think=True)
    assert e.value.status_code == 400 and "thinking" in e.value.error
    r = c.chat(model=name, messages=HI, think=False, options={"num_predict": 4})
    assert r.done and not r.message.thinking


@pytest.fixture(scope="module")
def qwen3(smollm2_path) -> Iterator[LiveServer]:
    from llamapy.server.backend import ContextBackend

    template = shared_path("templates", "Qwen-Qwen3-0.6B.jinja").read_text()
    backend = ContextBackend(smollm2_path, n_ctx=2048, n_seq_max=1, n_batch=256, chat_template=template)
    srv, thread = start_live(ServerSettings(model_path=str(smollm2_path), api_keys=[KEY]), backend)
    wait_ready(srv.base_url, timeout=120)
    yield srv
    stop_live(srv, thread)


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 24}},
            "required": ["city"],
        },
    },
}


@pytest.mark.slow
def test_tools_and_think_reach_the_template(qwen3):
    """(A 135M model seldom calls a tool or thinks on its own: the tools, the history's ollama-shaped tool
    call and the thinking switch are checked by what they do to the prompt; the answer's shapes by the
    formatter tests below.)"""
    c = _client(qwen3.base_url)
    name = c.list().models[0].model
    assert {"tools", "thinking"} <= set(c.show(name).capabilities)
    ask = [{"role": "user", "content": "What is the weather in Paris? Use the tool."}]
    opts = {"temperature": 0, "num_predict": 4}
    plain = c.chat(model=name, messages=ask, options=opts, think=False)
    tooled = c.chat(model=name, messages=ask, tools=[WEATHER], options=opts, think=False)
    assert tooled.prompt_eval_count > plain.prompt_eval_count + 20 and tooled.done
    history = ask + [
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather",
                                                                          "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "18 C, sunny", "tool_name": "get_weather"},
    ]  # fmt: skip
    after = c.chat(model=name, messages=history, tools=[WEATHER], options=opts, think=False)
    assert after.done and after.prompt_eval_count > tooled.prompt_eval_count
    want = _openai_greedy_chat(qwen3.base_url, ask, 4, tools=[WEATHER])
    assert tooled.message.content == want
    on = c.chat(model=name, messages=HI, think=True, options=opts)
    off = c.chat(model=name, messages=HI, think=False, options=opts)
    assert on.prompt_eval_count != off.prompt_eval_count  # Qwen3's switch: an empty <think> block when off
    assert "<think>" not in on.message.content + off.message.content and not off.message.thinking
    assert c.chat(model=name, messages=HI, think="low", options=opts).done


def _openai_greedy_chat(base_url: str, messages: list, n: int, **extra: object) -> str:
    body = {"messages": messages, "max_tokens": n, "temperature": 0, **extra}
    body["chat_template_kwargs"] = {"enable_thinking": False}
    r = _post(base_url, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def test_formatter_tool_calls_and_thinking():
    """ollama's shapes for a parsed answer: thinking apart, tool calls whole with object arguments."""
    from llamapy.chat.common import ChatDelta, ParsedMessage, ToolCall
    from llamapy.server.engine import Event
    from llamapy.server.ollama import OllamaFormatter

    msg = ParsedMessage("", "hmm", [ToolCall("get_weather", '{"city": "Paris"}', "c1")])
    final = Event(done=True, finish_reason="tool_calls", n_prompt=9, n_predicted=7, message=msg)
    out = OllamaFormatter("m", "chat", 0.0).response("", [], final)
    assert out["message"]["thinking"] == "hmm" and out["done_reason"] == "stop" and out["eval_count"] == 7
    assert out["message"]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    f = OllamaFormatter("m", "chat", 0.0)
    deltas = [ChatDelta(reasoning_content="hm"), ChatDelta(content="Hi"),
              ChatDelta(tool_call_index=0, tool_call_name="get_weather", tool_call_arguments='{"city": '),
              ChatDelta(tool_call_index=0, tool_call_arguments='"Paris"}')]  # fmt: skip
    chunks = f.chunks(Event(deltas=deltas))
    assert chunks[0]["message"] == {"role": "assistant", "content": "Hi", "thinking": "hm"}
    tail = f.final_chunk(Event(done=True, finish_reason="tool_calls"))
    calls = tail[0]["message"]["tool_calls"]
    assert calls == [{"id": calls[0]["id"],
                      "function": {"index": 0, "name": "get_weather", "arguments": {"city": "Paris"}}}]  # fmt: skip
    assert tail[-1]["done"] is True and not tail[0]["done"]
    gen = OllamaFormatter("m", "generate", 0.0).response("", [], final)
    assert gen["thinking"] == "hmm" and "message" not in gen


# -- embeddings -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def embedder(tmp_path_factory) -> Iterator[LiveServer]:
    from llamapy.server.embeddings import EmbeddingBackend
    from tests.test_api_embedding import write_tiny_embedder

    path = str(
        write_tiny_embedder(tmp_path_factory.mktemp("ollama-emb") / "emb.gguf", arch="qwen3", pooling=3)
    )
    backend = EmbeddingBackend(path, n_ctx=1024, n_seq_max=4, n_batch=128, embeddings=True)
    settings = ServerSettings(model_path=path, api_keys=[KEY], warmup=False)
    srv, thread = start_live(settings, backend)
    wait_ready(srv.base_url, timeout=120)
    yield srv
    stop_live(srv, thread)


def test_embed(embedder):
    import numpy as np

    c = _client(embedder.base_url)
    texts = ["Paris is the capital of France.", "bananas"]
    r = c.embed(model="emb", input=texts)
    want = _post(embedder.base_url, "/v1/embeddings", {"input": texts}).json()["data"]
    assert len(r.embeddings) == 2
    for got, w in zip(r.embeddings, want, strict=True):
        assert np.allclose(got, w["embedding"], atol=1e-5)
    one = c.embed(model="emb", input="bananas", dimensions=4).embeddings[0]
    assert len(one) == 4 and abs(np.linalg.norm(one) - 1) < 1e-4
    legacy = c.embeddings(model="emb", prompt="bananas").embedding
    assert np.allclose(np.asarray(legacy) / np.linalg.norm(legacy), want[1]["embedding"], atol=1e-5)
    assert "embedding" in c.show("emb").capabilities
    with pytest.raises(ollama.ResponseError) as e:
        c.chat(model="emb", messages=HI)
    assert e.value.status_code == 501
    r = _post(embedder.base_url, "/api/embed", {"model": "emb", "input": 7})
    assert r.status_code == 400 and list(r.json()) == ["error"]
    for body in ({"input": []}, {"input": ""}, {}):  # ollama: nothing to embed loads the model
        r = _post(embedder.base_url, "/api/embed", {"model": "emb"} | body)
        assert r.status_code == 200 and r.json() == {"model": "emb", "embeddings": []}, r.text
    r = _post(embedder.base_url, "/api/embeddings", {"model": "emb", "prompt": ""})
    assert r.status_code == 200 and r.json() == {"embedding": []}


# -- images -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vision(tmp_path_factory) -> Iterator[LiveServer]:
    from llamapy.mtmd import MtmdContext
    from llamapy.server.backend import ContextBackend
    from tests.mtmd import convert

    vlm = convert.make_llava(tmp_path_factory.mktemp("ollama-llava"))
    backend = ContextBackend(vlm.text_gguf(), n_ctx=256, n_seq_max=1, n_batch=64, n_ubatch=64)
    backend.mtmd = MtmdContext(vlm.mmproj_gguf(), backend.model)  # type: ignore[attr-defined]
    settings = ServerSettings(model_path=str(vlm.text_gguf()), warmup=False, api_keys=[KEY])
    srv, thread = start_live(settings, backend)
    wait_ready(srv.base_url, timeout=120)
    yield srv
    stop_live(srv, thread)


@pytest.mark.slow
def test_images_answer_like_openai_image_url_parts(vision):
    from tests.server.test_anthropic import _png

    c = _client(vision.base_url)
    name = c.list().models[0].model
    assert "vision" in c.show(name).capabilities
    data = _png(1)
    r = c.chat(model=name, messages=[{"role": "user", "content": "what is this", "images": [data]}],
               options={"temperature": 0, "num_predict": 4})  # fmt: skip
    parts = [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + data}},
             {"type": "text", "text": "what is this"}]  # fmt: skip
    body = {"messages": [{"role": "user", "content": parts}], "max_tokens": 4, "temperature": 0}
    want = _post(vision.base_url, "/v1/chat/completions", body).json()
    assert r.message.content == want["choices"][0]["message"]["content"]
    assert r.prompt_eval_count == want["usage"]["prompt_tokens"] >= 16  # the image's tokens counted
    g = c.generate(
        model=name, prompt="what is this", images=[data], options={"temperature": 0, "num_predict": 4}
    )
    assert g.response == r.message.content
    bad = _post(
        vision.base_url, "/api/chat", {"model": name, "messages": [{"role": "user", "images": ["QUJD"]}]}
    )
    assert bad.status_code == 400 and list(bad.json()) == ["error"], bad.text
    _healthy(vision.base_url)
