"""The Anthropic Messages API (/v1/messages, /v1/messages/count_tokens) with the official anthropic client
over a real socket.

Shapes, streams, errors and x-api-key auth run on the fake model (fast); the tool_use round trip runs on
the real SmolLM2 with the Qwen 2.5 template (tool_choice "any" is grammar-constrained)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import anthropic
import httpx
import jsonschema
import pytest

from llamapy.server.app import ServerSettings
from tests.server.conftest import LiveServer, start_live, stop_live, wait_ready
from tests.server.fake_backend import FakeBackend
from tests.util import shared_path

KEY = "sk-ant-test-456"
WEATHER = {
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 24},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
}
HI = [{"role": "user", "content": "Hello there!"}]


@pytest.fixture(scope="module")
def fake() -> Iterator[LiveServer]:
    settings = ServerSettings(model_path="/models/fake.gguf", api_keys=[KEY])
    srv, thread = start_live(settings, FakeBackend(n_ctx=1024, n_seq_max=2, n_batch=64))
    wait_ready(srv.base_url)
    yield srv
    stop_live(srv, thread)


def _client(srv: LiveServer, key: str = KEY) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=srv.base_url, api_key=key, max_retries=0, timeout=120)


def _post(srv: LiveServer, path: str, body, **headers) -> httpx.Response:
    return httpx.post(srv.base_url + path, json=body, headers={"x-api-key": KEY, **headers}, timeout=30)


# -- fake model ---------------------------------------------------------------------------------------


def test_text_message(fake):
    m = _client(fake).messages.create(model="claude-x", max_tokens=12, messages=HI)
    assert m.id.startswith("msg_") and m.type == "message" and m.role == "assistant"
    assert m.model == "claude-x"
    assert [b.type for b in m.content] == ["text"] and m.content[0].text
    assert m.stop_reason in ("end_turn", "max_tokens")
    assert 1 <= m.usage.output_tokens <= 12 and m.usage.input_tokens > 0


def _n_prompt(m) -> int:
    """The whole prompt of an answer: its evaluated and its cached tokens."""
    return m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)


def test_system_and_blocks_reach_the_prompt(fake):
    c = _client(fake)
    plain = c.messages.create(model="m", max_tokens=2, messages=HI)
    sys1 = c.messages.create(model="m", max_tokens=2, messages=HI, system="Be brief.")
    sys2 = c.messages.create(
        model="m", max_tokens=2, messages=HI, system=[{"type": "text", "text": "Be brief."}]
    )
    assert _n_prompt(sys1) == _n_prompt(sys2) == _n_prompt(plain) + len("<system>Be brief.\n")
    blocks = [
        {"role": "user", "content": [{"type": "text", "text": "Hello "}, {"type": "text", "text": "there!"}]}
    ]
    assert _n_prompt(c.messages.create(model="m", max_tokens=2, messages=blocks)) == _n_prompt(plain)


def test_max_tokens_and_stop_sequences(fake):
    c = _client(fake)
    m = c.messages.create(model="m", max_tokens=3, messages=[{"role": "user", "content": "abcdefghijklmnop"}])
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 3
    full = c.messages.create(
        model="m", max_tokens=30, messages=[{"role": "user", "content": "abcdefghijklmnop"}]
    )
    text = full.content[0].text
    stop = text[4:6]
    m = c.messages.create(
        model="m",
        max_tokens=30,
        messages=[{"role": "user", "content": "abcdefghijklmnop"}],
        stop_sequences=[stop],
    )
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop
    assert stop not in m.content[0].text and text.startswith(m.content[0].text)


def test_stream_events(fake):
    c = _client(fake)
    events = list(c.messages.create(model="m", max_tokens=10, messages=HI, stream=True))
    types = [e.type for e in events]
    assert types[:2] == ["message_start", "content_block_start"]
    assert types[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(types[2:-3]) == {"content_block_delta"}
    assert events[0].message.usage.input_tokens > 0 and events[0].message.content == []
    assert events[1].content_block.type == "text" and events[1].index == 0
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    assert events[-2].delta.stop_reason in ("end_turn", "max_tokens")
    assert 1 <= events[-2].usage.output_tokens <= 10
    whole = c.messages.create(model="m", max_tokens=10, messages=HI)
    assert text == whole.content[0].text
    with c.messages.stream(model="m", max_tokens=10, messages=HI) as s:
        pieces = list(s.text_stream)
        final = s.get_final_message()
    assert "".join(pieces) == text == final.content[0].text
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens
    raw = _post(fake, "/v1/messages", {"model": "m", "max_tokens": 4, "messages": HI, "stream": True}).text
    assert raw.startswith("event: message_start\ndata: ") and "event: ping\n" in raw
    assert raw.rstrip().endswith('event: message_stop\ndata: {"type":"message_stop"}')


def test_count_tokens(fake):
    c = _client(fake)
    n = c.messages.count_tokens(model="m", messages=HI).input_tokens
    assert n == _n_prompt(c.messages.create(model="m", max_tokens=2, messages=HI))
    assert c.messages.count_tokens(model="m", messages=HI, system="Be brief.").input_tokens == n + len(
        "<system>Be brief.\n"
    )
    assert _post(fake, "/v1/messages/count_tokens", {"messages": []}).status_code == 400


def test_x_api_key_auth(fake):
    assert _client(fake).messages.create(model="m", max_tokens=2, messages=HI).content
    with pytest.raises(anthropic.AuthenticationError) as e:
        _client(fake, key="wrong").messages.create(model="m", max_tokens=2, messages=HI)
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "authentication_error"
    r = httpx.post(fake.base_url + "/v1/messages", json={"model": "m", "max_tokens": 2, "messages": HI})
    assert r.status_code == 401 and "x-api-key" in r.json()["error"]["message"]
    # the same keys, either header, on the OpenAI endpoints too
    body = {"messages": HI, "max_tokens": 2}
    assert httpx.post(fake.base_url + "/v1/chat/completions", json=body).status_code == 401
    assert _post(fake, "/v1/chat/completions", body).status_code == 200
    bearer = {"authorization": f"Bearer {KEY}"}
    assert (
        httpx.post(fake.base_url + "/v1/messages/count_tokens", json=body, headers=bearer).status_code == 200
    )


@pytest.mark.parametrize(
    "body,where",
    [
        ({"messages": HI}, "max_tokens"),
        ({"max_tokens": "5", "messages": HI}, "max_tokens"),
        ({"max_tokens": 0, "messages": HI}, "max_tokens"),
        ({"max_tokens": 5, "messages": []}, "messages"),
        ({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}, "messages.0.role"),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
        (
            {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "bogus"}]}]},
            "messages.0.content.0.type",
        ),
        (
            {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image"}]}]},
            "messages.0.content.0.source",
        ),
        (
            {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "document"}]}]},
            "messages.0.content.0.type",
        ),
        (
            {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "text"}]}]},
            "messages.0.content.0.text",
        ),
        (
            {
                "max_tokens": 5,
                "messages": [
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f"}]}
                ],
            },
            "messages.0.content.0.input",
        ),
        (
            {
                "max_tokens": 5,
                "messages": [
                    {"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}
                ],
            },
            "messages.0.content.0.type",
        ),
        ({"max_tokens": 5, "messages": HI, "temperature": 3}, "temperature"),
        ({"max_tokens": 5, "messages": HI, "stop_sequences": "x"}, "stop_sequences"),
        ({"max_tokens": 5, "messages": HI, "tools": [{"name": "f"}]}, "tools.0.input_schema"),
        (
            {
                "max_tokens": 5,
                "messages": HI,
                "tools": [{"type": "bash_20250124", "name": "bash", "input_schema": {}}],
            },
            "tools.0.type",
        ),
        ({"max_tokens": 5, "messages": HI, "tool_choice": {"type": "sometimes"}}, "tool_choice.type"),
        (
            {"max_tokens": 5, "messages": HI, "tools": [WEATHER], "tool_choice": {"type": "tool"}},
            "tool_choice.name",
        ),
        (
            {
                "max_tokens": 5,
                "messages": HI,
                "tools": [WEATHER],
                "tool_choice": {"type": "tool", "name": "nope"},
            },
            "nope",
        ),
        ({"max_tokens": 5, "messages": HI, "thinking": {"type": "maybe"}}, "thinking.type"),
    ],
)
def test_bad_requests_are_anthropic_errors(fake, body, where):
    r = _post(fake, "/v1/messages", {"model": "m", **body})
    assert r.status_code == 400, r.text
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert where in err["error"]["message"], err


def test_bad_request_through_the_client(fake):
    # agent clients send max_tokens far over a small context: an upper bound, clamped to the slot
    m = _client(fake).messages.create(model="m", max_tokens=10**9, messages=HI)
    assert m.stop_reason in ("end_turn", "max_tokens") and m.usage.output_tokens < 512
    # a prompt longer than a slot's context (512 tokens here), streamed or not
    long = [{"role": "user", "content": "x" * 600}]
    for stream in (False, True):
        with pytest.raises(anthropic.BadRequestError) as e:
            _client(fake).messages.create(model="m", max_tokens=4, messages=long, stream=stream)
        assert e.value.body["type"] == "error" and "context" in e.value.body["error"]["message"]
    # and the engine still serves
    assert _client(fake).messages.create(model="m", max_tokens=2, messages=HI).content[0].text


def test_tool_result_for_an_unknown_tool_use_passes_through(fake):
    msgs = HI + [
        {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_x", "content": [{"type": "text", "text": "42"}]}
            ],
        },
    ]
    assert _client(fake).messages.create(model="m", max_tokens=2, messages=msgs).content


# -- the real model: tool_use round trip, streamed tool_use -----------------------------------------


@pytest.fixture(scope="module")
def hermes(smollm2_path) -> Iterator[LiveServer]:
    from llamapy.server.backend import ContextBackend

    template = shared_path("templates", "Qwen-Qwen2.5-7B-Instruct.jinja").read_text()
    backend = ContextBackend(smollm2_path, n_ctx=2048, n_seq_max=1, n_batch=256, chat_template=template)
    srv, thread = start_live(ServerSettings(model_path=str(smollm2_path), api_keys=[KEY]), backend)
    wait_ready(srv.base_url, timeout=120)
    yield srv
    stop_live(srv, thread)


@pytest.mark.slow
def test_tool_use_round_trip(hermes):
    c = _client(hermes)
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    # (this client version has no sampling arguments: they go in the body as extra fields)
    common = dict(model="m", tools=[WEATHER], extra_body={"temperature": 0})
    m = c.messages.create(
        **common, max_tokens=60, messages=ask, tool_choice={"type": "any", "disable_parallel_tool_use": True}
    )
    assert m.stop_reason == "tool_use", m
    uses = [b for b in m.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_weather" and uses[0].id
    jsonschema.validate(uses[0].input, WEATHER["input_schema"])
    n = c.messages.count_tokens(model="m", messages=ask, tools=[WEATHER]).input_tokens
    assert n == _n_prompt(m) > c.messages.count_tokens(model="m", messages=ask).input_tokens
    result = {"type": "tool_result", "tool_use_id": uses[0].id, "content": json.dumps({"temperature": 21})}
    turn = ask + [{"role": "assistant", "content": m.content}, {"role": "user", "content": [result]}]
    m2 = c.messages.create(**common, max_tokens=12, messages=turn)
    assert m2.content[-1].type == "text" and m2.content[-1].text.strip(), m2
    assert m2.stop_reason in ("end_turn", "max_tokens")
    assert _n_prompt(m2) > _n_prompt(m) and m2.usage.cache_read_input_tokens > 0  # the turn reused the cache


@pytest.mark.slow
def test_structured_output(hermes):
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    m = _client(hermes).messages.create(
        model="m",
        max_tokens=60,
        messages=[{"role": "user", "content": "Invent a person."}],
        output_config={"format": {"type": "json_schema", "schema": schema}},
        extra_body={"temperature": 0},
    )
    assert m.stop_reason == "end_turn"
    jsonschema.validate(json.loads(m.content[0].text), schema)


@pytest.mark.slow
def test_streamed_tool_use(hermes):
    c = _client(hermes)
    with c.messages.stream(
        model="m",
        max_tokens=60,
        extra_body={"temperature": 0},
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        messages=[{"role": "user", "content": "Weather in Rome?"}],
    ) as s:
        events = list(s)
        final = s.get_final_message()
    types = [e.type for e in events]
    assert "content_block_start" in types and "message_stop" in types
    partial = "".join(
        e.delta.partial_json
        for e in events
        if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
    )
    use = [b for b in final.content if b.type == "tool_use"]
    assert final.stop_reason == "tool_use" and len(use) == 1
    assert json.loads(partial) == use[0].input
    jsonschema.validate(use[0].input, WEATHER["input_schema"])


def test_formatter_thinking_text_and_tool_use_blocks():
    from llamapy.server.anthropic import MessagesFormatter
    from tests.server.test_responses import _synthetic_events

    evs, _ = _synthetic_events()
    fmt = MessagesFormatter("m", 9, [])
    out = fmt.first_chunk()
    for ev in evs[:-1]:
        out += fmt.chunks(ev)
    out += fmt.chunks(evs[-1]) + fmt.final_chunk(evs[-1])
    starts = [e["content_block"]["type"] for e in out if e["type"] == "content_block_start"]
    assert starts == ["thinking", "text", "tool_use"]
    deltas = [e["delta"]["type"] for e in out if e["type"] == "content_block_delta"]
    assert deltas == [
        "thinking_delta",
        "thinking_delta",
        "signature_delta",
        "text_delta",
        "text_delta",
        "input_json_delta",
    ]
    assert [e["index"] for e in out if e["type"] == "content_block_stop"] == [0, 1, 2]
    assert out[-2]["delta"]["stop_reason"] == "tool_use" and out[-2]["usage"]["output_tokens"] == 20
    whole = MessagesFormatter("m", 9, []).response("", [], evs[-1])
    assert [b["type"] for b in whole["content"]] == ["thinking", "text", "tool_use"]
    assert whole["content"][0]["thinking"] == "User wants weather."
    assert whole["content"][2] == {
        "type": "tool_use",
        "id": "call_1",
        "name": "get_weather",
        "input": {"city": "Oslo", "unit": "celsius"},
    }
    assert whole["stop_reason"] == "tool_use"
    from llamapy.server.errors import APIError

    err = fmt.error_event(APIError(500, "decode failed"))
    assert err == {"type": "error", "error": {"type": "api_error", "message": "decode failed"}}


def test_thinking_config_is_accepted(fake):
    for thinking in ({"type": "enabled", "budget_tokens": 1024}, {"type": "disabled"}):
        body = {"model": "m", "max_tokens": 2, "messages": HI, "thinking": thinking}
        assert _post(fake, "/v1/messages", body).status_code == 200
        assert _post(fake, "/v1/messages/count_tokens", body).json()["input_tokens"] > 0


# -- images (a tiny LLaVA: CLIP + mlp projector) ---------------------------------------------------------


def _png(seed: int, size: tuple[int, int] = (40, 56), fmt: str = "PNG") -> str:
    import base64
    import io

    import numpy as np
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)).save(
        buf, format=fmt
    )
    return base64.b64encode(buf.getvalue()).decode()


def _image(data: str, media_type: str = "image/png") -> dict:
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}


def _url_image(url: str) -> dict:
    return {"type": "image", "source": {"type": "url", "url": url}}


@pytest.fixture(scope="module")
def vision(tmp_path_factory) -> Iterator[tuple[LiveServer, LiveServer]]:
    """The same tiny vision model twice: without and with --allow-image-urls."""
    from llamapy.mtmd import MtmdContext
    from llamapy.server.backend import ContextBackend
    from tests.mtmd import convert

    vlm = convert.make_llava(tmp_path_factory.mktemp("anthropic-llava"))
    live = []
    for allow in (False, True):
        backend = ContextBackend(vlm.text_gguf(), n_ctx=256, n_seq_max=1, n_batch=64, n_ubatch=64)
        backend.mtmd = MtmdContext(vlm.mmproj_gguf(), backend.model)  # type: ignore[attr-defined]
        settings = ServerSettings(model_path=str(vlm.text_gguf()), warmup=False, allow_image_urls=allow)
        live.append(start_live(settings, backend))
        wait_ready(live[-1][0].base_url, timeout=120)
    yield live[0][0], live[1][0]
    for srv, thread in live:
        stop_live(srv, thread)


def test_image_blocks_answer_like_openai_image_url_parts(vision):
    import openai

    srv, _ = vision
    data = _png(1)
    msg = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "what is "}, _image(data), {"type": "text", "text": "this"}],
        }
    ]
    m = anthropic.Anthropic(base_url=srv.base_url, api_key="x", max_retries=0, timeout=120).messages.create(
        model="m", max_tokens=4, messages=msg, extra_body={"temperature": 0}
    )
    oa = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0, timeout=120)
    parts = [
        {"type": "text", "text": "what is "},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + data}},
        {"type": "text", "text": "this"},
    ]
    r = oa.chat.completions.create(
        model="m", messages=[{"role": "user", "content": parts}], max_tokens=4, temperature=0
    )
    assert m.content[0].text == r.choices[0].message.content
    assert m.usage.input_tokens == r.usage.prompt_tokens >= 16  # the image's 16 tokens counted
    c = anthropic.Anthropic(base_url=srv.base_url, api_key="x", max_retries=0).messages.count_tokens(
        model="m", messages=msg
    )
    assert c.input_tokens == m.usage.input_tokens
    two = [{"role": "user", "content": [_image(data), _image(_png(2, fmt="JPEG"), "image/jpeg")]}]
    m2 = anthropic.Anthropic(base_url=srv.base_url, api_key="x", max_retries=0, timeout=120).messages.create(
        model="m", max_tokens=2, messages=two
    )
    assert m2.usage.input_tokens >= 32


@pytest.mark.parametrize(
    "block,where,says",
    [
        (_image("AAAA", "image/tiff"), "source.media_type", "not a supported image type"),
        (_image("iVBORw0KGgo*not base64*", "image/png"), "source.data", "not valid base64"),
        (_image(_png(3), "image/jpeg"), "source.media_type", "is a image/png image"),
        (_image("aGVsbG8gd29ybGQ=", "image/png"), "messages", "not an image"),  # valid base64, no image
        ({"type": "image", "source": {"type": "file", "file_id": "f"}}, "source.type", "source.type"),
        (_url_image("http://127.0.0.1/cat.png"), "messages", "remote image URLs are not fetched"),
    ],
)
def test_bad_image_blocks_are_400(vision, block, where, says):
    srv, _ = vision
    body = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": [block]}]}
    r = httpx.post(srv.base_url + "/v1/messages", json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and where in err["message"] and says in err["message"], err


def test_url_images_follow_allow_image_urls(vision):
    _, allowed = vision
    body = {
        "model": "m",
        "max_tokens": 2,
        "messages": [{"role": "user", "content": [_url_image("http://127.0.0.1/a.png")]}],
    }
    r = httpx.post(allowed.base_url + "/v1/messages", json=body, timeout=60)
    assert r.status_code == 400 and "non-public address" in r.json()["error"]["message"], r.text


def test_image_block_to_a_server_without_mmproj(fake):
    with pytest.raises(anthropic.BadRequestError, match="mmproj"):
        _client(fake).messages.create(
            model="m", max_tokens=2, messages=[{"role": "user", "content": [_image(_png(1))]}]
        )
