"""OpenAI's API: ``/v1/models``, ``/v1/chat/completions``, ``/v1/completions`` (the Responses API is in
:mod:`llamapy.server.responses`, embeddings in :mod:`llamapy.server.embeddings`)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from starlette.concurrency import run_in_threadpool

from . import mcp_http
from . import params as P
from .choices import choice_params, generate_n
from .formats import ChatFormatter, CompletionFormatter
from .infill import suffix_tokens
from .inputs import chat_inputs, include_usage, messages_fit, no_completions, parsed_body, read_body
from .schemas import ChatCompletionRequest, CompletionRequest, validate
from .state import ServerState
from .stream import generate


def model_object(m: Any, created: int) -> dict[str, Any]:
    """One ``/v1/models`` entry: OpenAI's fields, the loaded model's ``meta`` and (router mode) its state."""
    obj: dict[str, Any] = {"id": m.name, "object": "model", "created": created, "owned_by": "llamapy"}
    if m.backend is not None:
        info = m.backend.info()
        obj["meta"] = {k: info[k] for k in ("n_vocab", "n_ctx_train", "n_embd", "size") if k in info}
    return obj


def add_routes(app: FastAPI, state: ServerState) -> None:
    @app.get("/v1/models")
    @app.get("/models")
    async def models() -> dict[str, Any]:
        if state.router is not None:
            return {"object": "list", "data": state.router.model_list()}
        m = state.default
        assert m is not None
        m.ready()
        return {"object": "list", "data": [model_object(m, m.created)]}

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
        if req.max_completion_tokens is not None:
            n_predict, name = req.max_completion_tokens, "max_completion_tokens"
        tokens, gp = await chat_inputs(req, m, n_predict, name, n_allowed=True)
        n = P.n_choices(req)
        if n > 1:
            fmts = [ChatFormatter(m.name, bool(req.logprobs)) for _ in range(n)]
            return await generate_n(
                request, engine, tokens, choice_params(gp, n), fmts, req.stream, include_usage(req)
            )
        fmt = ChatFormatter(m.name, bool(req.logprobs))
        return await generate(request, engine, tokens, gp, fmt, req.stream, include_usage(req))

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
        if req.suffix is not None:  # fill-in-the-middle: the prompt is the prefix
            args = (req.prompt, req.suffix, backend, engine.n_batch, engine.n_ctx_slot, n_predict)
            tokens = await run_in_threadpool(suffix_tokens, *args)
        else:
            limit = None if engine.context_shift else engine.n_ctx_slot
            tokens = await run_in_threadpool(P.tokenize_prompt, req.prompt, backend, "prompt", limit)
        echo = ""
        if req.echo:
            echo = req.prompt if isinstance(req.prompt, str) else backend.detokenize(tokens)
        n = P.n_choices(req)
        fmts = [CompletionFormatter(m.name, req.logprobs is not None, echo) for _ in range(n)]
        if n > 1:
            return await generate_n(
                request, engine, tokens, choice_params(gp, n), fmts, req.stream, include_usage(req)
            )
        return await generate(request, engine, tokens, gp, fmts[0], req.stream, include_usage(req))
