"""Response bodies and stream chunks: OpenAI's chat/completions objects and llama.cpp's /completion."""

from __future__ import annotations

import json
import math
import secrets
import time
from dataclasses import replace
from typing import Any

from fastapi.responses import JSONResponse

from .. import __version__
from ..api.chat_request import delta_dicts, message_dict
from .engine import Event, TokenProb
from .errors import APIError

FINGERPRINT = f"llamapy-{__version__}"


def new_id(prefix: str, sep: str = "_") -> str:
    """A fresh object id: ``resp_...``, ``msg_...`` (``sep="-"``: ``chatcmpl-...``, as OpenAI's)."""
    return f"{prefix}{sep}{secrets.token_hex(12)}"


def finite(obj: Any) -> Any:
    """``obj`` with every NaN or infinite float replaced by None, as llama.cpp's JSON writer has them
    (e.g. a ``logit_bias`` of ``false`` is a bias of -inf in ``generation_settings``): JSON has no such
    numbers, and a client's parser would refuse the whole answer."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def dumps(obj: Any) -> str:
    """Compact JSON text of an answer (non-finite floats written as null, see :func:`finite`)."""
    try:
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError:
        return json.dumps(finite(obj), ensure_ascii=False, separators=(",", ":"), allow_nan=False)


class JSONAnswer(JSONResponse):
    """A JSON response whose non-finite floats are written as null (never a 500 at the last step)."""

    def render(self, content: Any) -> bytes:
        return dumps(content).encode("utf-8")


def sse(obj: Any) -> bytes:
    return b"data: " + dumps(obj).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


def usage(final: Event) -> dict[str, Any]:
    return {
        "prompt_tokens": final.n_prompt,
        "completion_tokens": final.n_predicted,
        "total_tokens": final.n_prompt + final.n_predicted,
        "prompt_tokens_details": {"cached_tokens": final.n_cached},
    }


def timings(final: Event) -> dict[str, Any]:
    n_pp = final.n_prompt - final.n_cached
    n_tg = final.n_predicted
    draft = {"draft_n": final.draft_n, "draft_n_accepted": final.draft_n_accepted} if final.draft_n else {}
    return {
        "cache_n": final.n_cached,
        "prompt_n": n_pp,
        "prompt_ms": final.prompt_ms,
        "prompt_per_token_ms": final.prompt_ms / n_pp if n_pp else 0.0,
        "prompt_per_second": 1e3 * n_pp / final.prompt_ms if final.prompt_ms else 0.0,
        "predicted_n": n_tg,
        "predicted_ms": final.predicted_ms,
        "predicted_per_token_ms": final.predicted_ms / n_tg if n_tg else 0.0,
        "predicted_per_second": 1e3 * n_tg / final.predicted_ms if final.predicted_ms else 0.0,
        **draft,
    }


def _tok(piece: bytes) -> str:
    return piece.decode("utf-8", errors="replace")


def chat_logprobs(probs: list[TokenProb]) -> dict[str, Any]:
    return {
        "content": [
            post_sampling_entry(p)
            if p.post_sampling
            else {
                "id": p.id,
                "token": _tok(p.piece),
                "logprob": p.logprob,
                "bytes": list(p.piece),
                "top_logprobs": [
                    {"id": i, "token": _tok(b), "logprob": lp, "bytes": list(b)} for i, b, lp in p.top
                ],
            }
            for p in probs
        ]
    }


def post_sampling_entry(p: TokenProb) -> dict[str, Any]:
    """One token with llama-server's ``post_sampling_probs``: ``prob`` and ``top_probs`` (probabilities
    after the sampler chain) where the log-probabilities had ``logprob`` and ``top_logprobs`` (every
    route: llama-server's ``probs_vector_to_json``)."""
    return {
        "id": p.id,
        "token": _tok(p.piece),
        "bytes": list(p.piece),
        "prob": p.logprob,
        "top_probs": [{"id": i, "token": _tok(b), "bytes": list(b), "prob": v} for i, b, v in p.top],
    }


def progress_json(ev: Event) -> dict[str, int]:
    """llama-server's ``prompt_progress`` object of a progress event."""
    assert ev.progress is not None
    return dict(ev.progress)


def with_progress(c: dict[str, Any], ev: Event, timings_per_token: bool) -> dict[str, Any]:
    """``c`` with a progress event's ``prompt_progress`` and, with ``timings_per_token``, its ``timings``
    (the prompt tokens evaluated so far)."""
    assert ev.progress is not None
    if timings_per_token:
        c["timings"] = timings(replace(ev, n_prompt=ev.progress["processed"]))
    c["prompt_progress"] = progress_json(ev)
    return c


def completion_logprobs(
    probs: list[TokenProb], offset0: int, post_sampling: bool = False
) -> dict[str, Any] | None:
    """OpenAI's legacy ``logprobs`` object of a text completion; with ``post_sampling`` llama-server's
    ``{"content": [...]}`` (``prob``/``top_probs``), which has no log-probabilities to put in OpenAI's
    (None without tokens, as llama-server)."""
    if post_sampling:
        return {"content": [post_sampling_entry(p) for p in probs]} if probs else None
    offsets, off = [], offset0
    for p in probs:
        offsets.append(off)
        off += len(_tok(p.piece))
    return {
        "tokens": [_tok(p.piece) for p in probs],
        "token_logprobs": [p.logprob for p in probs],
        "top_logprobs": [{_tok(b): lp for _, b, lp in p.top} for p in probs],
        "text_offset": offsets,
    }


def native_probs(probs: list[TokenProb]) -> list[dict[str, Any]]:
    return [
        post_sampling_entry(p)
        if p.post_sampling
        else {
            "id": p.id,
            "token": _tok(p.piece),
            "bytes": list(p.piece),
            "logprob": p.logprob,
            "top_logprobs": [
                {"id": i, "token": _tok(b), "bytes": list(b), "logprob": lp} for i, b, lp in p.top
            ],
        }
        for p in probs
    ]


class BaseFormatter:
    """Defaults of :class:`~llamapy.server.stream.Formatter`: OpenAI-style server-sent events, no start or usage event, the error
    as OpenAI's error object."""

    media_type = "text/event-stream"
    done_marker: bytes | None = None
    text_in_final = False
    several_as_list = False  # several prompts answered as a list of answers (not as choices)

    def first_chunk(self) -> Any:
        return None

    def progress_chunk(self, ev: Event) -> Any:
        """The events of a prompt_progress event (``return_progress``): none unless the API has them."""
        return None

    def usage_chunk(self, ev: Event) -> Any:
        return None

    def encode(self, obj: Any) -> bytes:
        return sse(obj)

    def error_event(self, e: APIError) -> Any:
        return e.body()


class ChatFormatter(BaseFormatter):
    """OpenAI's chat completion; in a stream the ``finish_reason`` chunk carries llama-server's
    ``timings``, and with ``timings_per_token`` every event's last chunk does."""

    done_marker = SSE_DONE

    def __init__(self, model: str, want_logprobs: bool, timings_per_token: bool = False) -> None:
        self.id, self.created, self.model = new_id("chatcmpl", "-"), int(time.time()), model
        self.want_logprobs = want_logprobs
        self.timings_per_token = timings_per_token

    def _chunk(self, delta: dict[str, Any], finish: str | None, probs: list[TokenProb] | None = None) -> dict:
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        if self.want_logprobs and probs:
            choice["logprobs"] = chat_logprobs(probs)
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": FINGERPRINT,
            "choices": [choice],
        }

    def first_chunk(self) -> dict[str, Any]:
        return self._chunk({"role": "assistant", "content": None}, None)

    def progress_chunk(self, ev: Event) -> dict[str, Any]:
        """llama-server's progress chunk: the role delta with ``prompt_progress`` (the stream's own first
        role chunk still comes before the first token)."""
        c = self._chunk({"role": "assistant", "content": None}, None)
        return with_progress(c, ev, self.timings_per_token)

    def chunks(self, ev: Event) -> list[dict[str, Any]]:
        """The chunks of one event: a chunk per delta (text, reasoning, tool-call pieces); the event's
        log-probabilities ride on the first."""
        deltas = delta_dicts(ev.deltas)  # (chat requests always have a parser; its deltas are the text)
        if not deltas and self.want_logprobs and ev.probs:
            deltas = [{}]
        out = [self._chunk(d, None, ev.probs if i == 0 else None) for i, d in enumerate(deltas)]
        if out and self.timings_per_token:
            out[-1]["timings"] = timings(ev)
        return out

    def final_chunk(self, ev: Event) -> dict[str, Any]:
        return self._chunk({}, ev.finish_reason) | {"timings": timings(ev)}

    def usage_chunk(self, ev: Event) -> dict[str, Any]:
        c = self._chunk({}, None)
        c["choices"] = []
        c["usage"] = usage(ev)
        c["timings"] = timings(ev)
        return c

    def response(
        self, text: str, probs: list[TokenProb], final: Event, tokens: list[int] | None = None
    ) -> dict:
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": FINGERPRINT,
            "choices": [
                {
                    "index": 0,
                    "message": message_dict(final.message, text),
                    "logprobs": chat_logprobs(probs) if self.want_logprobs else None,
                    "finish_reason": final.finish_reason,
                }
            ],
            "usage": usage(final),
            "timings": timings(final),
        }


