"""JSON calls between tags (Nemotron Nano v2 ``<TOOLCALL>``, Apriel 1.6 and MiniMax M1 ``<tool_calls>``):
detection and the prompt on the real templates, parsing in any split, the grammars, read back."""

from __future__ import annotations

import json
import re

import pytest

from llamapy.chat import detect_format
from llamapy.chat.json_tags import JsonTagsFormat
from llamapy.vocab.chat_template import ChatTemplate
from tests.chat.conftest import TOOLS, run_pieces, summary
from tests.chat.test_gemma4 import SpecialVocab
from tests.chat.test_prepare import CONVERSATION
from tests.util import shared_path

TEMPLATES = {
    "NVIDIA-Nemotron-Nano-v2": ("nemotron-v2", '<TOOLCALL>[{"name": "get_weather", "arguments": {"location": "Paris"}}]'),
    "Apriel-1.6-15b-Thinker-fixed": ("apriel", '<tool_calls>[{"name": "get_weather", "arguments": {"location": "Paris"}'),
    "MiniMax-M1": ("minimax-m1", '<tool_calls>\n{"name": "get_weather", "arguments": {"location": "Paris"}}\n</tool_calls>'),
}  # fmt: skip
FAMILIES = {"nemotron-v2": "<TOOLCALL>", "apriel": "<tool_calls>", "minimax-m1": "<beginning_of_sentence>"}
VOCAB = SpecialVocab(
    ("<TOOLCALL>", "</TOOLCALL>", "<tool_calls>", "</tool_calls>", "<think>", "</think>", "<eos>")
)
W = {"name": "get_weather", "arguments": {"location": "Paris", "days": 3}}
T = {"name": "get_time", "arguments": {"timezone": "UTC"}}


def fmt_of(name: str, think: bool = True) -> JsonTagsFormat:
    return JsonTagsFormat("<think>" if think else "", FAMILIES[name])


def calls(name: str, *objs: dict) -> str:
    f = fmt_of(name)
    if f.form == "array":
        return f"{f.open_tag}{json.dumps(list(objs))}{f.close_tag}"
    return f.open_tag + "\n" + "".join(json.dumps(o) + "\n" for o in objs) + f.close_tag


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_detect_and_prompt(name):
    src = shared_path("templates", f"{name}.jinja").read_text()
    fmt = detect_format(src)
    expected, rendered = TEMPLATES[name]
    assert fmt.name == expected and detect_format(src, tools_requested=False).name == expected
    out = ChatTemplate(src, "<s>", "</s>").render(
        fmt.prepare_messages(CONVERSATION, tools=TOOLS), add_generation_prompt=True, tools=TOOLS
    )
    assert rendered in out and "22 degrees and sunny" in out


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_parse(name):
    fmt = fmt_of(name)
    f = fmt
    both = [("get_weather", W["arguments"]), ("get_time", T["arguments"])]
    cases = [
        (calls(name, W), ("", None, both[:1])),
        ("<think>hm</think>Sure. " + calls(name, W, T), ("Sure. ", "hm", both)),
        (f'{f.open_tag}{{"name": "get_time", "arguments": {{"timezone": "UTC"}}}}, {json.dumps(W)}{f.close_tag}',
         ("", None, both[::-1])),
        (calls(name, T)[: -len(f.close_tag)], ("", None, both[1:])),  # cut off by the stop
        (f"{f.open_tag}not json{f.close_tag}", (f"{f.open_tag}not json{f.close_tag}", None, [])),
        (f'{f.open_tag}[{{"x": 1}}]{f.close_tag}', (f'{f.open_tag}[{{"x": 1}}]{f.close_tag}', None, [])),
    ]  # fmt: skip
    for text, expected in cases:
        for pieces in ([text], list(text), [text[:15], text[15:]]):
            assert summary(run_pieces(fmt, pieces)) == expected, pieces


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_grammar(name):
    fmt = fmt_of(name)
    bad = calls(name, {"name": "get_weather", "arguments": {"location": "Paris", "days": "three"}})
    for specials in (True, False):
        sp = VOCAB.special if specials else (lambda t: None)

        def match(g, text: str) -> bool:
            return VOCAB.match(g, text, specials)  # noqa: B023

        g = fmt.grammar(TOOLS, "auto", True, sp)
        assert match(g, calls(name, W)) and match(g, calls(name, W, T))
        assert not match(g, bad) and not match(g, calls(name, {"name": "get_stock", "arguments": {}}))
        single = fmt.grammar(TOOLS, "auto", False, sp)
        assert match(single, calls(name, T)) and not match(single, calls(name, W, T))
        req = fmt.grammar(TOOLS, "required", True, sp)
        assert req.triggers == () and not match(req, "Hello")
        assert match(req, "<think>hm</think>\n" + calls(name, T))
        forced = fmt.grammar(TOOLS, "required", True, sp, thinking_forced_open=True)
        assert match(forced, "hm</think>\n" + calls(name, T)) and not match(forced, calls(name, T))
    g = fmt.grammar(TOOLS, "auto", True, VOCAB.special)
    (kind, pattern), text = g.triggers[0], "Sure. " + calls(name, T)
    assert kind == "pattern_full" and re.fullmatch(pattern, text).start(1) == len("Sure. ")
    assert re.fullmatch(pattern, f"<think>{fmt.open_tag}</think>x") is None
    plain = fmt_of(name, think=False).grammar(TOOLS, "auto", True, VOCAB.special)
    assert plain.triggers == (("word", fmt.open_tag),)
    msg = run_pieces(fmt, [text])
    assert [(c.name, json.loads(c.arguments)) for c in msg.tool_calls] == [("get_time", T["arguments"])]
