"""Request bodies -> prompt tokens and :class:`GenParams`, with every limit checked (400 otherwise)."""

from __future__ import annotations

from dataclasses import field, replace
from typing import Any

from .._dataclass import dataclass
from .backend import Backend
from .engine import GenParams
from .errors import APIError, bad_request, context_error, not_supported
from .lora import n_lora_adapters, parse_lora_list
from .sampling import SamplingError, SamplingParams, parse_samplers, prepare_dry
from .schemas import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    NativeCompletionRequest,
    SamplingFields,
)

_OFF: tuple[Any, ...] = (None, "", [], {}, False)  # (0 == False: a 0 is off too)
_INTERNAL = "llama-server's internal chat parser field; chat requests parse their answer themselves"
# llama-server request fields that change the answer and that llamapy does not implement: a 400 naming
# the field unless its value is one of those that leave the answer as it is
_UNSUPPORTED_FIELDS: dict[str, tuple[tuple[Any, ...], str]] = {
    # the raw lazy-grammar fields (tools arm a lazy grammar themselves)
    "grammar_lazy": (_OFF, "give 'tools' or 'grammar' instead"),
    "grammar_triggers": (_OFF, "give 'tools' or 'grammar' instead"),
    "preserved_tokens": (_OFF, "give 'tools' or 'grammar' instead"),
    "chat_format": ((None,), _INTERNAL),
    "chat_parser": ((None, ""), _INTERNAL),
    "generation_prompt": ((None, ""), _INTERNAL),
    "parse_tool_calls": ((None,), _INTERNAL),
    "reasoning_budget_message": (_OFF, "no thinking budget here to end with a message"),
    "reasoning_budget_start_tag": (_OFF, "no thinking budget here"),
    "reasoning_budget_end_tags": (_OFF, "no thinking budget here"),
    "reasoning_budget_end_tag": (_OFF, "no thinking budget here"),
}
MAX_STOP_STRINGS = 16


@dataclass
class Defaults:
    """Server-wide defaults (llama.cpp's), overridable per request."""

    sampling: SamplingParams = field(default_factory=SamplingParams)
    n_predict: int = -1
    n_keep: int = 0  # --keep: tokens a context shift keeps (-1: the whole prompt)
    # chat: llama-server's --reasoning (False: off), --reasoning-format (a request's reasoning_format wins)
    # and --chat-template-kwargs (a request's chat_template_kwargs are merged over them)
    reasoning: bool = True
    reasoning_format: str = "auto"
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)


def check_unsupported(req: SamplingFields) -> None:
    extra = req.model_extra or {}
    for name, (off, why) in _UNSUPPORTED_FIELDS.items():
        if extra.get(name) not in off:
            raise not_supported(f"'{name}' ({why})", param=name)
    if isinstance(req, ChatCompletionRequest):
        thinking_budget(req)
    n_choices(req)
    if isinstance(req, CompletionRequest):
        if req.best_of not in (None, 1):
            raise not_supported(f"best_of={req.best_of}", param="best_of")
    if isinstance(req, NativeCompletionRequest) and req.n_cmpl not in (None, 1):
        raise not_supported(f"n_cmpl={req.n_cmpl} (several completions per prompt)", param="n_cmpl")


def continue_flag(value: Any) -> bool | None:
    """llama-server's ``continue_final_message``: true, "content" or "reasoning_content" continue the last
    assistant message, false renders it as a finished turn, absent continues it when it is the last one
    (llama-server's default ``prefill_assistant``)."""
    if value is None:
        return None
    return value is True or value in ("content", "reasoning_content")


def thinking_budget(req: ChatCompletionRequest) -> int:
    """The request's ``reasoning_budget_tokens`` (or ``thinking_budget_tokens``, as llama-server reads
    them): -1 (absent) is unrestricted and 0 turns thinking off, as ``--reasoning-budget 0``; llamapy has
    no other budget (a 400)."""
    for name in ("reasoning_budget_tokens", "thinking_budget_tokens"):
        value = getattr(req, name)
        if value is None or value == -1:
            continue
        if value == 0:
            return 0
        raise not_supported(
            f"'{name}'={value} (a thinking token budget): give -1 (unrestricted) or 0 (thinking off)",
            param=name,
        )
    return -1


