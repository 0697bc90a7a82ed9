"""Hostile requests to /v1/responses over a real socket (issue 33 §2 items 5, 9 and 11).

Metadata is bounded as OpenAI bounds it, the response store is bounded in bytes as well as in count,
stored responses belong to the API key that made them, and a wrong JSON type at any field of the body is
a 400 in OpenAI's shape (a property-based test mutates valid bodies), answered at once, the server still
serving afterwards.
"""

from __future__ import annotations

import json
import os
import time
import tracemalloc
from collections.abc import Iterator

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings

from llamapy.server.app import ServerSettings
from llamapy.server.responses import ResponseStore, approx_size
from tests.server.conftest import LiveServer, start_live, stop_live, wait_ready
from tests.server.fake_backend import FakeBackend
from tests.server.mutate import WRONG, mutants, paths, replaced

KEY_A, KEY_B = "key-alice-123", "key-bob-456"
FAST = 5.0  # seconds: "answered at once" on a slow shared 2-core box (the bound is 1 s)


@pytest.fixture(scope="module")
def srv() -> Iterator[LiveServer]:
    # two API keys, the default body limit (8 MiB: the 6.3 MB metadata body reaches the app)
    settings = ServerSettings(model_path="/models/fake.gguf", api_keys=[KEY_A, KEY_B])
    live, thread = start_live(settings, FakeBackend(n_ctx=4096, n_seq_max=2, n_batch=256))
    wait_ready(live.base_url)
    yield live
    stop_live(live, thread)


def _client(srv: LiveServer, key: str = KEY_A) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url + "/v1", api_key=key, max_retries=0, timeout=60)


def _post(srv: LiveServer, body: object, key: str = KEY_A, timeout: float = 60) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    return httpx.post(srv.base_url + "/v1/responses", content=content, headers=headers, timeout=timeout)


def _assert_openai_400(r: httpx.Response, says: str = "") -> dict:
    assert r.status_code == 400, (r.status_code, r.text[:500])
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and isinstance(err["message"], str), err
    assert says in err["message"] or says == err.get("param"), err
    return err


def _still_serving(srv: LiveServer) -> None:
    assert httpx.get(srv.base_url + "/health", timeout=10).status_code == 200
    r = _client(srv).responses.create(model="m", input="Hello!", max_output_tokens=3)
    assert r.status in ("completed", "incomplete") and r.output_text


# -- 9: wrong JSON types are 400s, not 500s -----------------------------------------------------------


@pytest.mark.parametrize(
    "body, where",
    [
        ({"input": [{"type": ["x"]}]}, "input.0.type"),
        ({"input": [{"type": {"a": 1}}]}, "input.0.type"),
        ({"input": [{"type": ["message"], "role": "user", "content": "hi"}]}, "input.0.type"),
        ({"input": [{"role": "user", "content": [{"type": ["input_text"], "text": "x"}]}]}, "type"),
        (
            {"input": "hi", "reasoning": {"effort": "high"}, "chat_template_kwargs": "x"},
            "chat_template_kwargs",
        ),
        (
            {"input": "hi", "reasoning": {"effort": "high"}, "chat_template_kwargs": [1]},
            "chat_template_kwargs",
        ),
        ({"input": "hi", "tool_choice": {"type": ["function"], "name": "f"}}, "tool_choice"),
        ({"input": "hi", "tools": [{"type": ["function"], "name": "f"}]}, "tools.0.type"),
        ({"input": "hi", "text": {"format": {"type": ["json_schema"]}}}, "text.format.type"),
    ],
)
def test_wrong_types_are_400s(srv, body, where):
    t0 = time.perf_counter()
    r = _post(srv, {"model": "m", "max_output_tokens": 2, **body})
    assert time.perf_counter() - t0 < FAST
    err = _assert_openai_400(r)
    assert where in err["message"] or where == err.get("param"), err


MESSAGE_TOOLS_SEED = {
    "model": "m",
    "input": [
        {"role": "system", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"P"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "hm"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "It is sunny."}]},
        {"role": "user", "content": "Thanks"},
    ],
    "instructions": "Answer.",
    "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
    "tool_choice": "auto",
    "parallel_tool_calls": True,
    "max_output_tokens": 2,
    "temperature": 0.5,
    "top_p": 0.9,
    "metadata": {"k": "v"},
    "store": True,
    "user": "u",
}
FORMAT_SEED = {
    "model": "m",
    "input": "Hi",
    "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}, "strict": True}},
    "reasoning": {"effort": "high", "summary": "auto"},
    "chat_template_kwargs": {"enable_thinking": False},
    "tool_choice": {"type": "function", "name": "get_weather"},
    "tools": [{"type": "function", "name": "get_weather", "description": "d", "strict": False}],
    "max_output_tokens": 2,
    "top_k": 4,
    "seed": 3,
}
STREAM_SEED = {
    "model": "m",
    "input": [{"role": "user", "content": "Hi"}],
    "max_output_tokens": 2,
    "stream": True,
}
SEEDS = [MESSAGE_TOOLS_SEED, FORMAT_SEED, STREAM_SEED]


