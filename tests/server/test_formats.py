"""Chat deltas -> OpenAI chunks and messages (reasoning, tool calls), as the server sends them."""

from __future__ import annotations

from llamapy.chat import ChatDelta, ParsedMessage, ToolCall
from llamapy.server.engine import Event
from llamapy.server.formats import ChatFormatter


def test_chunks_carry_reasoning_content_and_tool_call_pieces():
    fmt = ChatFormatter("m", want_logprobs=False)
    ev = Event(
        deltas=[
            ChatDelta(reasoning_content="think "),
            ChatDelta(reasoning_content="more"),
            ChatDelta(content="Hi"),
            ChatDelta(
                tool_call_index=0, tool_call_id="call_1", tool_call_name="f", tool_call_arguments='{"a":'
            ),
            ChatDelta(tool_call_index=0, tool_call_arguments="1}"),
        ]
    )
    deltas = [c["choices"][0]["delta"] for c in fmt.chunks(ev)]
    assert deltas == [
        {"reasoning_content": "think more"},
        {"content": "Hi"},
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "f", "arguments": '{"a":'},
                }
            ]
        },
        {"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]},
    ]
    assert fmt.chunks(Event(text="held back", deltas=[])) == []  # the parser holds it: nothing to send yet


def test_response_message_from_the_parsed_message():
    fmt = ChatFormatter("m", want_logprobs=False)
    msg = ParsedMessage(content="", reasoning_content="why", tool_calls=[ToolCall("f", '{"a": 1}', "call_9")])
    body = fmt.response("<tool_call>...", [], Event(done=True, finish_reason="tool_calls", message=msg))
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"] == {
        "role": "assistant",
        "content": None,
        "reasoning_content": "why",
        "tool_calls": [
            {"id": "call_9", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
        ],
    }
