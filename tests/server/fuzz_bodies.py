"""Structure-aware fuzzing of the server's request bodies, shared by ``tests/server/test_fuzz_routes.py``
(CI, on a budget) and ``benchmarks/soak_fuzz.py`` (an hour against ``llamapy serve``).

- :data:`SEEDS`: valid bodies per POST route template (with the fields that reach deep code: tools and
  tool calls, content blocks, response formats, grammars, samplers, logit bias, stop, streaming...);
  :func:`post_routes` lists the routes of the app itself, so a new route without seeds fails the test.
- :func:`cases`: a hypothesis strategy of :class:`Case` (a URL and raw body bytes): a seed with one to
  three mutations at any depth (a value of the wrong JSON type, deep nesting, 100k-wide arrays and
  objects, huge or hostile strings, edge numbers, a missing field, an extra field, a value taken from
  another seed), sometimes a raw-bytes mutation (truncated, not UTF-8, an unterminated escaped string).
- :func:`check`: sends a case over a real socket and returns what was wrong (None when the answer was
  fine): a 5xx, no answer within the deadline, a dropped connection, a 4xx not in the API's own error
  shape, a stream that ends without its final event or an error event, a 2xx that is not JSON.
"""

from __future__ import annotations

import copy
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from hypothesis import strategies as st

# -- seeds ------------------------------------------------------------------------------------------

