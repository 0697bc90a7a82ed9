"""MiniCPM 5 ``<function name=...><param name=...>`` calls: detection and the prompt on the real template,
parsing in any split (CDATA values, values typed by the schemas), the grammar, read back."""

from __future__ import annotations

import json
import re

from llamapy.chat import detect_format
from llamapy.chat.minicpm5 import MiniCpm5Format
from llamapy.vocab.chat_template import ChatTemplate
from tests.chat.conftest import TOOLS, is_special, run_pieces, summary
from tests.chat.test_prepare import CONVERSATION
from tests.util import shared_path


def call(name: str, **args) -> str:
    params = "".join(
        f'<param name="{k}">{v if isinstance(v, str) else json.dumps(v)}</param>' for k, v in args.items()
    )
    return f'<function name="{name}">{params}</function>'


WEATHER = call("get_weather", location="Paris", days=3)
TIME = call("get_time", timezone="UTC")


def test_detect_and_prompt():
    src = shared_path("templates", "openbmb-MiniCPM5-1B.jinja").read_text()
    fmt = detect_format(src)
    assert fmt.name == "minicpm5" and detect_format(src, tools_requested=False).name == "minicpm5"
    out = ChatTemplate(src, "<s>", "</s>").render(
        fmt.prepare_messages(CONVERSATION, tools=TOOLS), add_generation_prompt=True, tools=TOOLS
    )
    assert call("get_weather", location="Paris") in out and "22 degrees and sunny" in out


def test_parse():
    fmt = MiniCpm5Format()
    cases = [
        (WEATHER, ("", None, [("get_weather", {"location": "Paris", "days": 3})])),
        ("<think>\nhm\n</think>\n\nSure. " + call("get_weather", location="<![CDATA[a <b> & c\nd]]>") + "\n" + TIME,
         ("Sure. ", "hm", [("get_weather", {"location": "a <b> & c\nd"}), ("get_time", {"timezone": "UTC"})])),
        (call("f", a=[1, {"b": None}], s="42"), ("", None, [("f", {"a": [1, {"b": None}], "s": 42})])),
        (TIME[: -len("</function>")], ("", None, [("get_time", {"timezone": "UTC"})])),  # cut off
        ('<function name="f">oops', ('<function name="f">oops', None, [])),
    ]  # fmt: skip
    for text, expected in cases:
        for pieces in ([text], list(text), [text[:12], text[12:]]):
            assert summary(run_pieces(fmt, pieces, tools=TOOLS)) == expected, pieces


def test_grammar(grammar_check):
    fmt = MiniCpm5Format()
    g = fmt.grammar(TOOLS, "auto", True, is_special)
    grammar_check.check(g)
    cdata = call("get_weather", location="<![CDATA[x<y]]>")
    for ok in (WEATHER, TIME, WEATHER + "\n" + TIME, cdata, call("get_weather", days=2, location="<b>")):
        assert grammar_check.match(g, ok), ok
    assert not grammar_check.match(g, call("get_weather", location="Paris", days="three"))
    assert not grammar_check.match(g, call("get_stock", symbol="X"))
    single = fmt.grammar(TOOLS, "auto", False, is_special)
    assert grammar_check.match(single, TIME) and not grammar_check.match(single, WEATHER + TIME)
    req = fmt.grammar(TOOLS, "required", True, is_special)
    assert req.triggers == () and grammar_check.match(req, "<think>hm</think>\n" + TIME)
    assert not grammar_check.match(req, "Hello")
    (kind, pattern), text = g.triggers[0], "Sure. " + TIME
    assert kind == "pattern_full" and re.fullmatch(pattern, text).start(1) == len("Sure. ")
    assert re.fullmatch(pattern, '<think><function name="</think>x') is None
    msg = run_pieces(fmt, [text], tools=TOOLS)
    assert [(c.name, json.loads(c.arguments)) for c in msg.tool_calls] == [("get_time", {"timezone": "UTC"})]
