"""A request's inputs: its parsed body, and for a chat request its prompt tokens and :class:`GenParams`
(template, tools, grammar, images), shared by every API that chats (OpenAI chat completions, Responses,
Anthropic Messages, ollama)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from . import params as P
from .backend import Backend
from .engine import Engine, GenParams
from .errors import APIError, bad_request
from .schemas import ChatCompletionRequest, parse_json, validate

if TYPE_CHECKING:
    from collections.abc import Callable

    from .state import ModelEntry

INLINE_BODY_BYTES = 64 << 10  # larger bodies are parsed and validated off the event loop
T = TypeVar("T")
_JSON_KEY = "llamapy.json"  # a body parsed once (router mode reads 'model' before the route does)


async def body_json(request: Request) -> Any:
    """The request's JSON body, parsed once per request (off the event loop when large)."""
    if _JSON_KEY not in request.scope:
        raw = await request.body()
        if len(raw) <= INLINE_BODY_BYTES:
            request.scope[_JSON_KEY] = parse_json(raw)
        else:
            request.scope[_JSON_KEY] = await run_in_threadpool(parse_json, raw)
    return request.scope[_JSON_KEY]


async def parsed_body(request: Request, work: Callable[[dict[str, Any]], T]) -> T:
    """``work`` on the parsed body: on the event loop for a small body, in a worker thread for a larger
    one (parsing megabytes takes a second on a slow machine: ``/health`` must not wait for it)."""
    raw = await request.body()
    if _JSON_KEY in request.scope:
        obj = request.scope[_JSON_KEY]
        return work(obj) if len(raw) <= INLINE_BODY_BYTES else await run_in_threadpool(work, obj)
    if len(raw) <= INLINE_BODY_BYTES:
        return work(parse_json(raw))
    return await run_in_threadpool(lambda: work(parse_json(raw)))


async def read_body(request: Request, model: type) -> Any:
    """The body validated as ``model``."""
    return await parsed_body(request, lambda obj: validate(model, obj))


def max_messages_of(engine: Engine) -> int | None:
    """The most messages a chat request may have: each renders as at least one token, so more than a
    slot's context cannot fit (no bound with context shift, which drops old tokens instead)."""
    return None if engine.context_shift else engine.n_ctx_slot


def check_message_count(n: int, max_messages: int | None) -> None:
    if max_messages is not None and n > max_messages:
        raise bad_request(
            f"{n} messages cannot fit a slot's context of {max_messages} tokens "
            "(shorten the conversation or start the server with a larger -c or fewer -np)",
            "messages",
        )


def messages_fit(raw: Any, engine: Engine) -> None:
    """Before validation: a body whose ``messages`` list cannot fit a slot's context is a 400 unvalidated
    (validating 100k messages is one call that holds the GIL for most of a second)."""
    items = raw.get("messages") if isinstance(raw, dict) else None
    if isinstance(items, list):
        check_message_count(len(items), max_messages_of(engine))


def no_completions(backend: Backend) -> None:
    if backend.embeddings:
        raise APIError(
            501, "this server computes embeddings only; start it without --embeddings for completions"
        )


def include_usage(req: Any) -> bool:
    return bool(req.stream_options and req.stream_options.include_usage)