_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "n": {"type": "integer"}},
    "required": ["city"],
    "additionalProperties": False,
}
_TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "the weather in a city", "parameters": _SCHEMA},
    }
]
_CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "P"}'},
}
_MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
    {"role": "assistant", "content": None, "tool_calls": [_CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny", "name": "get_weather"},
    {"role": "assistant", "content": "It is sunny.", "reasoning_content": "the tool said so"},
    {"role": "user", "content": "And tomorrow?"},
]
_SAMPLERS = {
    "temperature": 0.7,
    "top_p": 0.9,
    "top_k": 40,
    "min_p": 0.05,
    "typical_p": 1.0,
    "seed": 1,
    "presence_penalty": 0.1,
    "frequency_penalty": 0.1,
    "repeat_penalty": 1.1,
    "repeat_last_n": 64,
    "stop": ["\n\n", "END"],
    "logit_bias": {"65": -100, "66": 2.5},
    "n_probs": 2,
    "min_keep": 1,
    "top_n_sigma": -1.0,
    "xtc_probability": 0.1,
    "xtc_threshold": 0.2,
    "dynatemp_range": 0.5,
    "dynatemp_exponent": 1.0,
    "dry_multiplier": 0.8,
    "dry_base": 1.75,
    "dry_allowed_length": 2,
    "dry_penalty_last_n": -1,
    "dry_sequence_breakers": ["\n", ":", '"', "*"],
    "mirostat": 0,
    "mirostat_tau": 5.0,
    "mirostat_eta": 0.1,
    "cache_prompt": True,
    "samplers": ["dry", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"],
    "ignore_eos": False,
    "id_slot": -1,
    "n_keep": 0,
    "user": "u1",
}
_GBNF = 'root ::= "yes" | "no" | [a-z]{1,4}'
_LARK = '%llguidance {}\nstart: "a" | "b"'
_CHAT = [
    {"model": "m", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8, "stream": False},
    {
        "messages": _MESSAGES,
        "tools": _TOOLS,
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "max_tokens": 8,
        "stream": True,
        "stream_options": {"include_usage": True},
    },
    {
        "messages": [{"role": "user", "content": "Weather?"}],
        "tools": _TOOLS,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "max_completion_tokens": 8,
    },
    {
        "messages": [{"role": "developer", "content": "JSON only"}, {"role": "user", "content": "Hi"}],
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "w", "strict": True, "schema": _SCHEMA},
        },
        "logprobs": True,
        "top_logprobs": 2,
        "max_tokens": 8,
        **_SAMPLERS,
    },
    {
        "messages": [{"role": "user", "content": "Hi"}],
        "response_format": {"type": "json_object"},
        "reasoning_format": "deepseek",
        "chat_template_kwargs": {"enable_thinking": False},
        "add_generation_prompt": True,
        "logit_bias": [[65, -1.5], ["a", False]],
        "n": 2,
        "max_tokens": 6,
    },
    {"messages": [{"role": "user", "content": "Hi"}], "grammar": _GBNF, "max_tokens": 6, "stream": True},
    {"messages": [{"role": "user", "content": "Hi"}], "grammar": _LARK, "json_schema": None, "max_tokens": 4},
    {"messages": [{"role": "user", "content": "Hi"}], "json_schema": _SCHEMA, "max_tokens": 8, "mirostat": 2},
]
_OAI_COMPLETION = [
    {"model": "m", "prompt": "Hello", "max_tokens": 8, "logprobs": 2, "echo": True, "stop": "\n", "seed": 3},
    {"prompt": [72, 101, 108], "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True}},
    {"prompt": ["a b"], "n": 2, "max_tokens": 4, **_SAMPLERS},
    {"prompt": [[72, 105, 33]], "max_tokens": 4},
    {"prompt": "def f(", "suffix": "    return x\n", "max_tokens": 4},
    {"prompt": "x", "response_format": {"type": "json_object"}, "max_tokens": 4, "stream": True},
    {"prompt": "x", "grammar": _GBNF, "max_tokens": 4},
]
_NATIVE = [
    {"prompt": "Hello", "n_predict": 8, "n_probs": 3, "return_tokens": True, "samplers": "kmt", **_SAMPLERS},
    {
        "prompt": [72, "abc", 101],
        "n_predict": 4,
        "stream": True,
        "logit_bias": [[65, False], ["b", 1.0]],
        "lora": [{"id": 0, "scale": 0.5}],
        "id_slot": 1,
        "n_keep": 2,
        "n_discard": 1,
    },
    {"prompt": "x", "json_schema": _SCHEMA, "n_predict": 6},
    {"prompt": "x", "grammar": _LARK, "n_predict": 4, "stream": True},
]
_INFILL = [
    {
        "input_prefix": "def f(x):\n",
        "input_suffix": "\n    return y\n",
        "input_extra": [{"filename": "a.py", "text": "y = 1\n"}],
        "prompt": "",
        "n_predict": 4,
    },
    {"input_prefix": [72, "ab"], "input_suffix": ["c", 33], "prompt": "z", "n_predict": 4, "stream": True},
]
_RESPONSES = [
    {
        "model": "m",
        "input": "Hello",
        "instructions": "Be brief.",
        "max_output_tokens": 8,
        "temperature": 0.5,
        "top_p": 0.9,
        "store": True,
        "metadata": {"k": "v"},
    },
    {
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city":"P"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {"role": "assistant", "content": [{"type": "output_text", "text": "Sunny."}]},
            {"role": "user", "content": "Thanks"},
        ],
        "tools": [{"type": "function", "name": "get_weather", "description": "d", "parameters": _SCHEMA}],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "parallel_tool_calls": False,
        "reasoning": {"effort": "high", "summary": "auto"},
        "chat_template_kwargs": {"enable_thinking": False},
        "max_output_tokens": 8,
        "stream": True,
    },
    {
        "input": "Hi",
        "text": {"format": {"type": "json_schema", "name": "w", "schema": _SCHEMA, "strict": True}},
        "max_output_tokens": 8,
        "top_k": 5,
        "dry_multiplier": 0.5,
    },
    {"input": "Hi", "previous_response_id": "resp_0123456789abcdef01234567", "max_output_tokens": 4},
]
_A_MESSAGES = [
    {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "call it", "signature": "sig"},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "P"}},
        ],
    },
    {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "toolu_1",
                "content": [{"type": "text", "text": "sunny"}],
                "is_error": False,
            },
        ],
    },
]
_IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
_A_TOOLS = [{"name": "get_weather", "description": "d", "input_schema": _SCHEMA}]
_ANTHROPIC_COUNT = [
    {"model": "m", "system": "Be brief.", "messages": [{"role": "user", "content": "Hello"}]},
    {
        "system": [{"type": "text", "text": "Be brief."}],
        "messages": _A_MESSAGES[:2] + [{"role": "user", "content": [_A_MESSAGES[2]["content"][0]]}],
        "tools": _A_TOOLS,
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "thinking": {"type": "enabled", "budget_tokens": 100},
    },
    {
        "messages": [{"role": "user", "content": "Hi"}],
        "output_config": {"effort": "low", "format": {"type": "json_schema", "schema": _SCHEMA}},
    },
    {"messages": _A_MESSAGES, "tools": _A_TOOLS},
]
_ANTHROPIC = [
    dict(b, max_tokens=8, **extra)
    for b, extra in zip(
        _ANTHROPIC_COUNT,
        [
            {
                "temperature": 0.5,
                "top_p": 0.9,
                "top_k": 5,
                "stop_sequences": ["x"],
                "metadata": {"user_id": "u"},
            },
            {"stream": True},
            {"stream": False},
            {"stream": True, "tool_choice": {"type": "tool", "name": "get_weather"}},
        ],
        strict=True,
    )
]
_EMB_OAI = [
    {"model": "m", "input": "Hello", "encoding_format": "float"},
    {"input": ["a", "b c"], "encoding_format": "base64", "embd_normalize": 2, "truncate": True},
    {"input": [72, 105], "dimensions": None, "user": "u"},
    {"input": [[72, 105], [33]], "embd_normalize": -1},
]
_EMB_NATIVE = [
    {"content": "Hello", "embd_normalize": 2},
    {"input": ["a", [72, 105]], "truncate": False, "embd_normalize": 3},
    {"content": ["x", "y"], "embd_normalize": 0},
]
_RERANK = [
    {"model": "m", "query": "what?", "documents": ["a", "b c", "d"], "top_n": 2, "return_documents": True},
    {"query": "q", "documents": [{"text": "a"}, {"text": "b"}], "truncate": True},
    {"query": "q", "texts": ["a", "b"], "return_text": True},
]
_LORA = [[{"id": 0, "scale": 0.5}], [{"id": 0}], []]

# ollama's API (/api/...): the fuzz servers serve /models/fake.gguf, whose ollama name is fake(:latest)
_O_OPTIONS = {"num_predict": 6, "temperature": 0.5, "top_k": 20, "top_p": 0.9, "min_p": 0.05, "seed": 7,
              "repeat_penalty": 1.1, "repeat_last_n": 32, "stop": ["\n\n"], "num_ctx": 2048, "num_keep": 0}  # fmt: skip
