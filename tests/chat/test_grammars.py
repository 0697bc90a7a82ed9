"""Tool-call grammars: valid for llguidance, accept each family's canonical call, reject unknown tools
and bad arguments; lazy triggers fire where the call starts; the family's parser reads the call back."""

from __future__ import annotations

import json
import re

import pytest

from llamapy.chat import ChatSyntax, detect_format
from llamapy.chat.command_r7b import CommandR7BFormat
from llamapy.chat.deepseek_r1 import DeepSeekR1Format
from llamapy.chat.functionary import FunctionaryV31Format, FunctionaryV32Format
from llamapy.chat.generic import GenericFormat
from llamapy.chat.gpt_oss import GptOssFormat
from llamapy.chat.granite import GraniteFormat
from llamapy.chat.hermes import HermesFormat
from llamapy.chat.llama3 import Llama3Format
from llamapy.chat.mistral import MistralFormat
from llamapy.chat.phi4 import Phi4Format
from llamapy.chat.qwen3_coder import Qwen3CoderFormat
from tests.chat.conftest import TOOLS, is_special, run_pieces

WA = '{"location": "Paris", "days": 3}'
BAD = '{"location": "Paris", "days": "three"}'
TA = '{"timezone": "UTC"}'
SA = '{"symbol": "X"}'


def _hermes(name, args):
    return f'<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'


def _qwen3c(name, args):
    values = {k: v if isinstance(v, str) else json.dumps(v) for k, v in json.loads(args).items()}
    params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in values.items())
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def _nemo(*calls):
    items = ", ".join(
        f'{{"name": "{n}", "arguments": {a}, "id": "abcDEF12{k}"}}' for k, (n, a) in enumerate(calls)
    )
    return f"[TOOL_CALLS][{items}]"


def _array(*calls):
    return "[" + ", ".join(f'{{"name": "{n}", "arguments": {a}}}' for n, a in calls) + "]"


