"""prepare_messages: a conversation with a tool call and its result renders through each family's real
template (llamapy.vocab.chat_template) and shows both; thinking_forced_open from real prompts."""

from __future__ import annotations

import json

import pytest

from llamapy.chat import detect_format
from llamapy.vocab.chat_template import ChatTemplate
from tests.chat.conftest import PHI4_MINI_TEMPLATE, TOOLS

CALL_ID = "call_abc123"
CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What's the weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "reasoning_content": "The user wants the weather.",
        "tool_calls": [
            {
                "id": CALL_ID,
                "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps({"location": "Paris"})},
            }
        ],
    },
    {"role": "tool", "tool_call_id": CALL_ID, "name": "get_weather", "content": "22 degrees and sunny"},
]

TEMPLATES = {
    "Qwen-Qwen2.5-7B-Instruct": "hermes-2-pro",
    "Qwen-Qwen3-0.6B": "hermes-2-pro",
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use": "hermes-2-pro",
    "Qwen3-Coder": "qwen3-coder-xml",
    "Qwen3.5-4B": "qwen3-coder-xml",
    "meta-llama-Llama-3.1-8B-Instruct": "llama-3.x",
    "meta-llama-Llama-3.2-3B-Instruct": "llama-3.x",
    "meta-llama-Llama-3.3-70B-Instruct": "llama-3.x",
    "mistralai-Mistral-Nemo-Instruct-2407": "mistral-nemo",
    "Mistral-Small-3.2-24B-Instruct-2506": "mistral-v11",
    "unsloth-mistral-Devstral-Small-2507": "mistral-v11",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": "deepseek-r1",
    "llama-cpp-deepseek-r1": "deepseek-r1",
    "deepseek-ai-DeepSeek-V3.1": "deepseek-v3.1",
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use": "command-r7b",
    "meetkai-functionary-medium-v3.2": "functionary-v3.2",
    "meetkai-functionary-medium-v3.1": "functionary-v3.1-llama-3.1",
    "openai-gpt-oss-120b": "gpt-oss",
    "ibm-granite-granite-3.3-2B-Instruct": "granite",
    "google-gemma-2-2b-it": "generic",
    "microsoft-Phi-3.5-mini-instruct": "generic",
}


def _render(source: str, tools=TOOLS, messages=CONVERSATION, **kwargs) -> tuple[str, object]:
    fmt = detect_format(source)
    tmpl = ChatTemplate(source, "<s>", "</s>")
    msgs = fmt.prepare_messages(messages, tools=tools)
    out = tmpl.render(msgs, add_generation_prompt=True, tools=tools, **fmt.template_kwargs(tools), **kwargs)
    return out, fmt


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_renders_call_and_result(templates_dir, name):
    source = (templates_dir / f"{name}.jinja").read_text()
    out, fmt = _render(source)
    assert fmt.name == TEMPLATES[name]
    assert "get_weather" in out
    assert "Paris" in out
    assert "22 degrees and sunny" in out
    assert "What's the weather in Paris?" in out


def test_input_not_changed(templates_dir):
    before = json.dumps(CONVERSATION)
    _render((templates_dir / "mistralai-Mistral-Nemo-Instruct-2407.jinja").read_text())
    _render((templates_dir / "google-gemma-2-2b-it.jinja").read_text())
    _render(PHI4_MINI_TEMPLATE)
    assert json.dumps(CONVERSATION) == before


def test_phi4_mini():
    out, fmt = _render(PHI4_MINI_TEMPLATE)
    assert fmt.name == "phi-4-mini"
    assert out.startswith("<|system|>You are a helpful assistant.<|tool|>[")
    assert '<|tool_call|>[{"name": "get_weather", "arguments": {"location": "Paris"}}]<|/tool_call|>' in out
    assert "22 degrees and sunny" in out


def test_generic_describes_tools(templates_dir):
    out, _ = _render((templates_dir / "google-gemma-2-2b-it.jinja").read_text())
    assert "Respond in JSON format" in out
    assert '"tool_calls"' in out and '"tool_response"' in out
    assert '"description": "The time in a time zone."' in out  # the tool list itself


def test_mistral_ids(templates_dir):
    out, _ = _render((templates_dir / "mistralai-Mistral-Nemo-Instruct-2407.jinja").read_text())
    from llamapy.chat.mistral import mistral_id

    short = mistral_id(CALL_ID)
    assert len(short) == 9 and short.isalnum()
    assert f'"id": "{short}"' in out and f'"call_id": "{short}"' in out


def test_command_r7b_tool_plan(templates_dir):
    fmt = detect_format((templates_dir / "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja").read_text())
    msgs = fmt.prepare_messages(CONVERSATION, tools=TOOLS)
    assert msgs[2]["tool_plan"] == "The user wants the weather."
    out, _ = _render((templates_dir / "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja").read_text())
    assert "<|START_THINKING|>The user wants the weather.<|END_THINKING|>" in out


def test_gpt_oss_thinking(templates_dir):
    fmt = detect_format((templates_dir / "openai-gpt-oss-120b.jinja").read_text())
    assert fmt.prepare_messages(CONVERSATION)[2]["thinking"] == "The user wants the weather."


USER = [{"role": "user", "content": "Hi"}]


@pytest.mark.parametrize(
    ("name", "kwargs", "expected"),
    [
        ("Qwen-QwQ-32B", {"enable_thinking": True}, True),
        ("Qwen-Qwen3-0.6B", {"enable_thinking": False}, False),
        ("Qwen-Qwen3-0.6B", {}, False),
        ("llama-cpp-deepseek-r1", {}, True),
        ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", {"enable_thinking": True}, True),
        ("deepseek-ai-DeepSeek-V3.1", {"thinking": True}, True),
        ("deepseek-ai-DeepSeek-V3.1", {"thinking": False}, False),
        ("CohereForAI-c4ai-command-r7b-12-2024-tool_use", {}, False),
        ("meta-llama-Llama-3.2-3B-Instruct", {}, False),
    ],
)
def test_thinking_forced_open(templates_dir, name, kwargs, expected):
    source = (templates_dir / f"{name}.jinja").read_text()
    prompt, fmt = _render(source, tools=None, messages=USER, **kwargs)
    assert fmt.thinking_forced_open(prompt) is expected


def test_forced_open_r7b():
    fmt = detect_format("<|END_THINKING|><|START_ACTION|>")
    assert fmt.thinking_forced_open("<|CHATBOT_TOKEN|><|START_THINKING|>")
    assert not fmt.thinking_forced_open("<|START_THINKING|><|END_THINKING|>")
