"""Request bodies of the OpenAI and llama.cpp endpoints, validated strictly (wrong types -> 400).

Unknown fields are accepted and ignored (clients send many), except the ones that would change the
answer and that llamapy cannot honour yet (``grammar_triggers``, ``best_of`` ...): those are refused by
:mod:`llamapy.server.params` with a 400 "not supported yet".
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal, TypeVar

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator

from .errors import APIError, bad_request

Role = Literal["system", "developer", "user", "assistant", "tool"]
StopField = str | list[str] | None
# OpenAI: {"50256": -100}; llama.cpp also: [[id, bias | false], ...] and {"text": bias}
LogitBiasField = dict[str, float | bool] | list[list[int | float | bool | str]] | None


def _integral(v: Any) -> Any:
    """An integer field takes an integral float (``6.0``, as llama-server's JSON reader does); ``6.5``
    stays an error."""
    if isinstance(v, float) and not isinstance(v, bool):
        if not v.is_integer():
            raise ValueError(f"must be an integer, got {v}")
        return int(v)
    return v


Int = Annotated[int, BeforeValidator(_integral)]  # an integer field (strict, but 6.0 is 6)


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class ContentPart(_Body):
    type: str
    text: str | None = None


class ToolCallFunction(_Body):
    name: str
    arguments: str | dict[str, Any] | None = None  # OpenAI: a JSON string; llama.cpp also takes an object


class ToolCall(_Body):
    """An assistant message's tool call (OpenAI's shape), checked here so that the chat template and
    the format code only ever see this shape."""

    id: str | None = None
    type: str | None = None
    function: ToolCallFunction


class ChatMessage(_Body):
    role: Role
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class StreamOptions(_Body):
    include_usage: bool = False


class SamplingFields(_Body):
    """Fields common to every generating endpoint (OpenAI names and llama.cpp extras)."""

    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0.0, le=100.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    top_k: Int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    typical_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: Int | None = None
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    repeat_penalty: float | None = Field(None, ge=0.0, le=10.0)
    repeat_last_n: Int | None = Field(None, ge=-1)
    stop: StopField = None
    logit_bias: LogitBiasField = None
    n_probs: Int | None = Field(None, ge=0, le=100)
    min_keep: Int | None = Field(None, ge=0)
    top_n_sigma: float | None = None
    xtc_probability: float | None = Field(None, ge=0.0, le=1.0)
    xtc_threshold: float | None = Field(None, ge=0.0, le=1.0)
    dynatemp_range: float | None = Field(None, ge=0.0)
    dynatemp_exponent: float | None = Field(None, ge=0.0)
    dry_multiplier: float | None = Field(None, ge=0.0)
    dry_base: float | None = Field(None, ge=1.0)
    dry_allowed_length: Int | None = Field(None, ge=0)
    dry_penalty_last_n: Int | None = Field(None, ge=-1)
    dry_sequence_breakers: list[str] | None = None
    mirostat: Literal[0, 1, 2] | None = None
    mirostat_tau: float | None = Field(None, ge=0.0)
    mirostat_eta: float | None = Field(None, ge=0.0)
    adaptive_target: float | None = Field(None, le=1.0)  # the adaptive-p sampler (< 0: off)
    adaptive_decay: float | None = Field(None, ge=0.0, le=0.99)
    cache_prompt: bool = True
    samplers: list[str] | str | None = None
    ignore_eos: bool = False
    id_slot: Int | None = None
    n: Int | None = None
    user: str | None = None
    grammar: str | None = None  # llama.cpp GBNF (or llguidance Lark after "%llguidance")
    json_schema: dict[str, Any] | bool | None = None
    # llama-server's context shift fields (range-checked against the slot in params.gen_params)
    n_keep: Int | None = None
    n_discard: Int | None = None
    # llama-server's line stops for code completion (llama.vim, llama.vscode): params.gen_params
    n_indent: Int | None = Field(None, ge=0)
    t_max_predict_ms: float | None = None
    lora: list[Any] | None = None  # [{"id", "scale"}]: this request's LoRA scales (server/lora.py)
    timings_per_token: bool = False  # llama-server: every stream event carries "timings"
    # llama-server's: with n_probs/logprobs, probabilities after the sampler chain ("prob", "top_probs")
    post_sampling_probs: bool = False
    return_progress: bool = False  # llama-server's prompt_progress events in a stream (ignored otherwise)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: Int | None = None
    max_completion_tokens: Int | None = None
    n_predict: Int | None = None  # llama.cpp's name of max_tokens (it wins over both)
    logprobs: bool | None = None
    top_logprobs: Int | None = Field(None, ge=0, le=20)
    response_format: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    reasoning_format: str | None = None
    reasoning_effort: str | None = None  # OpenAI's: "none" turns thinking off, another is the template's
    # llama-server's: continue the last assistant message (the default when it is the last; params.continue_flag)
    continue_final_message: bool | Literal["content", "reasoning_content"] | None = None
    # llama-server's thinking budget: only -1 (unrestricted) and 0 (thinking off) here (params.thinking_budget)
    reasoning_budget_tokens: Int | None = None
    thinking_budget_tokens: Int | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    functions: list[dict[str, Any]] | None = None  # OpenAI's deprecated function calling
    function_call: str | dict[str, Any] | None = None

    @field_validator("chat_template_kwargs")
    @classmethod
    def _no_reserved_kwargs(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        for key in RESERVED_TEMPLATE_KWARGS.intersection(v or {}):
            hint = f": give it as the request's '{key}' field" if key in cls.model_fields else ""
            raise ValueError(f"'{key}' is set by the server and cannot be a chat template kwarg{hint}")
        return v


# what the chat template is rendered with by the server itself (ChatTemplate.render's arguments)
RESERVED_TEMPLATE_KWARGS = frozenset({"messages", "add_generation_prompt", "tools", "documents", "self"})

# one prompt (a string, token ids, or llama.cpp's mix of both) or several (a list of them, no number in
# it): params.tokenize_prompts
PromptField = str | list[int | str | list[int | str]]


class CompletionRequest(SamplingFields):
    prompt: PromptField
    max_tokens: Int | None = None
    logprobs: Int | None = Field(None, ge=0, le=20)
    echo: bool = False
    suffix: str | None = None
    best_of: Int | None = None
    response_format: dict[str, Any] | None = None


class NativeCompletionRequest(SamplingFields):
    """llama.cpp's ``/completion`` body."""

    prompt: PromptField
    n_predict: Int | None = None
    return_tokens: bool = False
    response_fields: list[str] | None = None  # only these fields of the answer (paths "a/b")
    n_cmpl: Int | None = None  # llama-server's completions per prompt (only 1 here)