class CompletionFormatter(BaseFormatter):
    done_marker = SSE_DONE

    def __init__(
        self,
        model: str,
        want_logprobs: bool,
        echo_text: str = "",
        timings_per_token: bool = False,
        post_sampling: bool = False,
    ) -> None:
        self.id, self.created, self.model = new_id("cmpl", "-"), int(time.time()), model
        self.want_logprobs = want_logprobs
        self.echo_text = echo_text
        self.offset = len(echo_text)
        self.timings_per_token = timings_per_token
        self.post_sampling = post_sampling  # logprobs as llama-server's post_sampling_probs content

    def _chunk(self, text: str, finish: str | None, probs: list[TokenProb] | None) -> dict[str, Any]:
        lp = None
        if self.want_logprobs:
            lp = completion_logprobs(probs or [], self.offset, self.post_sampling)
        self.offset += len(text)
        return {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": FINGERPRINT,
            "choices": [{"text": text, "index": 0, "logprobs": lp, "finish_reason": finish}],
        }

    def first_chunk(self) -> dict[str, Any] | None:
        return self._chunk(self.echo_text, None, []) if self.echo_text else None

    def progress_chunk(self, ev: Event) -> dict[str, Any]:
        """llama-server's progress chunk: an empty text with ``prompt_progress``."""
        c = self._chunk("", None, None)
        c["choices"][0]["logprobs"] = None
        return with_progress(c, ev, self.timings_per_token)

    def chunks(self, ev: Event) -> list[dict[str, Any]]:
        if not ev.text and not (self.want_logprobs and ev.probs):
            return []
        c = self._chunk(ev.text, None, ev.probs)
        if self.timings_per_token:
            c["timings"] = timings(ev)
        return [c]

    def final_chunk(self, ev: Event) -> dict[str, Any]:
        """The finish reason, with ``usage`` and ``timings`` (llama-server's final ``text_completion`` chunk
        has the usage whether or not ``stream_options.include_usage`` asked for it)."""
        return self._chunk("", ev.finish_reason, []) | {"usage": usage(ev), "timings": timings(ev)}

    def usage_chunk(self, ev: Event) -> dict[str, Any]:
        c = self._chunk("", None, None)
        c["choices"] = []
        c["usage"] = usage(ev)
        c["timings"] = timings(ev)
        return c

    def response(
        self, text: str, probs: list[TokenProb], final: Event, tokens: list[int] | None = None
    ) -> dict:
        body = self._chunk(self.echo_text + text, final.finish_reason, probs)
        body["usage"] = usage(final)
        body["timings"] = timings(final)
        return body


