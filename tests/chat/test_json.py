"""The JSON and reasoning helpers the parsers share."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llamapy.chat.common import PARTIAL, call_from_object, dump_arguments, read_json, scan_json
from llamapy.chat.reasoning import THINK, StrippedText, partial_suffix, prompt_opens_block


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"a": 1}', ("complete", 8)),
        ('  {"a": [1, 2.5e3, true, null, "x\\"y"]} tail', ("complete", 39)),
        ("[]", ("complete", 2)),
        ('{"a": 1', ("partial", 7)),
        ('{"a": "x\\u00', ("partial", 12)),
        ('{"a": tr', ("partial", 8)),
        ('{"a": 12', ("partial", 8)),
        ("{", ("partial", 1)),
        ("", ("partial", 0)),
        ('{"a" 1}', ("invalid", 5)),
        ('{"a": 01}', ("invalid", 7)),
        ('{"a": x}', ("invalid", 6)),
        ('{"a": "x\\q"}', ("invalid", 6)),
        ('{"a": 1,}', ("invalid", 8)),
        ("[1 2]", ("invalid", 3)),
        ('{"a": "line\nbreak"}', ("invalid", 6)),
    ],
)
def test_scan_json(text, expected):
    assert scan_json(text) == expected


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(JSON_VALUES, st.booleans())
def test_prefixes_are_partial_and_cache_resumes(value, ascii_only):
    text = json.dumps({"v": value}, ensure_ascii=ascii_only)
    cache: dict = {}
    for k in range(len(text)):
        assert scan_json(text[:k]) == ("partial", k)
        assert scan_json(text[:k], 0, cache) == ("partial", k)
    assert scan_json(text, 0, cache) == ("complete", len(text))
    assert read_json(text + " x")[0] == {"v": value}


def test_read_json():
    assert read_json('x {"a": 1} y', 2) == ({"a": 1}, 10)
    assert read_json('{"a": ') is PARTIAL
    assert read_json("{a}") is None


def test_dump_arguments():
    assert dump_arguments({"a": "é", "b": [1]}) == '{"a": "é", "b": [1]}'
    assert dump_arguments('{"a" :1}') == '{"a": 1}'
    assert dump_arguments("not json") == "not json"
    assert dump_arguments(None) == "{}"


def test_call_from_object():
    c = call_from_object({"name": "f", "arguments": {"x": 1}, "id": "abc"})
    assert (c.name, c.arguments, c.id) == ("f", '{"x": 1}', "abc")
    c = call_from_object({"type": "function", "function": {"name": "g", "arguments": "{}"}})
    assert (c.name, c.arguments) == ("g", "{}")
    c = call_from_object({"tool_name": "h", "parameters": {}}, "tool_name", ("parameters",))
    assert c.name == "h"
    assert call_from_object({"arguments": {}}) is None
    assert call_from_object([1]) is None


def test_partial_suffix():
    assert partial_suffix("abc</th", "</think>") == 4
    assert partial_suffix("abc<", "</think>", "<x>") == 1
    assert partial_suffix("abc", "</think>") == 0
    assert partial_suffix("</think>", "</think>") == 0  # a whole tag is not a partial one


def test_stripped_text():
    s = StrippedText()
    assert [s.push(p) for p in ["  ", " a", " ", "b  ", "\n"]] == ["", "a", "", " b", ""]
    s.open()
    assert s.push("\nc") == "c"


def test_prompt_opens_block():
    assert prompt_opens_block("<|im_start|>assistant\n<think>\n", THINK)
    assert not prompt_opens_block("<think>\n\n</think>\n\n", THINK)
    assert not prompt_opens_block("no tags", THINK)