class InfillChunk(_Body):
    text: str = ""
    filename: str = "tmp"


class InfillRequest(NativeCompletionRequest):
    """llama.cpp's ``/infill`` body: ``/completion``'s fields plus the fill-in-the-middle parts."""

    prompt: str = ""
    input_prefix: str | list[int | str]
    input_suffix: str | list[int | str]
    input_extra: list[InfillChunk] = Field(default_factory=list, max_length=1024)


class EmbeddingRequest(_Body):
    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None


class TokenizeRequest(_Body):
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(_Body):
    tokens: list[int]


class ApplyTemplateRequest(_Body):
    messages: list[ChatMessage] = Field(min_length=1)
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None  # (checked as a chat request's)
    reasoning_effort: str | None = None
    continue_final_message: bool | Literal["content", "reasoning_content"] | None = None


M = TypeVar("M", bound=BaseModel)


MAX_JSON_DEPTH = 64  # nesting of arrays and objects in a request body
MAX_JSON_CONTAINERS = (
    1 << 18
)  # arrays and objects in a request body (millions take seconds to parse and validate)


class _NonFinite(ValueError):
    pass


def _reject_constant(name: str) -> Any:
    raise _NonFinite(name)


def json_depth(raw: bytes) -> int:
    """The deepest nesting of ``[``/``{`` in JSON text, outside strings (see :func:`json_shape`)."""
    return json_shape(raw)[0]


def json_shape(raw: bytes) -> tuple[int, int]:
    """The deepest nesting of ``[``/``{`` in JSON text, outside strings, and how many arrays and objects
    it opens: linear, with no recursion and no regex (a string regex re-scans the rest of an
    unterminated string at every escaped quote: quadratic).

    Backslash pairs go first, then escaped quotes, so that every quote left opens or closes a string;
    a byte after an odd number of quotes is inside one. Text that is not JSON gets some numbers here and
    its 400 from the parser."""
    bare = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    if not bare:
        return 0, 0
    a = np.frombuffer(bare, np.uint8)
    steps = _STEP[a]
    if b'"' in bare:
        steps[(np.cumsum(a == _QUOTE, dtype=np.int32) & 1).astype(bool)] = 0
    return max(int(np.cumsum(steps, dtype=np.int32).max()), 0), int(np.count_nonzero(steps == 1))


