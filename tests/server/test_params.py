"""Request -> GenParams conversion: limits, logit bias forms, samplers, unsupported features."""

from __future__ import annotations

import math

import pytest

from llamapy.server import params as P
from llamapy.server.errors import APIError
from llamapy.server.schemas import ChatCompletionRequest, CompletionRequest, NativeCompletionRequest, validate
from tests.server.fake_backend import FakeBackend

B = FakeBackend()
MSG = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def gen(model, **body):
    req = validate(model, body)
    return P.gen_params(req, B, P.Defaults(), 128, -1, 2)


def test_sampling_fields_map_to_llama_cpp_names():
    gp = gen(
        ChatCompletionRequest,
        messages=MSG,
        temperature=0.5,
        top_k=7,
        top_p=0.9,
        min_p=0.1,
        presence_penalty=0.5,
        frequency_penalty=0.25,
        repeat_penalty=1.1,
        repeat_last_n=32,
        seed=42,
        stop="\n",
        samplers="kt",
        dry_multiplier=0.8,
        mirostat=2,
    )
    s = gp.sampling
    assert (s.temp, s.top_k, s.top_p, s.min_p, s.seed) == (0.5, 7, 0.9, 0.1, 42)
    assert (s.penalty_present, s.penalty_freq, s.penalty_repeat, s.penalty_last_n) == (0.5, 0.25, 1.1, 32)
    assert (s.samplers, s.dry_multiplier, s.mirostat) == (["top_k", "temperature"], 0.8, 2)
    assert gp.stop == ["\n"]
    defaults = gen(ChatCompletionRequest, messages=MSG).sampling
    assert (defaults.temp, defaults.top_k, defaults.top_p) == (0.8, 40, 0.95)  # llama.cpp's defaults


def test_logit_bias_forms():
    assert P.logit_bias_from({"65": 5}, B) == {65: 5.0}
    assert P.logit_bias_from([[65, -1.5], [66, False]], B) == {65: -1.5, 66: -math.inf}
    assert P.logit_bias_from({"AB": 2}, B) == {65: 2.0, 66: 2.0}  # text keys: each of its tokens
    for bad, msg in [
        ({"999": 1}, "out of range"),
        ({"65": 500}, "between -100 and 100"),
        ([[1, 2, 3]], "pair"),
    ]:
        with pytest.raises(APIError, match=msg):
            P.logit_bias_from(bad, B)


@pytest.mark.parametrize(
    "model, body, fragment",
    [
        (ChatCompletionRequest, {"samplers": ["top_k", "bogus"]}, "unknown sampler"),
        (ChatCompletionRequest, {"grammar_triggers": [{"type": "word", "value": "x"}]}, "not supported yet"),
        (ChatCompletionRequest, {"id_slot": 5}, "does not exist"),
        (ChatCompletionRequest, {"stop": [str(i) for i in range(20)]}, "at most 16"),
        (ChatCompletionRequest, {"repeat_penalty": 0.0}, "penalty_repeat"),
        (CompletionRequest, {"n": 17}, "between 1 and 16"),
        (ChatCompletionRequest, {"n": 0}, "between 1 and 16"),
        (CompletionRequest, {"best_of": 3}, "not supported yet"),
    ],
)
def test_refused(model, body, fragment):
    base = {"messages": MSG} if model is ChatCompletionRequest else {"prompt": "x"}
    with pytest.raises(APIError, match=fragment) as e:
        gen(model, **base, **body)
    assert e.value.status == 400


def test_response_format_text_and_tool_choice_none_are_fine():
    gen(ChatCompletionRequest, messages=MSG, response_format={"type": "text"})
    gen(ChatCompletionRequest, messages=MSG, tools=[{"type": "function"}], tool_choice="none")


def test_max_tokens_limits():
    """As llama-server: -1 is no limit, a limit past the slot's context is clamped to it (clients send
    4096 to 32000 by default), another negative is a 400."""
    assert P.n_predict_from(None, "max_tokens", 128, -1, False) == -1
    assert P.n_predict_from(5, "max_tokens", 128, -1, False) == 5
    assert P.n_predict_from(-1, "max_tokens", 128, 16, False) == -1
    assert P.n_predict_from(32000, "max_tokens", 128, 16, False) == 128
    assert P.n_predict_from(10**9, "n_predict", 128, -1, True) == 128
    assert P.n_predict_from(10**9, "n_predict", 128, -1, True, context_shift=True) == P.MAX_N_PREDICT
    for v, msg in [(0, "at least 1"), (-2, "at least 1")]:
        with pytest.raises(APIError, match=msg):
            P.n_predict_from(v, "max_tokens", 128, -1, False)
    assert P.n_predict_from(-1, "n_predict", 128, -1, True) == -1
    assert P.n_predict_from(0, "n_predict", 128, -1, True) == 0
    with pytest.raises(APIError, match="at least 0"):
        P.n_predict_from(-2, "n_predict", 128, -1, True)


def test_prompts():
    assert P.tokenize_prompt("ab", B) == [256, 97, 98]
    assert P.tokenize_prompt([1, 2], B) == [1, 2]
    assert P.tokenize_prompt(["ab"], B) == [256, 97, 98]
    assert P.tokenize_prompt([[5, 6]], B) == [5, 6]
    assert P.tokenize_prompt([5, "ab"], B) == [5, 97, 98]  # llama.cpp's mixed form
    with pytest.raises(APIError, match="out of range"):
        P.tokenize_prompt([1, 9999], B)
    req = validate(NativeCompletionRequest, {"prompt": [1, "x"]})
    assert P.tokenize_prompt(req.prompt, B) == [1, 120]


