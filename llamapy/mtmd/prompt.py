"""Images in chat requests and prompts made of chunks, shared by the API and the server.

- ``split_content(messages)``: OpenAI content parts (``{"type": "text"}``, ``{"type": "image_url",
  "image_url": {"url": "data:image/png;base64,..."}}``) -> messages whose content is a string with one
  media marker per image, and the encoded images in order. Only ``data:`` URLs are read, unless
  ``allow_remote``; a remote URL is then fetched only when its host resolves to public addresses.
- ``chunk_tokens(chunks)``: the prompt as a token list in which each image position holds a negative
  pseudo token derived from the image's hash, so a prompt cache compares images by their hash.
- ``prefill(mtmd, seq, chunks)``: make a ``TokenSequence`` hold the chunks, reusing the longest common
  prefix that ends on a chunk boundary (an image is evaluated whole), and leave the last logits ready.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import socket
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .errors import ImageError, MtmdError
from .mtmd import MEDIA_MARKER, Chunk, ImageChunk, MtmdContext, TextChunk

__all__ = ["chunk_tokens", "dedupe_bos", "has_images", "image_map", "prefill", "snap_prefix", "split_content"]

_K_BITS = 20  # pseudo token = -(1 + (image hash prefix << 20) + position in the image)

MAX_IMAGE_BYTES = 32 * 1024 * 1024
_IMAGE_TYPES = ("image_url", "input_image", "image")
# OpenAI's {"type": "input_audio", "input_audio": {"data": base64, "format": "wav"}}
_AUDIO_TYPES = ("input_audio",)


def _is_image_part(p: Any) -> bool:
    return isinstance(p, Mapping) and p.get("type") in _IMAGE_TYPES + _AUDIO_TYPES


def has_images(messages: Sequence[Any]) -> bool:
    return any(
        isinstance(m, Mapping)
        and isinstance(m.get("content"), list)
        and any(_is_image_part(p) for p in m["content"])
        for m in messages
    )


def _check_public(host: str, where: str) -> None:
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError as e:
        raise ImageError(f"{where}: cannot resolve {host!r}: {e}") from None
    for info in infos:
        ip = ipaddress.ip_address(info[4][0])
        if not ip.is_global or ip.is_multicast:
            raise ImageError(f"{where}: {host!r} resolves to the non-public address {ip}; not fetched")


def read_image_url(
    url: str, where: str, allow_remote: bool = False, max_bytes: int = MAX_IMAGE_BYTES
) -> bytes:
    """The bytes of a ``data:`` URL (base64 or percent-encoded), or of an http(s) URL when allowed."""
    if not isinstance(url, str) or not url:
        raise ImageError(f"{where}: the image URL must be a non-empty string")
    if url.startswith("data:"):
        head, sep, payload = url[5:].partition(",")
        if not sep:
            raise ImageError(f"{where}: a data URL needs a ',' before its payload")
        if head.endswith(";base64"):
            if len(payload) > max_bytes * 4 // 3 + 4:
                raise ImageError(f"{where}: the image is larger than {max_bytes} bytes")
            try:
                return base64.b64decode(payload, validate=False)
            except (binascii.Error, ValueError) as e:
                raise ImageError(f"{where}: the data URL's base64 payload is invalid: {e}") from None
        return urllib.parse.unquote_to_bytes(payload)
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    if scheme not in ("http", "https"):
        raise ImageError(
            f"{where}: image URLs must be data: URLs (or http(s) when allowed), got {scheme or url!r}"
        )
    if not allow_remote:
        raise ImageError(
            f"{where}: remote image URLs are not fetched (give the image as a data: URL, or start the "
            "server with --allow-image-urls)"
        )
    host = urllib.parse.urlsplit(url).hostname or ""
    _check_public(host, where)

    class _NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *a: Any, **k: Any) -> None:  # a redirect could lead to a private host
            return None

    try:
        with urllib.request.build_opener(_NoRedirect).open(url, timeout=10) as r:
            data = r.read(max_bytes + 1)
    except OSError as e:
        raise ImageError(f"{where}: cannot fetch {url!r}: {e}") from None
    if len(data) > max_bytes:
        raise ImageError(f"{where}: the image at {url!r} is larger than {max_bytes} bytes")
    return data


def split_content(
    messages: Sequence[Any], allow_remote: bool = False, marker: str = MEDIA_MARKER
) -> tuple[list[Any], list[tuple[str, bytes]]]:
    """Messages with string contents (text parts joined by newlines, a marker per image) and
    ``(where, encoded bytes)`` of each image in order."""
    out: list[Any] = []
    images: list[tuple[str, bytes]] = []
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, Mapping) else None
        if not isinstance(content, list):
            out.append(m)
            continue
        texts: list[str] = []
        for j, p in enumerate(content):
            where = f"messages[{i}].content[{j}]"
            if not isinstance(p, Mapping):
                raise MtmdError(f"{where}: a content part must be an object")
            kind = p.get("type")
            if kind == "text":
                texts.append(str(p.get("text", "")))
            elif kind in _IMAGE_TYPES:
                ref = p.get("image_url", p.get("image"))
                url = ref.get("url") if isinstance(ref, Mapping) else ref
                images.append((where, read_image_url(url, where, allow_remote)))
                texts.append(marker)
            elif kind in _AUDIO_TYPES:
                from .audio import read_input_audio

                images.append((where, read_input_audio(p.get("input_audio"), where)))
                texts.append(marker)
            else:
                raise MtmdError(
                    f"{where}: content part type {kind!r} is not supported (text, image_url, input_audio)"
                )
        out.append({**m, "content": "\n".join(texts)})
    return out, images


def chunk_tokens(chunks: Sequence[Chunk]) -> list[int]:
    """Token ids of the chunks, image positions as negative pseudo tokens (unique per image and position)."""
    toks: list[int] = []
    for ch in chunks:
        if isinstance(ch, TextChunk):
            toks += ch.tokens
        else:
            base = int(ch.id[:8], 16) << _K_BITS  # one entry per position (M-RoPE: fewer than tokens)
            toks += [-(1 + base + k) for k in range(ch.n_pos)]
    return toks


def dedupe_bos(chunks: Sequence[Chunk], bos: int) -> list[Chunk]:
    """Drop the second of two leading BOS tokens (the chat template wrote one, the tokenizer another)."""
    if chunks and bos >= 0 and isinstance(chunks[0], TextChunk) and chunks[0].tokens[:2] == [bos, bos]:
        return [TextChunk(chunks[0].tokens[1:]), *chunks[1:]]
    return list(chunks)


def image_map(chunks: Sequence[Chunk]) -> dict[int, ImageChunk]:
    """The image chunks by the pseudo token of their first position."""
    out: dict[int, ImageChunk] = {}
    toks = 0
    view = chunk_tokens(chunks)
    for ch in chunks:
        if isinstance(ch, ImageChunk):
            out[view[toks]] = ch
        toks += ch.n_pos
    return out


def snap_prefix(tokens: Sequence[int], n: int) -> int:
    """``n`` moved back to the start of the image it falls inside of (a cached prefix must end on a
    chunk boundary: an image is evaluated whole)."""
    if 0 < n < len(tokens) and tokens[n] < 0:
        k = (-tokens[n] - 1) & ((1 << _K_BITS) - 1)  # position of tokens[n] in its image
        return max(0, n - k)
    return n


def prefill(mt: MtmdContext, seq: Any, chunks: Sequence[Chunk]) -> list[int]:
    """Make ``seq`` (a ``TokenSequence``) hold ``chunks``; returns the prompt's token view."""
    chunks = dedupe_bos(chunks, getattr(mt.vocab, "bos", -1))
    want = chunk_tokens(chunks)
    n_cells = sum(ch.n_tokens for ch in chunks)  # KV cells; ``want`` counts positions
    if max(len(want), n_cells) > seq.n_ctx:
        from ..generation.sequence import PromptTooLongError

        raise PromptTooLongError(f"the prompt has {n_cells} tokens but the context holds {seq.n_ctx}")
    # chunk boundaries: the reused prefix may end inside text, never inside an image
    n = seq.common_prefix(want)
    if n == len(want) == len(seq.tokens) and seq._last_logits is not None:
        return want
    n = snap_prefix(want, min(n, len(want) - 1))
    if n < len(seq.tokens):
        if not seq.ctx.memory.seq_rm(seq.seq_id, n, -1):
            seq.ctx.memory.seq_rm(seq.seq_id, -1, -1)
            n = 0
        del seq.tokens[n:]
    rest: list[Chunk] = []
    start = 0
    for ch in chunks:
        end = start + ch.n_pos
        if end > n:
            if isinstance(ch, TextChunk) and start < n:
                rest.append(TextChunk(ch.tokens[n - start :]))
            else:
                rest.append(ch)
        start = end
    mt.eval_chunks(seq.ctx, rest, n, seq_id=seq.seq_id, n_batch=seq.n_batch)
    seq.tokens[:] = want
    seq._last_logits = np.array(seq.ctx.get_logits_ith(-1), dtype=np.float32)
    if seq.on_logits is not None:
        seq.on_logits(len(want) - 1, seq._last_logits[None, :])
    return want
