"""Apertus ``<|tools_prefix|>[{"NAME": {...}}]<|tools_suffix|>`` calls and ``<|inner_prefix|>`` reasoning:
detection and the prompt on the real template, parsing in any split, the grammar, read back."""

from __future__ import annotations

import json
import re

from llamapy.chat import detect_format
from llamapy.chat.apertus import ApertusFormat
from llamapy.vocab.chat_template import ChatTemplate
from tests.chat.conftest import TOOLS, run_pieces, summary
from tests.chat.test_gemma4 import SpecialVocab
from tests.chat.test_prepare import CONVERSATION
from tests.util import shared_path

VOCAB = SpecialVocab(
    ("<|tools_prefix|>", "<|tools_suffix|>", "<|inner_prefix|>", "<|inner_suffix|>", "<|end|>")
)
WA, TA = {"location": "Paris", "days": 3}, {"timezone": "UTC"}


def calls(*items: tuple[str, dict]) -> str:
    return "<|tools_prefix|>" + json.dumps([{n: a} for n, a in items]) + "<|tools_suffix|>"


def test_detect_and_prompt():
    src = shared_path("templates", "Apertus-8B-Instruct.jinja").read_text()
    fmt = detect_format(src)
    assert fmt.name == "apertus" and detect_format(src, tools_requested=False).name == "apertus"
    out = ChatTemplate(src, "<s>", "</s>").render(
        fmt.prepare_messages(CONVERSATION, tools=TOOLS), add_generation_prompt=True, tools=TOOLS
    )
    assert calls(("get_weather", {"location": "Paris"})) in out and "22 degrees and sunny" in out


def test_parse():
    fmt = ApertusFormat()
    cases = [
        (calls(("get_weather", WA)), ("", None, [("get_weather", WA)])),
        ("<|inner_prefix|>hm<|inner_suffix|>Sure. " + calls(("get_weather", WA), ("get_time", TA)),
         ("Sure. ", "hm", [("get_weather", WA), ("get_time", TA)])),
        (calls(("get_time", TA))[: -len("<|tools_suffix|>")], ("", None, [("get_time", TA)])),  # cut off
        ('<|tools_prefix|>[{"a": 1, "b": 2}]', ('<|tools_prefix|>[{"a": 1, "b": 2}]', None, [])),
    ]  # fmt: skip
    for text, expected in cases:
        for pieces in ([text], list(text)):
            assert summary(run_pieces(fmt, pieces)) == expected, pieces


def test_grammar():
    fmt = ApertusFormat()
    for specials in (True, False):
        sp = VOCAB.special if specials else (lambda t: None)
        g = fmt.grammar(TOOLS, "auto", True, sp)
        assert VOCAB.match(g, calls(("get_weather", WA)), specials)
        assert VOCAB.match(g, calls(("get_weather", WA), ("get_time", TA)), specials)
        assert not VOCAB.match(g, calls(("get_weather", {"location": "P", "days": "x"})), specials)
        assert not VOCAB.match(g, calls(("get_stock", {})), specials)
        single = fmt.grammar(TOOLS, "auto", False, sp)
        assert not VOCAB.match(single, calls(("get_weather", WA), ("get_time", TA)), specials)
        req = fmt.grammar(TOOLS, "required", True, sp)
        assert req.triggers == () and not VOCAB.match(req, "Hello", specials)
        assert VOCAB.match(req, "<|inner_prefix|>hm<|inner_suffix|>" + calls(("get_time", TA)), specials)
    g = fmt.grammar(TOOLS, "auto", True, VOCAB.special)
    (kind, pattern), text = g.triggers[0], "Sure. " + calls(("get_time", TA))
    assert kind == "pattern_full" and re.fullmatch(pattern, text).start(1) == len("Sure. ")
    msg = run_pieces(fmt, [text])
    assert [(c.name, json.loads(c.arguments)) for c in msg.tool_calls] == [("get_time", TA)]
