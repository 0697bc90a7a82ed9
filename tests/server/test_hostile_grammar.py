"""Issue 33 §2.1 and the grammar part of §2.9, over a real socket against `python -m llamapy serve` (SmolLM2):
a 700-deep ``$defs`` chain as ``response_format`` and 1000 ``$defs`` to ``/v1/messages/count_tokens``
killed the process (a native stack overflow in llguidance); ``{"$ref": "#"}``, ``$ref`` cycles and
repetition blow-ups were accepted and then failed, or took seconds a token, while sampling. Each is now a 400
in the API's own error shape, answered quickly, and the server still serves the same greedy answer."""

from __future__ import annotations

import time
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.grammar.test_limits import defs_chain

pytestmark = pytest.mark.slow
DEADLINE = 5.0  # seconds; measured ~0.1-0.4 s on this 2-core box (the issue asks < 1 s)
ASK = [{"role": "user", "content": "Say hi"}]


@pytest.fixture(scope="module")
def client(real_server) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=real_server.base_url + "/v1", api_key=real_server.api_key, max_retries=0, timeout=60
    )


@pytest.fixture(scope="module")
def claude(real_server) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=real_server.base_url, api_key=real_server.api_key, max_retries=0, timeout=60
    )


@pytest.fixture(scope="module")
def http(real_server) -> httpx.Client:
    return httpx.Client(
        base_url=real_server.base_url, headers={"Authorization": f"Bearer {real_server.api_key}"}, timeout=60
    )


def _greedy(client: openai.OpenAI) -> str:
    r = client.chat.completions.create(model="x", messages=ASK, max_tokens=6, temperature=0)
    return r.choices[0].message.content or ""


@pytest.fixture(scope="module")
def baseline(client) -> str:
    return _greedy(client)


def _schema_format(schema: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema}}


HOSTILE_SCHEMAS = {
    "defs_chain_700": defs_chain(700),
    "self_ref": {"$ref": "#"},
    "ref_cycle": {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
    "pattern_blowup": {"type": "string", "pattern": "^(x{1000}){1000}$"},
}


@pytest.mark.parametrize("name", list(HOSTILE_SCHEMAS))
def test_hostile_response_format_is_a_quick_400(name, client, real_server, baseline):
    t = time.perf_counter()
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="x", messages=ASK, max_tokens=4, response_format=_schema_format(HOSTILE_SCHEMAS[name])
        )
    elapsed = time.perf_counter() - t
    assert elapsed < DEADLINE, f"{name}: {elapsed:.2f} s"
    err = e.value.body
    assert isinstance(err, dict) and err["type"] == "invalid_request_error", err
    assert err["param"] == "response_format"
    if name == "defs_chain_700":
        assert "limit of 1000" in err["message"]
    assert real_server.proc.poll() is None, "the server process died"
    assert _greedy(client) == baseline


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "a", "n_predict": 4, "grammar": 'root ::= ("a"{1000}){1000}'}, "grammar"),
        ({"prompt": "a", "n_predict": 4, "json_schema": {"$ref": "#"}}, "json_schema"),
        (
            {
                "prompt": "a",
                "n_predict": 4,
                "grammar": "root ::= r0\n"
                + "".join(f'r{i} ::= "a" r{i + 1}\n' for i in range(3800))
                + 'r3800 ::= "b"\n',
            },
            "grammar",
        ),  # fmt: skip
    ],
    ids=["gbnf_repetition", "schema_self_ref", "gbnf_chain_3800"],
)
def test_hostile_completion_grammar_is_a_quick_400(body, param, http, client, real_server, baseline):
    t = time.perf_counter()
    r = http.post("/completion", json=body)
    elapsed = time.perf_counter() - t
    assert r.status_code == 400, r.text
    assert elapsed < DEADLINE, f"{elapsed:.2f} s"
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert real_server.proc.poll() is None
    assert _greedy(client) == baseline


def test_count_tokens_with_1000_defs_is_a_quick_400(claude, http, client, real_server, baseline):
    schema = defs_chain(1000)
    output_config = {"format": {"type": "json_schema", "schema": schema}}
    t = time.perf_counter()
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.count_tokens(model="x", messages=ASK, extra_body={"output_config": output_config})
    elapsed = time.perf_counter() - t
    assert elapsed < DEADLINE, f"{elapsed:.2f} s"
    body = e.value.body
    assert isinstance(body, dict) and body["type"] == "error", body  # Anthropic's shape
    assert body["error"]["type"] == "invalid_request_error" and "limit of 1000" in body["error"]["message"]
    # /v1/messages itself: the same 400, nothing generated
    r = http.post(
        "/v1/messages",
        json={"model": "x", "max_tokens": 4, "messages": ASK, "output_config": output_config},
    )
    assert r.status_code == 400 and r.json()["type"] == "error", r.text
    assert real_server.proc.poll() is None
    assert _greedy(client) == baseline
    assert http.get("/health").status_code == 200


def test_hostile_tool_parameters_are_a_quick_400(client, real_server, baseline):
    """The tool-call grammar embeds each tool's parameters as a JSON schema: the same limits apply."""
    tool = {"type": "function", "function": {"name": "f", "parameters": defs_chain(700)}}
    t = time.perf_counter()
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="x", messages=ASK, max_tokens=4, tools=[tool], tool_choice="required"
        )
    assert time.perf_counter() - t < DEADLINE
    assert e.value.body["param"] == "tools", e.value.body
    assert real_server.proc.poll() is None
    assert _greedy(client) == baseline
