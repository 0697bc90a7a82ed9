"""Fixtures for the chat-format tests: a byte-level llguidance tokenizer with the families' special
tokens, grammar matching, and a runner that feeds a parser any split of a text and checks that the
deltas reassemble to the message ``finish`` returns."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from llamapy.chat import ChatFormat, ChatSyntax, ParsedMessage, ToolGrammar
from tests.util import shared_path

SPECIAL_TOKENS = (
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
    "<|python_tag|>",
    "[TOOL_CALLS]",
    "[ARGS]",
    "[CALL_ID]",
    "[THINK]",
    "[/THINK]",
    "<|tool_call|>",
    "<|/tool_call|>",
    "<|START_ACTION|>",
    "<|END_ACTION|>",
    "<|START_THINKING|>",
    "<|END_THINKING|>",
    "<|START_RESPONSE|>",
    "<|END_RESPONSE|>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
    "<|start|>",
    "<|channel|>",
    "<|message|>",
    "<|constrain|>",
    "<|end|>",
    "<|call|>",
    "<|eot|>",
    "<|open|>",
    "<|close|>",
    "<|sep|>",
    "<|end_of_msg|>",
    "<|eom|>",
    "<|content|>",
    "<|begin|>",
    "<|think|>",
    "<|tool_calls|>",
    "<|calls|>",
    "<|tool_call:begin|>",
    "<|tool_call:name|>",
    "<|tool_call:args|>",
    "<|tool_call:end|>",
    "<tool_calls:opensource>",
    "</tool_calls:opensource>",
    "<tool_call:opensource>",
    "<tool_sep:opensource>",
    "</tool_call:opensource>",
    "<arg_key:opensource>",
    "</arg_key:opensource>",
    "<arg_value:opensource>",
    "</arg_value:opensource>",
    "<think:opensource>",
    "</think:opensource>",
)
EOS = "<|eot|>"


def is_special(text: str) -> int | None:
    """The test vocabulary's id of the special token ``text`` (None: not special)."""
    return 256 + SPECIAL_TOKENS.index(text) if text in SPECIAL_TOKENS else None


def is_special_by_text(text: str) -> bool:
    """Like ``is_special`` but answering True (the grammar then names the token by its text)."""
    return text in SPECIAL_TOKENS


class _ByteVocab:
    """256 single-byte tokens and the special tokens (marked with a leading 0xff, as llguidance wants)."""

    def __init__(self) -> None:
        self.tokens = [bytes([i]) for i in range(256)] + [b"\xff" + s.encode() for s in SPECIAL_TOKENS]
        self.eos_token_id = 256 + SPECIAL_TOKENS.index(EOS)
        self.bos_token_id = None
        self.special_token_ids = list(range(256, 256 + len(SPECIAL_TOKENS)))

    def __call__(self, text: bytes | str) -> list[int]:
        return list(text.encode() if isinstance(text, str) else text)


def tokenize(text: str, specials: Callable[[str], object] = is_special) -> list[int]:
    """Token ids of ``text``: special tokens where ``specials`` says so, bytes elsewhere."""
    names = sorted(
        (s for s in SPECIAL_TOKENS if specials(s) is not None and specials(s) is not False),
        key=len,
        reverse=True,
    )
    out: list[int] = []
    i = 0
    while i < len(text):
        for s in names:
            if text.startswith(s, i):
                out.append(256 + SPECIAL_TOKENS.index(s))
                i += len(s)
                break
        else:
            out.extend(text[i].encode())
            i += 1
    return out


@pytest.fixture(scope="session")
def lltokenizer():
    import llguidance
    from llguidance._tokenizer import TokenizerWrapper

    return llguidance.LLTokenizer(TokenizerWrapper(_ByteVocab()))


@pytest.fixture(scope="session")
def grammar_check(lltokenizer):
    """``check(grammar) -> None`` (asserts llguidance accepts the grammar) and ``match(grammar, text)``
    (whether the grammar accepts exactly ``text``)."""
    import llguidance

    def compile_(g: ToolGrammar) -> str:
        compiled = llguidance.LLMatcher.grammar_from_lark(g.lark)
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(compiled, lltokenizer)
        assert not is_error, f"{messages}\n{g.lark}"
        return compiled

    def match(g: ToolGrammar, text: str, specials: Callable[[str], object] = is_special) -> bool:
        m = llguidance.LLMatcher(lltokenizer, compile_(g), log_level=0)
        ok = m.consume_tokens(tokenize(text, specials))
        return bool(ok) and not m.is_error() and m.is_accepting()

    class Check:
        pass

    c = Check()
    c.check = compile_
    c.match = match
    return c


def reassemble(deltas: Sequence) -> tuple[str, str | None, list[tuple[str, str, str]]]:
    """Content, reasoning and (id, name, arguments) per call, from deltas; checks one group per delta."""
    content, reasoning, calls = "", None, {}
    for d in deltas:
        groups = bool(d.content) + bool(d.reasoning_content) + (d.tool_call_index is not None)
        assert groups <= 1, d
        content += d.content
        if d.reasoning_content:
            reasoning = (reasoning or "") + d.reasoning_content
        if d.tool_call_index is not None:
            entry = calls.setdefault(d.tool_call_index, ["", "", ""])
            entry[0] += d.tool_call_id or ""
            entry[1] += d.tool_call_name or ""
            entry[2] += d.tool_call_arguments
    assert sorted(calls) == list(range(len(calls)))
    return content, reasoning, [tuple(calls[i]) for i in range(len(calls))]


def run_pieces(fmt: ChatFormat, pieces: Sequence[str], **syntax) -> ParsedMessage:
    """Feed ``pieces`` to a new parser; check the deltas reassemble to the finished message."""
    parser = fmt.parser(ChatSyntax(fmt.name, **syntax))
    deltas = []
    for piece in pieces:
        deltas += parser.feed(piece)
    last, msg = parser.finish()
    deltas += last
    content, reasoning, calls = reassemble(deltas)
    assert content == msg.content
    assert reasoning == msg.reasoning_content
    assert calls == [(c.id, c.name, c.arguments) for c in msg.tool_calls]
    assert all(c.id for c in msg.tool_calls)
    return msg


def summary(msg: ParsedMessage) -> tuple[str, str | None, list[tuple[str, object]]]:
    """The message without the generated ids: (content, reasoning, [(name, arguments as an object)])."""
    return msg.content, msg.reasoning_content, [(c.name, json.loads(c.arguments)) for c in msg.tool_calls]


@pytest.fixture(scope="session")
def templates_dir() -> Path:
    return shared_path("templates")


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather at a place.",
        "parameters": {
            "type": "object",
            "properties": {"location": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["location"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time in a time zone.",
        "parameters": {
            "type": "object",
            "properties": {"timezone": {"type": "string"}},
            "required": ["timezone"],
        },
    },
}
TOOLS = [WEATHER, TIME]

# Phi-4-mini-instruct's own template (not in ../shared/templates)
PHI4_MINI_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' and 'tools' in message and "
    "message['tools'] is not none %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|tool|>' + "
    "message['tools'] + '<|/tool|>' + '<|end|>' }}{% else %}{{ '<|' + message['role'] + '|>' + "
    "message['content'] + '<|end|>' }}{% endif %}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|assistant|>' }}{% else %}{{ eos_token }}{% endif %}"
)
