"""DeepSeek V3.2 / V4 DSML calls: detection and the prompt on the real templates, parsing in any split, the
grammar with ``｜DSML｜`` as a special token and as text, read back by the parser."""

from __future__ import annotations

import json
import re

import pytest

from llamapy.chat import detect_format
from llamapy.chat.deepseek_dsml import DSML, DeepSeekDsmlFormat, sort_tool_results
from llamapy.vocab.chat_template import ChatTemplate
from tests.chat.conftest import TOOLS, run_pieces, summary
from tests.chat.test_gemma4 import SpecialVocab
from tests.chat.test_prepare import CONVERSATION
from tests.util import shared_path

TEMPLATES = {
    "deepseek-ai-DeepSeek-V3.2": "deepseek-v3.2",
    "deepseek-ai-DeepSeek-V4": "deepseek-v4",
    "deepseek-ai-DeepSeek-V4-Flash-0731": "deepseek-v4",
}
VOCAB = SpecialVocab((DSML, "<think>", "</think>", "<｜end▁of▁sentence｜>"))


def invoke(name: str, **args) -> str:
    params = "".join(
        f'<{DSML}parameter name="{k}" string="{"true" if isinstance(v, str) else "false"}">'
        f"{v if isinstance(v, str) else json.dumps(v)}</{DSML}parameter>\n"
        for k, v in args.items()
    )
    return f'<{DSML}invoke name="{name}">\n{params}</{DSML}invoke>\n'


def block(*invokes: str, v4: bool = False) -> str:
    b = "tool_calls" if v4 else "function_calls"
    return f"<{DSML}{b}>\n" + "".join(invokes) + f"</{DSML}{b}>"


WEATHER = invoke("get_weather", location="Paris", days=3)
TIME = invoke("get_time", timezone="UTC")


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_detect_and_prompt(name):
    src = shared_path("templates", f"{name}.jinja").read_text()
    fmt = detect_format(src)
    assert fmt.name == TEMPLATES[name] and detect_format(src, tools_requested=False).name == fmt.name
    tmpl = ChatTemplate(src, "", "")
    out = tmpl.render(
        fmt.prepare_messages(CONVERSATION, tools=TOOLS), add_generation_prompt=True, tools=TOOLS
    )
    assert block(invoke("get_weather", location="Paris"), v4=fmt.v4) in out
    assert "22 degrees and sunny" in out and '"get_time"' in out
    thinking = tmpl.render(CONVERSATION[:2], add_generation_prompt=True, tools=TOOLS, enable_thinking=True)
    assert fmt.thinking_forced_open(thinking)
    assert not fmt.thinking_forced_open(tmpl.render(CONVERSATION[:2], add_generation_prompt=True))


CASES = [
    (block(WEATHER), ("", None, [("get_weather", {"location": "Paris", "days": 3})])),
    ("Checking.\n\n" + block(WEATHER, TIME, v4=True), ("Checking.\n\n", None, [
        ("get_weather", {"location": "Paris", "days": 3}), ("get_time", {"timezone": "UTC"})])),
    ("<think>hmm</think>" + block(invoke("f", a=[1, {"b": None}], s="x < y")), ("", "hmm", [
        ("f", {"a": [1, {"b": None}], "s": "x < y"})])),
    (block(TIME)[: -len(f"</{DSML}function_calls>")], ("", None, [("get_time", {"timezone": "UTC"})])),  # cut off
    (f"<{DSML}function_calls>\nnot a call", (f"<{DSML}function_calls>\nnot a call", None, [])),
]  # fmt: skip


@pytest.mark.parametrize("k", range(len(CASES)))
def test_parse(k):
    text, expected = CASES[k]
    fmt = DeepSeekDsmlFormat("function_calls")
    for pieces in ([text], list(text), [text[:25], text[25:]]):
        assert summary(run_pieces(fmt, pieces)) == expected, pieces


def test_call_ends_open_reasoning():
    fmt = DeepSeekDsmlFormat("function_calls")
    text = "I should look it up.\n\n" + block(TIME)
    for pieces in ([text], list(text)):
        msg = run_pieces(fmt, pieces, thinking_forced_open=True)
        assert summary(msg) == ("", "I should look it up.", [("get_time", {"timezone": "UTC"})])


def test_sort_tool_results():
    calls = [{"id": i, "function": {"name": i, "arguments": "{}"}} for i in ("a", "b")]
    msgs = [
        {"role": "assistant", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "b", "content": "B"},
        {"role": "tool", "tool_call_id": "a", "content": "A"},
    ]
    assert [m.get("content") for m in sort_tool_results(msgs)] == [None, "A", "B"]
    assert [m.get("content") for m in DeepSeekDsmlFormat("function_calls").prepare_messages(msgs)][1:] == [
        "B",
        "A",
    ]


@pytest.mark.parametrize("v4", [False, True])
def test_grammar(v4):
    fmt = DeepSeekDsmlFormat("tool_calls" if v4 else "function_calls")
    bad = block(invoke("get_weather", location="Paris", days="three"), v4=v4)
    for specials in (True, False):
        sp = VOCAB.special if specials else (lambda t: None)

        def match(g, text: str) -> bool:
            return VOCAB.match(g, text, specials)  # noqa: B023

        g = fmt.grammar(TOOLS, "auto", True, sp)
        for ok in (
            block(WEATHER, v4=v4),
            block(TIME, WEATHER, v4=v4),
            block(invoke("get_weather", days=1, location="<b>"), v4=v4),
        ):
            assert match(g, ok), ok
        assert not match(g, bad) and not match(g, block(invoke("get_stock", symbol="X"), v4=v4))
        assert not match(g, block(WEATHER, v4=not v4))
        single = fmt.grammar(TOOLS, "auto", False, sp)
        assert match(single, block(TIME, v4=v4)) and not match(single, block(TIME, WEATHER, v4=v4))
        req = fmt.grammar(TOOLS, "required", True, sp)
        assert req.triggers == () and not match(req, "Hello")
        assert match(req, "<think>hmm</think>\n\n" + block(TIME, v4=v4))
        forced = fmt.grammar(TOOLS, "required", True, sp, thinking_forced_open=True)
        assert match(forced, "hmm</think>" + block(TIME, v4=v4)) and not match(forced, block(TIME, v4=v4))
    g = fmt.grammar(TOOLS, "auto", True, VOCAB.special)
    (kind, pattern), text = g.triggers[0], "Sure.\n\n" + block(TIME, v4=v4)
    assert kind == "pattern_full" and re.fullmatch(pattern, text).start(1) == len("Sure.\n\n")
    assert re.fullmatch(pattern, "<think>" + block(TIME, v4=v4) + "</think>x") is None
    msg = run_pieces(fmt, [text])
    assert [(c.name, json.loads(c.arguments)) for c in msg.tool_calls] == [("get_time", {"timezone": "UTC"})]
