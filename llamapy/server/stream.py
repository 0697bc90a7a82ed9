"""The one request path from an engine task to an HTTP answer, and the :class:`Formatter` protocol.

Every generating route (OpenAI chat and completions, llama.cpp's ``/completion`` and ``/infill``, the
Responses and Messages APIs, ollama's ``/api/chat`` and ``/api/generate``) plans its prompt tokens and
:class:`GenParams`, picks a formatter and calls :func:`generate`: the task goes to the model's engine
thread, its events come back through a :class:`TokenStream`, and the formatter turns them into the API's
answer object (not streamed) or its stream events (streamed). Only the formatter differs per API.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, Protocol, runtime_checkable

from fastapi import Request
from fastapi.responses import StreamingResponse

from .engine import Engine, Event, GenParams, Task, TokenProb
from .errors import APIError, bad_request
from .formats import BaseFormatter, JSONAnswer, new_id

__all__ = ["BaseFormatter", "Formatter", "TokenStream", "collect", "generate", "new_id", "watch_disconnect"]


@runtime_checkable
class Formatter(Protocol):
    """How one API writes a generation: its answer object, its stream events and its errors.

    A chunk method returns one event object, a list of them or None (no event); :meth:`encode` writes one
    event on the wire. :data:`done_marker` (bytes or None) ends a stream that finished; :data:`media_type`
    is the stream's content type. With :data:`text_in_final` the last event's text is part of
    :meth:`final_chunk`'s object (llama.cpp's ``/completion``), not of a last :meth:`chunks` call.
    A prompt_progress event (``return_progress``, streams only) goes to :meth:`progress_chunk`; those come
    before :meth:`first_chunk`, which is written with the first token (as llama-server sends them)."""

    media_type: str
    done_marker: bytes | None
    text_in_final: bool

    def first_chunk(self) -> Any: ...

    def progress_chunk(self, ev: Event) -> Any: ...

    def chunks(self, ev: Event) -> list[Any]: ...

    def final_chunk(self, ev: Event) -> Any: ...

    def usage_chunk(self, ev: Event) -> Any: ...

    def response(
        self, text: str, probs: list[TokenProb], final: Event, tokens: list[int] | None = None
    ) -> Any: ...

    def encode(self, obj: Any) -> bytes: ...

    def error_event(self, e: APIError) -> Any: ...


class TokenStream:
    """Relays a task's events from the engine thread to this request's event loop."""

    def __init__(self, engine: Engine, tokens: list[int], gp: GenParams, kind: str = "completion") -> None:
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[Event] = asyncio.Queue()
        self.engine = engine
        self.task = Task(tokens, gp, self._sink, kind)
        self.done = False

    def _sink(self, ev: Event) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, ev)

    def start(self) -> None:
        if len(self.task.prompt) >= self.engine.n_ctx_slot and not self.engine.context_shift:
            from .engine import _prompt_error

            raise _prompt_error(len(self.task.prompt), self.engine.n_ctx_slot)
        if not self.task.prompt:
            raise bad_request("the prompt is empty (it tokenized to no tokens)", "prompt")
        self.engine.submit(self.task)

    async def next(self) -> Event:
        ev = await self.queue.get()
        if ev.done:
            self.done = True
        if ev.error is not None:
            raise ev.error
        return ev

    def close(self) -> None:
        """Abandon the task (client gone, or the handler ended); wakes a pending :meth:`next`."""
        if not self.done:
            self.engine.cancel(self.task)
            self.done = True
            self.queue.put_nowait(Event(done=True, error=APIError(499, "the client closed the request")))


async def watch_disconnect(request: Request, stream: TokenStream) -> None:
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            stream.close()
            return


async def collect(
    request: Request,
    engine: Engine,
    tokens: list[int],
    gp: GenParams,
    kind: str = "completion",
    st: TokenStream | None = None,
) -> tuple[str, list[TokenProb], list[int], Event]:
    """Run a task to its end: (text, log-probabilities, tokens, final event)."""
    if st is None:
        st = TokenStream(engine, tokens, gp, kind)
        st.start()
    watcher = asyncio.create_task(watch_disconnect(request, st))
    try:
        text, probs, out = [], [], []
        while True:
            ev = await st.next()
            if ev.progress is not None:
                continue
            text.append(ev.text)
            probs += ev.probs
            out += ev.tokens
            if ev.done:
                return "".join(text), probs, out, ev
    finally:
        watcher.cancel()
        st.close()


def stream_response(events: AsyncIterator[bytes], media_type: str = "text/event-stream") -> StreamingResponse:
    return StreamingResponse(
        events, media_type=media_type, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )


async def generate(
    request: Request,
    engine: Engine,
    tokens: list[int],
    gp: GenParams,
    fmt: Formatter,
    stream: bool,
    include_usage: bool = False,
) -> Any:
    """One generation as ``fmt``'s answer object, or its stream when ``stream``."""
    if not stream:
        text, probs, out_tokens, final = await collect(request, engine, tokens, gp)
        return JSONAnswer(fmt.response(text, probs, final, tokens=out_tokens))
    st = TokenStream(engine, tokens, gp)
    st.start()
    # errors before the first token are plain HTTP errors; a client that leaves while its prompt is
    # evaluated is noticed here (after that, the streaming response watches for the disconnect)
    watcher = asyncio.create_task(watch_disconnect(request, st))
    try:
        first = await st.next()
    except BaseException:
        st.close()
        raise
    finally:
        watcher.cancel()

    def out(obj: Any) -> list[bytes]:
        return [] if obj is None else [fmt.encode(o) for o in (obj if isinstance(obj, list) else [obj])]

    async def events() -> AsyncIterator[bytes]:
        try:
            started = False
            ev = first
            while True:
                if ev.progress is not None:
                    for b in out(fmt.progress_chunk(ev)):
                        yield b
                    ev = await st.next()
                    continue
                if not started:
                    started = True
                    for b in out(fmt.first_chunk()):
                        yield b
                if ev.done:
                    if not fmt.text_in_final:
                        for b in out(fmt.chunks(ev)):
                            yield b
                    for b in out(fmt.final_chunk(ev)):
                        yield b
                    if include_usage:
                        for b in out(fmt.usage_chunk(ev)):
                            yield b
                    break
                for b in out(fmt.chunks(ev)):
                    yield b
                ev = await st.next()
            if fmt.done_marker:
                yield fmt.done_marker
        except APIError as e:
            yield fmt.encode(fmt.error_event(e))
        finally:
            st.close()

    return stream_response(events(), fmt.media_type)