@settings(
    max_examples=100,
    deadline=None,
    database=None,
    derandomize=bool(os.environ.get("CI")),  # (a fixed sample under CI, as tests/server/test_fuzz_routes.py)
    suppress_health_check=[HealthCheck.too_slow],
)
@given(mutant=mutants(SEEDS))
def test_fuzz_wrong_types_never_5xx(srv, mutant):
    body, what = mutant
    body.setdefault("max_output_tokens", 2)
    t0 = time.perf_counter()
    r = _post(srv, body, timeout=30)
    took = time.perf_counter() - t0
    assert r.status_code < 500, (what, r.status_code, r.text[:500])
    assert took < 10, (what, took)
    if r.status_code >= 400:
        err = r.json()["error"]
        assert isinstance(err["message"], str) and err["type"], (what, err)


def test_sweep_every_field_with_every_wrong_type(srv):
    # exhaustive: each field of the seeds (list items included) set to each value of another type
    bad = []
    t0 = time.perf_counter()
    n = 0
    with httpx.Client(headers={"authorization": f"Bearer {KEY_A}"}, timeout=30) as client:
        for seed in SEEDS:
            for path in paths(seed):
                for value in WRONG:
                    body = replaced(seed, path, value)
                    body.setdefault("max_output_tokens", 2)
                    r = client.post(srv.base_url + "/v1/responses", json=body)
                    n += 1
                    if r.status_code >= 500 or (r.status_code >= 400 and "error" not in r.json()):
                        bad.append((".".join(map(str, path)), value, r.status_code, r.text[:200]))
    print(f"{n} mutants in {time.perf_counter() - t0:.1f} s")
    assert not bad, bad[:10]


def test_fuzz_left_the_server_serving(srv):
    _still_serving(srv)


# -- 5: metadata as OpenAI bounds it; the store bounded in bytes --------------------------------------


@pytest.mark.parametrize(
    "metadata, says",
    [
        ({f"k{i}": "v" for i in range(17)}, "16"),
        ({"k" * 65: "v"}, "64"),
        ({"k": "v" * 513}, "512"),
        ({"k": 5}, "string"),
        ({"k": None}, "string"),
        ({"k": {"a": "b"}}, "string"),
        ("x", "object"),
        ([["k", "v"]], "object"),
    ],
)
def test_bad_metadata_is_400(srv, metadata, says):
    err = _assert_openai_400(_post(srv, {"model": "m", "input": "hi", "metadata": metadata}), says)
    assert err["param"].startswith("metadata"), err


def test_metadata_flood_is_400_at_once(srv):
    # the probe: 400k pairs (6.3 MB), which kept ~39 MB per stored response
    body = {"model": "m", "input": "hi", "max_output_tokens": 1}
    body["metadata"] = {f"k{i}": f"v{i % 1000}" for i in range(400_000)}
    raw = json.dumps(body, separators=(",", ":")).encode()
    assert 6_000_000 < len(raw) < 8 << 20
    t0 = time.perf_counter()
    r = _post(srv, raw)
    took = time.perf_counter() - t0
    print(f"400k-pair metadata answered in {took:.3f} s")
    assert took < FAST
    _assert_openai_400(r, "16")
    _still_serving(srv)


def test_metadata_at_the_limits_round_trips(srv):
    meta = {f"{i:02d}" + "k" * 62: "v" * 512 for i in range(16)}
    c = _client(srv)
    r = c.responses.create(model="m", input="hi", max_output_tokens=2, metadata=meta)
    assert r.metadata == meta
    assert c.responses.retrieve(r.id).metadata == meta


@pytest.mark.parametrize(
    "value",
    [
        {f"key{i:06d}": f"val{i:06d}" for i in range(20_000)},  # many small strings
        {"texts": ["x" * 1000] * 300},  # long strings (shared: counted once each time they appear)
        {"zeros": [0] * 50_000},
        {"dicts": [{} for _ in range(20_000)]},
        {"lists": [[1, 2.5, None, True] for _ in range(10_000)]},
        {"nested": [{"a": [{"b": "c" * 20}]} for _ in range(10_000)]},
    ],
    ids=["small-strings", "long-strings", "zeros", "empty-dicts", "small-lists", "nested"],
)
def test_approx_size_tracks_real_memory(value):
    raw = json.dumps(value)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    obj = json.loads(raw)
    real = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    est = approx_size(obj)
    print(f"real {real} estimated {est} ({est / real:.2f}x)")
    assert real * 0.8 <= est <= real * 12, (real, est)


