"""Hostile requests to /v1/messages and /v1/messages/count_tokens over a real socket (issue 33 §2 item 9).

A wrong JSON type at any field of the body (content block types that are lists or objects, also inside
``tool_result``, included) is a 400 in Anthropic's error shape, answered at once; and any error under
/v1/messages (a 404, a 405, even an internal 500) has Anthropic's shape, never OpenAI's.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import anthropic
import httpx
import pytest
from hypothesis import HealthCheck, given, settings

from llamapy.server.app import ServerSettings
from tests.server.conftest import LiveServer, start_live, stop_live, wait_ready
from tests.server.fake_backend import FakeBackend
from tests.server.mutate import WRONG, mutants, paths, replaced

KEY = "sk-ant-hostile-789"
FAST = 5.0  # seconds: "answered at once" on a slow shared 2-core box (the bound is 1 s)
HI = [{"role": "user", "content": "Hello there!"}]


@pytest.fixture(scope="module")
def srv() -> Iterator[LiveServer]:
    settings = ServerSettings(model_path="/models/fake.gguf", api_keys=[KEY])
    live, thread = start_live(settings, FakeBackend(n_ctx=4096, n_seq_max=2, n_batch=256))
    wait_ready(live.base_url)
    yield live
    stop_live(live, thread)


def _client(srv: LiveServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=srv.base_url, api_key=KEY, max_retries=0, timeout=60)


def _post(srv: LiveServer, path: str, body: object, client: httpx.Client | None = None) -> httpx.Response:
    c = client or httpx
    return c.post(srv.base_url + path, json=body, headers={"x-api-key": KEY}, timeout=30)


def _assert_anthropic_error(r: httpx.Response, status: int | None = None) -> dict:
    if status is not None:
        assert r.status_code == status, (r.status_code, r.text[:500])
    body = r.json()
    assert body["type"] == "error" and set(body) == {"type", "error"}, body
    assert isinstance(body["error"]["type"], str) and isinstance(body["error"]["message"], str), body
    return body["error"]


def _still_serving(srv: LiveServer) -> None:
    assert httpx.get(srv.base_url + "/health", timeout=10).status_code == 200
    m = _client(srv).messages.create(model="m", max_tokens=3, messages=HI)
    assert m.content[0].text


def _tool_result(content: object) -> list[dict]:
    return [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "w", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": content}]},
    ]


# -- the probes --------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
@pytest.mark.parametrize(
    "messages, where",
    [
        ([{"role": "user", "content": [{"type": ["text"], "text": "hi"}]}], "messages.0.content.0.type"),
        ([{"role": "user", "content": [{"type": {"a": 1}, "text": "hi"}]}], "messages.0.content.0.type"),
        ([{"role": "user", "content": [["text"]]}], "messages.0.content.0"),
        (_tool_result([{"type": ["text"], "text": "sunny"}]), "messages.2.content.0.content.0.type"),
        (_tool_result([{"type": {"a": 1}, "text": "sunny"}]), "messages.2.content.0.content.0.type"),
        (_tool_result(["sunny"]), "messages.2.content.0.content"),
        (
            [HI[0], {"role": "assistant", "content": [{"type": ["tool_use"], "id": "t", "name": "w"}]}],
            "messages.1.content.0.type",
        ),
    ],
)
def test_unhashable_block_types_are_400s(srv, path, messages, where):
    t0 = time.perf_counter()
    r = _post(srv, path, {"model": "m", "max_tokens": 2, "messages": messages})
    assert time.perf_counter() - t0 < FAST
    err = _assert_anthropic_error(r, 400)
    assert err["type"] == "invalid_request_error" and where in err["message"], err


def test_unhashable_block_type_through_the_client(srv):
    msgs = [{"role": "user", "content": [{"type": ["text"], "text": "hi"}]}]
    with pytest.raises(anthropic.BadRequestError) as e:
        _client(srv).messages.create(model="m", max_tokens=2, messages=msgs)  # type: ignore[arg-type]
    assert e.value.body["type"] == "error" and "messages.0.content.0.type" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError):
        _client(srv).messages.count_tokens(model="m", messages=msgs)  # type: ignore[arg-type]
    _still_serving(srv)


def test_every_error_under_v1_messages_is_anthropic_shaped(srv, monkeypatch):
    import llamapy.server.anthropic as A

    _assert_anthropic_error(_post(srv, "/v1/messages/nope", {}), 404)
    r = httpx.get(srv.base_url + "/v1/messages", headers={"x-api-key": KEY}, timeout=10)
    _assert_anthropic_error(r, 405)
    r = httpx.post(srv.base_url + "/v1/messages", content=b"{", headers={"x-api-key": KEY}, timeout=10)
    _assert_anthropic_error(r, 400)

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(A, "to_chat", broken)  # the server runs in this process: a bug on purpose
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        err = _assert_anthropic_error(_post(srv, path, {"model": "m", "max_tokens": 2, "messages": HI}), 500)
        assert err["type"] == "api_error" and "a bug" in err["message"], err
    monkeypatch.undo()
    # and OpenAI routes keep OpenAI's shape
    r = httpx.get(srv.base_url + "/v1/nope", headers={"x-api-key": KEY}, timeout=10)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    _still_serving(srv)


# -- every field, every wrong type ---------------------------------------------------------------------

TOOL = {"name": "get_weather", "description": "d", "input_schema": {"type": "object"}}
MESSAGES_SEED = {
    "model": "m",
    "max_tokens": 2,
    "system": [{"type": "text", "text": "Be brief."}],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hm", "signature": "s"},
                {"type": "redacted_thinking", "data": "x"},
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": [{"type": "text", "text": "sunny"}],
                    "is_error": False,
                },
                {"type": "text", "text": "Thanks"},
            ],
        },
    ],
    "tools": [TOOL],
    "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
    "stop_sequences": ["\n\n"],
    "temperature": 0.5,
    "top_p": 0.9,
    "top_k": 5,
    "metadata": {"user_id": "u"},
    "thinking": {"type": "enabled", "budget_tokens": 1024},
}
STREAM_SEED = {"model": "m", "max_tokens": 2, "system": "Answer.", "messages": HI, "stream": True}
FORMAT_SEED = {  # (grammars: the fake model refuses them at planning, after the translation)
    "model": "m",
    "max_tokens": 2,
    "messages": [{"role": "user", "content": "Hi"}],
    "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}},
    "tool_choice": {"type": "tool", "name": "get_weather"},
    "tools": [TOOL],
}
IMAGE_SEED = {
    "model": "m",
    "max_tokens": 2,
    "messages": [
        {
            "role": "user",
            "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}}
            ],
        }
    ],
}
SEEDS = [MESSAGES_SEED, STREAM_SEED, FORMAT_SEED, IMAGE_SEED]


def _ok_or_anthropic_4xx(r: httpx.Response) -> str | None:
    """Why the answer breaks the rule (None: a 2xx, or a 4xx in Anthropic's shape)."""
    if r.status_code >= 500:
        return f"{r.status_code}: {r.text[:200]}"
    if r.status_code >= 400:
        body = r.json()
        if body.get("type") != "error" or not isinstance(body.get("error"), dict):
            return f"{r.status_code} not in Anthropic's shape: {r.text[:200]}"
    return None


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_sweep_every_field_with_every_wrong_type(srv, path):
    bad, n, t0 = [], 0, time.perf_counter()
    with httpx.Client() as client:
        for seed in SEEDS:
            for p in paths(seed):
                for value in WRONG:
                    r = _post(srv, path, replaced(seed, p, value), client)
                    n += 1
                    why = _ok_or_anthropic_4xx(r)
                    if why:
                        bad.append((".".join(map(str, p)), value, why))
    print(f"{path}: {n} mutants in {time.perf_counter() - t0:.1f} s")
    assert not bad, bad[:10]


@settings(
    max_examples=100,
    deadline=None,
    database=None,
    derandomize=bool(os.environ.get("CI")),  # (a fixed sample under CI, as tests/server/test_fuzz_routes.py)
    suppress_health_check=[HealthCheck.too_slow],
)
@given(mutant=mutants(SEEDS))
def test_fuzz_never_5xx(srv, mutant):
    body, what = mutant
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        t0 = time.perf_counter()
        r = _post(srv, path, body)
        assert time.perf_counter() - t0 < 10, (what, path)
        why = _ok_or_anthropic_4xx(r)
        assert why is None, (what, path, why)


def test_fuzz_left_the_server_serving(srv):
    _still_serving(srv)