def test_several_prompts_follow_llama_servers_rules():
    """tokenize_input_prompts: a list with a number in it is ONE prompt (token ids, or ids and strings);
    a list with no number is one prompt per element."""
    assert P.tokenize_prompts([1, 2], B) == [[1, 2]]
    assert P.tokenize_prompts([5, "ab"], B) == [[5, 97, 98]]
    assert P.tokenize_prompts(["ab", "c"], B) == [[256, 97, 98], [256, 99]]
    assert P.tokenize_prompts([[1, 2], [3]], B) == [[1, 2], [3]]
    assert P.tokenize_prompts(["a", [3, "b"]], B) == [[256, 97], [3, 98]]
    with pytest.raises(APIError, match="at most 16 prompts"):
        P.tokenize_prompts(["a"] * 17, B)
    with pytest.raises(APIError, match=r"prompt\[1\]\[0\]"):
        P.tokenize_prompts(["a", [9999]], B)


def test_integral_floats_are_integers():
    req = validate(ChatCompletionRequest, {"messages": MSG, "max_tokens": 6.0, "top_k": 3.0})
    assert req.max_tokens == 6 and isinstance(req.max_tokens, int) and req.top_k == 3
    with pytest.raises(APIError, match="must be an integer, got 6.5") as e:
        validate(ChatCompletionRequest, {"messages": MSG, "max_tokens": 6.5})
    assert e.value.param == "max_tokens"


def test_an_assistant_message_may_have_null_content():
    msgs = P.messages_to_dicts(
        validate(ChatCompletionRequest, {"messages": [*MSG, {"role": "assistant", "content": None}]}).messages
    )
    assert msgs[-1] == {"role": "assistant", "content": ""}
    with pytest.raises(APIError, match="has no content"):
        P.messages_to_dicts(validate(ChatCompletionRequest, {"messages": [{"role": "user"}]}).messages)


def test_chat_messages():
    req = validate(
        ChatCompletionRequest,
        {
            "messages": [
                {"role": "system", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "user", "content": "q"},
            ]
        },
    )
    text, toks = P.chat_prompt(req, B)
    assert text == "<system>ab\n<user>q\n<assistant>" and toks[0] == 256 and toks[1] != 256
    with pytest.raises(APIError, match="has no content"):
        P.chat_prompt(validate(ChatCompletionRequest, {"messages": [{"role": "user", "content": None}]}), B)


@pytest.mark.parametrize(
    "body, fragment, param",
    [
        ({"grammar": "root ::= foo"}, "invalid grammar", "grammar"),
        (
            {"grammar": 'root ::= "a"', "json_schema": {"type": "object"}},
            "not grammar and json_schema",
            "json_schema",
        ),
        (
            {"json_schema": {"type": "object", "properties": {"a": {"type": "nope"}}}},
            "invalid json_schema",
            "json_schema",
        ),
        ({"response_format": {"type": "json_schema"}}, "json_schema", "response_format"),
        ({"response_format": {"type": "yaml"}}, "not one of text", "response_format"),
        (
            {"response_format": {"type": "json_object"}, "grammar": 'root ::= "a"'},
            "not grammar and response_format",
            "response_format",
        ),
    ],
)
def test_completion_grammar_refusals(body, fragment, param):
    req = validate(CompletionRequest, {"prompt": "x", **body})
    with pytest.raises(APIError, match=fragment) as e:
        P.completion_grammar(req, None)
    assert e.value.status == 400 and e.value.param == param


def test_completion_grammar_kinds():
    assert P.completion_grammar(validate(CompletionRequest, {"prompt": "x"}), None) is None
    text = {"prompt": "x", "response_format": {"type": "text"}}
    assert P.completion_grammar(validate(CompletionRequest, text), None) is None
    g = P.completion_grammar(
        validate(NativeCompletionRequest, {"prompt": "x", "grammar": 'root ::= "a" | "b"'}), None
    )
    assert g.kind == "gbnf"
    g = P.completion_grammar(
        validate(NativeCompletionRequest, {"prompt": "x", "json_schema": {"type": "integer"}}), None
    )
    assert g.kind == "json_schema"


@pytest.mark.parametrize(
    "body, fragment, param",
    [
        ({"tool_choice": "required"}, "no 'tools'", "tool_choice"),
        (
            {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "not in 'tools'",
            "tool_choice",
        ),
        ({"tools": [TOOL], "tool_choice": "sometimes"}, "not auto, none, required", "tool_choice"),
        ({"tools": [{"type": "function", "function": {}}]}, "no 'name'", "tools"),
        ({"tools": [TOOL], "response_format": {"type": "json_object"}}, "cannot be combined", "tools"),
        ({"grammar": 'root ::= "a"', "response_format": {"type": "json_object"}}, "not both", "grammar"),
        ({"reasoning_format": "loud"}, "reasoning_format", "reasoning_format"),
        ({"grammar": "root ::= ( "}, "invalid grammar", "grammar"),
    ],
)
def test_chat_plan_refusals(body, fragment, param):
    req = validate(ChatCompletionRequest, {"messages": MSG, **body})
    with pytest.raises(APIError, match=fragment) as e:
        P.chat_plan(req, B)
    assert e.value.status == 400 and e.value.param == param


def test_chat_plan_tool_choice_none_renders_plain_chat():
    req = validate(ChatCompletionRequest, {"messages": MSG, "tools": [TOOL], "tool_choice": "none"})
    plan = P.chat_plan(req, B)
    assert plan.grammar is None and not plan.syntax.parse_tool_calls
    assert plan.prompt == "<user>hi\n<assistant>"