class NativeFormatter(BaseFormatter):
    """llama.cpp's ``/completion``: ``{"content", "stop", ...}``. A stream has one event per token (its
    text, ``tokens``, ``tokens_predicted`` and ``tokens_evaluated``; ``timings`` on the last one, or on
    each with ``timings_per_token``) and ends with the final object, whose ``content`` and ``tokens`` are
    empty (llama-server's ``send_final_response`` in stream mode). ``response_fields``: only these
    fields of the final object, by ``/``-separated path (llama-server's ``json_get_nested_values``)."""

    several_as_list = True

    def __init__(
        self,
        model: str,
        prompt: str,
        settings: dict[str, Any],
        n_probs: int,
        return_tokens: bool,
        timings_per_token: bool = False,
        response_fields: list[str] | None = None,
    ) -> None:
        self.model, self.prompt, self.settings = model, prompt, settings
        self.n_probs, self.return_tokens = n_probs, return_tokens
        self.timings_per_token = timings_per_token
        self.response_fields = response_fields or []
        self.has_new_line = False  # (a stream's final object has no text to tell)

    def first_chunk(self) -> None:
        return None

    def progress_chunk(self, ev: Event) -> dict[str, Any]:
        """llama-server's progress event: a token event without text or token, with ``prompt_progress``
        (llama-server's own has ``"tokens": [0]``, an uninitialized token; here no token is given)."""
        c: dict[str, Any] = {
            "index": 0,
            "content": "",
            "tokens": [],
            "stop": False,
            "id_slot": ev.slot_id,
            "tokens_predicted": ev.n_predicted,
            "tokens_evaluated": ev.n_prompt,
        }
        return with_progress(c, ev, self.timings_per_token)

    def chunks(self, ev: Event) -> list[dict[str, Any]]:
        if not ev.text and not ev.tokens:
            return []
        self.has_new_line = self.has_new_line or "\n" in ev.text
        c: dict[str, Any] = {
            "index": 0,
            "content": ev.text,
            "tokens": ev.tokens,
            "stop": False,
            "id_slot": ev.slot_id,
            "tokens_predicted": ev.n_predicted,
            "tokens_evaluated": ev.n_prompt,
        }
        if ev.done or self.timings_per_token:
            c["timings"] = timings(ev)
        if self.n_probs:
            c["completion_probabilities"] = native_probs(ev.probs)
        return [c]

    def final_chunk(self, ev: Event) -> dict[str, Any]:
        body = self._body("", None, ev, [])
        return nested_values(self.response_fields, body) if self.response_fields else body

    def usage_chunk(self, ev: Event) -> None:
        return None

    def response(
        self, text: str, probs: list[TokenProb], final: Event, tokens: list[int] | None = None
    ) -> dict:
        self.has_new_line = "\n" in text
        body = self._body(text, probs, final, (tokens or []) if self.return_tokens else [])
        return nested_values(self.response_fields, body) if self.response_fields else body

    def _body(
        self, text: str, probs: list[TokenProb] | None, final: Event, tokens: list[int]
    ) -> dict[str, Any]:
        """The final object (``probs`` None: a stream's, whose probabilities went with each token)."""
        body: dict[str, Any] = {
            "index": 0,
            "content": text,
            "tokens": tokens,
            "id_slot": final.slot_id,
            "stop": True,
            "model": self.model,
            "tokens_predicted": final.n_predicted,
            "tokens_evaluated": final.n_prompt,
            "generation_settings": self.settings,
            "prompt": self.prompt,
            "has_new_line": self.has_new_line,
            "truncated": final.truncated,
            "stop_type": final.stop_type,
            "stopping_word": final.stopping_word,
            "tokens_cached": final.n_cached,
            "timings": timings(final),
        }
        if self.n_probs and probs is not None:
            body["completion_probabilities"] = native_probs(probs)
        return body


def nested_values(paths: list[str], obj: dict[str, Any]) -> dict[str, Any]:
    """llama-server's ``json_get_nested_values``: ``{path: value}`` for each ``/``-separated path found
    in ``obj`` (the key is the whole path, e.g. ``"generation_settings/n_predict"``)."""
    out: dict[str, Any] = {}
    for path in paths:
        cur: Any = obj
        for k in path.split("/"):
            if not isinstance(cur, dict) or k not in cur:
                break
            cur = cur[k]
        else:
            out[path] = cur
    return out