_O_MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather",
                                                                      "arguments": {"city": "P"}}}]},
    {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
    {"role": "assistant", "content": "It is sunny.", "thinking": "the tool said so"},
    {"role": "user", "content": "And tomorrow?"},
]  # fmt: skip
_O_CHAT = [
    {"model": "fake", "messages": _O_MESSAGES, "options": _O_OPTIONS, "stream": False, "keep_alive": "5m"},
    {"model": "fake:latest", "messages": _O_MESSAGES[1:2], "options": {"num_predict": 4}},  # (streamed)
    {"model": "fake", "messages": _O_MESSAGES[:2], "tools": _TOOLS, "stream": False,
     "options": {"num_predict": 8}, "think": False},
    {"model": "fake", "messages": _O_MESSAGES[1:2], "format": _SCHEMA, "options": {"num_predict": 8}},  # (no tools)
    {"model": "fake", "messages": _O_MESSAGES[1:2], "format": "json", "stream": False, "options": {"num_predict": 8}},
]  # fmt: skip
_O_GENERATE = [
    {"model": "fake", "prompt": "Once upon", "system": "Be brief.", "options": _O_OPTIONS, "stream": False},
    {"model": "fake", "prompt": "Once upon", "raw": True, "options": {"num_predict": 4}},
    {"model": "fake", "prompt": "def f(", "suffix": "    return x\n", "stream": False,
     "options": {"num_predict": 4}},
    {"model": "fake", "prompt": "A color:", "format": "json", "stream": False, "options": {"num_predict": 8}},
    {"model": "fake"},
]  # fmt: skip


@dataclass
class Seed:
    body: Any
    url: str | None = None  # the concrete URL (path parameters, query) when it is not the route itself
    expect: tuple[int, ...] = (200,)  # what the seed itself is answered with


def needs_grammar(body: Any) -> bool:
    """Whether a body asks for a constrained generation (the fake model has no vocabulary to build one)."""
    if not isinstance(body, dict):
        return False
    fmt = body.get("response_format") or body.get("text") or body.get("output_config") or {}
    return bool(
        body.get("grammar")
        or body.get("json_schema")
        or body.get("tools")
        or fmt not in ({}, {"type": "text"})
        or body.get("format") not in (None, "")  # ollama's format: "json" or a schema
    )


def _seeds(bodies: list[Any]) -> list[Seed]:
    return [Seed(b) for b in bodies]


_FIM = (200, 400)  # fill-in-the-middle: a 400 on a model without FIM tokens (SmolLM2)
SEEDS: dict[str, list[Seed]] = {
    "/v1/chat/completions": _seeds(_CHAT),
    "/chat/completions": _seeds(_CHAT[:3]),
    "/v1/completions": [Seed(b, expect=_FIM if "suffix" in b else (200,)) for b in _OAI_COMPLETION],
    "/completion": [Seed(b, expect=_FIM if "lora" in b else (200,)) for b in _NATIVE],  # (no adapters: 400)
    "/completions": _seeds(_NATIVE[:2]),
    "/infill": [Seed(b, expect=_FIM) for b in _INFILL],
    "/tokenize": _seeds(
        [
            {"content": "Hello world </s> <|im_start|>", "add_special": True, "with_pieces": True},
            {"content": "x", "parse_special": False},
        ]
    ),
    "/detokenize": _seeds([{"tokens": [72, 101, 108, 108, 111]}, {"tokens": []}]),
    "/apply-template": _seeds([{"messages": _MESSAGES, "add_generation_prompt": True}]),
    "/v1/responses": _seeds(_RESPONSES[:3]) + [Seed(_RESPONSES[3], expect=(400,))],
    "/responses": _seeds(_RESPONSES[:2]),
    "/v1/messages": _seeds(_ANTHROPIC)
    + [Seed({"max_tokens": 4, "messages": [{"role": "user", "content": [_IMAGE]}]}, expect=(400,))],
    "/v1/messages/count_tokens": _seeds(_ANTHROPIC_COUNT),
    "/v1/chat/completions/input_tokens": _seeds([{"messages": _MESSAGES}, *_CHAT[1:3]]),
    "/chat/completions/input_tokens": _seeds([{"messages": _MESSAGES}]),
    "/v1/responses/input_tokens": _seeds(_RESPONSES[:3]),
    "/responses/input_tokens": _seeds(_RESPONSES[:1]),
    "/v1/embeddings": _seeds(_EMB_OAI),
    "/embedding": _seeds(_EMB_NATIVE),
    "/embeddings": _seeds(_EMB_NATIVE[:2]),
    "/rerank": _seeds(_RERANK),
    "/reranking": _seeds(_RERANK[:1]),
    "/v1/rerank": _seeds(_RERANK),
    "/v1/reranking": _seeds(_RERANK[:1]),
    "/lora-adapters": _seeds(_LORA),
    "/api/chat": _seeds(_O_CHAT),
    "/api/generate": _seeds(_O_GENERATE[:2] + _O_GENERATE[3:]) + [Seed(_O_GENERATE[2], expect=_FIM)],
    # (the fuzz servers' "gen" model computes no embeddings: 501, a clear answer to fuzz all the same)
    "/api/embed": [
        Seed({"model": "fake", "input": ["a", "b c"], "truncate": True, "dimensions": 4}, expect=(501,))
    ],
    "/api/embeddings": [Seed({"model": "fake", "prompt": "Hello", "options": {}}, expect=(501,))],
    "/api/show": _seeds([{"model": "fake", "verbose": True}, {"name": "fake:latest"}]),
    "/api/pull": [Seed({"model": "user/repo:Q4_K_M", "stream": False}, expect=(501,))],
    "/api/push": [Seed({"model": "fake"}, expect=(501,))],
    "/api/create": [Seed({"model": "x", "from": "fake"}, expect=(501,))],
    "/api/copy": [Seed({"source": "fake", "destination": "x"}, expect=(501,))],
    "/api/blobs/{digest}": [Seed({}, "/api/blobs/sha256:" + "0" * 64, expect=(501,))],
    "/mcp/confirm": [Seed({"id": "mcpc-none", "allow": True}, expect=(404,))],  # (no call waits)
    "/props": [Seed({"n_ctx": 8}, expect=(501,))],  # (llama-server without --props: settings cannot change)
    # a multipart route: the fuzzer's JSON bodies are refused as not being its form (a 400, at once)
    "/v1/audio/transcriptions": [
        Seed({"model": "fake", "file": "x.wav", "response_format": "json"}, expect=(400,))
    ],
    "/slots/{id_slot}": [
        Seed({"filename": "fuzz.bin"}, "/slots/0?action=save"),
        Seed({"filename": "fuzz.bin"}, "/slots/1?action=restore", expect=(200, 404)),
        Seed({}, "/slots/0?action=erase"),
    ],
}
# routes that generate text (a long generation is not a hang: the real-server fuzz clamps their length)
LENGTH_FIELDS = ("max_tokens", "max_completion_tokens", "n_predict", "max_output_tokens")
SLOT_URLS = ["/slots/{}?action=save", "/slots/{}?action=restore", "/slots/{}?action=erase", "/slots/{}",
             "/slots/{}?action=bogus"]  # fmt: skip
