"""``n > 1`` on ``/v1/chat/completions`` and ``/v1/completions``: n independent engine tasks of the same
prompt, merged into one answer (``choices[i].index = i``; a stream interleaves the choices' chunks).
Several prompts in one completion request (``"prompt": ["a", "b"]``) go the same way, one task per
prompt: one choice each on ``/v1/completions``, a list of answers on ``/completion`` (its stream's events
tagged with ``index``), as llama-server.

The engine batches the n slots' tokens into one decode. The first choice evaluates the prompt; the
others start from it (the engine shares its KV cells with ``seq_cp`` and samples their first token
from the same logits: see ``Task.leader`` in :mod:`llamapy.server.engine`). A fixed seed gives choice ``i`` the seed ``seed + i``. Usage counts the prompt
once and sums the completion tokens.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from fastapi import Request

from ..sampling import LLAMA_DEFAULT_SEED
from .engine import Engine, Event, GenParams
from .errors import APIError
from .formats import JSONAnswer, timings, usage
from .stream import TokenStream, collect, stream_response, watch_disconnect


def choice_params(gp: GenParams, n: int) -> list[GenParams]:
    """n copies of ``gp``; with a fixed seed, choice i samples with seed + i."""
    out = []
    for i in range(n):
        seed = gp.sampling.seed
        if seed != LLAMA_DEFAULT_SEED:
            seed = (seed + i) % LLAMA_DEFAULT_SEED
        out.append(replace(gp, sampling=replace(gp.sampling, seed=seed)))
    return out


def merged_final(finals: list[Event], shared: bool = True) -> Event:
    """The statistics of n choices (in index order): with a ``shared`` prompt, the prompt once (the first
    choice's, which evaluated it), else the prompts summed; completions summed."""
    f = finals[0]
    prompt = {}
    if not shared:
        prompt = {
            "n_prompt": sum(e.n_prompt for e in finals),
            "n_cached": sum(e.n_cached for e in finals),
            "prompt_ms": max(e.prompt_ms for e in finals),
        }
    return replace(
        f,
        n_predicted=sum(e.n_predicted for e in finals),
        predicted_ms=max(e.predicted_ms for e in finals),
        **prompt,
    )


def _listed(obj: Any) -> list[Any]:
    """A chunk method's answer as a list of events (None: none)."""
    return [] if obj is None else obj if isinstance(obj, list) else [obj]


def _index(obj: Any, i: int) -> Any:
    """``obj`` as answer ``i``: its choices' index (OpenAI), or its own ``index`` (llama.cpp's)."""
    if isinstance(obj, dict):
        if "choices" in obj:
            for c in obj["choices"]:
                c["index"] = i
        else:
            obj["index"] = i
    return obj


async def generate_n(
    request: Request,
    engine: Engine,
    prompts: list[list[int]],
    gps: list[GenParams],
    fmts: list[Any],
    stream: bool,
    include_usage: bool,
) -> Any:
    """Answer ``i`` is ``prompts[i]`` generated with ``gps[i]`` and written by ``fmts[i]``; the same
    prompt for all (``n > 1``) is evaluated once."""
    for f in fmts[1:]:  # one answer: one id
        if hasattr(f, "id"):
            f.id, f.created = fmts[0].id, fmts[0].created
    shared = all(p == prompts[0] for p in prompts)
    streams = [TokenStream(engine, p, gp) for p, gp in zip(prompts, gps, strict=True)]
    if shared:
        streams[0].task.share_prompt = True
        for st in streams[1:]:
            st.task.leader = streams[0].task
    started: list[Any] = []
    try:
        for st in streams:
            st.start()
            started.append(st)
    except BaseException:
        for st in started:
            st.close()
        raise
    if not stream:
        results = await asyncio.gather(
            *(collect(request, engine, st.task.prompt, st.task.params, st=st) for st in streams),
            return_exceptions=True,
        )
        for r in results:
            if isinstance(r, BaseException):
                raise r
        bodies = [
            f.response(text, probs, final, tokens=toks)
            for f, (text, probs, toks, final) in zip(fmts, results, strict=True)
        ]
        if fmts[0].several_as_list:
            return JSONAnswer([_index(b, i) for i, b in enumerate(bodies)])
        body = bodies[0]
        body["choices"] = [dict(b["choices"][0], index=i) for i, b in enumerate(bodies)]
        merged = merged_final([r[3] for r in results], shared)
        body["usage"], body["timings"] = usage(merged), timings(merged)
        return JSONAnswer(body)

    try:
        firsts = []
        for st in streams:
            watcher = asyncio.create_task(watch_disconnect(request, st))
            try:
                firsts.append(await st.next())
            finally:
                watcher.cancel()
    except BaseException:
        for st in started:
            st.close()
        raise

    queue: asyncio.Queue[tuple[int, Event | None, APIError | None]] = asyncio.Queue()

    async def pump(i: int, st: Any, ev: Event) -> None:
        try:
            while True:
                queue.put_nowait((i, ev, None))
                if ev.done:
                    return
                ev = await st.next()
        except APIError as e:
            queue.put_nowait((i, None, e))

    async def events() -> AsyncIterator[bytes]:
        pumps = [
            asyncio.create_task(pump(i, st, f)) for i, (st, f) in enumerate(zip(streams, firsts, strict=True))
        ]
        try:
            started: set[int] = set()  # answers whose first chunk was written (after their progress)
            if not any(gp.return_progress for gp in gps):  # (no progress: every first chunk at once)
                for i, f in enumerate(fmts):
                    started.add(i)
                    for c in _listed(f.first_chunk()):
                        yield f.encode(_index(c, i))
            finals: dict[int, Event] = {}
            while len(finals) < len(streams):
                i, ev, err = await queue.get()
                if err is not None:
                    yield fmts[0].encode(fmts[0].error_event(err))
                    return
                assert ev is not None
                if ev.progress is not None:
                    for c in _listed(fmts[i].progress_chunk(ev)):
                        yield fmts[i].encode(_index(c, i))
                    continue
                if i not in started:
                    started.add(i)
                    for c in _listed(fmts[i].first_chunk()):
                        yield fmts[i].encode(_index(c, i))
                for c in fmts[i].chunks(ev):
                    yield fmts[i].encode(_index(c, i))
                if ev.done:
                    yield fmts[i].encode(_index(fmts[i].final_chunk(ev), i))
                    finals[i] = ev
            if include_usage:
                merged = merged_final([finals[i] for i in range(len(streams))], shared)
                yield fmts[0].encode(fmts[0].usage_chunk(merged))
            if fmts[0].done_marker:
                yield fmts[0].done_marker
        finally:
            for p in pumps:
                p.cancel()
            for st in streams:
                st.close()

    return stream_response(events())
