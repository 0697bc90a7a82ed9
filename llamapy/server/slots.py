"""``POST /slots/{id}?action=save|restore|erase`` (llama-server's slot persistence, ``--slot-save-path``).

A slot file is ``MAGIC``, a little-endian u32 header length, a JSON header (the model's identity from
:meth:`Backend.identity`, ``n_tokens``, ``n_state``), the ``n_tokens`` token ids (int32) and the KV
state of the slot's sequence (``n_state`` bytes, as :meth:`Backend.state_seq_get` gives it). Restoring
checks every part before the slot is touched, and clears the slot if the backend still refuses the
state. The work runs on the engine thread (:meth:`Engine.call`), between two decodes.
"""

from __future__ import annotations

import asyncio
import json
import os
import struct
import time
import unicodedata
from pathlib import Path
from typing import Any

import numpy as np

from .engine import Engine
from .errors import APIError, bad_request

MAGIC = b"LPYSLOT\x01"
MAX_FILENAME_BYTES = 255
MAX_HEADER_BYTES = 1 << 16
_RESERVED = set('/\\:*?"<>|')


def validate_filename(name: Any) -> str:
    """llama.cpp's ``fs_validate_filename``, stricter: a plain file name in the save folder (no path
    separators, no ``..``, no leading dot, no control or reserved characters, at most 255 UTF-8 bytes)."""
    if not isinstance(name, str) or not name:
        raise bad_request("'filename' must be a non-empty string", "filename")
    why = None
    if len(name.encode("utf-8", "surrogatepass")) > MAX_FILENAME_BYTES:
        why = f"longer than {MAX_FILENAME_BYTES} bytes"
    elif name.startswith("."):
        why = "it starts with a dot"
    elif name != name.strip() or name.endswith("."):
        why = "it starts or ends with a space, or ends with a dot"
    elif any(c in _RESERVED for c in name):
        why = 'it contains a path separator or a reserved character (/ \\ : * ? " < > |)'
    elif any(unicodedata.category(c) in ("Cc", "Cf", "Cs", "Co", "Cn") for c in name):
        why = "it contains a control, format or unassigned character"
    if why:
        raise bad_request(f"Invalid filename {name[:64]!r}: {why}", "filename")
    return name


def _slot(engine: Engine, id_slot: int, for_what: str):
    s = engine.slots[id_slot]
    if s.task is not None:
        raise APIError(409, f"slot {id_slot} is busy with a request; {for_what} it when it is idle")
    return s