SLOT_IDS = ["0", "1", "-1", "2", "99999999999999999999999", "abc", "0x1", "%2e%2e", "1.5", "%00"]


def post_routes(app: Any) -> list[str]:
    """Every POST/PUT/PATCH route of the app (its path template), in registration order."""
    out = []
    for r in app.routes:
        methods = getattr(r, "methods", None) or set()
        if methods & {"POST", "PUT", "PATCH"} and r.path not in out:
            out.append(r.path)
    return out


def is_anthropic(url: str) -> bool:
    return url.startswith("/v1/messages")


def is_ollama(url: str) -> bool:
    return url.startswith("/api/")


# -- mutations --------------------------------------------------------------------------------------

Path = tuple[Any, ...]


def _paths(x: Any, limit: int = 20_000) -> list[Path]:
    """Locations in a JSON value (the root included), depth first, at most ``limit`` of them and none
    deeper than 200 (an explicit stack: values may nest far deeper than Python's recursion limit)."""
    out: list[Path] = []
    stack: list[tuple[Path, Any]] = [((), x)]
    while stack and len(out) < limit:
        p, v = stack.pop()
        out.append(p)
        if len(p) >= 200:
            continue
        if isinstance(v, dict):
            stack += [(p + (k,), c) for k, c in reversed(list(v.items()))]
        elif isinstance(v, list):
            stack += [(p + (i,), c) for i, c in reversed(list(enumerate(v)))]
    return out


def _copy(x: Any) -> Any:
    try:
        return copy.deepcopy(x)
    except RecursionError:  # too deep to copy: share it (mutations only ever replace values)
        return x


def _get(x: Any, path: Path) -> Any:
    for p in path:
        x = x[p]
    return x


def _set(root: Any, path: Path, value: Any) -> Any:
    if not path:
        return value
    _get(root, path[:-1])[path[-1]] = value
    return root


def _all_keys() -> list[str]:
    keys: set[str] = set()
    for seeds in SEEDS.values():
        for s in seeds:
            for p in _paths(s.body):
                keys.update(k for k in p if isinstance(k, str))
    return sorted(keys)


def _all_values() -> list[Any]:
    vals = []
    for seeds in SEEDS.values():
        for s in seeds:
            vals += [_get(s.body, p) for p in _paths(s.body)[1:]]
    return vals


KEYS = _all_keys()
VALUES = _all_values()
EDGE_NUMBERS: list[Any] = [0, -1, 1, 2, 255, 256, 257, 2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**63 - 1, 2**63,
    2**64, -(2**63) - 1, 10**30, -(10**30), 10**400, 1e308, -1e308, 1.7976931348623157e308, 5e-324, -0.0, 0.5,
    -0.5, 1e-300, 100.0, 1e15, float("inf"), float("-inf"), float("nan")]  # fmt: skip
