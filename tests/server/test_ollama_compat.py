"""ollama's API as clients written for ollama use it, checked against ollama's Go server (api/types.go,
server/routes.go): the bodies Go's ``api.Client`` sends (``"suffix": ""``, ``"messages": null``,
``"options": null``), the empty requests that load a model, case-insensitive roles, ``tool_call_id``,
tool call ids, integer options sent as JSON floats, ``raw`` with ``system``, ``context``, HEAD routes."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import ollama
import pytest

from llamapy.server.app import ServerSettings
from tests.server.conftest import LiveServer, start_live, stop_live, wait_ready
from tests.server.fake_backend import FakeBackend

KEY = "ollama-compat-456"
AUTH = {"Authorization": f"Bearer {KEY}"}
HI = [{"role": "user", "content": "Hello there!"}]


@pytest.fixture(scope="module")
def fake() -> Iterator[LiveServer]:
    settings = ServerSettings(model_path="/models/fake.gguf", api_keys=[KEY])
    srv, thread = start_live(settings, FakeBackend(n_ctx=1024, n_seq_max=2, n_batch=64))
    wait_ready(srv.base_url)
    yield srv
    stop_live(srv, thread)


def _client(base_url: str) -> ollama.Client:
    return ollama.Client(host=base_url, headers=AUTH, timeout=60)


def _post(base_url: str, path: str, body: object) -> httpx.Response:
    return httpx.post(base_url + path, json=body, headers=AUTH, timeout=60)


def _healthy(base_url: str) -> None:
    assert httpx.get(base_url + "/api/version", headers=AUTH, timeout=5).status_code == 200


def test_go_client_generate_body(fake):
    """Go's api.GenerateRequest has no omitempty on suffix/system/template/options: an empty suffix is
    no suffix (ollama: ``req.Suffix != ""``), not fill-in-the-middle."""
    body = {"model": "fake", "prompt": "Once upon", "suffix": "", "system": "", "template": "",
            "options": None, "stream": False}  # fmt: skip
    r = _post(fake.base_url, "/api/generate", body | {"options": {"num_predict": 4}})
    assert r.status_code == 200, r.text
    assert r.json()["done"] is True and r.json()["response"]
    r = _post(fake.base_url, "/api/generate", body | {"prompt": ""})  # load
    assert r.status_code == 200 and r.json()["done_reason"] == "load", r.text


def test_empty_chat_loads_the_model(fake):
    """ollama answers a chat without messages (``ollama run``'s preload; Go sends ``"messages": null``)
    with done_reason "load"."""
    for msgs in ([], None):
        r = _post(fake.base_url, "/api/chat", {"model": "fake", "messages": msgs, "options": None})
        assert r.status_code == 200, r.text
        got = r.json()
        assert got["done"] is True and got["done_reason"] == "load"
        assert got["message"] == {"role": "assistant", "content": ""}
    r = _client(fake.base_url).chat(model="fake", messages=[])
    assert r.done and r.done_reason == "load"


def test_roles_are_case_insensitive(fake):
    """ollama's Message.UnmarshalJSON lowercases the role."""
    msgs = [{"role": "System", "content": "be brief"}, {"role": "USER", "content": "hi"}]
    r = _post(fake.base_url, "/api/chat", {"model": "fake", "messages": msgs, "stream": False,
                                           "options": {"num_predict": 3}})  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.json()["message"]["role"] == "assistant"


def test_integer_options_sent_as_floats(fake):
    """Go decodes options into map[string]any: a JSON number is a float64, and ollama's FromMap takes a
    float for an integer option (truncated)."""
    c = _client(fake.base_url)
    r = c.chat(model="fake", messages=HI, options={"num_predict": 3.0, "top_k": 40.0, "seed": 7.0})
    assert r.done and 0 < r.eval_count <= 3
    r = _post(fake.base_url, "/api/chat", {"model": "fake", "messages": HI, "stream": False,
                                           "options": {"num_predict": 2.7}})  # fmt: skip
    assert r.status_code == 200 and r.json()["eval_count"] <= 2, r.text
    r = _post(fake.base_url, "/api/chat", {"model": "fake", "messages": HI, "options": {"top_k": True}})
    assert r.status_code == 400 and "top_k" in r.json()["error"]


def test_raw_refuses_system_and_template(fake):
    """ollama: "raw mode does not support template, system, or context" (400), never a silent drop."""
    for extra in ({"system": "be brief"}, {"template": "{{ .Prompt }}"}, {"context": [1, 2]}):
        r = _post(fake.base_url, "/api/generate", {"model": "fake", "prompt": "x", "raw": True} | extra)
        assert r.status_code == 400, r.text
        assert list(r.json()) == ["error"] and "raw mode" in r.json()["error"]
    _healthy(fake.base_url)


def test_generate_context_round_trip(fake):
    """The final answer of a (non-raw) generate carries ``context``; sending it back continues there."""
    c = _client(fake.base_url)
    first = c.generate(model="fake", prompt="Once upon", options={"num_predict": 4, "temperature": 0})
    ctx = list(first.context or [])
    assert len(ctx) > first.eval_count > 0
    parts = list(
        c.generate(
            model="fake", prompt="Once upon", stream=True, options={"num_predict": 4, "temperature": 0}
        )
    )
    assert list(parts[-1].context or []) == ctx and all(p.context is None for p in parts[:-1])
    again = c.generate(model="fake", prompt="a time", context=ctx, options={"num_predict": 4})
    assert again.done and again.prompt_eval_count > first.prompt_eval_count
    assert list(again.context or [])[: len(ctx)] == ctx
    raw = c.generate(model="fake", prompt="Once upon", raw=True, options={"num_predict": 2})
    assert raw.context is None  # (ollama: no context in raw mode)


def test_head_routes(fake):
    """ollama answers HEAD /api/version and HEAD /api/tags (clients probe them)."""
    for path in ("/", "/api/version", "/api/tags"):
        assert httpx.head(fake.base_url + path, headers=AUTH).status_code == 200, path


def test_blobs_and_create_answer_in_ollamas_shape(fake):
    digest = "sha256:" + "0" * 64
    r = httpx.head(fake.base_url + f"/api/blobs/{digest}", headers=AUTH)
    assert r.status_code == 404
    r = httpx.post(fake.base_url + f"/api/blobs/{digest}", content=b"abc", headers=AUTH)
    assert r.status_code == 501 and list(r.json()) == ["error"], r.text
    with pytest.raises(ollama.ResponseError) as e:
        _client(fake.base_url).create(model="mine", from_="fake")
    assert e.value.status_code == 501
    _healthy(fake.base_url)


def test_think_max_is_a_think_level(fake):
    """ollama's ThinkValue takes "max" (as "high" where the template has levels); on a model without
    thinking it is the same "does not support thinking" 400 as true."""
    r = _post(fake.base_url, "/api/chat", {"model": "fake", "messages": HI, "think": "max"})
    assert r.status_code == 400 and "does not support thinking" in r.json()["error"], r.text


def test_tool_calls_have_ids_and_tool_call_id_reaches_the_template():
    from llamapy.server.ollama import OllamaFormatter
    from llamapy.server.ollama_requests import chat_messages

    fmt = OllamaFormatter("m", "chat", 0.0)
    calls = fmt._calls([("get_weather", '{"city": "Paris"}'), ("f", "")])
    assert [c["function"]["index"] for c in calls] == [0, 1]
    assert calls[0]["function"]["arguments"] == {"city": "Paris"} and calls[1]["function"]["arguments"] == {}
    assert all(c["id"].startswith("call_") for c in calls) and calls[0]["id"] != calls[1]["id"]
    msgs = chat_messages(
        [
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "call_1", "function": {"name": "f", "arguments": {"a": 1}}}]},
            {"role": "tool", "content": "42", "tool_name": "f", "tool_call_id": "call_1"},
        ]
    )  # fmt: skip
    assert msgs[0]["tool_calls"][0]["id"] == "call_1"
    assert msgs[1]["tool_call_id"] == "call_1" and msgs[1]["name"] == "f"


def test_stream_lines_are_json_objects(fake):
    body = {"model": "fake", "prompt": "Once upon", "options": {"num_predict": 3}}
    with httpx.stream("POST", fake.base_url + "/api/generate", json=body, headers=AUTH) as r:
        lines = [json.loads(x) for x in r.iter_lines() if x]
    assert lines[-1]["done"] is True and all(x["done"] is False for x in lines[:-1])
    assert all("response" in x and "created_at" in x for x in lines)
