"""``Llama`` with grammars, ``response_format`` and tools (llama-cpp-python's arguments) on SmolLM2."""

from __future__ import annotations

import json

import jsonschema
import pytest

from llamapy import Llama, LlamaGrammar
from llamapy.grammar import GrammarError
from tests.util import shared_path

pytestmark = pytest.mark.slow

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 16},
        "days": {"type": "integer", "minimum": 1, "maximum": 9},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOL = {
    "type": "function",
    "function": {"name": "plan_trip", "description": "Plan a trip", "parameters": SCHEMA},
}


@pytest.fixture(scope="module")
def llm(smollm2_path):
    return Llama(str(smollm2_path), n_ctx=1024, n_batch=256, verbose=False)


def test_grammar_on_completion_and_call(llm):
    g = LlamaGrammar.from_string('root ::= "colour: " ("red" | "green" | "blue")')
    out = llm("My favourite colour is", grammar=g, max_tokens=10, temperature=0)
    assert out["choices"][0]["text"] in ("colour: red", "colour: green", "colour: blue")
    assert out["choices"][0]["finish_reason"] == "stop"
    text = "".join(
        c["choices"][0]["text"] for c in llm("Pick:", grammar=g, max_tokens=10, stream=True, seed=3)
    )
    assert text.startswith("colour: ")


def test_response_format_json_schema_and_json_object(llm):
    msgs = [{"role": "user", "content": "Plan a trip to Rome."}]
    rf = {"type": "json_schema", "json_schema": {"name": "trip", "schema": SCHEMA}}
    out = llm.create_chat_completion(msgs, response_format=rf, max_tokens=60, temperature=0)
    jsonschema.validate(json.loads(out["choices"][0]["message"]["content"]), SCHEMA)
    out = llm.create_chat_completion(
        msgs, response_format={"type": "json_object", "schema": SCHEMA}, max_tokens=60
    )
    jsonschema.validate(json.loads(out["choices"][0]["message"]["content"]), SCHEMA)
    g = LlamaGrammar.from_json_schema(json.dumps(SCHEMA))
    out = llm.create_chat_completion(msgs, grammar=g, max_tokens=60, temperature=0)
    jsonschema.validate(json.loads(out["choices"][0]["message"]["content"]), SCHEMA)


def test_tools_through_the_hermes_template(llm):
    llm.chat_template = shared_path("templates", "Qwen-Qwen2.5-7B-Instruct.jinja").read_text()
    try:
        msgs = [{"role": "user", "content": "Plan a 3 day trip to Rome."}]
        out = llm.create_chat_completion(
            msgs,
            tools=[TOOL],
            tool_choice="required",
            parallel_tool_calls=False,
            max_tokens=80,
            temperature=0,
        )
        choice = out["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        (call,) = choice["message"]["tool_calls"][:1]
        assert call["type"] == "function" and call["function"]["name"] == "plan_trip" and call["id"]
        jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMA)
        chunks = list(
            llm.create_chat_completion(
                msgs,
                tools=[TOOL],
                tool_choice="required",
                parallel_tool_calls=False,
                max_tokens=80,
                temperature=0,
                stream=True,
            )
        )
        args = "".join(
            tc["function"].get("arguments", "")
            for c in chunks
            for tc in c["choices"][0]["delta"].get("tool_calls", [])
            if tc["index"] == 0
        )
        assert json.loads(args) == json.loads(call["function"]["arguments"])
        assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    finally:
        llm.chat_template = None


def test_bad_grammars_are_refused_before_decoding(llm):
    with pytest.raises(GrammarError, match="nope"):
        LlamaGrammar.from_string("root ::= nope")
    with pytest.raises(GrammarError):
        LlamaGrammar.from_json_schema("{not json")
    with pytest.raises(ValueError, match="not both"):
        llm.create_chat_completion(
            [{"role": "user", "content": "x"}],
            grammar=LlamaGrammar.from_string('root ::= "a"'),
            response_format={"type": "json_object"},
        )
    with pytest.raises(ValueError, match="not in 'tools'"):
        llm.create_chat_completion(
            [{"role": "user", "content": "x"}],
            tools=[TOOL],
            tool_choice={"type": "function", "function": {"name": "other"}},
        )