def settings_dict(
    gp: GenParams,
    full: bool = True,
    stream: bool = False,
    timings_per_token: bool = False,
    *,
    reasoning_format: str = "none",
    speculative_types: str = "none",
) -> dict[str, Any]:
    """llama-server's ``task_params::to_json``: a task's settings under its names and key set (``full``:
    the ``generation_settings`` of an answer; not: ``/props``' defaults, without stop, logit_bias,
    grammar and DRY's breakers). ``reasoning_format``: what the task reports (llama-server's /completion:
    the request's or the server's, "auto" shown as "deepseek"); ``speculative_types``: the backend's
    (:attr:`ContextBackend.speculative_types`). Chat answers carry no settings: the chat format, the
    generation prompt and the lazy grammar's triggers are those of a plain completion."""
    c = gp.sampling
    lazy = getattr(gp.grammar, "triggers", None) or []
    out: dict[str, Any] = {
        "seed": c.seed,
        "temperature": c.temp,
        "dynatemp_range": c.dynatemp_range,
        "dynatemp_exponent": c.dynatemp_exponent,
        "top_k": c.top_k,
        "top_p": c.top_p,
        "min_p": c.min_p,
        "top_n_sigma": c.top_n_sigma,
        "xtc_probability": c.xtc_probability,
        "xtc_threshold": c.xtc_threshold,
        "typical_p": c.typ_p,
        "repeat_last_n": c.penalty_last_n,
        "repeat_penalty": c.penalty_repeat,
        "presence_penalty": c.penalty_present,
        "frequency_penalty": c.penalty_freq,
        "dry_multiplier": c.dry_multiplier,
        "dry_base": c.dry_base,
        "dry_allowed_length": c.dry_allowed_length,
        "dry_penalty_last_n": c.dry_penalty_last_n,
        "dry_sequence_breakers": list(c.dry_sequence_breakers),
        "mirostat": c.mirostat,
        "mirostat_tau": c.mirostat_tau,
        "mirostat_eta": c.mirostat_eta,
        "adaptive_target": c.adaptive_target,
        "adaptive_decay": c.adaptive_decay,
        "stop": list(gp.stop),
        "max_tokens": gp.n_predict,
        "n_predict": gp.n_predict,
        "n_keep": gp.n_keep,
        "n_discard": gp.n_discard,
        "ignore_eos": gp.ignore_eos or c.ignore_eos,
        "stream": stream,
        "logit_bias": [{"bias": v, "token": k} for k, v in c.logit_bias.items()],
        "n_probs": gp.n_probs,
        "min_keep": c.min_keep,
        "grammar": getattr(gp.grammar, "source", "") if gp.grammar is not None else "",
        "grammar_lazy": bool(lazy),
        "grammar_triggers": [_trigger_json(t) for t in lazy],
        "preserved_tokens": list(gp.preserved_tokens),
        "chat_format": "Content-only" if gp.chat_format is None else str(getattr(gp.chat_format, "name", "")),
        "reasoning_format": reasoning_format,
        "reasoning_in_content": False,
        "generation_prompt": "",
        "samplers": list(c.samplers),
        "speculative.types": speculative_types,
        "timings_per_token": timings_per_token,
        "post_sampling_probs": gp.post_sampling_probs,
        "backend_sampling": False,
        "lora": [{"id": k, "scale": v} for k, v in (gp.lora or {}).items()],
    }
    if not full:
        for k in ("dry_sequence_breakers", "stop", "logit_bias", "grammar", "grammar_lazy"):
            del out[k]
        for k in ("grammar_triggers", "preserved_tokens"):
            del out[k]
    return out


_TRIGGER_TYPES = {"token": 0, "word": 1, "pattern": 2, "pattern_full": 3}  # common_grammar_trigger_type


def _trigger_json(t: Any) -> dict[str, Any]:
    """A lazy grammar's trigger as llama-server's ``server_grammar_trigger::to_json`` (a token trigger
    holds its id only: its text is left empty)."""
    if t.kind == "token":
        return {"type": 0, "value": "", "token": int(t.value)}
    return {"type": _TRIGGER_TYPES[t.kind], "value": str(t.value)}


async def prompt_tokens(
    req: ChatCompletionRequest, m: ModelEntry, limit: int | None, max_messages: int | None = None
) -> tuple[Any, list[int], dict[int, Any] | None]:
    """A chat request's plan (template, tools, grammar, parser) and prompt tokens; with image parts, the
    token view with negative pseudo tokens at image positions and the images by first token.
    ``limit``: the most prompt tokens (a longer prompt is a 400); ``max_messages``: the most messages."""
    _, backend = m.ready()
    images = None
    if has_image_parts(req):  # OpenAI image_url parts -> media markers; the images go in GenParams
        req, images = await run_in_threadpool(split_images, req, backend, m.settings.allow_image_urls)
    check_message_count(len(req.messages), max_messages)
    plan = await run_in_threadpool(P.chat_plan, req, backend, m.settings.defaults)
    if images is None:
        return plan, await run_in_threadpool(P.chat_tokens, plan.prompt, backend, limit), None
    tokens, by_pos = await run_in_threadpool(image_tokens, plan.prompt, images, backend)
    return plan, tokens, by_pos


async def count_tokens(req: ChatCompletionRequest, m: ModelEntry) -> int:
    """The prompt tokens a chat request would take (images as the tokens they become)."""
    _, tokens, _ = await prompt_tokens(req, m, None)
    return len(tokens)


