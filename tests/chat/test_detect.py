"""Format detection from real templates (as llama.cpp's chat.cpp dispatch maps them)."""

from __future__ import annotations

import pytest

from llamapy.chat import detect_format

# template -> (format with tools, format without tools)
EXPECTED = {
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use": ("command-r7b", "command-r7b"),
    "CohereForAI-c4ai-command-r-plus-tool_use": ("generic", "content-only"),
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use": ("hermes-2-pro", "hermes-2-pro"),
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": ("hermes-2-pro", "hermes-2-pro"),
    "Qwen-Qwen2.5-7B-Instruct": ("hermes-2-pro", "hermes-2-pro"),
    "Qwen-Qwen3-0.6B": ("hermes-2-pro", "hermes-2-pro"),
    "Qwen-QwQ-32B": ("hermes-2-pro", "hermes-2-pro"),
    "Qwen3-Coder": ("qwen3-coder-xml", "qwen3-coder-xml"),
    "Qwen3.5-4B": ("qwen3-coder-xml", "qwen3-coder-xml"),
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": ("qwen3-coder-xml", "qwen3-coder-xml"),
    "StepFun3.5-Flash": ("qwen3-coder-xml", "qwen3-coder-xml"),
    "meta-llama-Llama-3.1-8B-Instruct": ("llama-3.x", "content-only"),
    "meta-llama-Llama-3.2-3B-Instruct": ("llama-3.x", "content-only"),
    "meta-llama-Llama-3.3-70B-Instruct": ("llama-3.x", "content-only"),
    "mistralai-Mistral-Nemo-Instruct-2407": ("mistral-nemo", "content-only"),
    "Mistral-Small-3.2-24B-Instruct-2506": ("mistral-v11", "content-only"),
    "unsloth-mistral-Devstral-Small-2507": ("mistral-v11", "content-only"),
    "mistralai-Ministral-3-14B-Reasoning-2512": ("magistral", "magistral"),
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B": ("deepseek-r1", "deepseek-r1"),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": ("deepseek-r1", "deepseek-r1"),
    "llama-cpp-deepseek-r1": ("deepseek-r1", "deepseek-r1"),
    "deepseek-ai-DeepSeek-V3.1": ("deepseek-v3.1", "deepseek-v3.1"),
    "meetkai-functionary-medium-v3.1": ("functionary-v3.1-llama-3.1", "content-only"),
    "meetkai-functionary-medium-v3.2": ("functionary-v3.2", "functionary-v3.2"),
    "openai-gpt-oss-120b": ("gpt-oss", "gpt-oss"),
    "ibm-granite-granite-3.3-2B-Instruct": ("granite", "granite"),
    "ibm-granite-granite-4.0": ("hermes-2-pro", "hermes-2-pro"),
    "google-gemma-2-2b-it": ("generic", "content-only"),
    "microsoft-Phi-3.5-mini-instruct": ("generic", "content-only"),
    # <tool_call> with another syntax inside (GLM's <arg_key>, MiniMax M3's <invoke>): not Hermes
    "GLM-4.6": ("glm-4.5", "glm-4.5"),
    "inclusionai-ling-3.0-flash": ("glm-4.5", "glm-4.5"),
    "MiniMax-M3": ("minimax-m3", "minimax-m3"),
    "fireworks-ai-llama-3-firefunction-v2": ("generic", "content-only"),
    "muse-glimmer": ("muse-glimmer", "muse-glimmer"),
    "upstage-Solar-Open-100B": ("solar-open", "solar-open"),
    "tencent-Hy3": ("hy3", "hy3"),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_detect_real_templates(templates_dir, name):
    src = (templates_dir / f"{name}.jinja").read_text()
    with_tools, without = EXPECTED[name]
    assert detect_format(src).name == with_tools
    assert detect_format(src, tools_requested=False).name == without


def test_every_template_detects(templates_dir):
    for path in sorted(templates_dir.glob("*.jinja")):
        fmt = detect_format(path.read_text())
        assert fmt.name in {
            "hermes-2-pro", "qwen3-coder-xml", "llama-3.x", "mistral-nemo", "mistral-v11", "magistral",
            "phi-4-mini", "deepseek-r1", "deepseek-v3.1", "command-r7b", "functionary-v3.2",
            "functionary-v3.1-llama-3.1", "gpt-oss", "granite", "generic",
            "gemma4", "glm-4.5", "kimi-k2", "kimi-k3", "deepseek-v3.2", "deepseek-v4", "minimax-m2", "minimax-m3", "lfm2", "seed-oss",
            "nemotron-v2", "apriel", "minimax-m1", "cohere2moe", "minicpm5", "gigachat3",
            "gigachat3.1", "apertus", "muse-glimmer", "solar-open", "hy3",
        }, path.name  # fmt: skip


def test_no_template():
    assert detect_format(None).name == "generic"
    assert detect_format("", tools_requested=False).name == "content-only"


def test_phi4_mini_template():
    from tests.chat.conftest import PHI4_MINI_TEMPLATE

    assert detect_format(PHI4_MINI_TEMPLATE).name == "phi-4-mini"
    assert detect_format(PHI4_MINI_TEMPLATE, tools_requested=False).name == "content-only"


def test_supports_tools():
    assert detect_format("{{ '<tool_call>' }} {\"name\": x}").supports_tools
    assert not detect_format(None, tools_requested=False).supports_tools