MAX_CHOICES = 16


def n_choices(req: SamplingFields, allowed: bool = True) -> int:
    """The request's ``n`` (1 when absent): 1 to :data:`MAX_CHOICES`; ``allowed=False``: only 1."""
    if req.n is None:
        return 1
    if not allowed and req.n != 1:
        raise not_supported(f"n={req.n} (several choices) on this endpoint; use n=1", param="n")
    if not 1 <= req.n <= MAX_CHOICES:
        raise bad_request(f"'n' must be between 1 and {MAX_CHOICES}, got {req.n}", "n")
    return req.n


def _grammar_error(e: Exception, param: str) -> APIError:
    return bad_request(f"invalid {param}: {e}", param)


def completion_grammar(req: SamplingFields, vocab: Any) -> Any:
    """The grammar of a completion request: ``grammar`` (GBNF, or Lark after ``%llguidance``),
    ``json_schema``, or (``/v1/completions``) ``response_format``; two of them at once is a 400."""
    from ..api.chat_request import ChatRequestError, response_format_grammar
    from ..grammar import GrammarError, LlamaGrammar

    given = [
        n for n in ("grammar", "json_schema", "response_format") if getattr(req, n, None) not in (None, "")
    ]
    rf = getattr(req, "response_format", None)
    if "response_format" in given and (rf or {}).get("type", "text") == "text":
        given.remove("response_format")
    if len(given) > 1:
        raise bad_request(
            f"give one of 'grammar', 'json_schema' or 'response_format', not {' and '.join(given)}", given[1]
        )
    if not given:
        return None
    name = given[0]
    try:
        if name == "grammar":
            g = LlamaGrammar.from_string(req.grammar)
        elif name == "json_schema":
            g = LlamaGrammar.from_json_schema(req.json_schema)
        else:
            g = response_format_grammar(rf)
        if g is not None:
            g.check(vocab)
        return g
    except ChatRequestError as e:
        raise bad_request(str(e), e.param or name) from None
    except GrammarError as e:
        raise _grammar_error(e, name) from None


MAX_N_PREDICT = 1 << 24  # with a context shift an answer may outgrow the slot, up to this


def n_predict_from(
    value: int | None,
    name: str,
    n_ctx_slot: int,
    default: int,
    allow_zero: bool,
    context_shift: bool = False,
) -> int:
    """A token limit, as llama-server takes it: -1 is no limit (up to the context), a value past what a
    slot can generate is clamped to the slot's context (:data:`MAX_N_PREDICT` with ``context_shift``);
    another negative (or 0 unless ``allow_zero``) is a 400."""
    if value is None:
        return default
    if value == -1:
        return -1
    lo = 0 if allow_zero else 1
    if value < lo:
        raise bad_request(f"'{name}' must be at least {lo} (or -1 for no limit), got {value}", name)
    return min(value, MAX_N_PREDICT if context_shift else n_ctx_slot)