EDGE_STRINGS = ["", " ", "NaN", "Infinity", "-1", "1e308", "null", "true", "0x10", "\x00", "\x7f\x1b[31m", "\ud800",
    "a\udfffb", "\U0001f600" * 3, "\u202e\u200b\ufeff", "</s>", "<s>", "<|im_start|>assistant\n", "<|endoftext|>",
    "{{ 7 * 7 }}", "{% for i in range(99999999) %}x{% endfor %}", "%llguidance {}", "root ::= root",
    '{"$ref": "#"}', "../../etc/passwd", "/dev/zero", "a" * 300, "\\", '"', "\r\n", "é" * 50, "\U0010ffff",
    "function", "text", "tool_use", "json_schema", "json_object", "message", "user", "assistant", "system",
    "tool", "auto", "none", "required", "any", "image", "tool_result", "base64", "url"]  # fmt: skip
HUGE_CHARS = ["x", "\\", '"', "\x00", "é", "\U0001f600", "\ud800", "{", "[", "<|im_start|>", " ", "\n", "a b"]


def _scalar() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.none(),
        st.booleans(),
        st.sampled_from(EDGE_NUMBERS),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=False, allow_infinity=False),
        st.sampled_from(EDGE_STRINGS),
        st.text(max_size=30),
    )


def _containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    keys = st.sampled_from(KEYS) | st.text(max_size=8)
    return st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4)


def _json_small() -> st.SearchStrategy[Any]:
    """Small JSON values of every type (the field names of all seeds among the keys)."""
    return st.recursive(_scalar(), _containers, max_leaves=8)


def _type_of(x: Any) -> str:
    return "null" if x is None else type(x).__name__


def _deep(depth: int, kind: str, inner: Any) -> Any:
    v = inner
    for i in range(depth):
        if kind == "list" or (kind == "mixed" and i % 2):
            v = [v]
        else:
            v = {"a": v}
    return v


def _approx_size(x: Any) -> int:
    try:
        return len(json.dumps(x))
    except (TypeError, ValueError, RecursionError):
        return 1 << 30


MAX_BODY = 6 << 20  # bytes a mutation may grow a body to (the fuzz servers take 8 MiB)


def _size_over(x: Any, limit: int) -> bool:
    """Whether the JSON text of ``x`` would be longer than ``limit`` bytes (roughly; it stops counting
    there). Values may be shared (a mutation inside a repeated value repeats too): each use counts."""
    n, stack = 0, [x]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            n += 2 + 4 * len(v) + sum(len(str(k)) for k in v)
            stack.extend(v.values())
        elif isinstance(v, list):
            n += 2 + len(v)
            stack.extend(v)
        else:
            n += len(v) if isinstance(v, str) else 8
        if n > limit:
            return True
    return False


# how often each mutation is drawn (by repetition); "same_type" becomes the op for the old value's type
OPS = ["same_type"] * 6 + ["wrong_type"] * 3 + ["foreign"] * 2
OPS += ["deep", "wide", "huge_string", "string", "number", "delete", "extra", "dup"]
_SAME_TYPE = {"str": "string_or_huge", "int": "number", "float": "number", "bool": "foreign",
              "null": "foreign", "list": "list_same", "dict": "dict_same"}  # fmt: skip