# ------------------------------------------------------------------------------------ reasoning, on a fake model


def _spelling_llm(text: str):
    """The fake byte-level model of tests/test_api.py, answering ``text`` after the prompt's last '\\n'."""
    from tests.test_api import EOS, FakeModel
    from tests.test_generation import FakeContext, fake_batch

    script = list(text.encode()) + [EOS]

    def rule(history):
        last = max((i for i, t in enumerate(history) if t == ord("\n")), default=-1)
        k = len(history) - 1 - last
        # after the prompt's final newline the model spells the script (its own newlines excepted)
        return script[k] if k < len(script) else EOS

    ctx = FakeContext(258, rule, n_ctx=4096, n_batch=64)
    return Llama._from_parts(FakeModel(), ctx, batch_factory=fake_batch)


QWEN3 = "Qwen-Qwen3-0.6B.jinja"


@pytest.mark.parametrize("reasoning_format", [None, "auto", "deepseek", "none"])
def test_reasoning_content_split_streamed_and_not(reasoning_format):
    llm = _spelling_llm("<think>plan it</think>Paris.")
    llm.chat_template = shared_path("templates", QWEN3).read_text()
    msgs = [{"role": "user", "content": "Capital of France?"}]
    kw = dict(max_tokens=64, temperature=0, reasoning_format=reasoning_format)
    msg = llm.create_chat_completion(msgs, **kw)["choices"][0]["message"]
    chunks = list(llm.create_chat_completion(msgs, stream=True, **kw))
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    reasoning = "".join(c["choices"][0]["delta"].get("reasoning_content") or "" for c in chunks)
    if reasoning_format == "none":
        assert msg["content"] == "<think>plan it</think>Paris." and "reasoning_content" not in msg
        assert content == msg["content"] and reasoning == ""
    else:
        assert msg["content"] == "Paris." and msg["reasoning_content"] == "plan it"
        assert (content, reasoning) == ("Paris.", "plan it")


def test_chat_template_kwargs_reach_the_template():
    llm = _spelling_llm("Paris.")
    llm.chat_template = shared_path("templates", QWEN3).read_text()
    from llamapy.api.chat_request import plan_chat

    msgs = [{"role": "user", "content": "Capital of France?"}]
    on = plan_chat(llm._chat_template(), llm.vocab, msgs)
    off = plan_chat(llm._chat_template(), llm.vocab, msgs, chat_template_kwargs={"enable_thinking": False})
    assert "<think>" not in on.prompt[-40:] and off.prompt.endswith("<think>\n\n</think>\n\n")
    out = llm.create_chat_completion(msgs, chat_template_kwargs={"enable_thinking": False}, max_tokens=16)
    assert out["choices"][0]["message"]["content"] == "Paris."


@pytest.mark.parametrize("template", ["llama-cpp-deepseek-r1.jinja", "Qwen3.5-4B.jinja"])
def test_prompt_ending_inside_think_is_reasoning(template):
    llm = _spelling_llm("still thinking</think>Paris.")
    llm.chat_template = shared_path("templates", template).read_text()
    msgs = [{"role": "user", "content": "Capital of France?"}]
    plan = llm._plan(msgs)
    assert plan.prompt.endswith("<think>\n") and plan.syntax.thinking_forced_open
    msg = llm.create_chat_completion(msgs, max_tokens=64)["choices"][0]["message"]
    assert msg["reasoning_content"] == "still thinking" and msg["content"] == "Paris."


def test_sample_and_generate_take_a_grammar(llm):
    g = LlamaGrammar.from_string('root ::= "42"')
    tokens = llm.tokenize(b"The answer is")
    llm.reset()
    llm.eval(tokens)
    first = llm.sample(grammar=g, temp=0)
    assert llm.detokenize([first]).decode() in ("4", "42")
    out = []
    for t in llm.generate(tokens, grammar=g, temp=0):
        if llm.vocab.is_eog(t) or len(out) > 4:
            break
        out.append(t)
    assert llm.detokenize(out).decode() == "42"