def gen_params(
    req: SamplingFields, backend: Backend, defaults: Defaults, n_ctx_slot: int, n_predict: int, n_slots: int
) -> GenParams:
    """The request's :class:`GenParams`, every value checked (a 400 otherwise). It may tokenize
    (``logit_bias`` text keys, DRY's sequence breakers): the server calls it off the event loop."""
    check_unsupported(req)
    try:
        samplers = parse_samplers(req.samplers) if req.samplers is not None else None
    except SamplingError as e:
        raise bad_request(str(e), "samplers") from None
    # request field -> SamplingParams field (llama.cpp's names on the right)
    mapping = {
        "temperature": "temp",
        "top_k": "top_k",
        "top_p": "top_p",
        "min_p": "min_p",
        "typical_p": "typ_p",
        "min_keep": "min_keep",
        "top_n_sigma": "top_n_sigma",
        "xtc_probability": "xtc_probability",
        "xtc_threshold": "xtc_threshold",
        "dynatemp_range": "dynatemp_range",
        "dynatemp_exponent": "dynatemp_exponent",
        "repeat_penalty": "penalty_repeat",
        "repeat_last_n": "penalty_last_n",
        "presence_penalty": "penalty_present",
        "frequency_penalty": "penalty_freq",
        "dry_multiplier": "dry_multiplier",
        "dry_base": "dry_base",
        "dry_allowed_length": "dry_allowed_length",
        "dry_penalty_last_n": "dry_penalty_last_n",
        "dry_sequence_breakers": "dry_sequence_breakers",
        "mirostat": "mirostat",
        "mirostat_tau": "mirostat_tau",
        "mirostat_eta": "mirostat_eta",
        "adaptive_target": "adaptive_target",
        "adaptive_decay": "adaptive_decay",
    }
    changes: dict[str, Any] = {
        dst: getattr(req, src) for src, dst in mapping.items() if getattr(req, src) is not None
    }
    if req.seed is not None and req.seed >= 0:
        changes["seed"] = req.seed & 0xFFFFFFFF
    if samplers is not None:
        changes["samplers"] = samplers
    changes["logit_bias"] = logit_bias_from(req.logit_bias, backend)
    cfg = replace(defaults.sampling, **changes)
    try:
        cfg.validate()
    except SamplingError as e:
        raise bad_request(f"invalid sampling parameters: {e}") from None
    prepare_dry(cfg, getattr(backend, "vocab", None))
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if len(stop) > MAX_STOP_STRINGS:
        raise bad_request(f"at most {MAX_STOP_STRINGS} stop strings are allowed, got {len(stop)}", "stop")
    if req.id_slot is not None and req.id_slot != -1 and not 0 <= req.id_slot < n_slots:
        raise bad_request(
            f"'id_slot' {req.id_slot} does not exist (the server has {n_slots} slots)", "id_slot"
        )
    n_keep, n_discard = shift_params(req, defaults, n_ctx_slot)
    return GenParams(
        n_predict=n_predict,
        n_keep=n_keep,
        n_discard=n_discard,
        sampling=cfg,
        stop=[s for s in stop if s],
        ignore_eos=req.ignore_eos,
        n_probs=req.n_probs or 0,
        post_sampling_probs=req.post_sampling_probs,
        return_progress=req.return_progress and req.stream,  # (llama-server: streams only, else ignored)
        cache_prompt=req.cache_prompt,
        id_slot=-1 if req.id_slot is None else req.id_slot,
        lora=None if req.lora is None else parse_lora_list(req.lora, n_lora_adapters(backend)),
        n_indent=req.n_indent or 0,
        t_max_predict_ms=max(0.0, req.t_max_predict_ms or 0.0),  # (<= 0: off, as llama-server)
    )


def shift_params(req: SamplingFields, defaults: Defaults, n_ctx_slot: int) -> tuple[int, int]:
    """The request's ``n_keep`` and ``n_discard``, checked here (a 400 when out of range): ``n_keep``
    -1 (the whole prompt) or 0 to ``n_ctx_slot - 1``; ``n_discard`` 0 (half of what follows
    ``n_keep``) to ``n_ctx_slot - 1``. The engine clamps both again against what the slot holds at each
    shift (:func:`llamapy.generation.context_shift_plan`), so a value that passes here still never
    reaches the KV cache out of bounds."""
    n_keep = defaults.n_keep if req.n_keep is None else req.n_keep
    if not -1 <= n_keep < n_ctx_slot:
        raise bad_request(
            f"'n_keep' must be -1 (the whole prompt) or between 0 and {n_ctx_slot - 1} (a slot's context "
            f"holds {n_ctx_slot} tokens), got {n_keep}",
            "n_keep",
        )
    n_discard = req.n_discard or 0
    if not 0 <= n_discard < n_ctx_slot:
        raise bad_request(
            f"'n_discard' must be between 0 (half of the tokens after n_keep) and {n_ctx_slot - 1}, "
            f"got {n_discard}",
            "n_discard",
        )
    return n_keep, n_discard