def _save(engine: Engine, id_slot: int, path: Path, filename: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    s = _slot(engine, id_slot, "save")
    b = engine.backend
    if any(t < 0 for t in s.cache):  # (llama-server: "not supported by multimodal")
        raise APIError(501, f"slot {id_slot} holds an image; saving image chunks is not supported")
    tokens = np.asarray(s.cache, dtype="<i4")
    state = b.state_seq_get(s.id)
    header = json.dumps({"model": b.identity(), "n_tokens": len(tokens), "n_state": len(state)}).encode()
    data = MAGIC + struct.pack("<I", len(header)) + header + tokens.tobytes() + state
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return {
        "id_slot": id_slot,
        "filename": filename,
        "n_saved": len(tokens),
        "n_written": len(data),
        "timings": {"save_ms": (time.perf_counter() - t0) * 1e3},
    }


def parse_slot_file(raw: bytes, identity: dict[str, Any], n_vocab: int, n_ctx_slot: int, name: str):
    """(tokens, KV state) of a slot file, or a 400 saying what is wrong with it."""

    def bad(why: str) -> APIError:
        return bad_request(f"cannot restore {name!r}: {why}", "filename")

    if len(raw) < len(MAGIC) + 4 or raw[: len(MAGIC)] != MAGIC:
        raise bad("not a llamapy slot file (bad magic)")
    (n_header,) = struct.unpack_from("<I", raw, len(MAGIC))
    off = len(MAGIC) + 4
    if n_header > MAX_HEADER_BYTES or off + n_header > len(raw):
        raise bad("the header is truncated or too large")
    try:
        header = json.loads(raw[off : off + n_header])
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise bad("the header is not valid JSON") from None
    off += n_header
    if not isinstance(header, dict):
        raise bad("the header is not an object")
    if header.get("model") != identity:
        raise bad(f"it was saved with another model ({header.get('model')!r}, this one is {identity!r})")
    n_tokens, n_state = header.get("n_tokens"), header.get("n_state")
    for k, v in (("n_tokens", n_tokens), ("n_state", n_state)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise bad(f"the header's {k} is not a count ({v!r})")
    if n_tokens > n_ctx_slot:
        raise bad(f"it holds {n_tokens} tokens but a slot's context holds {n_ctx_slot}")
    if len(raw) != off + 4 * n_tokens + n_state:
        raise bad(f"its size is {len(raw)} bytes, the header says {off + 4 * n_tokens + n_state}")
    tokens = np.frombuffer(raw, dtype="<i4", count=n_tokens, offset=off)
    if n_tokens and (int(tokens.min()) < 0 or int(tokens.max()) >= n_vocab):
        raise bad(f"it holds token ids outside [0, {n_vocab})")
    off += 4 * n_tokens
    return [int(t) for t in tokens], raw[off:]


def _restore(engine: Engine, id_slot: int, path: Path, filename: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    s = _slot(engine, id_slot, "restore")
    b = engine.backend
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise bad_request(
            f"cannot restore {filename!r}: no such file in the slot save folder", "filename"
        ) from None
    except OSError as e:
        raise bad_request(f"cannot restore {filename!r}: {e.strerror}", "filename") from None
    tokens, state = parse_slot_file(raw, b.identity(), b.n_vocab, s.n_ctx, filename)
    b.seq_rm(s.id, -1, -1)
    s.cache.clear()
    try:
        b.state_seq_set(state, s.id)
    except Exception as e:
        b.seq_rm(s.id, -1, -1)
        raise bad_request(f"cannot restore {filename!r}: the KV state is invalid ({e})", "filename") from None
    s.cache[:] = tokens
    return {
        "id_slot": id_slot,
        "filename": filename,
        "n_restored": len(tokens),
        "n_read": len(raw),
        "timings": {"restore_ms": (time.perf_counter() - t0) * 1e3},
    }


def _erase(engine: Engine, id_slot: int) -> dict[str, Any]:
    s = _slot(engine, id_slot, "erase")
    n = len(s.cache)
    engine.backend.seq_rm(s.id, -1, -1)
    s.cache.clear()
    return {"id_slot": id_slot, "n_erased": n}


async def slot_action(
    engine: Engine, save_path: str | None, id_slot: str, action: str | None, body: Any
) -> dict[str, Any]:
    if not save_path:
        raise APIError(501, "This server does not support slots action. Start it with `--slot-save-path`")
    try:
        sid = int(id_slot)
    except ValueError:
        raise bad_request(f"Invalid slot ID {id_slot[:32]!r}: not an integer", "id_slot") from None
    if not 0 <= sid < engine.n_parallel:
        raise bad_request(f"Invalid slot ID {sid}: the server has {engine.n_parallel} slots", "id_slot")
    if action == "erase":
        fn = lambda e: _erase(e, sid)  # noqa: E731
    elif action in ("save", "restore"):
        if not isinstance(body, dict):
            raise bad_request("the body must be an object with a 'filename'")
        name = validate_filename(body.get("filename"))
        path = Path(save_path) / name
        op = _save if action == "save" else _restore
        fn = lambda e: op(e, sid, path, name)  # noqa: E731
    else:
        raise bad_request(f"Invalid action {action!r}: use save, restore or erase", "action")
    return await asyncio.wrap_future(engine.call(fn))
