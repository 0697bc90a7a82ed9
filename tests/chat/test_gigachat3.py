"""GigaChat 3 / 3.1 single JSON calls: detection and the prompt on the real templates, parsing in any
split, the grammar (one call at most), read back."""

from __future__ import annotations

import json

import pytest

from llamapy.chat import detect_format
from llamapy.vocab.chat_template import ChatTemplate
from tests.chat.conftest import TOOLS, run_pieces, summary
from tests.chat.test_gemma4 import SpecialVocab
from tests.chat.test_prepare import CONVERSATION
from tests.util import shared_path

TEMPLATES = {"GigaChat3-10B-A1.8B": "gigachat3", "GigaChat3.1-10B-A1.8B": "gigachat3.1"}
VOCAB = SpecialVocab(("<|message_sep|>", "<|role_sep|>", "<|function_call|>", "</s>"))
W = {"name": "get_weather", "arguments": {"location": "Paris", "days": 3}}
T = {"name": "get_time", "arguments": {"timezone": "UTC"}}


@pytest.fixture(scope="module", params=sorted(TEMPLATES))
def fmt(request):
    f = detect_format(shared_path("templates", f"{request.param}.jinja").read_text())
    assert f.name == TEMPLATES[request.param]
    return f


def test_detect_and_prompt(fmt):
    assert detect_format(fmt.source, tools_requested=False).name == fmt.name
    out = ChatTemplate(fmt.source, "<s>", "</s>").render(
        fmt.prepare_messages(CONVERSATION, tools=TOOLS), add_generation_prompt=True, tools=TOOLS
    )
    assert fmt.prefix + '{"name": "get_weather", "arguments": {"location": "Paris"}}' in out
    assert "22 degrees and sunny" in out


def test_parse(fmt):
    cases = [
        (fmt.prefix + json.dumps(W), ("", None, [("get_weather", W["arguments"])])),
        (
            "Let me check." + fmt.prefix + json.dumps(T),
            ("Let me check.", None, [("get_time", T["arguments"])]),
        ),
        (fmt.prefix + '{"x": 1}', (fmt.prefix + '{"x": 1}', None, [])),
        (fmt.prefix + '{"name": "f", "argu', (fmt.prefix + '{"name": "f", "argu', None, [])),
    ]
    for text, expected in cases:
        for pieces in ([text], list(text)):
            assert summary(run_pieces(fmt, pieces)) == expected, pieces


def test_grammar(fmt):
    for specials in (True, False):
        sp = VOCAB.special if specials else (lambda t: None)
        g = fmt.grammar(TOOLS, "auto", True, sp)
        assert g.triggers == (("word", fmt.prefix),)
        assert VOCAB.match(g, fmt.prefix + json.dumps(W), specials)
        assert not VOCAB.match(g, fmt.prefix + json.dumps(W) + fmt.prefix + json.dumps(T), specials)
        bad = {"name": "get_weather", "arguments": {"location": "Paris", "days": "x"}}
        assert not VOCAB.match(g, fmt.prefix + json.dumps(bad), specials)
        req = fmt.grammar(TOOLS, "required", True, sp)
        assert req.triggers == () and not VOCAB.match(req, "Hello", specials)
    msg = run_pieces(fmt, ["Sure." + fmt.prefix + json.dumps(T)])
    assert [(c.name, json.loads(c.arguments)) for c in msg.tool_calls] == [("get_time", T["arguments"])]