MAX_LOGIT_BIAS_STRINGS = 1024  # text keys (each one tokenized): at most this many ...
MAX_LOGIT_BIAS_CHARS = 16384  # ... and this many characters in all


def logit_bias_from(lb: Any, backend: Backend) -> dict[int, float]:
    """OpenAI ``{"id": bias}``, llama.cpp ``[[id, bias | false], ...]`` and ``{"text": bias}`` forms.

    Bounded before anything is tokenized: at most one entry per vocabulary token, and at most
    :data:`MAX_LOGIT_BIAS_STRINGS` text keys of :data:`MAX_LOGIT_BIAS_CHARS` characters in all."""
    if not lb:
        return {}
    if len(lb) > backend.n_vocab:
        raise bad_request(
            f"logit_bias has {len(lb)} entries; the limit is one per token of the vocabulary "
            f"({backend.n_vocab})",
            "logit_bias",
        )
    pairs: list[tuple[Any, Any]] = list(lb.items()) if isinstance(lb, dict) else []
    if isinstance(lb, list):
        for i, item in enumerate(lb):
            if len(item) != 2:
                raise bad_request(f"logit_bias[{i}] must be a pair [token, bias], got {item!r}", "logit_bias")
            pairs.append((item[0], item[1]))
    texts = [k for k, _ in pairs if isinstance(k, str) and not k.lstrip("-").isdigit()]
    if len(texts) > MAX_LOGIT_BIAS_STRINGS or sum(map(len, texts)) > MAX_LOGIT_BIAS_CHARS:
        raise bad_request(
            f"logit_bias has {len(texts)} text keys of {sum(map(len, texts))} characters; the limits are "
            f"{MAX_LOGIT_BIAS_STRINGS} keys and {MAX_LOGIT_BIAS_CHARS} characters (give token ids instead)",
            "logit_bias",
        )
    out: dict[int, float] = {}
    for key, bias in pairs:
        if bias is False:
            value = float("-inf")
        elif isinstance(bias, bool) or not isinstance(bias, int | float):
            raise bad_request(f"logit_bias for {key!r} must be a number or false, got {bias!r}", "logit_bias")
        else:
            value = float(bias)
            if not -100.0 <= value <= 100.0:
                raise bad_request(
                    f"logit_bias for {key!r} must be between -100 and 100, got {value}", "logit_bias"
                )
        if isinstance(key, int) and not isinstance(key, bool):
            ids = [key]
        elif isinstance(key, str) and key.lstrip("-").isdigit():
            ids = [int(key)]
        elif isinstance(key, str):
            ids = backend.tokenize(key, add_special=False, parse_special=False)
        else:
            raise bad_request(f"logit_bias key {key!r} must be a token id or a string", "logit_bias")
        for t in ids:
            if not 0 <= t < backend.n_vocab:
                raise bad_request(
                    f"logit_bias token id {t} is out of range [0, {backend.n_vocab})", "logit_bias"
                )
            out[t] = value
    return out


def check_tokens(tokens: list[int], n_vocab: int, param: str = "prompt") -> list[int]:
    for i, t in enumerate(tokens):
        if not 0 <= t < n_vocab:
            raise bad_request(f"token id {t} at {param}[{i}] is out of range [0, {n_vocab})", param)
    return tokens


def tokenize_limited(
    backend: Backend, text: str, add_special: bool, parse_special: bool, max_tokens: int | None
) -> list[int]:
    """``backend.tokenize``, stopping with a 400 as soon as the text is known to have more than
    ``max_tokens`` tokens (a prompt past the slot's context: no need to tokenize all of a huge one)."""
    from ..vocab import TooManyTokensError, Vocab

    vocab = getattr(backend, "vocab", None)
    if max_tokens is None or not isinstance(vocab, Vocab):
        return backend.tokenize(text, add_special=add_special, parse_special=parse_special)
    try:
        return list(vocab.tokenize(text, add_special, parse_special, max_tokens=max_tokens))
    except TooManyTokensError:
        pass
    # past the context: counted exactly for llama-server's n_prompt_tokens unless the text is huge
    n = len(vocab.tokenize(text, add_special, parse_special)) if len(text) <= EXACT_COUNT_CHARS else None
    raise context_error(n or max_tokens + 1, max_tokens, at_least=n is None)


