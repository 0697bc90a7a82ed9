"""The OpenAI Responses API (/v1/responses) with the official openai client over a real socket, and the
JSON-body hardening of every endpoint.

Shapes, streams, errors and previous_response_id run on the fake model (fast); the function tool round
trip and text.format run on the real SmolLM2 with the Qwen 2.5 template (Hermes ``<tool_call>`` format;
tool_choice "required" and json_schema are grammar-constrained, so even this 135M model answers validly).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import jsonschema
import openai
import pytest

from llamapy.server.app import ServerSettings
from tests.server.conftest import LiveServer, start_live, stop_live, wait_ready
from tests.server.fake_backend import FakeBackend
from tests.util import shared_path

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 24},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
}


@pytest.fixture(scope="module")
def fake() -> Iterator[LiveServer]:
    # the default body limit (8 MiB), so that deep JSON reaches the parser instead of the 413
    srv, thread = start_live(
        ServerSettings(model_path="/models/fake.gguf"), FakeBackend(n_ctx=1024, n_seq_max=2, n_batch=64)
    )
    wait_ready(srv.base_url)
    yield srv
    stop_live(srv, thread)


def _client(srv: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0, timeout=120)


# -- fake model: shapes, stream, state, errors --------------------------------------------------------


def test_plain_text(fake):
    r = _client(fake).responses.create(model="m", input="Hello there!", max_output_tokens=12)
    assert r.id.startswith("resp_") and r.object == "response"
    assert r.status in ("completed", "incomplete")
    assert [o.type for o in r.output] == ["message"]
    assert r.output_text and r.output_text == r.output[0].content[0].text
    assert r.usage.output_tokens <= 12 and r.usage.input_tokens > 0
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    if r.status == "incomplete":
        assert r.incomplete_details.reason == "max_output_tokens"


def test_instructions_reach_the_prompt(fake):
    c = _client(fake)
    plain = c.responses.create(model="m", input="Hi!", max_output_tokens=4)
    told = c.responses.create(model="m", input="Hi!", instructions="Be brief.", max_output_tokens=4)
    assert told.instructions == "Be brief."
    # the fake template renders "<system>Be brief.\n" before the user turn
    assert told.usage.input_tokens == plain.usage.input_tokens + len("<system>Be brief.\n")


def test_message_items_input(fake):
    items = [
        {"role": "developer", "content": "rules"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "b"}]},
        {"role": "user", "content": "c"},
    ]
    r = _client(fake).responses.create(model="m", input=items, max_output_tokens=4)
    one = _client(fake).responses.create(model="m", input="c", max_output_tokens=4)
    extra = len("<system>rules\n<user>a\n<assistant>b\n")
    assert r.usage.input_tokens == one.usage.input_tokens + extra
    # the output items of a response replayed as input (a client managing its own context)
    replay = [{"role": "user", "content": "a"}] + [o.model_dump(exclude_none=True) for o in one.output]
    again = _client(fake).responses.create(model="m", input=replay + [{"role": "user", "content": "c"}])
    turn = len("<user>a\n<assistant>") + len(one.output_text) + len("\n")
    assert again.usage.input_tokens == one.usage.input_tokens + turn


def test_stream_events_in_order(fake):
    events = list(
        _client(fake).responses.create(model="m", input="Hello!", max_output_tokens=10, stream=True)
    )
    types = [e.type for e in events]
    assert types[:5] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
    ]
    assert types[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete" if events[-1].response.status == "incomplete" else "response.completed",
    ]
    assert set(types[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text and text == events[-4].text
    final = events[-1].response
    assert final.output_text == text and 1 <= final.usage.output_tokens <= 10
    item_ids = {e.item_id for e in events if hasattr(e, "item_id")}
    assert item_ids == {final.output[0].id}


def test_previous_response_id_carries_the_conversation(fake):
    c = _client(fake)
    first = c.responses.create(model="m", input="Hello!", max_output_tokens=6)
    second = c.responses.create(model="m", input="More!", previous_response_id=first.id, max_output_tokens=6)
    alone = c.responses.create(model="m", input="More!", max_output_tokens=6)
    turn = len("<user>Hello!\n<assistant>") + len(first.output_text) + len("\n")
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens == alone.usage.input_tokens + turn
    # streamed responses are stored too
    events = list(c.responses.create(model="m", input="Hi!", max_output_tokens=4, stream=True))
    third = c.responses.create(
        model="m", input="x", previous_response_id=events[-1].response.id, max_output_tokens=2
    )
    assert third.usage.input_tokens > alone.usage.input_tokens
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model="m", input="x", previous_response_id="resp_nope", max_output_tokens=2)
    assert "resp_nope" in str(e.value) and e.value.body["param"] == "previous_response_id"
    # retrieved and deleted by id
    got = c.responses.retrieve(first.id)
    assert got.id == first.id and got.output_text == first.output_text
    c.responses.delete(second.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(second.id)
    # store=false: not kept
    gone = c.responses.create(model="m", input="Hi!", max_output_tokens=2, store=False)
    with pytest.raises(openai.BadRequestError):
        c.responses.create(model="m", input="x", previous_response_id=gone.id, max_output_tokens=2)


def test_response_store_is_bounded():
    from llamapy.server.errors import APIError
    from llamapy.server.responses import ResponseStore

    s = ResponseStore(size=3)
    for i in range(5):
        s.put(f"r{i}", [{"role": "user", "content": str(i)}], {"id": f"r{i}"})
    with pytest.raises(APIError):
        s.get("r1")
    assert s.get("r4") == [{"role": "user", "content": "4"}] and s.response("r4") == {"id": "r4"}


@pytest.mark.parametrize(
    "body,param",
    [
        ({"input": 5}, "input"),
        ({"input": [{"type": "bogus"}]}, "input.0.type"),
        ({"input": [7]}, "input.0"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input.0.content.0.type",
        ),
        ({"input": [{"role": "user", "content": [{"type": "input_text"}]}]}, "input.0.content.0.text"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input.0.role"),
        ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input.0.call_id"),
        ({"input": [{"type": "function_call_output", "call_id": "c", "output": 3}]}, "input.0.output"),
        ({"input": []}, "input"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "x", "max_output_tokens": "9"}, "max_output_tokens"),
        ({"input": "x", "temperature": "hot"}, "temperature"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools.0.type"),
        ({"input": "x", "tools": [{"type": "function", "parameters": {}}]}, "tools.0.name"),
        ({"input": "x", "tool_choice": {"type": "function"}}, "tool_choice"),
        ({"input": "x", "text": {"format": {"type": "json_schema"}}}, "text.format.schema"),
        ({"input": "x", "text": {"format": {"type": "yaml"}}}, "text.format.type"),
        ({"input": "x", "previous_response_id": 12}, "previous_response_id"),
        ({"input": "x", "n": 3}, "n"),
    ],
)
def test_bad_requests_name_the_field(fake, body, param):
    r = httpx.post(fake.base_url + "/v1/responses", json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param, err


def test_engine_survives_bad_requests(fake):
    for body in ({"input": [{"type": "bogus"}]}, {"input": "x", "max_output_tokens": -1}, {"input": None}):
        assert httpx.post(fake.base_url + "/v1/responses", json=body).status_code == 400
    assert _client(fake).responses.create(model="m", input="ok", max_output_tokens=3).output_text


# -- JSON hardening: every endpoint ------------------------------------------------------------------

ENDPOINTS = [
    "/v1/chat/completions",
    "/v1/completions",
    "/completion",
    "/v1/responses",
    "/v1/messages",
    "/tokenize",
]


@pytest.mark.parametrize("path", ENDPOINTS)
def test_deeply_nested_json_is_a_400(fake, path):
    body = b"[" * 100_000 + b"]" * 100_000
    t0 = time.monotonic()
    r = httpx.post(fake.base_url + path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert "deep" in r.text and time.monotonic() - t0 < 5
    nested = b'{"messages": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    assert httpx.post(fake.base_url + path, content=nested).status_code == 400


@pytest.mark.parametrize("path", ENDPOINTS)
@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity", b"1" * 5000])
def test_non_json_numbers_are_a_400(fake, path, literal):
    body = b'{"input": "x", "prompt": "x", "content": "x", "max_tokens": 4, "temperature": ' + literal + b"}"
    r = httpx.post(fake.base_url + path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert "JSON" in r.text or "parse" in r.text
    assert httpx.get(fake.base_url + "/health").status_code == 200


@pytest.mark.parametrize("path", ENDPOINTS)
def test_lone_surrogates_are_a_400(fake, path):
    for text in (b"a\\ud800b", b"\\udfff"):
        body = (
            b'{"input": "x", "prompt": "x", "content": "%s", "max_tokens": 4, "max_output_tokens": 4, ' % text
        )
        body += b'"messages": [{"role": "user", "content": "%s"}]}' % text
        r = httpx.post(fake.base_url + path, content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400, r.text
        assert "surrogate" in r.text
    # a surrogate pair is one character, and an escaped backslash is no escape
    ok = b'{"content": "\\ud83d\\ude00 \\\\ud800"}'
    assert httpx.post(fake.base_url + "/tokenize", content=ok).status_code == 200


def test_json_depth_scan():
    from llamapy.server.schemas import json_depth, parse_json

    assert json_depth(b'{"a": "[[[\\"[[{{", "b": [[1]]}') == 3
    assert json_depth(b"[]") == 1 and json_depth(b'"x"') == 0
    assert parse_json(b'{"a": ' + b"[" * 63 + b"]" * 63 + b"}")["a"]


# -- the real model: function tool round trip, streamed tool call, text.format ----------------------


@pytest.fixture(scope="module")
def hermes(smollm2_path) -> Iterator[LiveServer]:
    from llamapy.server.backend import ContextBackend

    template = shared_path("templates", "Qwen-Qwen2.5-7B-Instruct.jinja").read_text()
    backend = ContextBackend(smollm2_path, n_ctx=2048, n_seq_max=1, n_batch=256, chat_template=template)
    srv, thread = start_live(ServerSettings(model_path=str(smollm2_path)), backend)
    wait_ready(srv.base_url, timeout=120)
    yield srv
    stop_live(srv, thread)


def _check_call(item) -> dict:
    assert item.type == "function_call" and item.name == "get_weather"
    assert item.call_id and item.id.startswith("fc_") and item.status == "completed"
    args = json.loads(item.arguments)
    jsonschema.validate(args, WEATHER["parameters"])
    return args


@pytest.mark.slow
def test_function_tool_round_trip(hermes):
    c = _client(hermes)
    ask = "What is the weather in Paris?"
    r = c.responses.create(
        model="m",
        input=ask,
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=60,
        temperature=0,
    )
    assert r.status == "completed" and r.parallel_tool_calls is False
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) >= 1, r.output
    _check_call(calls[0])
    result = json.dumps({"temperature": 21, "unit": "celsius"})
    # the turn after the call, by previous_response_id ...
    r2 = c.responses.create(
        model="m",
        previous_response_id=r.id,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": result}],
        tools=[WEATHER],
        max_output_tokens=12,
        temperature=0,
    )
    assert r2.output[-1].type == "message" and r2.output_text.strip(), r2.output
    # ... and with the call and its output as input items
    items = [
        {"role": "user", "content": ask},
        {
            "type": "function_call",
            "call_id": calls[0].call_id,
            "name": calls[0].name,
            "arguments": calls[0].arguments,
        },
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": result},
    ]
    r3 = c.responses.create(model="m", input=items, tools=[WEATHER], max_output_tokens=12, temperature=0)
    assert r3.output_text == r2.output_text  # the same prompt, greedy
    assert r3.usage.input_tokens == r2.usage.input_tokens


@pytest.mark.slow
def test_streamed_function_call(hermes):
    events = list(
        _client(hermes).responses.create(
            model="m",
            input="Weather in Rome?",
            tools=[WEATHER],
            tool_choice={"type": "function", "name": "get_weather"},
            parallel_tool_calls=False,
            max_output_tokens=60,
            temperature=0,
            stream=True,
        )
    )
    types = [e.type for e in events]
    assert types[0] == "response.created" and types[-1] == "response.completed"
    assert (
        "response.function_call_arguments.delta" in types and "response.function_call_arguments.done" in types
    )
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert deltas == done.arguments
    final = [o for o in events[-1].response.output if o.type == "function_call"]
    assert final and final[0].arguments == done.arguments
    _check_call(final[0])


@pytest.mark.slow
def test_text_format_json_schema(hermes):
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    r = _client(hermes).responses.create(
        model="m",
        input="Invent a person.",
        text={"format": {"type": "json_schema", "name": "person", "schema": schema, "strict": True}},
        max_output_tokens=60,
        temperature=0,
    )
    assert r.status == "completed"
    jsonschema.validate(json.loads(r.output_text), schema)


def test_chat_completions_still_stream(fake):
    """The shared stream loop (``_generate``) after its generalisation: chat chunks and the [DONE] marker."""
    c = _client(fake)
    chunks = list(
        c.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "Hello!"}],
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    whole = c.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Hello!"}], max_tokens=6
    )
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    raw = httpx.post(
        fake.base_url + "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "stream": True},
    ).text
    assert raw.endswith("data: [DONE]\n\n") and "event:" not in raw


def _synthetic_events():
    """Reasoning, then text, then a tool call, as the chat parser streams them."""
    from llamapy.chat.common import ChatDelta, ParsedMessage, ToolCall
    from llamapy.server.engine import Event

    call = ToolCall("get_weather", '{"city": "Oslo", "unit": "celsius"}', "call_1")
    msg = ParsedMessage(content="Let me check.", reasoning_content="User wants weather.", tool_calls=[call])
    evs = [
        Event(deltas=[ChatDelta(reasoning_content="User wants ")]),
        Event(deltas=[ChatDelta(reasoning_content="weather.")]),
        Event(deltas=[ChatDelta(content="Let me "), ChatDelta(content="check.")]),
        Event(
            deltas=[
                ChatDelta(
                    tool_call_index=0,
                    tool_call_id="call_1",
                    tool_call_name="get_weather",
                    tool_call_arguments=call.arguments,
                )
            ]
        ),
        Event(done=True, finish_reason="tool_calls", message=msg, n_prompt=9, n_predicted=20),
    ]
    return evs, msg


def test_formatter_reasoning_text_and_call_items():
    from llamapy.server.responses import ResponsesFormatter, ResponsesRequest

    evs, _ = _synthetic_events()
    stored = {}

    def keep(rid, conv, body):
        stored[rid] = conv

    req = ResponsesRequest(input="x")
    fmt = ResponsesFormatter("m", req, {"input": "x"}, [{"role": "user", "content": "x"}], keep)
    out = fmt.first_chunk()
    for ev in evs[:-1]:
        out += fmt.chunks(ev)
    out += fmt.chunks(evs[-1]) + fmt.final_chunk(evs[-1])
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    body = out[-1]["response"]
    assert out[-1]["type"] == "response.completed"
    assert [i["type"] for i in body["output"]] == ["reasoning", "message", "function_call"]
    assert body["output"][0]["summary"] == [{"type": "summary_text", "text": "User wants weather."}]
    assert body["output"][1]["content"][0]["text"] == "Let me check."
    assert (
        body["output"][2]["call_id"] == "call_1"
        and json.loads(body["output"][2]["arguments"])["city"] == "Oslo"
    )
    kinds = [e["type"] for e in out]
    for k in (
        "response.reasoning_summary_text.delta",
        "response.output_text.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
    ):
        assert k in kinds
    assert kinds.count("response.output_item.added") == kinds.count("response.output_item.done") == 3
    # the stored conversation ends with the assistant turn, ready for previous_response_id
    (conv,) = stored.values()
    assert (
        conv[-1]["tool_calls"][0]["id"] == "call_1" and conv[-1]["reasoning_content"] == "User wants weather."
    )
    # the non-streamed object has the same items
    fmt2 = ResponsesFormatter("m", req, {"input": "x"}, [], None)
    whole = fmt2.response("", [], evs[-1])
    strip = lambda items: [{k: v for k, v in i.items() if k != "id"} for i in items]  # noqa: E731
    assert strip(whole["output"]) == strip(body["output"])
    from llamapy.server.errors import APIError

    err = fmt.error_event(APIError(500, "decode failed"))
    assert err["type"] == "error" and err["message"] == "decode failed" and err["sequence_number"] == len(out)