def _r1(name, args):
    return f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{args}\n```<｜tool▁call▁end｜>"


def _v31(name, args):
    return f"<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{args}<｜tool▁call▁end｜>"


def _r7b(*calls):
    items = ", ".join(
        f'{{"tool_call_id": "{k}", "tool_name": "{n}", "parameters": {a}}}' for k, (n, a) in enumerate(calls)
    )
    return f"<|START_ACTION|>[\n    {items}\n]<|END_ACTION|>"


def _oss(name, args):
    return f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{args}"


DS = ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>")

# name -> (format, call(name, args) -> text, calls(*[(name, args)]) -> text or None, prefix before a lazy
#          call, reasoning block a required grammar may start with)
FAMILIES = {
    "hermes": (HermesFormat("<tool_call> <think>"), _hermes, lambda *c: "\n".join(_hermes(*x) for x in c),
               "Let me check.\n", "<think>\nhmm\n</think>\n\n"),
    "qwen3-coder": (Qwen3CoderFormat("<think>"), _qwen3c, lambda *c: "\n".join(_qwen3c(*x) for x in c),
                    "Checking.\n", "<think>\nhmm\n</think>\n\n"),
    "llama3": (Llama3Format("<|python_tag|>"), lambda n, a: f'{{"name": "{n}", "parameters": {a}}}',
               lambda *c: "; ".join(f'{{"name": "{n}", "parameters": {a}}}' for n, a in c), "", None),
    "mistral-nemo": (MistralFormat("[TOOL_CALLS]"), lambda n, a: _nemo((n, a)), _nemo, "Sure. ", None),
    "mistral-v11": (MistralFormat("[TOOL_CALLS] [CALL_ID] [ARGS]"), lambda n, a: f"[TOOL_CALLS]{n}[CALL_ID]abcDEF123[ARGS]{a}",
                    lambda *c: "".join(f"[TOOL_CALLS]{n}[CALL_ID]abcDEF12{k}[ARGS]{a}" for k, (n, a) in enumerate(c)),
                    "Sure. ", None),
    "magistral": (MistralFormat("[TOOL_CALLS] [ARGS] [THINK]"), lambda n, a: f"[TOOL_CALLS]{n}[ARGS]{a}",
                  lambda *c: "".join(f"[TOOL_CALLS]{n}[ARGS]{a}" for n, a in c), "Sure. ", "[THINK]hmm[/THINK]"),
    "phi4": (Phi4Format(), lambda n, a: f"<|tool_call|>{_array((n, a))}<|/tool_call|>",
             lambda *c: f"<|tool_call|>{_array(*c)}<|/tool_call|>", "One moment. ", None),
    "granite": (GraniteFormat(), lambda n, a: f"<|tool_call|>{_array((n, a))}", lambda *c: f"<|tool_call|>{_array(*c)}",
                "Calling. ", "<think>hmm</think>"),
    "deepseek-r1": (DeepSeekR1Format(), lambda n, a: DS[0] + _r1(n, a) + DS[1],
                    lambda *c: DS[0] + "\n".join(_r1(*x) for x in c) + DS[1], "Checking.", "<think>hmm</think>\n\n"),
    "deepseek-v3.1": (DeepSeekR1Format(v31=True), lambda n, a: DS[0] + _v31(n, a) + DS[1],
                      lambda *c: DS[0] + "".join(_v31(*x) for x in c) + DS[1], "", "<think>hmm</think>"),
    "command-r7b": (CommandR7BFormat(), lambda n, a: _r7b((n, a)), _r7b, "Let me look.",
                    "<|START_THINKING|>hmm<|END_THINKING|>"),
    "functionary-v3.2": (FunctionaryV32Format(), lambda n, a: f"{n}\n{a}",
                         lambda *c: "\n>>>".join(f"{n}\n{a}" for n, a in c), "all\nLet me check.>>>", None),
    "functionary-v3.1": (FunctionaryV31Format(), lambda n, a: f"<function={n}>{a}</function>",
                         lambda *c: "".join(f"<function={n}>{a}</function>" for n, a in c), "Sure. ", None),
    "gpt-oss": (GptOssFormat(), _oss, None, "<|channel|>analysis<|message|>Thinking.<|end|><|start|>assistant",
                "<|channel|>analysis<|message|>Thinking.<|end|><|start|>assistant"),
}  # fmt: skip
NAMES = sorted(FAMILIES)


def trigger_start(g, text: str) -> int | None:
    """Where the lazy grammar ``g`` starts in ``text`` (the triggers' semantics in ToolGrammar's doc)."""
    best = None
    for kind, value in g.triggers:
        pos = None
        if kind == "word":
            i = text.find(value)
            pos = i if i >= 0 else None
        else:
            m = re.search(value, text) if kind == "pattern" else re.fullmatch(value, text)
            if m:
                pos = m.start(1) if m.re.groups else m.start()
        if pos is not None and (best is None or pos < best):
            best = pos
    return best


@pytest.mark.parametrize("name", NAMES)
def test_auto(grammar_check, name):
    fmt, call, calls, prefix, _ = FAMILIES[name]
    g = fmt.grammar(TOOLS, "auto", True, is_special)
    grammar_check.check(g)
    assert g.triggers
    weather = call("get_weather", WA)
    assert grammar_check.match(g, weather)
    assert not grammar_check.match(g, call("get_stock", SA)), "unknown tool accepted"
    assert not grammar_check.match(g, call("get_weather", BAD)), "bad arguments accepted"
    if calls is not None:
        assert grammar_check.match(g, calls(("get_weather", WA), ("get_time", TA)))
    text = prefix + weather
    assert trigger_start(g, text) == len(prefix)
    assert trigger_start(g, prefix) is None


@pytest.mark.parametrize("name", NAMES)
def test_required(grammar_check, name):
    fmt, call, _, prefix, reasoning = FAMILIES[name]
    g = fmt.grammar(TOOLS, "required", True, is_special)
    grammar_check.check(g)
    assert g.triggers == ()
    assert grammar_check.match(g, call("get_time", TA))
    assert not grammar_check.match(g, "Hello")
    if reasoning is not None:
        assert grammar_check.match(g, reasoning + call("get_time", TA))


@pytest.mark.parametrize("name", NAMES)
def test_named_and_single(grammar_check, name):
    fmt, call, calls, _, _ = FAMILIES[name]
    named = fmt.grammar(TOOLS, {"type": "function", "function": {"name": "get_time"}}, True, is_special)
    grammar_check.check(named)
    assert grammar_check.match(named, call("get_time", TA))
    assert not grammar_check.match(named, call("get_weather", WA))
    single = fmt.grammar(TOOLS, "auto", False, is_special)
    grammar_check.check(single)
    assert grammar_check.match(single, call("get_weather", WA))
    if calls is not None:
        assert not grammar_check.match(single, calls(("get_weather", WA), ("get_time", TA)))
    assert fmt.grammar(TOOLS, "none", True, is_special) is None
    assert fmt.grammar([], "auto", True, is_special) is None


@pytest.mark.parametrize("name", NAMES)
def test_parser_reads_grammar_output(name):
    fmt, call, calls, prefix, _ = FAMILIES[name]
    msg = run_pieces(fmt, list(prefix + call("get_weather", WA)))
    assert [(c.name, json.loads(c.arguments)) for c in msg.tool_calls] == [("get_weather", json.loads(WA))]
    if calls is not None:
        msg = run_pieces(fmt, [calls(("get_weather", WA), ("get_time", TA))])
        assert [c.name for c in msg.tool_calls] == ["get_weather", "get_time"]


def test_literal_tags(grammar_check):
    """Without special tokens the tags are plain strings in the grammar."""
    fmt = HermesFormat("<tool_call> <think>")
    g = fmt.grammar(TOOLS, "required", True, lambda t: False)
    assert "<tool_call>" not in g.lark.replace('"<tool_call>"', "")
    never = lambda t: False  # noqa: E731
    assert grammar_check.match(g, _hermes("get_weather", WA), never)
    assert grammar_check.match(g, "<think>\nhmm\n</think>\n\n" + _hermes("get_weather", WA), never)
    assert not grammar_check.match(g, _hermes("get_weather", BAD), never)


def test_forced_open_reasoning(grammar_check):
    fmt = HermesFormat("<tool_call> <think>")
    g = fmt.grammar(TOOLS, "required", True, is_special, thinking_forced_open=True)
    assert grammar_check.match(g, "hmm\nyes\n</think>\n\n" + _hermes("get_time", TA))
    assert not grammar_check.match(g, _hermes("get_time", TA))
    lazy = fmt.grammar(TOOLS, "auto", True, is_special, thinking_forced_open=True)
    text = "I could use <tool_call> here</think>\n" + _hermes("get_time", TA)
    assert trigger_start(lazy, text) == text.index("</think>\n") + len("</think>\n")


def test_trigger_not_inside_reasoning():
    fmt = HermesFormat("<tool_call> <think>")
    g = fmt.grammar(TOOLS, "auto", True, is_special)
    assert trigger_start(g, "<think>maybe <tool_call> no</think>\nThe answer") is None
    text = "<think>maybe <tool_call> no</think>\nOK " + _hermes("get_time", TA)
    assert trigger_start(g, text) == text.rindex("<tool_call>")


def test_llama_builtin_tools(grammar_check):
    brave = {
        "type": "function",
        "function": {
            "name": "brave_search",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        },
    }
    fmt = Llama3Format("<|start_header_id|>ipython<|end_header_id|> <|python_tag|>")
    g = fmt.grammar([brave, *TOOLS], "auto", True, is_special)
    assert ("word", "<|python_tag|>") in g.triggers
    assert grammar_check.match(g, '<|python_tag|>brave_search.call(query="news")')
    assert not grammar_check.match(g, "<|python_tag|>brave_search.call(query=1)")
    assert fmt.template_kwargs([brave, *TOOLS])["builtin_tools"] == ["brave_search"]
    plain = Llama3Format("<|start_header_id|>ipython<|end_header_id|>")
    assert "builtin_tools" not in plain.template_kwargs([brave])


@pytest.mark.parametrize("parallel", [False, True])
def test_generic(grammar_check, parallel):
    fmt = GenericFormat()
    g = fmt.grammar(TOOLS, "auto", parallel, is_special)
    grammar_check.check(g)
    assert g.triggers == ()
    if parallel:
        weather = '{"tool_calls": [{"name": "get_weather", "arguments": ' + WA + ', "id": "call_1"}]}'
        bad = '{"tool_calls": [{"name": "get_weather", "arguments": ' + BAD + ', "id": "call_1"}]}'
    else:
        weather = '{"tool_call": {"name": "get_weather", "arguments": ' + WA + "}}"
        bad = '{"tool_call": {"name": "get_weather", "arguments": ' + BAD + "}}"
    assert grammar_check.match(g, weather)
    assert not grammar_check.match(g, bad)
    assert grammar_check.match(g, '{"response": "Hello"}')
    required = fmt.grammar(TOOLS, "required", parallel, is_special)
    assert not grammar_check.match(required, '{"response": "Hello"}')
    assert grammar_check.match(required, weather)
    msg = run_pieces(fmt, list(weather))
    assert [(c.name, json.loads(c.arguments)) for c in msg.tool_calls] == [("get_weather", json.loads(WA))]


def test_unknown_named_tool():
    with pytest.raises(ValueError, match="get_nothing"):
        HermesFormat().grammar(
            TOOLS, {"type": "function", "function": {"name": "get_nothing"}}, True, is_special
        )


def test_preserved_tokens():
    g = detect_format("{{ '<tool_call>' }} {\"name\": x}").grammar(TOOLS, "auto", True, is_special)
    assert {"<tool_call>", "</tool_call>"} <= set(g.preserved_tokens)
    assert ChatSyntax("x").reasoning_format == "auto"


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("specials", ["none", "by-text"])
def test_other_vocabularies(grammar_check, name, specials):
    """Tags that are plain text in the vocabulary, and specials named by text instead of by id."""
    from tests.chat.conftest import is_special_by_text

    fn = (lambda t: None) if specials == "none" else is_special_by_text
    fmt, call, _, _, reasoning = FAMILIES[name]
    if specials == "by-text" and name in ("mistral-nemo", "mistral-v11", "magistral"):
        with pytest.raises(ValueError, match="by id"):  # llguidance names only <...> tokens by text
            fmt.grammar(TOOLS, "auto", True, fn)
        return
    for choice in ("auto", "required"):
        g = fmt.grammar(TOOLS, choice, True, fn)
        grammar_check.check(g)
        assert grammar_check.match(g, call("get_weather", WA), fn)
        assert not grammar_check.match(g, call("get_weather", BAD), fn)
    if reasoning is not None:
        assert grammar_check.match(
            fmt.grammar(TOOLS, "required", True, fn), reasoning + call("get_time", TA), fn
        )


# A tool as pydantic writes it: the parameters refer to their own ``$defs`` (and to themselves, ``#``)
PLACE = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "$defs": {
                "Unit": {"enum": ["c", "f"], "type": "string"},
                "Where": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}, "near": {"anyOf": [{"$ref": "#/$defs/Where"}, {"type": "null"}]}},
                    "required": ["city"],
                },
            },
            "properties": {
                "location": {"$ref": "#/$defs/Where"},
                "days": {"$ref": "#/$defs/Unit"},
                "then": {"anyOf": [{"$ref": "#"}, {"type": "null"}]},
            },
            "required": ["location"],
        },
    },
}  # fmt: skip
PLACE_OK = '{"location": {"city": "Paris", "near": {"city": "Orly", "near": null}}, "days": "c"}'
PLACE_NESTED = '{"location": {"city": "Paris"}, "then": {"location": {"city": "Nice"}, "then": null}}'
PLACE_BAD = '{"location": {"city": "Paris", "near": {"city": 5}}, "days": "c"}'


@pytest.mark.parametrize("name", NAMES)
def test_tool_schema_refs(grammar_check, name):
    """Parameters with local ``$ref``s keep their meaning wherever the family puts them (embedded in a
    call object, or one parameter's schema on its own), and the request's tools are left unchanged."""
    fmt, call, _, _, _ = FAMILIES[name]
    before = json.dumps(PLACE)
    g = fmt.grammar([PLACE, TOOLS[1]], "required", True, is_special)
    assert json.dumps(PLACE) == before
    grammar_check.check(g)
    assert grammar_check.match(g, call("get_weather", PLACE_OK))
    assert grammar_check.match(g, call("get_weather", PLACE_NESTED))
    assert not grammar_check.match(g, call("get_weather", PLACE_BAD)), "a bad $defs value accepted"