EXACT_COUNT_CHARS = 1 << 18  # a longer prompt past the context is reported as "more than n_ctx tokens"


def tokenize_prompt(
    prompt: Any, backend: Backend, param: str = "prompt", max_tokens: int | None = None
) -> list[int]:
    """ONE completion prompt: a string, a token list, a one-element list of either, or llama.cpp's mix of
    token ids and strings (``max_tokens``: a string prompt past it is a 400, found early). A list of
    several prompts is :func:`tokenize_prompts`' (a 400 here)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tokenize_limited(backend, prompt, True, True, max_tokens)
    if isinstance(prompt, list) and all(isinstance(x, int) for x in prompt):
        return check_tokens(list(prompt), backend.n_vocab, param)
    if isinstance(prompt, list) and all(isinstance(x, int | str) for x in prompt) and not several(prompt):
        out: list[int] = []
        for i, x in enumerate(prompt):
            if isinstance(x, str):
                out += backend.tokenize(x, add_special=(i == 0), parse_special=True)
            else:
                out += check_tokens([x], backend.n_vocab, f"{param}[{i}]")
        return out
    raise bad_request(
        f"'{param}' must be a string, a list of token ids or a list of token ids and strings", param
    )


def several(prompt: Any) -> bool:
    """llama-server's rule (``tokenize_input_prompts``): a list that holds no number is several prompts
    (each a string, a token list or a mixed list); a list with a number in it is one prompt."""
    return isinstance(prompt, list) and len(prompt) > 1 and not any(isinstance(x, int) for x in prompt)


def tokenize_prompts(
    prompt: Any, backend: Backend, param: str = "prompt", max_tokens: int | None = None
) -> list[list[int]]:
    """The prompts of a completion request (one or several, see :func:`several`), at most
    :data:`MAX_CHOICES` of them."""
    if not several(prompt):
        return [tokenize_prompt(prompt, backend, param, max_tokens)]
    if len(prompt) > MAX_CHOICES:
        raise bad_request(f"at most {MAX_CHOICES} prompts per request, got {len(prompt)}", param)
    return [tokenize_prompt(p, backend, f"{param}[{i}]", max_tokens) for i, p in enumerate(prompt)]


def messages_to_dicts(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    out = []
    for i, m in enumerate(messages):
        d: dict[str, Any] = {"role": m.role}
        if isinstance(m.content, list):
            texts = []
            for j, part in enumerate(m.content):
                if part.type != "text":
                    raise not_supported(f"content part type '{part.type}'", param=f"messages.{i}.content.{j}")
                if part.text is None:
                    raise bad_request(
                        f"messages.{i}.content.{j} has type 'text' but no 'text'", f"messages.{i}.content"
                    )
                texts.append(part.text)
            d["content"] = "".join(texts)
        elif m.content is None:  # an assistant's may be null (with tool calls or not), as llama-server's
            if m.role != "assistant":
                raise bad_request(f"messages.{i} ({m.role}) has no content", f"messages.{i}.content")
            d["content"] = ""
        else:
            d["content"] = m.content
        for k in ("name", "tool_call_id", "reasoning_content"):
            v = getattr(m, k)
            if v is not None:
                d[k] = v
        if m.tool_calls is not None:
            d["tool_calls"] = [c.model_dump(exclude_unset=True) for c in m.tool_calls]
        out.append(d)
    return out


def chat_prompt(
    req: ChatCompletionRequest, backend: Backend, defaults: Defaults | None = None
) -> tuple[str, list[int]]:
    """The prompt text and tokens of a conversation (``/apply-template`` and chat without extras)."""
    plan = chat_plan(req, backend, defaults)
    return plan.prompt, chat_tokens(plan.prompt, backend)


def chat_tokens(text: str, backend: Backend, max_tokens: int | None = None) -> list[int]:
    """The tokens of a rendered chat prompt (``max_tokens``: past it is a 400, found early)."""
    tokens = tokenize_limited(backend, text, True, True, max_tokens)
    if len(tokens) >= 2 and tokens[0] == tokens[1] and backend.tokenize("", True, False)[:1] == tokens[:1]:
        tokens = tokens[1:]  # the template wrote BOS and the tokenizer added another one
    return tokens


def chat_plan(req: ChatCompletionRequest, backend: Backend, defaults: Defaults | None = None) -> Any:
    """A chat request planned by :func:`llamapy.api.chat_request.plan_chat`: prompt, grammar, chat format
    (bad tools, grammars and templates are 400s). ``defaults``: the server's reasoning switch, reasoning
    format and template kwargs (the request's ``reasoning_format`` and ``chat_template_kwargs`` win, as
    llama-server's); the request's ``reasoning_effort`` is OpenAI's field."""
    from ..api.chat_request import ChatRequestError, plan_chat
    from ..grammar import GrammarError, LlamaGrammar
    from ..vocab.chat_template import TemplateError

    grammar = req.grammar or None
    if req.json_schema is not None:
        if grammar is not None:
            raise bad_request("give either 'grammar' or 'json_schema', not both", "json_schema")
        try:
            grammar = LlamaGrammar.from_json_schema(req.json_schema)
        except GrammarError as e:
            raise _grammar_error(e, "json_schema") from None
    d = defaults or Defaults()
    kwargs = {**d.chat_template_kwargs, **(req.chat_template_kwargs or {})}
    budget = thinking_budget(req)
    if budget == 0:  # as --reasoning-budget 0: thinking off, over the kwargs
        kwargs["enable_thinking"] = False
    tools = req.tools
    tool_choice = req.tool_choice
    if req.functions and not tools:  # OpenAI's deprecated function calling
        tools = [{"type": "function", "function": f} for f in req.functions]
        fc = req.function_call
        tool_choice = {"type": "function", "function": fc} if isinstance(fc, dict) else fc
    try:
        return plan_chat(
            backend.chat_template,
            getattr(backend, "vocab", None),
            messages_to_dicts(req.messages),
            tools=tools,
            tool_choice=tool_choice,
            parallel_tool_calls=req.parallel_tool_calls,
            response_format=req.response_format,
            grammar=grammar,
            reasoning_format=req.reasoning_format or d.reasoning_format,
            chat_template_kwargs=kwargs,
            add_generation_prompt=req.add_generation_prompt,
            reasoning=d.reasoning and budget != 0,
            reasoning_effort=req.reasoning_effort,
            continue_final_message=continue_flag(req.continue_final_message),
        )
    except ChatRequestError as e:
        raise bad_request(str(e), e.param) from None
    except GrammarError as e:
        param = "grammar" if req.grammar else "json_schema" if req.json_schema is not None else "tools"
        if req.response_format is not None and not req.tools:
            param = "response_format"
        raise _grammar_error(e, param) from None
    except TemplateError as e:
        raise APIError(400, f"the chat template failed on these messages: {e}", param="messages") from None


def completion_reasoning_format(req: SamplingFields, defaults: Defaults) -> str:
    """The reasoning format a ``/completion`` reports, as llama-server's: the request's
    ``reasoning_format`` (checked) or the server's, "auto" shown as "deepseek". (A completion's text is
    not parsed: this is the value echoed in its ``generation_settings``.)"""
    from ..api.chat_request import REASONING_FORMATS

    value = (req.model_extra or {}).get("reasoning_format")
    if value is None:
        value = defaults.reasoning_format
    elif value not in REASONING_FORMATS:
        raise bad_request(
            f"'reasoning_format' {value!r} is not one of {', '.join(REASONING_FORMATS)}", "reasoning_format"
        )
    return "deepseek" if value == "auto" else value


def native_n_predict(
    req: NativeCompletionRequest, n_ctx_slot: int, defaults: Defaults, context_shift: bool = False
) -> int:
    return n_predict_from(
        req.n_predict, "n_predict", n_ctx_slot, defaults.n_predict, True, context_shift=context_shift
    )