@st.composite
def _mutate(draw: st.DrawFn, body: Any) -> tuple[Any, str]:
    """One mutation of ``body`` (a deep copy) at a drawn location -> (the new body, what was done)."""
    paths = _paths(body)
    if len(paths) > 1 and draw(st.integers(0, 19)):  # the root itself now and then
        paths = paths[1:]
    path = draw(st.sampled_from(paths))
    old = _get(body, path)
    op = draw(st.sampled_from(OPS))
    if op == "same_type":  # a hostile value of the type the field has: past type checks, into the code
        op = _SAME_TYPE.get(_type_of(old), "wrong_type")
    where = "/".join(map(str, path)) or "<root>"
    if op == "wrong_type":
        new = draw(_json_small().filter(lambda v: _type_of(v) != _type_of(old)))
    elif op == "deep":
        depth = draw(st.sampled_from([2, 8, 30, 60, 62, 63, 64, 65, 100, 1000, 10_000, 100_000]))
        kind = draw(st.sampled_from(["list", "dict", "mixed"]))
        new = _deep(depth, kind, old if _approx_size(old) < 200 else None)
        op = f"deep({depth},{kind})"
    elif op == "wide":
        n = draw(st.sampled_from([2, 100, 1000, 10_000, 100_000, 300_000]))
        elem = old if isinstance(old, list) and not old else (old[0] if isinstance(old, list) else old)
        if draw(st.booleans()) or _approx_size(elem) * n > MAX_BODY:
            elem = draw(st.sampled_from([0, 1, "a", None, True, 0.5, [], {}, "</s>", 65]))
        if isinstance(old, dict) and draw(st.booleans()):
            new = dict(old) | {f"k{i}": elem for i in range(n)}
        else:
            new = [_copy(elem) if isinstance(elem, (list, dict)) and elem else elem for _ in range(n)]
        op = f"wide({n})"
    elif op == "huge_string":
        n = draw(st.sampled_from([1000, 10_000, 100_000, 1_000_000, 3_000_000]))
        ch = draw(st.sampled_from(HUGE_CHARS))
        new = (ch * (n // len(ch) + 1))[:n] if len(ch) > 1 else ch * n
        if isinstance(old, str) and draw(st.booleans()):
            new = old + new
        op = f"huge_string({n}x{ch!r})"
    elif op == "string" or (op == "string_or_huge" and draw(st.integers(0, 3))):
        new = draw(st.sampled_from(EDGE_STRINGS) | st.text(max_size=50))
        if isinstance(old, str) and draw(st.booleans()):
            new = old + new if draw(st.booleans()) else new + old
    elif op == "string_or_huge":
        n = draw(st.sampled_from([1000, 100_000, 1_000_000]))
        new = (old or "x") * (n // max(len(old), 1))
        op = f"huge_string({n})"
    elif op == "list_same":  # the list's own items, repeated, emptied or reordered
        n = draw(st.sampled_from([0, 1, 2, 50, 1000, 100_000]))
        if old and _approx_size(old) * n // len(old) < MAX_BODY:
            new = [_copy(old[i % len(old)]) for i in range(n)]
        else:
            new = []
        op = f"list_same({n})"
    elif op == "dict_same":  # drop a key, or add one of the keys any seed has
        if old and draw(st.booleans()):
            k = draw(st.sampled_from(sorted(old, key=str)))
            del old[k]
            return body, f"delete {where}/{k}"
        k = draw(st.sampled_from(KEYS))
        old[k] = _copy(draw(st.sampled_from(VALUES) | _json_small()))
        return body, f"extra {where}/{k}"
    elif op == "number":
        new = draw(st.sampled_from(EDGE_NUMBERS))
    elif op == "delete":
        if path:
            parent = _get(body, path[:-1])
            del parent[path[-1]]
            return body, f"delete {where}"
        new = {}
    elif op == "extra":
        if isinstance(old, dict):
            k = draw(st.sampled_from(KEYS) | st.text(max_size=10))
            old[k] = _copy(draw(_json_small() | st.sampled_from(VALUES)))
            return body, f"extra {where}/{k}"
        new = draw(_json_small())
    elif op == "dup":
        if isinstance(old, list) and old:
            n = draw(st.sampled_from([2, 10, 500, 5000, 50_000]))
            if _approx_size(old[0]) * n > MAX_BODY:
                n = 10
            i = draw(st.integers(0, len(old) - 1))
            old[i:i] = [_copy(old[i]) for _ in range(n)]
            return body, f"dup {where}[{i}] x{n}"
        new = [old, old]
    else:  # foreign: a value (of any shape) from a seed of any route
        new = _copy(draw(st.sampled_from(VALUES)))
    return _set(body, path, new), f"{op} at {where} ({_type_of(old)} -> {_type_of(new)})"


RAW_OPS = ["truncate", "not_utf8", "unterminated", "top_level", "empty", "bom", "dup_keys", "nan_literal",
           "big_int_text", "trailing"]  # fmt: skip


@st.composite
def _raw(draw: st.DrawFn, data: bytes) -> tuple[bytes, str]:
    op = draw(st.sampled_from(RAW_OPS))
    if op == "truncate":
        i = draw(st.integers(0, max(len(data) - 1, 0)))
        return data[:i], f"raw truncate at {i}"
    if op == "not_utf8":
        i = draw(st.integers(0, len(data)))
        return data[:i] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00"])) + data[i:], op
    if op == "unterminated":  # {"a":"\"\"\"... with no closing quote (a regex scan could be quadratic)
        n = draw(st.sampled_from([100, 10_000, 100_000, 1_000_000]))
        return b'{"a":"' + b'\\"' * n, f"raw unterminated {n}"
    if op == "top_level":
        return draw(st.sampled_from([b"[]", b"null", b"1", b'"x"', b"true", b"[{}]", b"[" * 100_000])), op
    if op == "empty":
        return draw(st.sampled_from([b"", b" ", b"\n\t "])), op
    if op == "bom":
        return b"\xef\xbb\xbf" + data, op
    if op == "dup_keys":
        return data[:-1] + b',"stream":true,"stream":false}' if data.endswith(b"}") else data, op
    if op == "nan_literal":
        return data[:-1] + b',"temperature":NaN,"seed":Infinity}' if data.endswith(b"}") else b"NaN", op
    if op == "big_int_text":
        return data[:-1] + b',"seed":' + b"9" * 5000 + b"}" if data.endswith(b"}") else data, op
    return data + draw(st.sampled_from([b"x", b"}", b" {}", b"\x00"])), op


@dataclass
class Case:
    route: str
    url: str
    body: bytes
    note: str = ""

    def describe(self, limit: int = 300) -> str:
        b = self.body[:limit] + (b"..." if len(self.body) > limit else b"")
        return f"POST {self.url} ({len(self.body)} bytes; {self.note}): {b!r}"


def _dumps(body: Any, ascii_only: bool) -> bytes:
    try:
        return json.dumps(body, ensure_ascii=ascii_only, allow_nan=True).encode("utf-8", "surrogatepass")
    except (RecursionError, ValueError):  # too deep for the encoder: write the nesting by hand
        return _deep_text(body)


def _deep_text(body: Any) -> bytes:
    """JSON text of a value too deep for ``json.dumps`` (an explicit stack, no recursion)."""
    out: list[bytes] = []
    stack: list[Any] = [body]
    while stack:
        x = stack.pop()
        if isinstance(x, bytes):
            out.append(x)
        elif isinstance(x, list):
            out.append(b"[")
            stack.append(b"]")
            for i, v in enumerate(reversed(x)):
                stack += ([b","] if i else []) + [v]
        elif isinstance(x, dict):
            out.append(b"{")
            stack.append(b"}")
            for i, (k, v) in enumerate(reversed(list(x.items()))):
                stack += ([b","] if i else []) + [v, json.dumps(str(k)).encode() + b":"]
        else:
            out.append(json.dumps(x).encode("utf-8", "surrogatepass"))
    return b"".join(out)


def clamp_lengths(route: str, body: Any, n: int = 16) -> Any:
    """For a real model: generate at most ``n`` tokens (a long generation is slow, not a hang)."""
    if not isinstance(body, dict):
        return body
    for k in LENGTH_FIELDS:
        v = body.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and (v > n or v < 0):
            body[k] = n
    if route.startswith("/api/"):  # ollama's: options.num_predict
        opts = body.setdefault("options", {"num_predict": n})
        v = opts.get("num_predict", -1) if isinstance(opts, dict) else 0
        if isinstance(opts, dict) and (not isinstance(v, int) or isinstance(v, bool) or v > n or v < 0):
            opts["num_predict"] = n
        return body
    if not any(k in body for k in LENGTH_FIELDS):
        if route in ("/completion", "/completions", "/infill"):
            body["n_predict"] = n
        elif route in ("/v1/responses", "/responses"):
            body["max_output_tokens"] = n
        elif route != "/v1/messages":  # (required there: its absence is the 400 under test)
            body["max_tokens"] = n
    return body


def with_model(body: Any, model: str) -> Any:
    """A seed naming the fake model ("fake", as ollama's routes call /models/fake.gguf) naming ``model``."""
    if not isinstance(body, dict) or model == "fake":
        return body
    names = {"fake": model, "fake:latest": f"{model}:latest"}
    return {k: names.get(v, v) if k in ("model", "name", "source", "from") and isinstance(v, str) else v
            for k, v in body.items()}  # fmt: skip


def cases(route: str, real: bool = False, model: str = "fake") -> st.SearchStrategy[Case]:
    """Mutated seed bodies for ``route`` (a path template of the app); ``model``: the served model's name
    for ollama's routes, which check it (``real``: generations clamped to a few tokens)."""
    seeds = [Seed(with_model(s.body, model), s.url, s.expect) for s in SEEDS[route]]

    @st.composite
    def build(draw: st.DrawFn) -> Case:
        seed = draw(st.sampled_from(seeds))
        url = seed.url or route
        if route == "/slots/{id_slot}" and draw(st.booleans()):
            url = draw(st.sampled_from(SLOT_URLS)).format(draw(st.sampled_from(SLOT_IDS)))
        body = copy.deepcopy(seed.body)
        notes = []
        for _ in range(draw(st.integers(1, 3))):
            body, note = draw(_mutate(body))
            notes.append(note)
        if _size_over(body, 2 * MAX_BODY):  # mutations of shared values can multiply: a plain big body
            body, notes = {"content": "x" * (2 * MAX_BODY)}, notes + ["oversize -> a 12 MiB body"]
        if isinstance(body, dict) and "stream" in KEYS and draw(st.integers(0, 3)) == 0:
            body["stream"] = True
            notes.append("stream")
        if real:
            body = clamp_lengths(route, body)
        data = _dumps(body, draw(st.booleans()))
        if draw(st.integers(0, 9)) == 0:
            data, note = draw(_raw(data))
            notes.append(note)
        return Case(route, url, data, "; ".join(notes) or "seed")

    return build()


# -- checking an answer -----------------------------------------------------------------------------


@dataclass
class Result:
    status: int | None
    seconds: float
    problem: str | None = None  # None: the answer was fine
    events: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def error_shape_problem(url: str, obj: Any) -> str | None:
    """What is wrong with a 4xx body (None when it is the API's own error shape)."""
    if is_ollama(url):
        ok = isinstance(obj, dict) and isinstance(obj.get("error"), str)
        return None if ok else "4xx body is not ollama's {error: message}"
    if is_anthropic(url):
        ok = (
            isinstance(obj, dict)
            and obj.get("type") == "error"
            and isinstance(obj.get("error"), dict)
            and isinstance(obj["error"].get("type"), str)
            and isinstance(obj["error"].get("message"), str)
        )
        return None if ok else "4xx body is not Anthropic's {type: error, error: {type, message}}"
    ok = (
        isinstance(obj, dict)
        and isinstance(obj.get("error"), dict)
        and isinstance(obj["error"].get("message"), str)
        and isinstance(obj["error"].get("type"), str)
    )
    return None if ok else "4xx body is not OpenAI's {error: {message, type}}"


def _is_error_event(url: str, ev: str | None, obj: Any) -> bool:
    if not isinstance(obj, dict):
        return False
    if is_anthropic(url):
        return ev == "error" and error_shape_problem(url, obj) is None
    if obj.get("type") == "error":  # Responses API: {"type": "error", "code", "message", "param"}
        return isinstance(obj.get("message"), str)
    return error_shape_problem(url, obj) is None


def _stream_end_problem(url: str, events: list[tuple[str | None, Any]]) -> str | None:
    """What is wrong with a finished SSE stream: each data line must be JSON, and the last event must
    be the API's final event or an error event."""
    if not events:
        return "the stream has no events"
    ev, last = events[-1]
    if _is_error_event(url, ev, last):
        return None
    path = url.split("?")[0]
    if path in ("/v1/chat/completions", "/chat/completions", "/v1/completions"):
        ok = last == "[DONE]"
    elif path in ("/completion", "/completions", "/infill"):
        ok = isinstance(last, dict) and last.get("stop") is True
    elif path in ("/v1/responses", "/responses"):
        ok = isinstance(last, dict) and last.get("type") in (
            "response.completed",
            "response.incomplete",
            "response.failed",
        )
    elif is_anthropic(path):
        ok = ev == "message_stop"
    else:
        ok = True
    return (
        None
        if ok
        else f"the stream ended without its final event or an error event (last: {str(last)[:200]})"
    )


def parse_sse(text: str) -> tuple[list[tuple[str | None, Any]], str | None]:
    """-> ([(event name, data as JSON or "[DONE]")], a problem)."""
    out: list[tuple[str | None, Any]] = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        if not block.strip():
            continue
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip(" "))
            elif line.startswith(":") or not line:
                continue
            else:
                return out, f"not an SSE line: {line[:120]!r}"
        if not data:
            continue
        raw = "\n".join(data)
        if raw == "[DONE]":
            out.append((name, raw))
            continue
        try:
            out.append((name, json.loads(raw, parse_constant=_no_constant)))
        except ValueError as e:
            return out, f"an SSE data line is not JSON ({e}): {raw[:120]!r}"
    return out, None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def check(client: httpx.Client, base_url: str, case: Case, deadline: float = 10.0,
          headers: dict[str, str] | None = None) -> Result:  # fmt: skip
    """Send ``case``; the result says what was wrong with the answer (``problem`` None: nothing)."""
    # a connection of its own: a drop is this request's (after a 500, a pooled connection may be reset)
    h = {"content-type": "application/json", "connection": "close"} | (headers or {})
    t0 = time.monotonic()
    status = None
    try:
        with client.stream("POST", base_url + case.url, content=case.body, headers=h, timeout=deadline) as r:
            status = r.status_code
            chunks = []
            for chunk in r.iter_bytes():
                chunks.append(chunk)
                if time.monotonic() - t0 > deadline:
                    return Result(
                        status, time.monotonic() - t0, f"no complete answer within {deadline} s (hang)"
                    )
            raw = b"".join(chunks)
            ctype = r.headers.get("content-type", "")
    except httpx.TimeoutException:
        return Result(status, time.monotonic() - t0, f"no answer within {deadline} s (hang)")
    except httpx.HTTPError as e:
        return Result(status, time.monotonic() - t0, f"connection dropped: {type(e).__name__}: {e}")
    dt = time.monotonic() - t0
    if status >= 500 and status not in (501, 503):  # (501: a feature this server was not started with)
        return Result(status, dt, f"HTTP {status}: {raw[:500]!r}")
    if "application/x-ndjson" in ctype:  # ollama's stream: a JSON object a line, the last done or an error
        try:
            lines = [
                json.loads(x, parse_constant=_no_constant) for x in raw.decode("utf-8").splitlines() if x
            ]
        except ValueError as e:
            return Result(status, dt, f"an NDJSON line is not JSON ({e})")
        last = lines[-1] if lines else None
        ok = isinstance(last, dict) and (last.get("done") is True or isinstance(last.get("error"), str))
        return Result(status, dt, None if ok else f"the NDJSON stream ended without done or error: {last}")
    if "text/event-stream" in ctype:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            return Result(status, dt, "the stream is not UTF-8")
        events, problem = parse_sse(text)
        problem = problem or _stream_end_problem(case.url, events)
        return Result(status, dt, problem, events=len(events))
    try:
        obj = json.loads(raw, parse_constant=_no_constant)
    except ValueError:
        return Result(status, dt, f"HTTP {status} body is not JSON: {raw[:300]!r}")
    if status >= 400:
        problem = error_shape_problem(case.url, obj)
        return Result(status, dt, f"{problem}: {raw[:300]!r}" if problem else None)
    if status >= 300 or not math.isfinite(dt):
        return Result(status, dt, f"unexpected HTTP {status}")
    return Result(status, dt)


def served_model(client: httpx.Client, base_url: str) -> str:
    """The served model's name on ollama's routes (``GET /api/tags``)."""
    name = str(client.get(base_url + "/api/tags", timeout=30).json()["models"][0]["name"])
    return name.removesuffix(":latest")


def healthy(client: httpx.Client, base_url: str, timeout: float = 10.0) -> str | None:
    """None when ``/health`` answers 200 within ``timeout`` seconds, else what happened."""
    t0 = time.monotonic()
    try:
        r = client.get(base_url + "/health", timeout=timeout)
    except httpx.HTTPError as e:
        return f"/health failed: {type(e).__name__}: {e}"
    if r.status_code != 200:
        return f"/health answered {r.status_code}: {r.text[:200]}"
    if time.monotonic() - t0 > timeout:
        return f"/health took {time.monotonic() - t0:.1f} s"
    return None
