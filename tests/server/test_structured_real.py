"""Must-show: structured output and tool calls through a real server (uvicorn on a real socket, the real
SmolLM2 model) with the official openai client: json_schema answers that validate, GBNF on /completion,
tool calls for required / named / none / parallel_tool_calls false, streamed and not, a follow-up turn.

The model is tiny (135M), so every answer here is *constrained*: the grammar, not the model, makes it
valid. SmolLM2's own template has no tool support (the generic JSON format); the Qwen 2.5 template
(ChatML like SmolLM2's) gives the Hermes ``<tool_call>`` format."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import jsonschema
import openai
import pytest

from tests.server.conftest import LiveServer, start_live, stop_live, wait_ready
from tests.util import shared_path

pytestmark = pytest.mark.slow

WEATHER = {
    "type": "function",
    "function": {
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
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Get the local time in a time zone",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "enum": ["UTC", "CET", "PST"]}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, TIME]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def _server(smollm2_path, template: str | None) -> tuple[LiveServer, object]:
    from llamapy.server.app import ServerSettings
    from llamapy.server.backend import ContextBackend

    backend = ContextBackend(smollm2_path, n_ctx=2048, n_seq_max=2, n_batch=256, chat_template=template)
    srv, thread = start_live(ServerSettings(model_path=str(smollm2_path)), backend)
    wait_ready(srv.base_url, timeout=60)
    return srv, thread


@pytest.fixture(scope="module")
def hermes(smollm2_path) -> Iterator[LiveServer]:
    template = shared_path("templates", "Qwen-Qwen2.5-7B-Instruct.jinja").read_text()
    srv, thread = _server(smollm2_path, template)
    yield srv
    stop_live(srv, thread)


@pytest.fixture(scope="module")
def generic(smollm2_path) -> Iterator[LiveServer]:
    srv, thread = _server(smollm2_path, None)
    yield srv
    stop_live(srv, thread)


def _client(srv: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0, timeout=300)


def _check_calls(message, names: set[str] | None = None) -> list:
    calls = message.tool_calls or []
    assert calls, f"no tool calls in {message}"
    for c in calls:
        assert c.type == "function" and c.id
        assert names is None or c.function.name in names
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])
    return calls


def test_response_format_json_schema_validates(generic):
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    r = _client(generic).chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Invent a person."}],
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}},
        max_tokens=80,
        temperature=0,
    )
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    r = _client(generic).chat.completions.create(
        model="m", messages=ASK, response_format={"type": "json_object"}, max_tokens=60, temperature=0
    )
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_native_completion_with_gbnf(generic):
    gbnf = 'root ::= "The answer is " ("yes" | "no") "."'
    body = {"prompt": "Is the sky blue?", "grammar": gbnf, "n_predict": 20, "temperature": 0}
    r = httpx.post(generic.base_url + "/completion", json=body, timeout=300).json()
    assert r["content"] in ("The answer is yes.", "The answer is no.") and r["stop_type"] == "eos"
    bad = httpx.post(generic.base_url + "/completion", json={"prompt": "x", "grammar": "root ::= nope"})
    assert bad.status_code == 400 and "grammar" in bad.json()["error"]["message"]


@pytest.mark.parametrize("server", ["hermes", "generic"])
def test_tool_choice_required_and_named(server, request):
    client = _client(request.getfixturevalue(server))
    r = client.chat.completions.create(
        model="m", messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=160, temperature=0
    )
    _check_calls(r.choices[0].message, set(SCHEMAS))  # (parallel calls: it may go on calling to the limit)
    r = client.chat.completions.create(
        model="m",
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=100,
        temperature=0,
    )
    assert r.choices[0].finish_reason == "tool_calls"
    assert len(_check_calls(r.choices[0].message, set(SCHEMAS))) == 1
    r = client.chat.completions.create(
        model="m",
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        parallel_tool_calls=False,
        max_tokens=100,
        temperature=0,
    )
    calls = _check_calls(r.choices[0].message, {"get_time"})
    assert r.choices[0].finish_reason == "tool_calls" and len(calls) == 1


def test_parallel_false_gives_one_call_and_none_gives_text(hermes):
    client = _client(hermes)
    r = client.chat.completions.create(
        model="m",
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=100,
        temperature=0,
    )
    assert len(_check_calls(r.choices[0].message)) == 1
    r = client.chat.completions.create(
        model="m", messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=8, temperature=0
    )
    assert not r.choices[0].message.tool_calls and r.choices[0].message.content


def test_streamed_tool_calls_reassemble_to_the_plain_answer(hermes):
    client = _client(hermes)
    kw = dict(model="m", messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=160, temperature=0)
    plain = client.chat.completions.create(**kw).choices[0].message
    calls: dict[int, dict] = {}
    content, finish = "", None
    for chunk in client.chat.completions.create(stream=True, **kw):
        if not chunk.choices:
            continue
        ch = chunk.choices[0]
        finish = ch.finish_reason or finish
        content += ch.delta.content or ""
        for tc in ch.delta.tool_calls or []:
            c = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
            c["id"] = c["id"] or tc.id
            c["name"] += (tc.function.name or "") if tc.function else ""
            c["arguments"] += (tc.function.arguments or "") if tc.function else ""
    assert finish in ("tool_calls", "length")
    got = [(calls[i]["name"], json.loads(calls[i]["arguments"])) for i in sorted(calls)]
    want = [(c.function.name, json.loads(c.function.arguments)) for c in plain.tool_calls]
    assert got == want and all(calls[i]["id"] for i in calls)
    assert content == (plain.content or "")


def test_follow_up_turn_with_the_tool_result(hermes):
    client = _client(hermes)
    r = client.chat.completions.create(
        model="m",
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=100,
        temperature=0,
    )
    msg = r.choices[0].message
    call = _check_calls(msg)[0]
    history = ASK + [
        {
            "role": "assistant",
            "content": msg.content,
            "tool_calls": [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": c.function.arguments},
                }
                for c in msg.tool_calls
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 21, "sky": "clear"})},
    ]
    r = client.chat.completions.create(
        model="m", messages=history, tools=TOOLS, tool_choice="none", max_tokens=12, temperature=0
    )
    assert r.choices[0].message.content and r.choices[0].finish_reason in ("stop", "length")
    r = client.chat.completions.create(model="m", messages=history, tools=TOOLS, max_tokens=40, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")  # auto: never a 500
