"""plan_chat's render inputs as llama-server's: enable_thinking on where the template reacts to it (off on
request), the date variables for every template, tools undefined without tools; and what the families
read back without tools (the answer's wrappers dropped), on the real templates."""

from __future__ import annotations

import datetime
import json

import pytest

from llamapy.api import chat_request
from llamapy.api.chat_request import ChatRequestError, plan_chat
from llamapy.vocab.chat_template import ChatTemplate
from tests.chat.conftest import TOOLS
from tests.util import shared_path

USER = [{"role": "user", "content": "Hi"}]


def _template(name: str) -> ChatTemplate:
    return ChatTemplate(shared_path("templates", f"{name}.jinja").read_text(), "<s>", "</s>")


def _prompt(name: str, messages: list[dict] = USER, **kw: object) -> str:
    return plan_chat(_template(name), None, messages, **kw).prompt  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "name", ["Qwen-QwQ-32B", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "deepseek-ai-DeepSeek-V3.1"]
)
def test_thinking_on_by_default_where_the_template_reacts(name):
    on = plan_chat(_template(name), None, USER)
    assert on.prompt.endswith("<think>\n") or on.prompt.endswith("<think>")
    assert on.syntax.thinking_forced_open
    off = _prompt(name, chat_template_kwargs={"enable_thinking": False})
    assert off.endswith("</think>")
    assert _prompt(name, reasoning_effort="none") == off
    assert _prompt(name, reasoning=False) == off  # llama-server's --reasoning off
    assert _prompt(name, reasoning=False, chat_template_kwargs={"enable_thinking": True}) == on.prompt


def test_thinking_off_where_the_template_shows_it_elsewhere():
    # Apertus writes "Deliberation: enabled/disabled" in its developer turn; llama.cpp passes false
    assert "Deliberation: disabled" in _prompt("Apertus-8B-Instruct")


def test_enable_thinking_must_be_a_boolean():
    with pytest.raises(ChatRequestError, match="enable_thinking"):
        _prompt("Qwen-QwQ-32B", chat_template_kwargs={"enable_thinking": "false"})


def test_date_variables_for_every_template(monkeypatch):
    context = chat_request.template_context
    monkeypatch.setattr(chat_request, "template_context", lambda: context(datetime.datetime(2025, 3, 14)))
    assert "Today Date: 14 Mar 2025" in _prompt("meta-llama-Llama-3.1-8B-Instruct")  # without tools too
    assert "Today is Mar 14 2025." in _prompt("fireworks-ai-llama-3-firefunction-v2")


@pytest.mark.parametrize(
    "name",
    [
        "CohereForAI-c4ai-command-r-plus-tool_use",
        "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use",
        "NousResearch-Hermes-3-Llama-3.1-8B-tool_use",
    ],
)
def test_templates_looping_over_tools_render_without_tools(name):
    msgs = [{"role": "system", "content": "Be terse, Zed."}, *USER]
    assert "Be terse, Zed." in _prompt(name, msgs)
    assert "Be terse, Zed." in _prompt(name, msgs, tools=TOOLS)


def test_gpt_oss_call_with_content_and_reasoning():
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    msgs = [
        *USER,
        {
            "role": "assistant",
            "content": "Let me check.",
            "reasoning_content": "Need it.",
            "tool_calls": [call],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    prompt = _prompt("openai-gpt-oss-120b", msgs, tools=TOOLS)
    assert "Need it." in prompt and "Let me check." not in prompt  # llama.cpp drops the content


def _parse(name: str, text: str, tools: list | None = None) -> tuple[object, str]:
    plan = plan_chat(_template(name), None, USER, tools=tools)
    parser = plan.format.parser(plan.syntax)
    streamed = "".join(d.content for ch in text for d in parser.feed(ch))
    last, msg = parser.finish()
    return msg, streamed + "".join(d.content for d in last)


@pytest.mark.parametrize(
    ("name", "text", "content"),
    [
        (
            "CohereForAI-c4ai-command-r7b-12-2024-tool_use",
            "<|START_RESPONSE|>It is sunny.<|END_RESPONSE|>",
            "It is sunny.",
        ),
        ("meetkai-functionary-medium-v3.2", "all\nIt is sunny.", "It is sunny."),
    ],
)
def test_answer_wrappers_dropped_without_tools(name, text, content):
    msg, streamed = _parse(name, text)
    assert msg.content == content and streamed == content and not msg.tool_calls


def test_apriel_15_calls_between_tool_calls_tags():
    args = {"location": "Paris"}
    text = (
        'Let me check.\n<tool_calls>[{"name": "get_weather", "arguments": '
        + json.dumps(args)
        + "}]</tool_calls>"
    )
    msg, _ = _parse("unsloth-Apriel-1.5", text, TOOLS)
    assert msg.content == "Let me check.\n"
    assert [(c.name, json.loads(c.arguments)) for c in msg.tool_calls] == [("get_weather", args)]


# -- a last assistant message is continued (llama-server's prefill_assistant, Anthropic's prefill) --

PREFILL = [*USER, {"role": "assistant", "content": "The answer is"}]


def test_last_assistant_message_is_continued():
    closed = _prompt("Qwen-Qwen2.5-7B-Instruct", PREFILL, continue_final_message=False)
    assert closed.endswith("The answer is<|im_end|>\n<|im_start|>assistant\n")
    plan = plan_chat(_template("Qwen-Qwen2.5-7B-Instruct"), None, PREFILL)
    assert plan.prompt == closed[: closed.index("The answer is")] + "The answer is"
    assert not plan.syntax.thinking_forced_open
    # a template with reasoning tags: the reasoning closed first, as llama.cpp's continue_msg
    assert _prompt("Qwen-Qwen3-0.6B", PREFILL).endswith("<|im_start|>assistant\n<think></think>The answer is")
    both = [*USER, {"role": "assistant", "content": "So 4.", "reasoning_content": "2+2"}]
    assert _prompt("Qwen-Qwen3-0.6B", both).endswith("assistant\n<think>2+2</think>So 4.")
    # only reasoning: the answer goes on thinking (the parser reads it as reasoning)
    thinking = [*USER, {"role": "assistant", "content": "", "reasoning_content": "Let me see"}]
    plan = plan_chat(_template("Qwen-Qwen3-0.6B"), None, thinking)
    assert plan.prompt.endswith("assistant\n<think>Let me see") and plan.syntax.thinking_forced_open
    assert _prompt("Qwen-Qwen2.5-7B-Instruct", PREFILL, continue_final_message=True) == _prompt(
        "Qwen-Qwen2.5-7B-Instruct", PREFILL
    )


def test_what_cannot_be_continued():
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    with_call = [*USER, {"role": "assistant", "content": "", "tool_calls": [call]}]
    assert _prompt("Qwen-Qwen2.5-7B-Instruct", with_call) == _prompt(
        "Qwen-Qwen2.5-7B-Instruct", with_call, continue_final_message=False
    )  # (not continued by default)
    with pytest.raises(ChatRequestError, match="tool calls"):
        _prompt("Qwen-Qwen2.5-7B-Instruct", with_call, continue_final_message=True)
    with pytest.raises(ChatRequestError, match="2 or more assistant messages"):
        _prompt("Qwen-Qwen2.5-7B-Instruct", [*PREFILL, {"role": "assistant", "content": "x"}])
    with pytest.raises(ChatRequestError, match="last message"):
        _prompt("Qwen-Qwen2.5-7B-Instruct", USER, continue_final_message=True)
