"""Differential check of `llamapy serve` against llama.cpp's `llama-server` on the same model: where would a
client written for llama-server break on llamapy?

A diagnostic, not a test. It starts both servers on free ports (same context size, ``-t 1``, one slot,
``--metrics``; llama-server also ``--jinja --slots``), sends every case (health, props, models, slots,
metrics, /completion with its options, /v1/completions, /v1/chat/completions, tokenize/detokenize,
apply-template, infill, Anthropic /v1/messages, /v1/responses, token counting, error cases) to both, one
request at a time, greedy (temperature 0, fixed seed, few tokens), and compares the response STRUCTURE,
not the generated text: status code, media type, the JSON key set recursively, value types (int vs
float reported apart), the values of enum-like keys (object, finish_reason, stop_type, type, role...)
and of prompt/usage token counts, id formats, and for streams the SSE event sequence (first event,
merged middle events, last event, ``event:`` names, ``[DONE]``). ``--embeddings`` adds a second pair of
servers started with ``--embeddings`` for /embedding(s), /v1/embeddings and /rerank.

    python benchmarks/server_vs_llamacpp.py [-m MODEL] [--bin DIR] [-c 2048] [--embeddings]
        [--only SUBSTR] [--out /tmp/srvdiff/results.json]

Prints, per case: ``same`` or ``differs`` with the path of each differing key (``lc`` = llama-server,
``py`` = llamapy), then totals per endpoint. Exit status 0 whether or not differences were found.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import time  # noqa: E402
from collections import OrderedDict  # noqa: E402
from typing import Any  # noqa: E402

import httpx  # noqa: E402

from benchmarks.harness import MODELS_DIR, exit_on_sigterm, llamacpp_bin, start_server  # noqa: E402

DEFAULT_MODEL = MODELS_DIR / "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT = "The capital of France is"
G = {"temperature": 0, "seed": 42}  # greedy
ENUM_KEYS = {"object", "finish_reason", "stop_type", "type", "role", "stop_reason", "status", "owned_by",
             "truncated", "stop", "has_next_token", "is_processing", "event", "tool_choice"}  # fmt: skip
COUNT_KEYS = {"tokens_evaluated", "prompt_tokens", "input_tokens", "n_prompt_tokens", "total_tokens",
              "tokens_predicted", "completion_tokens", "output_tokens", "prompt_n", "predicted_n",
              "n_ctx", "total_slots", "n_probs", "n_predict", "max_tokens", "total"}  # fmt: skip
ID_KEYS = {"id", "system_fingerprint", "call_id", "item_id", "response_id"}


# --- the cases ---------------------------------------------------------------------------------------


def cases(ids: list[int], long_prompt: str) -> list[tuple[str, str, str, Any]]:
    """(name, method, path, body): body None (no body), a dict/list (JSON), or bytes (sent raw)."""
    cmp = {"prompt": PROMPT, "n_predict": 6, **G}
    oai = {"model": "m", "prompt": PROMPT, "max_tokens": 6, **G}
    msgs = [{"role": "user", "content": "Say hello."}]
    chat = {"model": "m", "messages": msgs, "max_tokens": 6, **G}
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    tool = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}  # fmt: skip
    anth = {"model": "m", "max_tokens": 6, "messages": msgs, **G}
    resp = {"model": "m", "input": "Say hello.", "max_output_tokens": 16, **G}
    c: list[tuple[str, str, str, Any]] = [
        ("health", "GET", "/health", None),
        ("v1 health", "GET", "/v1/health", None),
        ("props GET", "GET", "/props", None),
        ("props POST", "POST", "/props", {"n_ctx": 1024}),
        ("models", "GET", "/models", None),
        ("v1 models", "GET", "/v1/models", None),
        ("slots", "GET", "/slots", None),
        ("slots fail_on_no_slot", "GET", "/slots?fail_on_no_slot=1", None),
        ("metrics", "GET", "/metrics", None),
        ("lora-adapters", "GET", "/lora-adapters", None),
        # /completion
        ("completion", "POST", "/completion", cmp),
        ("completions alias", "POST", "/completions", cmp),
        ("completion stream", "POST", "/completion", {**cmp, "stream": True}),
        ("completion token ids", "POST", "/completion", {**cmp, "prompt": ids}),
        ("completion mixed", "POST", "/completion", {**cmp, "prompt": [ids[0], " capital", *ids[2:]]}),
        ("completion multi", "POST", "/completion", {**cmp, "prompt": [PROMPT, "Hello, my name is"]}),
        ("completion multi stream", "POST", "/completion", {**cmp, "prompt": [PROMPT, "Hi"], "stream": True}),
        ("completion n_probs", "POST", "/completion", {**cmp, "n_probs": 3}),
        ("completion n_probs stream", "POST", "/completion", {**cmp, "n_probs": 2, "stream": True}),
        (
            "completion post_sampling_probs",
            "POST",
            "/completion",
            {**cmp, "n_probs": 2, "post_sampling_probs": True},
        ),
        ("completion return_tokens", "POST", "/completion", {**cmp, "return_tokens": True}),
        ("completion cache_prompt false", "POST", "/completion", {**cmp, "cache_prompt": False}),
        ("completion stop", "POST", "/completion", {**cmp, "n_predict": 20, "stop": [" ", "\n"]}),
        ("completion grammar", "POST", "/completion", {**cmp, "grammar": 'root ::= "yes" | "no"'}),
        ("completion json_schema", "POST", "/completion", {**cmp, "n_predict": 12, "json_schema": schema}),
        (
            "completion response_fields",
            "POST",
            "/completion",
            {**cmp, "response_fields": ["content", "generation_settings/n_predict", "nope"]},
        ),
        ("completion id_slot", "POST", "/completion", {**cmp, "id_slot": 0}),
        (
            "completion logit_bias pairs",
            "POST",
            "/completion",
            {**cmp, "logit_bias": [[ids[-1], False], ["Paris", -5]]},
        ),
        ("completion logit_bias object", "POST", "/completion", {**cmp, "logit_bias": {str(ids[-1]): -100}}),
        ("completion samplers list", "POST", "/completion", {**cmp, "samplers": ["top_k", "temperature"]}),
        ("completion samplers string", "POST", "/completion", {**cmp, "samplers": "kt"}),
        (
            "completion timings_per_token",
            "POST",
            "/completion",
            {**cmp, "timings_per_token": True, "stream": True},
        ),
        (
            "completion return_progress",
            "POST",
            "/completion",
            {**cmp, "return_progress": True, "stream": True},
        ),
        ("completion n_predict 0", "POST", "/completion", {**cmp, "n_predict": 0}),
        (
            "completion n_predict -2",
            "POST",
            "/completion",
            {**cmp, "n_predict": -2, "grammar": 'root ::= "yes"'},
        ),
        (
            "completion n_predict huge",
            "POST",
            "/completion",
            {**cmp, "n_predict": 10**9, "grammar": 'root ::= "yes"'},
        ),
        ("completion n_cmpl", "POST", "/completion", {**cmp, "n_cmpl": 2}),
        ("completion ignore_eos", "POST", "/completion", {**cmp, "ignore_eos": True}),
        # /v1/completions
        ("v1 completions", "POST", "/v1/completions", oai),
        ("v1 completions stream", "POST", "/v1/completions", {**oai, "stream": True}),
        (
            "v1 completions stream usage",
            "POST",
            "/v1/completions",
            {**oai, "stream": True, "stream_options": {"include_usage": True}},
        ),
        ("v1 completions logprobs", "POST", "/v1/completions", {**oai, "logprobs": 2}),
        ("v1 completions logprobs stream", "POST", "/v1/completions", {**oai, "logprobs": 2, "stream": True}),
        ("v1 completions echo", "POST", "/v1/completions", {**oai, "echo": True}),
        ("v1 completions n", "POST", "/v1/completions", {**oai, "n": 2}),
        ("v1 completions multi prompt", "POST", "/v1/completions", {**oai, "prompt": [PROMPT, "Hi"]}),
        ("v1 completions stop", "POST", "/v1/completions", {**oai, "max_tokens": 20, "stop": "\n"}),
        ("v1 completions token ids", "POST", "/v1/completions", {**oai, "prompt": ids}),
        (
            "v1 completions max_tokens > ctx",
            "POST",
            "/v1/completions",
            {**oai, "max_tokens": 4096, "stop": [" ", "\n", "."]},
        ),
        (
            "v1 completions no max_tokens",
            "POST",
            "/v1/completions",
            {k: v for k, v in {**oai, "stop": [" ", "\n", "."]}.items() if k != "max_tokens"},
        ),
        (
            "v1 completions default max_tokens",
            "POST",
            "/v1/completions",
            {k: v for k, v in oai.items() if k != "max_tokens"},
        ),
        (
            "completion stream return_tokens",
            "POST",
            "/completion",
            {**cmp, "stream": True, "return_tokens": True},
        ),
        ("v1 completions suffix", "POST", "/v1/completions", {**oai, "suffix": "!"}),
        # /v1/chat/completions
        ("chat", "POST", "/v1/chat/completions", chat),
        ("chat no v1", "POST", "/chat/completions", chat),
        ("chat stream", "POST", "/v1/chat/completions", {**chat, "stream": True}),
        (
            "chat stream usage",
            "POST",
            "/v1/chat/completions",
            {**chat, "stream": True, "stream_options": {"include_usage": True}},
        ),
        ("chat logprobs", "POST", "/v1/chat/completions", {**chat, "logprobs": True, "top_logprobs": 2}),
        (
            "chat logprobs stream",
            "POST",
            "/v1/chat/completions",
            {**chat, "logprobs": True, "top_logprobs": 2, "stream": True},
        ),
        (
            "chat json_object",
            "POST",
            "/v1/chat/completions",
            {**chat, "max_tokens": 10, "response_format": {"type": "json_object"}},
        ),
        (
            "chat json_schema",
            "POST",
            "/v1/chat/completions",
            {
                **chat,
                "max_tokens": 10,
                "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
            },
        ),
        (
            "chat tools auto",
            "POST",
            "/v1/chat/completions",
            {**chat, "max_tokens": 24, "tools": [tool], "tool_choice": "auto"},
        ),
        (
            "chat tools required",
            "POST",
            "/v1/chat/completions",
            {**chat, "max_tokens": 24, "tools": [tool], "tool_choice": "required"},
        ),
        (
            "chat tools stream",
            "POST",
            "/v1/chat/completions",
            {**chat, "max_tokens": 24, "tools": [tool], "tool_choice": "required", "stream": True},
        ),
        (
            "chat tool result turn",
            "POST",
            "/v1/chat/completions",
            {
                **chat,
                "tools": [tool],
                "messages": [
                    *msgs,
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "call_1",
                                "type": "function",
                                "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                            }
                        ],
                    },
                    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
                ],
            },
        ),  # fmt: skip
        ("chat n", "POST", "/v1/chat/completions", {**chat, "n": 2}),
        (
            "chat max_completion_tokens",
            "POST",
            "/v1/chat/completions",
            {k: v for k, v in {**chat, "max_completion_tokens": 5}.items() if k != "max_tokens"},
        ),
        (
            "chat reasoning_format",
            "POST",
            "/v1/chat/completions",
            {**chat, "reasoning_format": "deepseek", "chat_template_kwargs": {"enable_thinking": True}},
        ),
        (
            "chat content parts",
            "POST",
            "/v1/chat/completions",
            {**chat, "messages": [{"role": "user", "content": [{"type": "text", "text": "Say hello."}]}]},
        ),
        ("chat stop", "POST", "/v1/chat/completions", {**chat, "max_tokens": 20, "stop": ["!", "."]}),
        (
            "chat timings_per_token stream",
            "POST",
            "/v1/chat/completions",
            {**chat, "stream": True, "timings_per_token": True},
        ),
        ("chat input_tokens", "POST", "/v1/chat/completions/input_tokens", {"model": "m", "messages": msgs}),
        (
            "chat nulls",
            "POST",
            "/v1/chat/completions",
            {
                **chat,
                **dict.fromkeys(
                    (
                        "stop",
                        "tools",
                        "tool_choice",
                        "response_format",
                        "logprobs",
                        "top_logprobs",
                        "n",
                        "stream_options",
                        "user",
                        "frequency_penalty",
                        "presence_penalty",
                        "top_p",
                        "logit_bias",
                        "parallel_tool_calls",
                    )
                ),
            },
        ),  # fmt: skip
        ("chat max_tokens float", "POST", "/v1/chat/completions", {**chat, "max_tokens": 6.0}),
        ("chat temperature int", "POST", "/v1/chat/completions", {**chat, "temperature": 0, "top_p": 1}),
        (
            "chat max_tokens > ctx",
            "POST",
            "/v1/chat/completions",
            {
                **chat,
                "max_tokens": 4096,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"enum": ["yes"]}},
                },
            },
        ),  # fmt: skip
        (
            "chat max_tokens -1",
            "POST",
            "/v1/chat/completions",
            {
                **chat,
                "max_tokens": -1,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"enum": ["yes"]}},
                },
            },
        ),  # fmt: skip
        ("chat no model", "POST", "/v1/chat/completions", {k: v for k, v in chat.items() if k != "model"}),
        (
            "chat developer role",
            "POST",
            "/v1/chat/completions",
            {**chat, "messages": [{"role": "developer", "content": "Be brief."}, *msgs]},
        ),
        (
            "chat message name",
            "POST",
            "/v1/chat/completions",
            {**chat, "messages": [{"role": "user", "name": "bob", "content": "Say hello."}]},
        ),
        (
            "chat assistant null content",
            "POST",
            "/v1/chat/completions",
            {
                **chat,
                "messages": [
                    *msgs,
                    {"role": "assistant", "content": None},
                    {"role": "user", "content": "Again."},
                ],
            },
        ),
        ("chat stop string", "POST", "/v1/chat/completions", {**chat, "stop": "!"}),
        (
            "chat logit_bias object",
            "POST",
            "/v1/chat/completions",
            {**chat, "logit_bias": {str(ids[-1]): -100}},
        ),
        ("chat top_logprobs without logprobs", "POST", "/v1/chat/completions", {**chat, "top_logprobs": 2}),
        (
            "chat response_format text",
            "POST",
            "/v1/chat/completions",
            {**chat, "response_format": {"type": "text"}},
        ),
        (
            "chat tool_choice named",
            "POST",
            "/v1/chat/completions",
            {
                **chat,
                "max_tokens": 24,
                "tools": [tool],
                "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            },
        ),  # fmt: skip
        (
            "chat parallel_tool_calls",
            "POST",
            "/v1/chat/completions",
            {**chat, "tools": [tool], "parallel_tool_calls": True},
        ),
        ("chat reasoning_effort", "POST", "/v1/chat/completions", {**chat, "reasoning_effort": "low"}),
        (
            "chat n_predict (llama.cpp field)",
            "POST",
            "/v1/chat/completions",
            {k: v for k, v in {**chat, "n_predict": 4}.items() if k != "max_tokens"},
        ),
        (
            "chat grammar (llama.cpp field)",
            "POST",
            "/v1/chat/completions",
            {**chat, "grammar": 'root ::= "yes"'},
        ),
        ("chat stream n=2", "POST", "/v1/chat/completions", {**chat, "n": 2, "stream": True}),
        (
            "chat stream stop",
            "POST",
            "/v1/chat/completions",
            {**chat, "max_tokens": 20, "stop": ["!", "."], "stream": True},
        ),
        (
            "chat stream json_schema",
            "POST",
            "/v1/chat/completions",
            {
                **chat,
                "stream": True,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"enum": ["yes"]}},
                },
            },
        ),  # fmt: skip
        # tokenizer, templates, infill
        ("tokenize", "POST", "/tokenize", {"content": "Hello world"}),
        ("tokenize with_pieces", "POST", "/tokenize", {"content": "Hello wörld", "with_pieces": True}),
        ("tokenize add_special", "POST", "/tokenize", {"content": "Hello", "add_special": True}),
        ("tokenize parse_special", "POST", "/tokenize", {"content": "<|im_start|>hi", "parse_special": True}),
        (
            "tokenize no parse_special",
            "POST",
            "/tokenize",
            {"content": "<|im_start|>hi", "parse_special": False},
        ),
        ("detokenize", "POST", "/detokenize", {"tokens": ids}),
        ("detokenize empty", "POST", "/detokenize", {"tokens": []}),
        ("apply-template", "POST", "/apply-template", {"messages": msgs}),
        (
            "infill",
            "POST",
            "/infill",
            {"input_prefix": "def add(a, b):\n    return ", "input_suffix": "\n", "n_predict": 4, **G},
        ),
        # Anthropic, Responses
        ("messages", "POST", "/v1/messages", anth),
        ("messages system", "POST", "/v1/messages", {**anth, "system": "Be brief."}),
        ("messages stream", "POST", "/v1/messages", {**anth, "stream": True}),
        (
            "messages tools",
            "POST",
            "/v1/messages",
            {
                **anth,
                "max_tokens": 24,
                "tool_choice": {"type": "any"},
                "tools": [
                    {
                        "name": "get_weather",
                        "description": "Weather",
                        "input_schema": tool["function"]["parameters"],
                    }
                ],
            },
        ),  # fmt: skip
        (
            "messages max_tokens > ctx",
            "POST",
            "/v1/messages",
            {**anth, "max_tokens": 32000, "stop_sequences": ["!", "."]},
        ),
        ("messages count_tokens", "POST", "/v1/messages/count_tokens", {"model": "m", "messages": msgs}),
        ("messages no max_tokens", "POST", "/v1/messages", {"model": "m", "messages": msgs}),
        ("responses", "POST", "/v1/responses", resp),
        ("responses stream", "POST", "/v1/responses", {**resp, "stream": True}),
        (
            "responses input_tokens",
            "POST",
            "/v1/responses/input_tokens",
            {"model": "m", "input": "Say hello."},
        ),
        # errors
        ("err malformed json completion", "POST", "/completion", b'{"prompt": "x",'),
        ("err malformed json chat", "POST", "/v1/chat/completions", b"{not json"),
        ("err missing prompt", "POST", "/completion", {"n_predict": 4}),
        ("err prompt wrong type", "POST", "/completion", {"prompt": {"a": 1}, "n_predict": 4}),
        ("err n_predict wrong type", "POST", "/completion", {**cmp, "n_predict": "six"}),
        ("err temperature wrong type", "POST", "/v1/chat/completions", {**chat, "temperature": "hot"}),
        ("unknown field", "POST", "/completion", {**cmp, "frobnicate": 1}),
        ("err messages missing", "POST", "/v1/chat/completions", {"model": "m", "max_tokens": 4}),
        ("err messages empty", "POST", "/v1/chat/completions", {**chat, "messages": []}),
        ("err messages not list", "POST", "/v1/chat/completions", {**chat, "messages": "hi"}),
        (
            "err bad role",
            "POST",
            "/v1/chat/completions",
            {**chat, "messages": [{"role": "wizard", "content": "hi"}]},
        ),
        ("err prompt too long", "POST", "/completion", {**cmp, "prompt": long_prompt}),
        (
            "err chat too long",
            "POST",
            "/v1/chat/completions",
            {**chat, "messages": [{"role": "user", "content": long_prompt}]},
        ),
        ("err prompt too long stream", "POST", "/completion", {**cmp, "prompt": long_prompt, "stream": True}),
        ("err n too many", "POST", "/v1/chat/completions", {**chat, "n": 1000}),
        ("err bad grammar", "POST", "/completion", {**cmp, "grammar": "root ::= ("}),
        ("err bad json_schema", "POST", "/completion", {**cmp, "json_schema": {"type": "nonsense"}}),
        (
            "err response_format bad",
            "POST",
            "/v1/chat/completions",
            {**chat, "response_format": {"type": "xml"}},
        ),
        ("err detokenize bad id", "POST", "/detokenize", {"tokens": [10**8]}),
        ("err tokenize missing content", "POST", "/tokenize", {}),
        ("err id_slot bad", "POST", "/completion", {**cmp, "id_slot": 99}),
        ("err empty body", "POST", "/completion", b""),
        ("err embeddings off", "POST", "/v1/embeddings", {"model": "m", "input": "hi"}),
        ("err unknown endpoint GET", "GET", "/nope", None),
        ("err unknown endpoint POST", "POST", "/v1/nope", {"a": 1}),
        ("err wrong method GET completion", "GET", "/completion", None),
        ("err wrong method GET chat", "GET", "/v1/chat/completions", None),
        ("err wrong method POST health", "POST", "/health", {}),
        ("err messages empty anthropic", "POST", "/v1/messages", {**anth, "messages": []}),
        ("err slot action no path", "POST", "/slots/0?action=save", {"filename": "x.bin"}),
    ]
    return c


def key_cases() -> list[tuple[str, str, str, Any]]:
    """Run against servers started with ``--api-key secret``; the client sends no key unless the path says so."""
    return [
        ("key health (public)", "GET", "/health", None),
        ("key models without key", "GET", "/v1/models", None),
        (
            "key chat without key",
            "POST",
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
        ),
        (
            "key chat wrong key",
            "POST",
            "/v1/chat/completions#Bearer wrong",
            {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
        ),
        (
            "key chat right key",
            "POST",
            "/v1/chat/completions#Bearer secret",
            {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, **G},
        ),
        (
            "key anthropic x-api-key",
            "POST",
            "/v1/messages#x-api-key secret",
            {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}], **G},
        ),
        ("key props without key", "GET", "/props", None),
    ]


def emb_cases() -> list[tuple[str, str, str, Any]]:
    return [
        ("embedding", "POST", "/embedding", {"content": "Hello world"}),
        ("embeddings", "POST", "/embeddings", {"content": "Hello world"}),
        ("embeddings list", "POST", "/embeddings", {"content": ["Hello", "world"]}),
        ("v1 embeddings", "POST", "/v1/embeddings", {"model": "m", "input": "Hello world"}),
        ("v1 embeddings list", "POST", "/v1/embeddings", {"model": "m", "input": ["Hello", "world"]}),
        (
            "v1 embeddings base64",
            "POST",
            "/v1/embeddings",
            {"model": "m", "input": "Hi", "encoding_format": "base64"},
        ),
        ("v1 embeddings tokens", "POST", "/v1/embeddings", {"model": "m", "input": [1, 2, 3]}),
        ("err v1 embeddings empty", "POST", "/v1/embeddings", {"model": "m", "input": ""}),
        ("err v1 embeddings missing", "POST", "/v1/embeddings", {"model": "m"}),
        ("err completion in embeddings mode", "POST", "/completion", {"prompt": "hi", "n_predict": 2}),
        ("rerank (no rank pooling)", "POST", "/v1/rerank", {"query": "a", "documents": ["a", "b"]}),
        ("props embeddings", "GET", "/props", None),
    ]


# --- one response, normalized ----------------------------------------------------------------------


def parse_sse(text: str) -> dict:
    events: list[dict] = []
    for block in re.split(r"\r?\n\r?\n", text):
        name, data = None, []
        for line in block.splitlines():
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip(" "))
            elif line.startswith(":"):
                name = name or "(comment)"
        if not data and name is None:
            continue
        raw = "\n".join(data)
        try:
            payload = json.loads(raw) if raw and raw != "[DONE]" else raw
        except json.JSONDecodeError:
            payload = f"<not json: {raw[:60]}>"
        events.append({"event": name, "data": payload})
    done = bool(events) and events[-1]["data"] == "[DONE]"
    body = [e for e in events if e["data"] != "[DONE]"]
    names = []
    for e in body:
        sig = f"{e['event'] or '-'}:{signature(e['data'])}"
        if not names or names[-1] != sig:
            names.append(sig)
    return {
        "first": body[0]["data"] if body else None,
        "middle": [e["data"] for e in body[1:-1]],
        "last": body[-1]["data"] if len(body) > 1 else None,
        "done": done,
        "sequence": names,
    }


def signature(d: Any) -> str:
    """Short description of one SSE payload (for the collapsed event sequence)."""
    if not isinstance(d, dict):
        return type(d).__name__
    parts = [",".join(sorted(d))]
    ch = d.get("choices")
    if isinstance(ch, list) and ch and isinstance(ch[0], dict):
        c0 = ch[0]
        delta = c0.get("delta")
        parts.append("delta=" + (",".join(sorted(delta)) if isinstance(delta, dict) else "-"))
        parts.append("finish=" + str(c0.get("finish_reason")))
    if "type" in d:
        parts.append(f"type={d['type']}")
    if "stop" in d:
        parts.append(f"stop={d['stop']}")
    return "|".join(parts)


def metric_names(text: str) -> dict:
    names = {}
    for line in text.splitlines():
        if line.startswith("# TYPE"):
            _, _, name, kind = line.split(None, 3)
            names[name] = kind
    return names


def request(client: httpx.Client, base: str, method: str, path: str, body: Any) -> dict:
    kw: dict[str, Any] = {"headers": {}}
    if "#" in path:  # "/path#Bearer KEY" or "/path#x-api-key KEY": an auth header
        path, auth = path.split("#", 1)
        how, key = auth.split(" ", 1)
        kw["headers"] = {"x-api-key": key} if how == "x-api-key" else {"Authorization": f"Bearer {key}"}
    if isinstance(body, bytes):
        kw["content"] = body
        kw["headers"]["Content-Type"] = "application/json"
    elif body is not None:
        kw["json"] = body
    t0 = time.perf_counter()
    try:
        r = client.request(method, base + path, **kw)
    except httpx.HTTPError as e:
        return {"status": None, "error": f"{type(e).__name__}: {e}", "seconds": time.perf_counter() - t0}
    ctype = r.headers.get("content-type", "")
    media = ctype.split(";")[0].strip().lower()
    out: dict[str, Any] = {"status": r.status_code, "media": media, "ctype": ctype,
                           "seconds": round(time.perf_counter() - t0, 3), "raw": r.text[:4000]}  # fmt: skip
    if media == "text/event-stream":
        out["sse"] = parse_sse(r.text)
    elif path.startswith("/metrics"):
        out["metrics"] = metric_names(r.text)
    else:
        try:
            out["json"] = r.json()
        except ValueError:
            out["text"] = r.text[:200]
    return out


# --- structural diff ---------------------------------------------------------------------------------


def kind(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "float"
    if isinstance(v, str):
        return "str"
    if isinstance(v, list):
        return "list"
    return "dict"


def id_pattern(s: str) -> str:
    m = re.match(r"^([A-Za-z]+[-_])?(.*)$", s)
    prefix, rest = (m.group(1) or ""), m.group(2)
    cls = (
        "digits"
        if rest.isdigit()
        else "hex"
        if re.fullmatch(r"[0-9a-f]+", rest)
        else "alnum"
        if rest.isalnum()
        else "other"
    )
    return f"{prefix}<{cls}>"


def diff(a: Any, b: Any, path: str, out: dict[str, str], key: str = "", lens: bool = True) -> None:
    ka, kb = kind(a), kind(b)
    if ka != kb:
        tag = "num" if {ka, kb} == {"int", "float"} else "type"
        out.setdefault(path, f"{tag}: lc {ka} {short(a)} / py {kb} {short(b)}")
        return
    if ka == "dict":
        for k in a.keys() - b.keys():
            out.setdefault(f"{path}.{k}", f"only in llama-server ({kind(a[k])} {short(a[k])})")
        for k in b.keys() - a.keys():
            out.setdefault(f"{path}.{k}", f"only in llamapy ({kind(b[k])} {short(b[k])})")
        for k in a.keys() & b.keys():
            diff(a[k], b[k], f"{path}.{k}", out, k, lens)
    elif ka == "list":
        if lens and len(a) != len(b) and (not a or not b or key in ("choices", "content", "data", "results", "")
                                          or path.count(".") <= 1):  # fmt: skip
            out.setdefault(f"{path}#len", f"len: lc {len(a)} / py {len(b)}")
        for x, y in zip(a, b, strict=False):
            diff(x, y, f"{path}[]", out, "", lens)
    elif key in ID_KEYS and ka == "str":
        pa, pb = id_pattern(a), id_pattern(b)
        if pa != pb:
            out.setdefault(path, f"id format: lc {short(a)} / py {short(b)}")
    elif (key in ENUM_KEYS or key in COUNT_KEYS) and a != b:
        out.setdefault(path, f"value: lc {short(a)} / py {short(b)}")


def short(v: Any, n: int = 70) -> str:
    s = json.dumps(v, ensure_ascii=False) if not isinstance(v, str) else repr(v)
    return s if len(s) <= n else s[: n - 3] + "..."


def compare(lc: dict, py: dict) -> dict[str, str]:
    out: dict[str, str] = OrderedDict()
    if lc.get("status") != py.get("status"):
        out["status"] = f"lc {lc.get('status')} / py {py.get('status')}"
    if lc.get("media") != py.get("media"):
        out["content-type"] = f"lc {lc.get('ctype')!r} / py {py.get('ctype')!r}"
    if "error" in lc or "error" in py:
        out["transport"] = f"lc {lc.get('error')} / py {py.get('error')}"
        return out
    ok_lc, ok_py = 200 <= lc["status"] < 300, 200 <= py["status"] < 300
    if ok_lc != ok_py:  # one answered, the other refused: the refusal is the difference
        out["body"] = f"lc {short(lc['raw'], 160)}\n        py {short(py['raw'], 160)}"
        return out
    if "sse" in lc and "sse" in py:
        s, t = lc["sse"], py["sse"]
        if s["done"] != t["done"]:
            out["sse.[DONE]"] = f"lc {s['done']} / py {t['done']}"
        if s["sequence"] != t["sequence"]:
            out["sse.sequence"] = f"\n        lc {s['sequence']}\n        py {t['sequence']}"
        diff(s["first"], t["first"], "sse.first", out)
        diff(s["last"], t["last"], "sse.last", out)
        diff(s["middle"], t["middle"], "sse.middle", out, lens=False)
    elif "metrics" in lc and "metrics" in py:
        for k in lc["metrics"].keys() - py["metrics"].keys():
            out[f"metric {k}"] = "only in llama-server"
        for k in py["metrics"].keys() - lc["metrics"].keys():
            out[f"metric {k}"] = "only in llamapy"
    elif "json" in lc and "json" in py:
        diff(lc["json"], py["json"], "$", out)
    elif ("json" in lc) != ("json" in py) or ("sse" in lc) != ("sse" in py):
        out["body"] = f"lc {short(lc.get('raw', ''), 120)} / py {short(py.get('raw', ''), 120)}"
    return out


# --- main --------------------------------------------------------------------------------------------


def run_pair(args: argparse.Namespace, extra: list[str], case_list_fn, results: dict, totals: dict) -> int:
    """Start both servers with ``extra``, run the cases; the number of distinct differences."""
    seen: dict[str, str] = {}
    common = ["-c", str(args.ctx), "-t", "1", "-np", "1"]
    lc_extra = [*common, "--jinja", "--metrics", "--slots", *extra]
    py_extra = [*common, "--metrics", "--log-level", "warning", *extra]
    lc = start_server(
        "llama.cpp", args.model, lc_extra, bin_dir=Path(args.bin), log=args.log_dir / "llama-server.log"
    )
    try:
        py = start_server("llamapy", args.model, py_extra, log=args.log_dir / "llamapy.log")
        try:
            print(f"# llama-server {lc.base} ({lc.seconds:.1f} s), llamapy {py.base} ({py.seconds:.1f} s); "
                  f"flags {' '.join(extra) or '-'}")  # fmt: skip
            with httpx.Client(timeout=args.timeout) as client:
                auth = {"Authorization": "Bearer secret"}  # (ignored by servers without --api-key)
                ids = client.post(lc.base + "/tokenize", json={"content": PROMPT}, headers=auth).json()[
                    "tokens"
                ]
                long_prompt = " ".join(["word"] * (args.ctx + 200))
                for name, method, path, body in case_list_fn(ids, long_prompt):
                    if args.only and not any(o in name for o in args.only):
                        continue
                    a = request(client, lc.base, method, path, body)
                    b = request(client, py.base, method, path, body)
                    d = compare(a, b)
                    fresh = OrderedDict()  # differences not printed for an earlier case
                    for k, v in d.items():
                        norm = (
                            re.sub(r"^sse\.(first|last|middle\[\])", "$", k)
                            + " "
                            + (v if v.startswith(("value", "len", "lc", "status")) else v.split("(")[0])
                        )
                        if (
                            k in ("status", "content-type", "body", "sse.sequence", "sse.[DONE]")
                            or norm not in seen
                        ):
                            seen[norm] = name
                            fresh[k] = v
                    ep = f"{method} {path.split('?')[0].split('#')[0]}"
                    tot = totals.setdefault(ep, [0, 0])
                    tot[0 if not d else 1] += 1
                    results[name] = {"method": method, "path": path, "body": body if not isinstance(body, bytes)
                                     else body.decode(), "llama-server": a, "llamapy": b, "diff": d}  # fmt: skip
                    head = f"[{name}] {method} {path}  lc {a.get('status')} / py {b.get('status')}"
                    if not d:
                        print(f"{head}: same")
                    else:
                        again = (
                            f" (+{len(d) - len(fresh)} shown for an earlier case)"
                            if len(fresh) < len(d)
                            else ""
                        )
                        print(f"{head}: differs{again}")
                        for k, v in fresh.items():
                            print(f"    {k}: {v}")
        finally:
            py.stop()
    finally:
        lc.stop()
    return len(seen)


def main() -> None:
    exit_on_sigterm()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default=str(DEFAULT_MODEL))
    ap.add_argument("--bin", default=str(llamacpp_bin("avx2")), help="llama-server's directory")
    ap.add_argument("-c", "--ctx", type=int, default=2048)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--embeddings", action="store_true", help="also a pair with --embeddings --pooling mean")
    ap.add_argument("--api-key", action="store_true", help="also a pair with --api-key (auth error shapes)")
    ap.add_argument("--no-main", action="store_true", help="skip the completion pair")
    ap.add_argument("--only", action="append", help="only the cases whose name contains this (repeatable)")
    ap.add_argument("--out", type=Path, help="JSON with every response and difference")
    args = ap.parse_args()
    args.log_dir = args.out.parent if args.out else Path("/tmp")
    args.log_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    totals: dict[str, list[int]] = {}
    n_distinct = [0]
    if not args.no_main:
        n_distinct[0] += run_pair(args, [], cases, results, totals)
    if args.embeddings:
        n_distinct[0] += run_pair(
            args, ["--embeddings", "--pooling", "mean"], lambda ids, lp: emb_cases(), results, totals
        )
    if args.api_key:
        n_distinct[0] += run_pair(args, ["--api-key", "secret"], lambda ids, lp: key_cases(), results, totals)
    print("\n# per endpoint: same / differs (cases)")
    for ep, (same, differs) in sorted(totals.items()):
        print(f"{ep:45s} {same:3d} / {differs:3d}")
    n_same = sum(s for s, _ in totals.values())
    n_diff = sum(d for _, d in totals.values())
    print(
        f"total: {n_same + n_diff} cases, {n_same} same, {n_diff} differ; {n_distinct[0]} distinct differences"
    )
    if args.out:
        args.out.write_text(json.dumps(results, indent=1, default=str))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
