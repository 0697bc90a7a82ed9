"""MiniMax M2 ``<minimax:tool_call>`` blocks: detection and the prompt on the real template, parsing in
any split (values typed by the tools' schemas), the grammar and its trigger, read back by the parser."""

from __future__ import annotations

import json
import re

from llamapy.chat import detect_format
from llamapy.chat.minimax_m2 import MiniMaxM2Format
from llamapy.vocab.chat_template import ChatTemplate
from tests.chat.conftest import TOOLS, run_pieces, summary
from tests.chat.test_gemma4 import SpecialVocab
from tests.chat.test_prepare import CONVERSATION
from tests.util import shared_path

VOCAB = SpecialVocab(("<minimax:tool_call>", "</minimax:tool_call>", "<think>", "</think>", "[e~["))


def invoke(name: str, **args) -> str:
    params = "".join(
        f'<parameter name="{k}">{v if isinstance(v, str) else json.dumps(v)}</parameter>\n'
        for k, v in args.items()
    )
    return f'<invoke name="{name}">\n{params}</invoke>\n'


def block(*invokes: str) -> str:
    return "<minimax:tool_call>\n" + "".join(invokes) + "</minimax:tool_call>"


WEATHER = invoke("get_weather", location="Paris", days=3)
TIME = invoke("get_time", timezone="UTC")


def test_detect_and_prompt():
    src = shared_path("templates", "MiniMax-M2.jinja").read_text()
    fmt = detect_format(src)
    assert fmt.name == "minimax-m2" and detect_format(src, tools_requested=False).name == "minimax-m2"
    out = ChatTemplate(src, "", "").render(
        fmt.prepare_messages(CONVERSATION, tools=TOOLS), add_generation_prompt=True, tools=TOOLS
    )
    assert '<invoke name="get_weather">\n<parameter name="location">Paris</parameter>' in out
    assert "22 degrees and sunny" in out and '"get_time"' in out
    assert fmt.thinking_forced_open(out)
    for other, name in (("MiniMax-M1", "minimax-m1"), ("MiniMax-M3", "minimax-m3")):  # other syntaxes
        assert detect_format(shared_path("templates", f"{other}.jinja").read_text()).name == name


CASES = [
    (block(WEATHER), ("", None, [("get_weather", {"location": "Paris", "days": 3})])),
    ("<think>\nhmm\n</think>\n\nSure.\n" + block(invoke("get_weather", location="42"), TIME), ("Sure.\n", "hmm", [
        ("get_weather", {"location": "42"}), ("get_time", {"timezone": "UTC"})])),  # string schema: stays text
    (block(invoke("f", a=[1, 2], b="not json")), ("", None, [("f", {"a": [1, 2], "b": "not json"})])),
    (block(TIME)[: -len("</minimax:tool_call>")], ("", None, [("get_time", {"timezone": "UTC"})])),  # cut off
    ("<minimax:tool_call>oops", ("<minimax:tool_call>oops", None, [])),
]  # fmt: skip


def test_parse():
    fmt = MiniMaxM2Format()
    for text, expected in CASES:
        for pieces in ([text], list(text), [text[:30], text[30:]]):
            assert summary(run_pieces(fmt, pieces, tools=TOOLS)) == expected, pieces
    msg = run_pieces(fmt, list("I'm thinking</think>" + block(TIME)), thinking_forced_open=True)
    assert summary(msg) == ("", "I'm thinking", [("get_time", {"timezone": "UTC"})])


def test_grammar():
    fmt = MiniMaxM2Format()
    bad = block(invoke("get_weather", location="Paris", days="three"))
    for specials in (True, False):
        sp = VOCAB.special if specials else (lambda t: None)

        def match(g, text: str) -> bool:
            return VOCAB.match(g, text, specials)  # noqa: B023

        g = fmt.grammar(TOOLS, "auto", True, sp)
        for ok in (
            block(WEATHER),
            block(TIME, WEATHER),
            block(invoke("get_weather", days=1, location="<b>x</b>")),
        ):
            assert match(g, ok), ok
        assert not match(g, bad) and not match(g, block(invoke("get_stock", symbol="X")))
        single = fmt.grammar(TOOLS, "auto", False, sp)
        assert match(single, block(TIME)) and not match(single, block(TIME, WEATHER))
        named = fmt.grammar(TOOLS, {"type": "function", "function": {"name": "get_time"}}, True, sp)
        assert match(named, block(TIME)) and not match(named, block(WEATHER))
        forced = fmt.grammar(TOOLS, "required", True, sp, thinking_forced_open=True)
        assert forced.triggers == () and match(forced, "hmm\n</think>\n\n" + block(TIME))
        assert not match(forced, "Hello")
    g = fmt.grammar(TOOLS, "auto", True, VOCAB.special, thinking_forced_open=True)
    (kind, pattern), text = g.triggers[0], "hmm <minimax:tool_call></think>\nSure.\n" + block(TIME)
    assert kind == "pattern_full" and re.fullmatch(pattern, text).start(1) == text.rindex(
        "<minimax:tool_call>"
    )
    msg = run_pieces(fmt, [text], thinking_forced_open=True, tools=TOOLS)
    assert [(c.name, json.loads(c.arguments)) for c in msg.tool_calls] == [("get_time", {"timezone": "UTC"})]