_QUOTE = ord('"')
_STEP = np.zeros(256, np.int8)
_STEP[list(b"[{")] = 1
_STEP[list(b"]}")] = -1


def parse_json(raw: bytes, max_depth: int = MAX_JSON_DEPTH, array_ok: bool = False) -> Any:
    """Parse a request body; anything but a JSON object (or array, with ``array_ok``) is a 400 that
    says where it broke.

    Bounded before anything is built: the size by the guard middleware's body limit, the nesting depth
    here (deeper bodies are refused unparsed, so neither the parser nor validation can recurse without
    bound); ``NaN`` / ``Infinity`` literals (not JSON) and over-long integers are 400s too."""
    if not raw.strip():
        raise bad_request("the request body is empty; expected a JSON object")
    depth, containers = json_shape(raw)
    if depth > max_depth:
        raise bad_request(f"the request body nests arrays/objects {depth} deep; the limit is {max_depth}")
    if containers > MAX_JSON_CONTAINERS:
        raise bad_request(
            f"the request body has {containers} arrays/objects; the limit is {MAX_JSON_CONTAINERS}"
        )
    try:  # strict UTF-8 (RFC 8259): json.loads on bytes would let encoded surrogates through
        obj = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except UnicodeDecodeError as e:
        raise bad_request(f"the request body is not UTF-8 ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise bad_request(
            f"the request body is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}"
        ) from None
    except _NonFinite as e:
        raise bad_request(f"the request body is not valid JSON: {e} is not a JSON number") from None
    except (ValueError, RecursionError) as e:  # e.g. an integer of more than 4300 digits
        raise bad_request(f"the request body cannot be parsed: {e}") from None
    if not isinstance(obj, dict) and not (array_ok and isinstance(obj, list)):
        raise bad_request(f"the request body must be a JSON object, not {type(obj).__name__}")
    if _SURROGATE_ESCAPE.search(raw):
        where = _lone_surrogate(obj)
        if where is not None:
            raise bad_request(
                f"the request body has a lone UTF-16 surrogate escape (\\uD800-\\uDFFF) at '{where}', "
                "which is no Unicode character",
                where,
            )
    return obj


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _lone_surrogate(obj: Any) -> str | None:
    """The path of the first string (or key) holding a lone surrogate, which no text can be encoded with."""
    stack: list[tuple[str, Any]] = [("", obj)]
    while stack:
        path, x = stack.pop()
        if isinstance(x, dict):
            for k, v in x.items():
                key = str(k).encode("utf-8", "backslashreplace").decode()  # printable in the error
                p = f"{path}.{key}" if path else key
                if _bad_str(k):
                    return p
                stack.append((p, v))
        elif isinstance(x, list):
            stack.extend((f"{path}.{i}" if path else str(i), v) for i, v in enumerate(x))
        elif isinstance(x, str) and _bad_str(x):
            return path or "body"
    return None


def _bad_str(s: str) -> bool:
    if s.isascii():
        return False
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def validate(model: type[M], obj: Any) -> M:
    """Validate a parsed body; the first problem becomes a 400 naming the field and what was wrong."""
    try:
        return model.model_validate(obj)
    except ValidationError as e:
        errors = e.errors()
        err = errors[0]
        loc = _loc(err["loc"])
        got = err.get("input")
        got_s = "" if err["type"] == "missing" else f" (got {json.dumps(got)[:80]})" if _jsonable(got) else ""
        n_more = len({_loc(x["loc"]) for x in errors} - {loc})
        more = f" (and {n_more} more problems)" if n_more else ""
        msg = err["msg"].removeprefix("Value error, ")
        raise APIError(400, f"invalid field '{loc}': {msg}{got_s}{more}", param=loc) from None


_TYPE_TAGS = {"str", "int", "float", "bool", "none", "dict", "list", "ContentPart", "StreamOptions"}


def _loc(loc: tuple[Any, ...]) -> str:
    """``('stop', 'list[str]', 0)`` -> ``stop.0``: drop pydantic's union-member tags."""
    parts = [str(p) for p in loc if not (isinstance(p, str) and ("[" in p or p in _TYPE_TAGS))]
    return ".".join(parts) or "body"


def _jsonable(x: Any) -> bool:
    try:
        json.dumps(x)
        return True
    except (TypeError, ValueError):
        return False
