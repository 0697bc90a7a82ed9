"""llama.cpp's own endpoints: ``/health``, ``/props``, ``/slots``, ``/metrics``, ``/tokenize``,
``/detokenize``, ``/apply-template``, ``/completion``, ``/infill`` (LoRA adapters: :mod:`.lora`). In router
mode each answers for the model named by ``?model=`` (or the body's ``model``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.concurrency import run_in_threadpool

from .. import __version__
from . import params as P
from .choices import generate_n
from .engine import GenParams
from .errors import APIError
from .formats import NativeFormatter
from .infill import infill_tokens
from .inputs import no_completions, read_body, settings_dict
from .schemas import (
    ApplyTemplateRequest,
    ChatCompletionRequest,
    DetokenizeRequest,
    InfillRequest,
    NativeCompletionRequest,
    TokenizeRequest,
    parse_json,
    validate,
)
from .state import ModelEntry, ServerState
from .stream import generate


async def native_params(req: NativeCompletionRequest, m: ModelEntry) -> tuple[GenParams, dict[str, Any]]:
    """``/completion`` and ``/infill``: GenParams (one choice, the grammar) and the settings echoed back."""
    engine, backend = m.ready()
    s = m.settings
    P.n_choices(req, allowed=False)
    n_predict = P.native_n_predict(req, engine.n_ctx_slot, s.defaults, engine.context_shift)
    gp = await run_in_threadpool(
        P.gen_params, req, backend, s.defaults, engine.n_ctx_slot, n_predict, engine.n_parallel
    )
    gp.grammar = await run_in_threadpool(P.completion_grammar, req, getattr(backend, "vocab", None))
    settings = settings_dict(
        gp,
        stream=req.stream,
        timings_per_token=req.timings_per_token,
        reasoning_format=P.completion_reasoning_format(req, s.defaults),
        speculative_types=getattr(backend, "speculative_types", "none"),
    )
    return gp, settings


def native_formatter(
    m: ModelEntry, req: NativeCompletionRequest, prompt: str, settings: dict[str, Any], n_probs: int
) -> NativeFormatter:
    return NativeFormatter(
        m.name, prompt, settings, n_probs, req.return_tokens, req.timings_per_token, req.response_fields
    )


def template_caps(backend: Any) -> dict[str, bool]:
    """llama-server's ``chat_template_caps``: what llamapy probes of the template (the tool-call
    capabilities are not probed: False)."""
    t = getattr(backend, "chat_template", None)
    caps = dict.fromkeys(
        (
            "supports_object_arguments",
            "supports_parallel_tool_calls",
            "supports_preserve_reasoning",
            "supports_reasoning_effort",
            "supports_string_content",
            "supports_system_role",
            "supports_tool_calls",
            "supports_tools",
            "supports_typed_content",
        ),
        False,
    )
    for k, attr in (
        ("supports_string_content", "supports_string_content"),
        ("supports_typed_content", "supports_typed_content"),
        ("supports_system_role", "supports_system_role"),
        ("supports_object_arguments", "wants_object_arguments"),
    ):
        try:
            caps[k] = bool(getattr(t, attr, False))
        except Exception:  # a template that fails its probes: not capable
            caps[k] = False
    return caps


def _down(m: Any) -> str | None:
    """Why a loaded model cannot answer (its context's ``health()``, e.g. a Ray pipeline that lost a
    stage), or None."""
    _, backend = m.ready()
    return backend.health()


def add_routes(app: FastAPI, state: ServerState) -> None:
    s = state.settings

    @app.get("/health")
    @app.get("/v1/health")
    async def health(request: Request) -> JSONResponse:
        if state.router is None or request.query_params.get("model"):
            down = _down(await state.pick(request))
            if down:  # a pipeline that lost a stage: answered at once, with what went wrong
                err = {"code": 503, "message": f"the model is down: {down}", "type": "unavailable_error"}
                return JSONResponse({"error": err}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.post("/props")
    async def post_props() -> None:  # as llama-server started without --props (which llamapy lacks)
        raise APIError(501, "This server does not support changing global properties (no --props in llamapy)")

    @app.get("/props")
    async def props(request: Request) -> dict[str, Any]:
        m = await state.pick(request)
        engine, backend = m.ready()
        info = backend.info()
        mt = getattr(backend, "mtmd", None)
        d = m.settings.defaults
        defaults = GenParams(n_predict=d.n_predict, sampling=d.sampling, n_keep=d.n_keep)
        caps = await run_in_threadpool(template_caps, backend)
        return {
            "default_generation_settings": {
                "params": settings_dict(
                    defaults, full=False, speculative_types=getattr(backend, "speculative_types", "none")
                ),
                "n_ctx": engine.n_ctx_slot,
            },
            "total_slots": engine.n_parallel,
            "model_alias": m.name,
            "model_ftype": info.get("ftype", ""),
            "model_path": m.settings.model_path,
            "modalities": {
                "vision": mt is not None and bool(getattr(mt, "support_vision", True)),
                "video": False,
                "audio": mt is not None and bool(getattr(mt, "support_audio", False)),
            },
            "endpoint_slots": bool(s.slots),
            "endpoint_props": False,  # (POST /props, changing settings, is not served)
            "endpoint_metrics": bool(s.metrics),
            "chat_template": info.get("chat_template", ""),
            "chat_template_caps": caps,
            "bos_token": info.get("bos_token", ""),
            "eos_token": info.get("eos_token", ""),
            "build_info": f"llamapy {__version__}",
            "is_sleeping": False,
            "embeddings": backend.embeddings,
        }

    @app.get("/slots")
    async def slots(request: Request) -> list[dict[str, Any]]:
        if not s.slots:
            raise APIError(501, "this server does not expose slots (started with --no-slots)")
        m = await state.pick(request)
        engine, _ = m.ready()
        return engine.slots_info(verbose=s.slots_verbose)

    @app.post("/slots/{id_slot}")
    async def slot_action(id_slot: str, request: Request) -> dict[str, Any]:
        from .slots import slot_action

        m = await state.pick(request)
        engine, _ = m.ready()
        raw = await request.body()
        body = parse_json(raw) if raw.strip() else {}
        return await slot_action(engine, s.slot_save_path, id_slot, request.query_params.get("action"), body)

    @app.get("/metrics")
    async def metrics(request: Request) -> PlainTextResponse:
        if not s.metrics:
            raise APIError(501, "this server does not expose metrics; start it with --metrics")
        m = await state.pick(request)
        engine, _ = m.ready()
        engine._update_gauges()
        return PlainTextResponse(m.metrics.prometheus(), media_type="text/plain; version=0.0.4")

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict[str, Any]:
        _, backend = (await state.pick(request)).ready()
        req: TokenizeRequest = await read_body(request, TokenizeRequest)
        toks = await run_in_threadpool(backend.tokenize, req.content, req.add_special, req.parse_special)
        if not req.with_pieces:
            return {"tokens": toks}
        out = []
        for t in toks:
            piece = backend.token_to_piece(t, special=True)
            try:
                out.append({"id": t, "piece": piece.decode("utf-8")})
            except UnicodeDecodeError:
                out.append({"id": t, "piece": list(piece)})
        return {"tokens": out}

    @app.post("/detokenize")
    async def detokenize(request: Request) -> dict[str, Any]:
        _, backend = (await state.pick(request)).ready()
        req: DetokenizeRequest = await read_body(request, DetokenizeRequest)
        P.check_tokens(req.tokens, backend.n_vocab, "tokens")
        return {"content": await run_in_threadpool(backend.detokenize, req.tokens)}

    @app.post("/apply-template")
    async def apply_template(request: Request) -> dict[str, Any]:
        m = await state.pick(request)
        _, backend = m.ready()
        req: ApplyTemplateRequest = await read_body(request, ApplyTemplateRequest)
        fields = (
            "messages",
            "add_generation_prompt",
            "chat_template_kwargs",
            "reasoning_effort",
            "continue_final_message",
        )
        creq = validate(ChatCompletionRequest, {k: getattr(req, k) for k in fields})
        text, _ = await run_in_threadpool(P.chat_prompt, creq, backend, m.settings.defaults)
        return {"prompt": text}

    @app.post("/completion")
    @app.post("/completions")
    async def completion_native(request: Request) -> Any:
        m = await state.pick(request)
        engine, backend = m.ready()
        no_completions(backend)
        req: NativeCompletionRequest = await read_body(request, NativeCompletionRequest)
        gp, settings = await native_params(req, m)
        limit = None if engine.context_shift else engine.n_ctx_slot
        prompts = await run_in_threadpool(P.tokenize_prompts, req.prompt, backend, "prompt", limit)
        texts = req.prompt if P.several(req.prompt) else [req.prompt]
        fmts = [
            native_formatter(m, req, t if isinstance(t, str) else backend.detokenize(p), settings, gp.n_probs)
            for t, p in zip(texts, prompts, strict=True)
        ]
        if len(prompts) > 1:  # several prompts: a list of answers (events tagged with "index")
            gps = [replace(gp) for _ in prompts]
            return await generate_n(request, engine, prompts, gps, fmts, req.stream, False)
        return await generate(request, engine, prompts[0], gp, fmts[0], req.stream)

    @app.post("/infill")
    async def infill(request: Request) -> Any:
        m = await state.pick(request)
        engine, backend = m.ready()
        no_completions(backend)
        req: InfillRequest = await read_body(request, InfillRequest)
        gp, settings = await native_params(req, m)
        args = (req, backend, engine.n_batch, engine.n_ctx_slot, gp.n_predict)
        tokens = await run_in_threadpool(infill_tokens, *args)
        fmt = native_formatter(m, req, backend.detokenize(tokens), settings, gp.n_probs)
        return await generate(request, engine, tokens, gp, fmt, req.stream)
