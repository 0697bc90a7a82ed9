"""OpenAI's API: ``/v1/models``, ``/v1/chat/completions``, ``/v1/completions`` (the Responses API is in
:mod:`llamapy.server.responses`, embeddings in :mod:`llamapy.server.embeddings`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from fastapi import FastAPI, Request
from starlette.concurrency import run_in_threadpool

from . import mcp_http
from . import params as P
from .choices import choice_params, generate_n
from .errors import bad_request
from .formats import ChatFormatter, CompletionFormatter
from .infill import suffix_tokens
from .inputs import (
    chat_inputs,
    count_tokens,
    include_usage,
    messages_fit,
    no_completions,
    parsed_body,
    read_body,
)
from .schemas import ChatCompletionRequest, CompletionRequest, validate
from .state import ServerState
from .stream import generate


def model_object(m: Any, created: int) -> dict[str, Any]:
    """One ``/v1/models`` entry as llama-server's: OpenAI's fields, ``aliases``, ``tags`` and the loaded
    model's ``meta`` (and, router mode, its state)."""
    obj: dict[str, Any] = {
        "id": m.name,
        "aliases": [m.name],
        "tags": [],
        "object": "model",
        "created": created,
        "owned_by": "llamacpp",
    }
    if m.backend is not None:
        info = m.backend.info()
        meta = {"vocab_type": info.get("vocab_type", 0), "n_vocab": info.get("n_vocab", 0)}
        if m.engine is not None:
            meta["n_ctx"] = m.engine.n_ctx_slot
        for k in ("n_ctx_train", "n_embd", "n_params", "size", "ftype"):
            if k in info:
                meta[k] = info[k]
        obj["meta"] = meta
    return obj


def models_list(m: Any) -> dict[str, Any]:
    """llama-server's ``/models`` answer for one model: its ollama-style ``models`` list and OpenAI's
    ``data``."""
    entry = {
        "name": m.name,
        "model": m.name,
        "modified_at": "",
        "size": "",
        "digest": "",
        "type": "model",
        "description": "",
        "tags": [""],
        "capabilities": ["completion", "multimodal"] if getattr(m.backend, "mtmd", None) else ["completion"],
        "parameters": "",
        "details": {
            "parent_model": "",
            "format": "gguf",
            "family": "",
            "families": [""],
            "parameter_size": "",
            "quantization_level": "",
        },
    }
    return {"models": [entry], "object": "list", "data": [model_object(m, m.created)]}


def add_routes(app: FastAPI, state: ServerState) -> None:
    @app.get("/v1/models")
    @app.get("/models")
    async def models() -> dict[str, Any]:
        if state.router is not None:
            return {"object": "list", "data": state.router.model_list()}
        m = state.default
        assert m is not None
        m.ready()
        return models_list(m)

    @app.post("/v1/chat/completions")
    @app.post("/chat/completions")
    async def chat_completions(request: Request) -> Any:
        m = await state.pick(request)
        engine, backend = m.ready()
        no_completions(backend)

        def plan(raw: dict[str, Any]) -> ChatCompletionRequest:
            messages_fit(raw, engine)
            return validate(ChatCompletionRequest, raw)

        req = await parsed_body(request, plan)
        if mcp_http.requested(req):  # "mcp": the agent loop over the MCP servers' tools
            return await mcp_http.chat(request, m, req)
        n_predict, name = req.max_tokens, "max_tokens"
        for other in ("max_completion_tokens", "n_predict"):  # (llama.cpp's n_predict wins, as there)
            if getattr(req, other) is not None:
                n_predict, name = getattr(req, other), other
        tokens, gp = await chat_inputs(req, m, n_predict, name, n_allowed=True)
        n = P.n_choices(req)
        fmts = [ChatFormatter(m.name, bool(req.logprobs), req.timings_per_token) for _ in range(n)]
        if n > 1:
            return await generate_n(
                request, engine, [tokens] * n, choice_params(gp, n), fmts, req.stream, include_usage(req)
            )
        return await generate(request, engine, tokens, gp, fmts[0], req.stream, include_usage(req))

    @app.post("/v1/chat/completions/input_tokens")
    @app.post("/chat/completions/input_tokens")
    async def chat_input_tokens(request: Request) -> dict[str, Any]:
        """llama-server's token count of a chat request (its prompt as the chat template renders it)."""
        m = await state.pick(request)
        req = await read_body(request, ChatCompletionRequest)
        return {"input_tokens": await count_tokens(req, m), "object": "response.input_tokens"}

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        m = await state.pick(request)
        engine, backend = m.ready()
        no_completions(backend)
        s = m.settings
        req: CompletionRequest = await read_body(request, CompletionRequest)
        P.check_unsupported(req)
        n_predict = P.n_predict_from(
            req.max_tokens, "max_tokens", engine.n_ctx_slot, 16, False, engine.context_shift
        )
        gp = await run_in_threadpool(
            P.gen_params, req, backend, s.defaults, engine.n_ctx_slot, n_predict, engine.n_parallel
        )
        if req.logprobs is not None:
            gp.logprobs, gp.n_probs = True, req.logprobs
        gp.grammar = await run_in_threadpool(P.completion_grammar, req, getattr(backend, "vocab", None))
        n = P.n_choices(req)
        several = P.several(req.prompt)
        if several and (n > 1 or req.suffix is not None):
            what, param = ("'n' > 1", "n") if n > 1 else ("'suffix'", "suffix")
            raise bad_request(f"several prompts cannot be combined with {what}; send one per request", param)
        if req.suffix is not None:  # fill-in-the-middle: the prompt is the prefix
            args = (req.prompt, req.suffix, backend, engine.n_batch, engine.n_ctx_slot, n_predict)
            prompts = [await run_in_threadpool(suffix_tokens, *args)]
        else:
            limit = None if engine.context_shift else engine.n_ctx_slot
            prompts = await run_in_threadpool(P.tokenize_prompts, req.prompt, backend, "prompt", limit)
        texts = req.prompt if several else [req.prompt]
        if n > 1:
            prompts, texts = prompts * n, texts * n
        fmts = [
            CompletionFormatter(
                m.name,
                req.logprobs is not None,
                (t if isinstance(t, str) else backend.detokenize(p)) if req.echo else "",
                req.timings_per_token,
                gp.post_sampling_probs,
            )
            for t, p in zip(texts, prompts, strict=True)
        ]
        stream, usage = req.stream, include_usage(req)
        if len(fmts) > 1:
            gps = choice_params(gp, n) if n > 1 else [replace(gp) for _ in prompts]
            return await generate_n(request, engine, prompts, gps, fmts, stream, usage)
        return await generate(request, engine, prompts[0], gp, fmts[0], stream, usage)
