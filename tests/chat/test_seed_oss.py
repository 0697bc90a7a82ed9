"""Seed-OSS ``<seed:tool_call>`` XML calls and ``<seed:think>`` reasoning: detection and the prompt on the
real template, parsing in any split (values typed by the schemas), the grammar, read back."""

from __future__ import annotations

import json
import re

from llamapy.chat import detect_format
from llamapy.chat.seed_oss import SeedOssFormat
from llamapy.vocab.chat_template import ChatTemplate
from tests.chat.conftest import TOOLS, run_pieces, summary
from tests.chat.test_gemma4 import SpecialVocab
from tests.chat.test_prepare import CONVERSATION
from tests.util import shared_path

VOCAB = SpecialVocab(("<seed:tool_call>", "</seed:tool_call>", "<seed:think>", "</seed:think>", "<seed:eos>"))


def call(name: str, **args) -> str:
    params = "".join(
        f"<parameter={k}>{v if isinstance(v, str) else json.dumps(v)}</parameter>\n" for k, v in args.items()
    )
    return f"<seed:tool_call>\n<function={name}>\n{params}</function>\n</seed:tool_call>"


WEATHER = call("get_weather", location="Paris", days=3)
TIME = call("get_time", timezone="UTC")


def test_detect_and_prompt():
    src = shared_path("templates", "ByteDance-Seed-OSS.jinja").read_text()
    fmt = detect_format(src)
    assert fmt.name == "seed-oss" and detect_format(src, tools_requested=False).name == "seed-oss"
    out = ChatTemplate(src, "<seed:bos>", "<seed:eos>").render(
        fmt.prepare_messages(CONVERSATION, tools=TOOLS), add_generation_prompt=True, tools=TOOLS
    )
    assert "<function=get_weather>\n<parameter=location>Paris</parameter>" in out
    assert "<seed:think>The user wants the weather.</seed:think>" in out and "22 degrees and sunny" in out


CASES = [
    (WEATHER, ("", None, [("get_weather", {"location": "Paris", "days": 3})])),
    ("<seed:think>I'm thinking</seed:think>\nSure.\n" + call("get_weather", location="42") + "\n" + TIME,
     ("Sure.\n", "I'm thinking", [("get_weather", {"location": "42"}), ("get_time", {"timezone": "UTC"})])),
    (call("f", todos=[{"item": "x", "selected": False}], s="a\nb"), ("", None, [
        ("f", {"todos": [{"item": "x", "selected": False}], "s": "a\nb"})])),
    (TIME[: -len("</seed:tool_call>")], ("", None, [("get_time", {"timezone": "UTC"})])),  # cut off
    ("<seed:tool_call>oops", ("<seed:tool_call>oops", None, [])),
]  # fmt: skip


def test_parse():
    fmt = SeedOssFormat()
    for text, expected in CASES:
        for pieces in ([text], list(text), [text[:20], text[20:]]):
            assert summary(run_pieces(fmt, pieces, tools=TOOLS)) == expected, pieces


def test_grammar():
    fmt = SeedOssFormat()
    bad = call("get_weather", location="Paris", days="three")
    for specials in (True, False):
        sp = VOCAB.special if specials else (lambda t: None)

        def match(g, text: str) -> bool:
            return VOCAB.match(g, text, specials)  # noqa: B023

        g = fmt.grammar(TOOLS, "auto", True, sp)
        for ok in (WEATHER, TIME, WEATHER + "\n" + TIME, call("get_weather", days=1, location="<b>")):
            assert match(g, ok), ok
        assert not match(g, bad) and not match(g, call("get_stock", symbol="X"))
        single = fmt.grammar(TOOLS, "auto", False, sp)
        assert match(single, TIME) and not match(single, WEATHER + "\n" + TIME)
        req = fmt.grammar(TOOLS, "required", True, sp)
        assert req.triggers == () and not match(req, "Hello")
        assert match(req, "<seed:think>hm</seed:think>\n" + TIME)
    g = fmt.grammar(TOOLS, "auto", True, VOCAB.special)
    (kind, pattern), text = g.triggers[0], "Sure.\n" + TIME
    assert kind == "pattern_full" and re.fullmatch(pattern, text).start(1) == len("Sure.\n")
    assert re.fullmatch(pattern, "<seed:think><seed:tool_call></seed:think>x") is None
    msg = run_pieces(fmt, [text], tools=TOOLS)
    assert [(c.name, json.loads(c.arguments)) for c in msg.tool_calls] == [("get_time", {"timezone": "UTC"})]
