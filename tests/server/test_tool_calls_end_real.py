"""Issue 33 §1: tool calls that must end, end. On the real SmolLM2 (its own template: the generic JSON
format) and on a Qwen-template run of it (Qwen2.5's template: Hermes ``<tool_call>`` tags), a required or
named tool choice ends with ``finish_reason: "tool_calls"`` well before ``max_tokens`` through the official
``openai`` client, streamed and not; the ``anthropic`` client with ``tool_choice: {"type": "any"}`` gets
``stop_reason: "tool_use"``. Before the fix the model wrote a space after the call until ``max_tokens``."""

from __future__ import annotations

import json
from collections.abc import Iterator

import anthropic
import openai
import pytest

from tests.server.conftest import RealServer, run_real_server
from tests.util import shared_path

pytestmark = pytest.mark.slow
MAX_TOKENS = 200
WELL_BEFORE = MAX_TOKENS * 3 // 4  # (two calls on SmolLM2's JSON format take about 110 tokens)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city's name"}},
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The current time in a time zone.",
        "parameters": {
            "type": "object",
            "properties": {"timezone": {"type": "string"}},
            "required": ["timezone"],
        },
    },
}
TOOLS = [WEATHER, TIME]
MESSAGES = [{"role": "user", "content": "What is the weather like in Paris today?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
# (tool_choice, parallel_tool_calls): required with OpenAI's default (parallel) and without, a named tool
CHOICES = {
    "required": ("required", None),
    "required-single": ("required", False),
    "named": (NAMED, None),
}


@pytest.fixture(scope="module")
def qwen_server(smollm2_path) -> Iterator[RealServer]:
    """SmolLM2 served with Qwen2.5-7B-Instruct's chat template (Hermes tool calls)."""
    template = shared_path("templates", "Qwen-Qwen2.5-7B-Instruct.jinja")
    with run_real_server(smollm2_path, ["--chat-template-file", str(template), "-c", "2048"]) as srv:
        yield srv


@pytest.fixture(scope="module", params=["smollm2", "qwen-template"])
def server(request) -> RealServer:
    return request.getfixturevalue("real_server" if request.param == "smollm2" else "qwen_server")


def _openai(srv: RealServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url + "/v1", api_key=srv.api_key, max_retries=0, timeout=300)


def _check_calls(calls: list[tuple[str, str]], choice: object, parallel: bool | None) -> None:
    assert calls, "no tool call"
    for name, arguments in calls:
        assert name in ("get_weather", "get_time")
        assert isinstance(json.loads(arguments), dict), arguments
    if choice == NAMED or parallel is False:
        assert len(calls) == 1, calls
    if choice == NAMED:
        assert calls[0][0] == "get_weather"


@pytest.mark.parametrize("case", sorted(CHOICES))
def test_openai_tool_call_ends(server, case):
    choice, parallel = CHOICES[case]
    extra = {} if parallel is None else {"parallel_tool_calls": parallel}
    r = _openai(server).chat.completions.create(
        model="m",
        messages=MESSAGES,
        tools=TOOLS,
        tool_choice=choice,
        max_tokens=MAX_TOKENS,
        temperature=0,
        **extra,
    )
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", (c.finish_reason, c.message)
    assert r.usage.completion_tokens < WELL_BEFORE, r.usage
    _check_calls([(t.function.name, t.function.arguments) for t in c.message.tool_calls], choice, parallel)


@pytest.mark.parametrize("case", sorted(CHOICES))
def test_openai_streamed_tool_call_ends(server, case):
    choice, parallel = CHOICES[case]
    extra = {} if parallel is None else {"parallel_tool_calls": parallel}
    stream = _openai(server).chat.completions.create(
        model="m",
        messages=MESSAGES,
        tools=TOOLS,
        tool_choice=choice,
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        **extra,
    )
    calls: dict[int, list[str]] = {}
    finish, usage = None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            for d in ch.delta.tool_calls or ():
                entry = calls.setdefault(d.index, ["", ""])
                entry[0] += (d.function and d.function.name) or ""
                entry[1] += (d.function and d.function.arguments) or ""
            if ch.finish_reason is not None:
                finish = ch.finish_reason
    assert finish == "tool_calls", (finish, calls)
    assert usage is not None and usage.completion_tokens < WELL_BEFORE, usage
    _check_calls([tuple(calls[i]) for i in sorted(calls)], choice, parallel)


def _anthropic_tools() -> list[dict]:
    return [
        {
            "name": t["function"]["name"],
            "description": t["function"]["description"],
            "input_schema": t["function"]["parameters"],
        }
        for t in TOOLS
    ]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_anthropic_tool_choice_any_ends_with_tool_use(server, stream):
    client = anthropic.Anthropic(base_url=server.base_url, api_key=server.api_key, max_retries=0, timeout=300)
    kwargs = dict(
        model="m",
        max_tokens=MAX_TOKENS,
        messages=MESSAGES,
        tools=_anthropic_tools(),
        tool_choice={"type": "any"},
        extra_body={"temperature": 0},  # (this client version has no temperature argument)
    )
    if stream:
        with client.messages.stream(**kwargs) as s:
            m = s.get_final_message()
    else:
        m = client.messages.create(**kwargs)
    assert m.stop_reason == "tool_use", (m.stop_reason, m.content)
    assert m.usage.output_tokens < WELL_BEFORE, m.usage
    uses = [b for b in m.content if b.type == "tool_use"]
    assert uses and all(u.name in ("get_weather", "get_time") and isinstance(u.input, dict) for u in uses)


# A tool as pydantic writes it (``Model.model_json_schema()``): the parameters refer to their ``$defs``.
BOOKING = {
    "type": "function",
    "function": {
        "name": "book_table",
        "description": "Book a table at a restaurant.",
        "parameters": {
            "$defs": {
                "Place": {
                    "properties": {"city": {"title": "City", "type": "string"}},
                    "required": ["city"],
                    "title": "Place",
                    "type": "object",
                },
                "Size": {"enum": ["small", "large"], "title": "Size", "type": "string"},
            },
            "properties": {"where": {"$ref": "#/$defs/Place"}, "size": {"$ref": "#/$defs/Size"}},
            "required": ["where", "size"],
            "title": "Booking",
            "type": "object",
        },
    },
}


def test_tool_with_defs_refs(server):
    """A pydantic model's schema as the parameters: the call is made, and its arguments follow the
    ``$defs`` the parameters refer to (the grammar embeds the parameters in the call's own object)."""
    import jsonschema

    r = _openai(server).chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Book a small table in Paris."}],
        tools=[BOOKING],
        tool_choice="required",
        max_tokens=MAX_TOKENS,
        temperature=0,
    )
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", (c.finish_reason, c.message)
    for call in c.message.tool_calls:
        assert call.function.name == "book_table"
        jsonschema.validate(json.loads(call.function.arguments), BOOKING["function"]["parameters"])
