"""Embedding and rerank endpoints, as llama-server's (``--embedding``, ``--pooling``, ``--reranking``):

- ``POST /v1/embeddings``: OpenAI's (``input``: a string, a list of strings, a token list or a list of
  token lists; ``encoding_format`` float or base64; ``usage``); pooled vectors, L2-normalized unless
  ``embd_normalize`` says otherwise; pooling none is refused (not OpenAI-shaped).
- ``POST /embedding``, ``/embeddings``: llama.cpp's native shape, ``[{"index", "embedding": [[...]]}]``:
  one normalized vector per input, or with pooling none each token's raw vector.
- ``POST /rerank``, ``/reranking``, ``/v1/rerank``, ``/v1/reranking``: Jina/Cohere-style (``query``,
  ``documents``, ``top_n``, ``return_documents``) -> ``results`` sorted by ``relevance_score``; a body
  with ``texts`` instead of ``documents`` gets TEI's answer (a list of ``index``/``score``[/``text``]).

Every input is one engine task (a slot); the engine decodes the tasks of several slots in one batch. An
input longer than a slot's context or a batch is a 400, or is cut with ``"truncate": true``.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Sequence
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from starlette.concurrency import run_in_threadpool

from ..api.embedding import (
    EmbeddingError,
    embedding_inputs,
    ends_with_special,
    fit_tokens,
    format_rerank,
    max_input_tokens,
    normalize_embedding,
    normalize_mode,
    rerank_results,
)
from ..model.hparams import PoolingType
from .backend import ContextBackend
from .engine import GenParams
from .errors import APIError, bad_request
from .schemas import parse_json
from .stream import collect


class EmbeddingBackend(ContextBackend):
    """:class:`ContextBackend` that also keeps each sequence's per-token embeddings of the last decode,
    which ``embeddings_seq`` returns (float32[n_tokens, n_embd]) when the pooling is none."""

    _per_token: dict[int, np.ndarray]

    def decode(
        self, tokens: Sequence[int], pos: Sequence[int], seq_ids: Sequence[int], outputs: Sequence[bool]
    ) -> np.ndarray:
        out = super().decode(tokens, pos, seq_ids, outputs)
        self._per_token = {}
        if self.embeddings and self.pooling_type == PoolingType.NONE:
            rows = np.asarray(self.ctx.get_embeddings(), dtype=np.float32)  # output tokens, batch order
            out_seqs = np.array([s for s, o in zip(seq_ids, outputs, strict=True) if o], dtype=np.int64)
            for s in np.unique(out_seqs):
                self._per_token[int(s)] = rows[out_seqs == s].copy()
        return out

    def embeddings_seq(self, seq: int) -> np.ndarray:
        if self.pooling_type == PoolingType.NONE:
            return self._per_token[seq]
        return super().embeddings_seq(seq)


MAX_INPUTS = 2048  # inputs (texts or token lists) of one request, and rerank documents: OpenAI's limit


def _pooling(backend: Any) -> int:
    return int(getattr(backend, "pooling_type", PoolingType.MEAN))


def _limit(engine: Any, backend: Any) -> int:
    """The most tokens one input may have: it goes whole into one slot and one decode."""
    lim = min(int(engine.n_ctx_slot) - 1, int(engine.n_batch))
    ctx = getattr(backend, "ctx", None)
    return min(lim, max_input_tokens(ctx)) if ctx is not None else lim


def tokens_of(
    backend: Any, engine: Any, inputs: list[str | list[int]], truncate: bool, names: str
) -> list[list[int]]:
    _check_count(len(inputs), names)  # (again here for callers without _inputs: ollama's /api/embed)
    limit = _limit(engine, backend)
    vocab = getattr(backend, "vocab", None)
    out = []
    for i, x in enumerate(inputs):
        where = f"{names}[{i}]"
        if isinstance(x, str):
            toks = _tokenize(backend, x, None if truncate else limit, where, names)
            keep_last = vocab is not None and ends_with_special(vocab, toks)
        else:
            toks = x
            bad = [t for t in toks if not 0 <= t < backend.n_vocab]
            if bad:
                raise bad_request(f"{where}: token id {bad[0]} is out of range [0, {backend.n_vocab})", names)
            keep_last = False
        out.append(_fit(toks, limit, truncate, where, keep_last, names))
    return out


def _tokenize(backend: Any, text: str, max_tokens: int | None, where: str, param: str) -> list[int]:
    """An input's tokens; without truncation, a text past ``max_tokens`` is a 400 as soon as that is known
    (a multi-megabyte input is not tokenized whole only to be refused)."""
    from ..vocab import TooManyTokensError, Vocab

    vocab = getattr(backend, "vocab", None)
    if max_tokens is None or not isinstance(vocab, Vocab):
        return list(backend.tokenize(text, add_special=True, parse_special=True))
    try:
        return list(vocab.tokenize(text, True, True, max_tokens=max_tokens))
    except TooManyTokensError:
        raise bad_request(
            f"{where} has more than {max_tokens} tokens, more than the {max_tokens} one input may have here "
            '(n_batch/n_ctx; send "truncate": true to cut it, or raise n_ctx and n_batch)',
            param,
        ) from None


def _fit(toks: list[int], limit: int, truncate: bool, where: str, keep_last: bool, param: str) -> list[int]:
    try:
        return fit_tokens(toks, limit, truncate, where, keep_last)
    except EmbeddingError as e:
        raise bad_request(str(e).replace("pass truncate=True", 'send "truncate": true'), param) from None


async def run_embeddings(request: Request, engine: Any, token_lists: list[list[int]]) -> list[Any]:
    """Each token list as an embedding task; their final events, in order (the first error raised)."""
    results = await asyncio.gather(
        *(collect(request, engine, t, GenParams(), "embedding") for t in token_lists)
    )
    finals = [r[3] for r in results]
    for ev in finals:
        if ev.error is not None:
            raise ev.error
    return finals


def _body(raw: bytes) -> dict[str, Any]:
    body = parse_json(raw)
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return body


def _flag(body: dict[str, Any], key: str, default: bool) -> bool:
    v = body.get(key, default)
    if not isinstance(v, bool):
        raise bad_request(f"'{key}' must be true or false", key)
    return v


def _norm(body: dict[str, Any]) -> int:
    v = body.get("embd_normalize", 2)
    try:
        return normalize_mode(v)
    except EmbeddingError as e:
        raise bad_request(str(e), "embd_normalize") from None


def _inputs(value: Any, name: str) -> tuple[list[str | list[int]], bool]:
    try:
        inputs, single = embedding_inputs(value, name)
    except EmbeddingError as e:
        raise bad_request(str(e), name) from None
    _check_count(len(inputs), name)
    return inputs, single


def _check_count(n: int, name: str) -> None:
    """Every input is an engine task: a request may not queue more than :data:`MAX_INPUTS` of them."""
    if n > MAX_INPUTS:
        raise bad_request(f"'{name}' has {n} inputs; the limit is {MAX_INPUTS} per request", name)


def add_routes(app: FastAPI, state: Any) -> None:
    async def embedding_server(request: Request) -> tuple[Any, Any, str]:
        m = await state.pick(request)
        engine, backend = m.ready()
        if not backend.embeddings:
            raise APIError(501, "this server does not compute embeddings; start it with --embeddings")
        return engine, backend, m.name

    @app.post("/v1/embeddings")
    async def embeddings_oai(request: Request) -> dict[str, Any]:
        engine, backend, name = await embedding_server(request)
        body = _body(await request.body())
        if _pooling(backend) == PoolingType.NONE:
            raise bad_request(
                "pooling type 'none' is not OpenAI-compatible (one vector per token): use /embedding, or "
                "start the server with --pooling mean (or cls, last)"
            )
        if body.get("dimensions") is not None:
            raise bad_request("'dimensions' (shortened embeddings) is not supported yet", "dimensions")
        fmt = body.get("encoding_format", "float")
        if fmt not in ("float", "base64"):
            raise bad_request("'encoding_format' must be float or base64", "encoding_format")
        if "input" not in body:
            raise bad_request("'input' must be provided", "input")
        inputs, _ = _inputs(body["input"], "input")
        norm, truncate = _norm(body), _flag(body, "truncate", False)
        lists = await run_in_threadpool(tokens_of, backend, engine, inputs, truncate, "input")
        finals = await run_embeddings(request, engine, lists)
        data, n = [], 0
        for i, ev in enumerate(finals):
            v = normalize_embedding(np.asarray(ev.embedding, dtype=np.float32).reshape(-1), norm)
            item: dict[str, Any] = {"object": "embedding", "index": i}
            if fmt == "base64":
                item["embedding"] = base64.b64encode(v.astype("<f4").tobytes()).decode()
            else:
                item["embedding"] = v.tolist()
            data.append(item)
            n += ev.n_prompt
        usage = {"prompt_tokens": n, "total_tokens": n}
        return {"object": "list", "data": data, "model": name, "usage": usage}

    @app.post("/embedding")
    @app.post("/embeddings")
    async def embeddings_native(request: Request) -> list[dict[str, Any]]:
        engine, backend, _ = await embedding_server(request)
        body = _body(await request.body())
        key = "content" if "content" in body else "input"
        if key not in body:
            raise bad_request("'content' (or 'input') must be provided", "content")
        inputs, _ = _inputs(body[key], key)
        norm, truncate = _norm(body), _flag(body, "truncate", False)
        lists = await run_in_threadpool(tokens_of, backend, engine, inputs, truncate, key)
        finals = await run_embeddings(request, engine, lists)
        pooled = _pooling(backend) != PoolingType.NONE
        out = []
        for i, ev in enumerate(finals):
            e = np.atleast_2d(np.asarray(ev.embedding, dtype=np.float32))
            if pooled:  # as llama-server: normalized when pooled, raw per token
                e = normalize_embedding(e[:1], norm)
            out.append({"index": i, "embedding": e.tolist()})
        return out

    @app.post("/rerank")
    @app.post("/reranking")
    @app.post("/v1/rerank")
    @app.post("/v1/reranking")
    async def rerank(request: Request) -> Any:
        m = await state.pick(request)
        engine, backend = m.ready()
        if not backend.embeddings or _pooling(backend) != PoolingType.RANK:
            raise APIError(
                501, "this server does not rerank: start it with --reranking (a model with a rank head)"
            )
        body = _body(await request.body())
        tei = "texts" in body
        query = body.get("query")
        if not isinstance(query, str):
            raise bad_request("'query' must be provided as a string", "query")
        key = "texts" if tei else "documents"
        docs = body.get(key)
        if isinstance(docs, list):
            docs = [d.get("text") if isinstance(d, dict) else d for d in docs]
        if not isinstance(docs, list) or not docs or not all(isinstance(d, str) for d in docs):
            raise bad_request(f"'{key}' must be a non-empty array of strings", key)
        _check_count(len(docs), key)
        top_n = body.get("top_n", len(docs))
        if top_n is None:
            top_n = len(docs)
        if not isinstance(top_n, int) or isinstance(top_n, bool) or top_n < 0:
            raise bad_request("'top_n' must be a non-negative integer", "top_n")
        ret = _flag(body, "return_text", False) if tei else _flag(body, "return_documents", False)
        truncate = _flag(body, "truncate", False)
        meta = getattr(getattr(backend, "model", None), "metadata", {}) or {}
        limit = _limit(engine, backend)

        def prompts() -> list[list[int]]:
            return [
                _fit(
                    format_rerank(backend.vocab, meta, query, d),
                    limit,
                    truncate,
                    f"query + {key}[{i}]",
                    False,
                    key,
                )
                for i, d in enumerate(docs)
            ]

        lists = await run_in_threadpool(prompts)
        finals = await run_embeddings(request, engine, lists)
        scores = [float(np.asarray(ev.embedding).reshape(-1)[0]) for ev in finals]
        results = rerank_results(scores, docs, top_n, ret)
        if tei:
            return [{"index": r["index"], "score": r["relevance_score"]} | ({"text": docs[r["index"]]} if ret else {})
                    for r in results]  # fmt: skip
        n = sum(ev.n_prompt for ev in finals)
        usage = {"prompt_tokens": n, "total_tokens": n}
        return {"object": "list", "model": m.name, "results": results, "usage": usage}
