"""LFM2 / LFM2.5 Python-style calls: detection and the prompt on the real templates (calls written into
the content where the template does not render them), parsing in any split, the grammar, read back."""

from __future__ import annotations

import json
import re

import pytest

from llamapy.chat import detect_format
from llamapy.chat.lfm2 import END, START, Lfm2Format, parse_python_calls
from llamapy.vocab.chat_template import ChatTemplate
from tests.chat.conftest import TOOLS, run_pieces, summary
from tests.chat.test_gemma4 import SpecialVocab
from tests.chat.test_prepare import CONVERSATION
from tests.util import shared_path

TEMPLATES = ("LFM2-8B-A1B", "LFM2.5-8B-A1B", "LFM2.5-Instruct")
VOCAB = SpecialVocab((START, END, "<think>", "</think>", "<|im_end|>"))
WEATHER = f'{START}[get_weather(location="Paris", days=3)]{END}'
TIME = f'{START}[get_time(timezone="UTC")]{END}'
BOTH = f'{START}[get_weather(location="Paris", days=3), get_time(timezone="UTC")]{END}'


@pytest.mark.parametrize("name", TEMPLATES)
def test_detect_and_prompt(name):
    src = shared_path("templates", f"{name}.jinja").read_text()
    fmt = detect_format(src)
    assert fmt.name == "lfm2" and detect_format(src, tools_requested=False).name == "lfm2"
    out = ChatTemplate(src, "", "").render(
        fmt.prepare_messages(CONVERSATION, tools=TOOLS), add_generation_prompt=True, tools=TOOLS
    )
    assert re.search(
        r"<\|tool_call_start\|>\[get_weather\(location=[\"']Paris[\"']\)\]<\|tool_call_end\|>", out
    )
    assert out.count("get_weather(") == 1 and "22 degrees and sunny" in out and '"get_time"' in out


CASES = [
    (WEATHER, ("", None, [("get_weather", {"location": "Paris", "days": 3})])),
    ("Sure. " + BOTH + " Done.", ("Sure. Done.", None, [
        ("get_weather", {"location": "Paris", "days": 3}), ("get_time", {"timezone": "UTC"})])),
    (f"<think>hm</think>{START}[f(a=true, b=None, c={{'x': [1, -2.5]}}, d=(1, 2))]{END}", ("", "hm", [
        ("f", {"a": True, "b": None, "c": {"x": [1, -2.5]}, "d": [1, 2]})])),
    (f"{START}get_time(timezone='UTC')", ("", None, [("get_time", {"timezone": "UTC"})])),  # no list, cut off
    (f"{START}[f(1)]{END}", (f"{START}[f(1)]{END}", None, [])),  # positional: not a call
    (f'{START}[f(a=__import__("os"))]{END}', (f'{START}[f(a=__import__("os"))]{END}', None, [])),
    (f"{START}[f(a=]{END}", (f"{START}[f(a=]{END}", None, [])),
]  # fmt: skip


def test_parse():
    fmt = Lfm2Format("<think>")
    for text, expected in CASES:
        for pieces in ([text], list(text), [text[:10], text[10:]]):
            assert summary(run_pieces(fmt, pieces)) == expected, pieces
    assert parse_python_calls("[" * 100000) is None


def test_grammar():
    fmt = Lfm2Format("<think>")
    bad = f'{START}[get_weather(location="Paris", days="three")]{END}'
    for specials in (True, False):
        sp = VOCAB.special if specials else (lambda t: None)

        def match(g, text: str) -> bool:
            return VOCAB.match(g, text, specials)  # noqa: B023

        g = fmt.grammar(TOOLS, "auto", True, sp)
        for ok in (WEATHER, TIME, BOTH, f'{START}[get_weather(days=1,location="x")]{END}'):
            assert match(g, ok), ok
        assert not match(g, bad) and not match(g, f'{START}[get_stock(symbol="X")]{END}')
        single = fmt.grammar(TOOLS, "auto", False, sp)
        assert match(single, TIME) and not match(single, BOTH)
        named = fmt.grammar(TOOLS, {"type": "function", "function": {"name": "get_time"}}, True, sp)
        assert match(named, TIME) and not match(named, WEATHER)
        req = fmt.grammar(TOOLS, "required", True, sp)
        assert req.triggers == () and not match(req, "Hello") and match(req, "<think>hm</think>" + TIME)
    g = fmt.grammar(TOOLS, "auto", True, VOCAB.special)
    (kind, pattern), text = g.triggers[0], "Sure. " + TIME
    assert kind == "pattern_full" and re.fullmatch(pattern, text).start(1) == len("Sure. ")
    assert re.fullmatch(pattern, f"<think>{START}</think>x") is None
    msg = run_pieces(fmt, [text])
    assert [(c.name, json.loads(c.arguments)) for c in msg.tool_calls] == [("get_time", {"timezone": "UTC"})]
