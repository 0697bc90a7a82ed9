"""Cohere2MoE: detection and the prompt on the real template, Command R7B-style calls with the answer in
``<|START_TEXT|>`` tags (dropped), parsing in any split, the grammar (any string id), read back."""

from __future__ import annotations

import json
import re

from llamapy.chat import detect_format
from llamapy.chat.cohere2moe import Cohere2MoeFormat
from llamapy.vocab.chat_template import ChatTemplate
from tests.chat.conftest import TOOLS, is_special, run_pieces, summary
from tests.chat.test_prepare import CONVERSATION
from tests.util import shared_path


def action(*calls: tuple[str, str, dict]) -> str:
    items = ", ".join(json.dumps({"tool_call_id": i, "tool_name": n, "parameters": a}) for i, n, a in calls)
    return f"<|START_ACTION|>[\n    {items}\n]<|END_ACTION|>"


W = ("0", "get_weather", {"location": "Paris", "days": 3})
T = ("call_x1", "get_time", {"timezone": "UTC"})


def test_detect_and_prompt():
    src = shared_path("templates", "Cohere2MoE.jinja").read_text()
    fmt = detect_format(src)
    assert fmt.name == "cohere2moe" and detect_format(src, tools_requested=False).name == "cohere2moe"
    out = ChatTemplate(src, "<s>", "</s>").render(
        fmt.prepare_messages(CONVERSATION, tools=TOOLS), add_generation_prompt=True, tools=TOOLS
    )
    assert '"tool_name": "get_weather", "parameters": {"location": "Paris"}' in out
    assert "22 degrees and sunny" in out and fmt.thinking_forced_open(out)
    r7b = shared_path("templates", "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja").read_text()
    assert detect_format(r7b).name == "command-r7b"


def test_parse():
    fmt = Cohere2MoeFormat()
    cases = [
        ("<|START_TEXT|>Hello!<|END_TEXT|>", ("Hello!", None, [])),
        ("<|START_THINKING|>hm<|END_THINKING|>" + action(W, T), ("", "hm", [W[1:], T[1:]])),
        ("<|START_TEXT|>Sure.<|END_TEXT|>" + action(T), ("Sure.", None, [T[1:]])),
        ("<|START_ACTION|>[oops", ("<|START_ACTION|>[oops", None, [])),
    ]
    for text, expected in cases:
        for pieces in ([text], list(text)):
            assert summary(run_pieces(fmt, pieces)) == expected, pieces
    msg = run_pieces(fmt, list("hm<|END_THINKING|>" + action(W, T)), thinking_forced_open=True)
    assert summary(msg) == ("", "hm", [W[1:], T[1:]])
    assert [c.id for c in msg.tool_calls] == ["0", "call_x1"]  # the model's ids, as llama.cpp keeps them


def test_answer_tags_dropped_without_tools():
    fmt = Cohere2MoeFormat()
    text = "The user asks.<|END_THINKING|><|START_TEXT|>It is sunny.<|END_TEXT|>"
    for pieces in ([text], list(text)):
        msg = run_pieces(fmt, pieces, thinking_forced_open=True, parse_tool_calls=False)
        assert summary(msg) == ("It is sunny.", "The user asks.", [])
    # without tools an action block stays content
    msg = run_pieces(fmt, list(action(W)), parse_tool_calls=False)
    assert summary(msg) == (action(W), None, [])


def test_grammar(grammar_check):
    fmt = Cohere2MoeFormat()
    g = fmt.grammar(TOOLS, "auto", True, is_special)
    grammar_check.check(g)
    assert grammar_check.match(g, action(W)) and grammar_check.match(g, action(W, T))
    assert not grammar_check.match(g, action(("0", "get_weather", {"location": "Paris", "days": "x"})))
    assert not grammar_check.match(g, action(("0", "get_stock", {})))
    single = fmt.grammar(TOOLS, "auto", False, is_special)
    assert grammar_check.match(single, action(T)) and not grammar_check.match(single, action(W, T))
    forced = fmt.grammar(TOOLS, "required", True, is_special, thinking_forced_open=True)
    assert grammar_check.match(forced, "hm<|END_THINKING|>" + action(T))
    assert not grammar_check.match(forced, "Hello")
    (kind, pattern), text = g.triggers[0], "<|START_THINKING|>hm<|END_THINKING|>" + action(T)
    assert kind == "pattern_full" and re.fullmatch(pattern, text).start(1) == text.index("<|START_ACTION|>")
    msg = run_pieces(fmt, [text])
    assert [(c.name, json.loads(c.arguments)) for c in msg.tool_calls] == [T[1:]]