def test_store_evicts_by_bytes_and_count():
    store = ResponseStore(size=100, max_bytes=1_000_000)
    big = [{"role": "user", "content": "x" * 300_000}]
    for i in range(5):
        store.put(f"resp_{i}", big, {"id": f"resp_{i}"})
    assert store.n_bytes <= 1_000_000
    kept = [i for i in range(5) if store.has(f"resp_{i}")]
    assert kept == [2, 3, 4]  # the oldest went first
    store.put("resp_huge", [{"role": "user", "content": "x" * 2_000_000}], {"id": "resp_huge"})
    assert not store.has("resp_huge") and store.has("resp_4")  # larger than the budget: never kept
    small = ResponseStore(size=3, max_bytes=10**9)
    for i in range(5):
        small.put(f"r{i}", [], {"id": f"r{i}"})
    assert [i for i in range(5) if small.has(f"r{i}")] == [2, 3, 4]


def test_store_byte_budget_over_the_socket(srv):
    # junk in fields that are echoed back (text.format) is stored: the budget keeps it bounded
    store: ResponseStore = srv.app.state.server.response_store  # type: ignore[attr-defined]
    old = store.max_bytes
    store.max_bytes = 3_000_000
    try:
        junk = {"type": "text", "junk": ["y" * 100] * 5000}  # ~0.9 MB kept
        ids = []
        for _ in range(8):
            body = {"model": "m", "input": "hi", "max_output_tokens": 1, "text": {"format": junk}}
            r = _post(srv, body)
            assert r.status_code == 200, r.text[:300]
            ids.append(r.json()["id"])
            assert store.n_bytes <= store.max_bytes
        c = _client(srv)
        assert c.responses.retrieve(ids[-1]).id == ids[-1]
        with pytest.raises(openai.NotFoundError):
            c.responses.retrieve(ids[0])
    finally:
        store.max_bytes = old


# -- 11: stored responses belong to the key that made them ---------------------------------------------


def test_responses_are_scoped_to_their_api_key(srv):
    a, b = _client(srv, KEY_A), _client(srv, KEY_B)
    r = a.responses.create(model="m", input="My secret is 42.", max_output_tokens=2)
    missing = "resp_" + "0" * 24

    # what the other key sees is what it would see for an id that does not exist
    for rid in (r.id, missing):
        with pytest.raises(openai.NotFoundError) as e:
            b.responses.retrieve(rid)
        with pytest.raises(openai.NotFoundError):
            b.responses.delete(rid)
        with pytest.raises(openai.BadRequestError) as e:
            b.responses.create(
                model="m", input="What is my secret?", previous_response_id=rid, max_output_tokens=2
            )
        assert "not found" in str(e.value)
    nb = httpx.get(srv.base_url + f"/v1/responses/{r.id}", headers={"x-api-key": KEY_B}, timeout=10)
    nm = httpx.get(srv.base_url + f"/v1/responses/{missing}", headers={"x-api-key": KEY_B}, timeout=10)
    assert nb.status_code == nm.status_code == 404
    assert nb.json()["error"]["message"].replace(r.id, "ID") == nm.json()["error"]["message"].replace(
        missing, "ID"
    )

    # the owner still has it, whole (the other key's delete did nothing), and can continue and delete it
    assert a.responses.retrieve(r.id).id == r.id
    nxt = a.responses.create(model="m", input="And?", previous_response_id=r.id, max_output_tokens=2)
    assert nxt.previous_response_id == r.id
    # the same key sent as x-api-key (Anthropic clients' header) is the same owner
    got = httpx.get(srv.base_url + f"/v1/responses/{r.id}", headers={"x-api-key": KEY_A}, timeout=10)
    assert got.status_code == 200 and got.json()["id"] == r.id
    a.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        a.responses.retrieve(r.id)


def test_the_key_itself_is_not_kept_in_the_request_state(srv):
    # the guard passes on which key matched as a digest, never the secret itself
    from llamapy.server.guard import key_id

    assert KEY_A not in key_id(KEY_A.encode()) and key_id(KEY_A.encode()) != key_id(KEY_B.encode())


def test_without_keys_responses_are_shared():
    live, thread = start_live(ServerSettings(model_path="/models/fake.gguf"), FakeBackend(n_ctx=256))
    try:
        wait_ready(live.base_url)
        c = openai.OpenAI(base_url=live.base_url + "/v1", api_key="anything", max_retries=0, timeout=60)
        r = c.responses.create(model="m", input="hi", max_output_tokens=2)
        other = openai.OpenAI(base_url=live.base_url + "/v1", api_key="other", max_retries=0, timeout=60)
        assert other.responses.retrieve(r.id).id == r.id
    finally:
        stop_live(live, thread)
