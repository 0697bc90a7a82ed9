"""The server's reasoning defaults (llama-server's ``--reasoning``, ``--reasoning-format``,
``--chat-template-kwargs``) and the request fields over them (``reasoning_effort``, ``chat_template_kwargs``,
the Responses API's ``reasoning.effort``, Anthropic's ``thinking``). Fake model with a template that shows
``enable_thinking`` and ``reasoning_effort`` in its generation prompt, real socket."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from llamapy.server.app import ServerSettings
from llamapy.server.params import Defaults, chat_plan
from llamapy.server.schemas import ChatCompletionRequest, validate
from tests.server.conftest import LiveServer, start_live, stop_live, wait_ready
from tests.server.fake_backend import FakeBackend

THINKING_TEMPLATE = (
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% if enable_thinking %}<think>{% else %}<nothink>{% endif %}"
    "{% if reasoning_effort is defined %}[{{ reasoning_effort }}]{% endif %}{{ style | default('') }}{% endif %}"
)
MSGS = [{"role": "user", "content": "hi"}]


class ThinkingBackend(FakeBackend):
    @property
    def chat_template(self):
        from llamapy.vocab.chat_template import ChatTemplate

        return ChatTemplate(THINKING_TEMPLATE, "<s>", "</s>", name="thinking template")


def _server(defaults: Defaults) -> tuple[LiveServer, object]:
    settings = ServerSettings(model_path="/models/fake.gguf", defaults=defaults, warmup=False)
    srv, thread = start_live(settings, ThinkingBackend(n_ctx=512, n_seq_max=2, n_batch=64))
    wait_ready(srv.base_url)
    return srv, thread


@pytest.fixture(scope="module")
def auto() -> Iterator[LiveServer]:
    srv, thread = _server(Defaults())
    yield srv
    stop_live(srv, thread)


@pytest.fixture(scope="module")
def off() -> Iterator[LiveServer]:
    from llamapy.cli import build_parser
    from llamapy.cli.serve import server_settings

    argv = ["serve", "--reasoning", "off", "--chat-template-kwargs", '{"style": "S"}']
    srv, thread = _server(server_settings(build_parser("serve").parse_args(argv), "m.gguf", []).defaults)
    yield srv
    stop_live(srv, thread)


def generation_prompt(live: LiveServer, **body) -> str:
    r = httpx.post(live.base_url + "/apply-template", json={"messages": MSGS, **body}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["prompt"].split("<assistant>")[1]


def test_reasoning_on_where_the_template_has_a_switch(auto):
    assert generation_prompt(auto) == "<think>"
    assert generation_prompt(auto, reasoning_effort="none") == "<nothink>"
    assert generation_prompt(auto, reasoning_effort="high") == "<think>[high]"
    assert generation_prompt(auto, chat_template_kwargs={"enable_thinking": False}) == "<nothink>"


def test_reasoning_off_and_template_kwargs_from_the_command_line(off):
    assert generation_prompt(off) == "<nothink>S"
    assert generation_prompt(off, chat_template_kwargs={"enable_thinking": True}) == "<think>S"
    assert generation_prompt(off, chat_template_kwargs={"style": "T"}) == "<nothink>T"


def test_chat_completion_reasoning_effort_reaches_the_template(auto):
    url = auto.base_url + "/v1/chat/completions/input_tokens"
    counts = {}
    for effort in (None, "none", "high"):
        body = {"messages": MSGS} | ({"reasoning_effort": effort} if effort else {})
        r = httpx.post(url, json=body, timeout=30)
        assert r.status_code == 200, r.text
        counts[effort] = r.json()["input_tokens"]
    # the fake tokenizer is one token a byte: "<think>", "<nothink>", "<think>[high]"
    assert counts["none"] - counts[None] == 2 and counts["high"] - counts[None] == 6


def test_responses_effort_and_anthropic_thinking_over_the_defaults(off):
    def responses(effort: str) -> int:
        body = {"input": "hi", "reasoning": {"effort": effort}}
        r = httpx.post(off.base_url + "/v1/responses/input_tokens", json=body, timeout=30)
        assert r.status_code == 200, r.text
        return r.json()["input_tokens"]

    def anthropic(kind: str) -> int:
        thinking = {"type": kind} | ({"budget_tokens": 1024} if kind == "enabled" else {})
        body = {"model": "m", "messages": MSGS, "thinking": thinking}
        r = httpx.post(off.base_url + "/v1/messages/count_tokens", json=body, timeout=30)
        assert r.status_code == 200, r.text
        return r.json()["input_tokens"]

    # "none": llama-server's off (was left to the default); "low": the template's reasoning_effort
    assert responses("low") - responses("none") == len("[low]")
    assert anthropic("disabled") - anthropic("enabled") == len("<nothink>") - len("<think>")


def test_reasoning_format_default_and_the_request_over_it():
    backend = ThinkingBackend()
    req = validate(ChatCompletionRequest, {"messages": MSGS})
    assert chat_plan(req, backend).syntax.reasoning_format == "auto"
    assert chat_plan(req, backend, Defaults(reasoning_format="none")).syntax.reasoning_format == "none"
    req = validate(ChatCompletionRequest, {"messages": MSGS, "reasoning_format": "deepseek"})
    assert chat_plan(req, backend, Defaults(reasoning_format="none")).syntax.reasoning_format == "deepseek"


def test_thinking_budget_0_is_thinking_off_and_another_a_400(auto):
    url = auto.base_url + "/v1/chat/completions/input_tokens"

    def count(**body) -> int:
        r = httpx.post(url, json={"messages": MSGS, **body}, timeout=30)
        assert r.status_code == 200, r.text
        return r.json()["input_tokens"]

    base = count()
    assert count(reasoning_budget_tokens=-1) == base
    for name in ("reasoning_budget_tokens", "thinking_budget_tokens"):  # "<nothink>" for "<think>"
        assert count(**{name: 0}) - base == 2
        assert count(**{name: 0, "chat_template_kwargs": {"enable_thinking": True}}) - base == 2
        for value in (256, -2):
            body = {"messages": MSGS, "max_tokens": 2, name: value}
            r = httpx.post(auto.base_url + "/v1/chat/completions", json=body, timeout=30)
            assert r.status_code == 400 and r.json()["error"]["param"] == name, r.text