async def chat_inputs(
    req: ChatCompletionRequest,
    m: ModelEntry,
    n_predict: int | None,
    n_predict_name: str,
    n_allowed: bool = False,
) -> tuple[list[int], GenParams]:
    """A validated chat request -> its prompt tokens and :class:`GenParams` (planned: template, tools,
    grammar, parser); shared by chat completions and the Responses, Messages and ollama APIs
    (``n_allowed``: chat completions only, which answers ``n > 1`` itself)."""
    engine, backend = m.ready()
    s = m.settings
    P.check_unsupported(req)
    P.n_choices(req, allowed=n_allowed)
    n = P.n_predict_from(
        n_predict, n_predict_name, engine.n_ctx_slot, s.defaults.n_predict, False, engine.context_shift
    )
    gp = await run_in_threadpool(
        P.gen_params, req, backend, s.defaults, engine.n_ctx_slot, n, engine.n_parallel
    )
    if req.logprobs:
        gp.logprobs, gp.n_probs = True, req.top_logprobs or 0
    elif req.top_logprobs:
        raise bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    limit = None if engine.context_shift else engine.n_ctx_slot  # a longer prompt is a 400: stop there
    plan, tokens, images = await prompt_tokens(req, m, limit, max_messages_of(engine))
    if images is not None:
        gp.images = images
    gp.grammar, gp.preserved_tokens = plan.grammar, plan.preserved_tokens
    gp.chat_format, gp.chat_syntax = plan.format, plan.syntax
    return tokens, gp


def has_image_parts(req: ChatCompletionRequest) -> bool:
    return any(isinstance(m.content, list) and any(p.type != "text" for p in m.content) for m in req.messages)


def split_images(req: ChatCompletionRequest, backend: Backend, allow_remote: bool) -> tuple[Any, list[Any]]:
    """The request with each image part turned into a media-marker text part, and the decoded images."""
    from ..mtmd import MEDIA_MARKER, MtmdError
    from ..mtmd.prompt import split_content
    from .schemas import ChatMessage, ContentPart

    mt = getattr(backend, "mtmd", None)
    if mt is None:
        raise bad_request(
            "image content parts are not supported yet on this server: start it with --mmproj FILE for vision",
            "messages",
        )
    raw = [{"role": m.role, "content": [p.model_dump() for p in m.content]} if isinstance(m.content, list)
           else None for m in req.messages]  # fmt: skip
    try:
        split, encoded = split_content([r for r in raw if r is not None], allow_remote=allow_remote)
        bitmaps = [mt.bitmap_from_bytes(data, where) for where, data in encoded]
    except MtmdError as e:
        raise bad_request(str(e), "messages") from None
    it = iter(split)
    msgs = []
    for m, r in zip(req.messages, raw, strict=True):
        if r is not None:
            text = next(it)["content"]
            parts = [ContentPart(type="text", text=text)]
            m = ChatMessage(**{**m.model_dump(exclude_none=True), "content": parts})
        msgs.append(m)
    n_markers = sum(m.content[0].text.count(MEDIA_MARKER) for m, r in zip(msgs, raw, strict=True) if r)
    if n_markers != len(bitmaps):
        raise bad_request(f"the text of the messages may not contain {MEDIA_MARKER!r}", "messages")
    return req.model_copy(update={"messages": msgs}), bitmaps


def image_tokens(prompt: str, bitmaps: list[Any], backend: Backend) -> tuple[list[int], dict[int, Any]]:
    """The prompt's token view (negative pseudo tokens at image positions) and its images by first token."""
    from ..mtmd import MtmdError
    from ..mtmd.prompt import chunk_tokens, dedupe_bos, image_map

    mt = backend.mtmd  # type: ignore[attr-defined]
    try:
        chunks = dedupe_bos(mt.tokenize(prompt, bitmaps), getattr(mt.vocab, "bos", -1))
    except MtmdError as e:
        raise bad_request(str(e), "messages") from None
    n_ub = int(backend.ctx.n_ubatch)  # type: ignore[attr-defined]
    for ch in image_map(chunks).values():
        if ch.non_causal and ch.n_tokens > min(n_ub, int(backend.n_batch)):
            raise bad_request(
                f"an image takes {ch.n_tokens} tokens, more than the server's batch (-b/-ub {n_ub})",
                "messages",
            )
    return chunk_tokens(chunks), image_map(chunks)
