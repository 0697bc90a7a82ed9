"""The routing key of a request: the token ids of its conversation so far, and a session hint.

The ingress does not render chat templates (the replica does, with the request's tools, images and
options): it tokenizes each message's role and text on its own, with the model's vocabulary, and joins
the pieces. A conversation's next turn repeats its earlier messages, so its key starts with the earlier
key, which is what prefix matching needs; the key only has to be stable, not equal to the prompt. Bounded:
at most ``MAX_CHARS`` of text are tokenized, whatever the body holds.
"""

from __future__ import annotations

import json
from typing import Any

MAX_CHARS = 16384  # text tokenized for a key: the prefix decides the route, the rest need not be read


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI/Anthropic/Responses parts: their text; other parts by type
        out = []
        for part in content:
            if isinstance(part, dict):
                t = part.get("text")
                out.append(t if isinstance(t, str) else f"[{part.get('type', 'part')}]")
            elif isinstance(part, str):
                out.append(part)
        return "".join(out)
    return "" if content is None else json.dumps(content, sort_keys=True, default=str)[:MAX_CHARS]


def key_pieces(body: Any) -> tuple[list[str] | list[int], str | None]:
    """The pieces of a request body's key (texts to tokenize one by one, or the prompt's token ids
    when the body gives ids) and its session hint (``session_id``, ``user`` or Anthropic's
    ``metadata.user_id``). An unknown body gives no pieces (the request goes to the least loaded)."""
    if not isinstance(body, dict):
        return [], None
    session = body.get("session_id") or body.get("user")
    meta = body.get("metadata")
    if not session and isinstance(meta, dict):
        session = meta.get("user_id")
    session = session if isinstance(session, str) and session else None
    pieces: list[str] = []
    for name in ("system", "instructions"):  # Anthropic's and ollama's system, the Responses API's
        if body.get(name) is not None:
            pieces.append(f"{name}\n{_text(body[name])}\n")
    messages = body.get("messages")
    if messages is None and isinstance(body.get("input"), list):  # the Responses API
        messages = body["input"]
    if isinstance(messages, list):
        for m in messages:
            if isinstance(m, dict):
                pieces.append(f"{m.get('role', m.get('type', ''))}\n{_text(m.get('content'))}\n")
    for name in ("prompt", "input"):
        v = body.get(name)
        if isinstance(v, str):
            pieces.append(v)
        elif isinstance(v, list) and v and all(isinstance(t, int) and not isinstance(t, bool) for t in v):
            return list(v[:MAX_CHARS]), session
        elif isinstance(v, list) and v and isinstance(v[0], str):
            pieces.append(v[0])
    out, n = [], 0
    for p in pieces:
        if n >= MAX_CHARS:
            break
        out.append(p[: MAX_CHARS - n])
        n += len(out[-1])
    return out, session


def key_tokens(body: Any, tokenize: Any) -> tuple[list[int], str | None]:
    """:func:`key_pieces`, tokenized with ``tokenize(text) -> list[int]``."""
    pieces, session = key_pieces(body)
    if pieces and isinstance(pieces[0], int):
        return list(pieces), session  # type: ignore[arg-type]
    tokens: list[int] = []
    for p in pieces:
        tokens += tokenize(p)
    return tokens, session
