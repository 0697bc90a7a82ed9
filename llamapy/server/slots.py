"""``POST /slots/{id}?action=save|restore|erase`` (llama-server's slot persistence, ``--slot-save-path``).

A slot file is ``MAGIC``, a little-endian u32 header length, a JSON header (the model's identity from
:meth:`Backend.identity`, ``n_tokens``, ``n_state``), the ``n_tokens`` token ids (int32) and the KV
state of the slot's sequence (``n_state`` bytes, as :meth:`Backend.state_seq_get` gives it).

Only plain files directly in the save folder are touched. Saving writes a new hidden temporary file
(``O_CREAT | O_EXCL | O_NOFOLLOW``, a random name) and renames it over the target, so a link or file
planted in the folder is never written through. Restoring opens the name without following a link and
without blocking (``O_NOFOLLOW | O_NONBLOCK``: a FIFO cannot stall it), refuses anything but a regular
file, reads and checks the header before the body, reads no more than the header promises and the slot
can hold, and has the backend check the KV cells against the tokens (positions ``0..n_tokens-1``).
The file work runs in a worker thread; only taking the KV state and putting it back run on the engine
thread (:meth:`Engine.call`), between two decodes. Errors name the file as given, nothing else.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import secrets
import stat
import struct
import time
import unicodedata
from collections.abc import Callable
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


def _snapshot(engine: Engine, id_slot: int) -> tuple[np.ndarray, bytes]:
    """The slot's tokens and KV state (on the engine thread)."""
    s = _slot(engine, id_slot, "save")
    if any(t < 0 for t in s.cache):  # (llama-server: "not supported by multimodal")
        raise APIError(501, f"slot {id_slot} holds an image; saving image chunks is not supported")
    return np.asarray(s.cache, dtype="<i4"), engine.backend.state_seq_get(s.id)


def _open_folder(folder: str) -> int:
    try:
        return os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise APIError(500, f"the slot save folder cannot be opened ({e.strerror})") from None


def _write_file(folder: str, name: str, data: bytes) -> None:
    """Write ``data`` as ``name`` in ``folder``: a fresh temporary file, then an atomic rename."""
    dfd = _open_folder(folder)
    tmp = f".slot-{secrets.token_hex(8)}.tmp"  # a hidden name: no valid slot file name starts with a dot
    try:
        fd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd
        )
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
            raise
    except IsADirectoryError:
        raise bad_request(f"cannot save {name!r}: a folder of that name is in the way", "filename") from None
    except OSError as e:
        raise APIError(500, f"cannot save {name!r}: {e.strerror}") from None
    finally:
        os.close(dfd)


def _read_exact(fd: int, n: int) -> bytes:
    parts, got = [], 0
    while got < n:
        b = os.read(fd, min(n - got, 1 << 24))
        if not b:
            break
        parts.append(b)
        got += len(b)
    return b"".join(parts)


def read_slot_file(
    folder: str,
    name: str,
    identity: dict[str, Any],
    n_vocab: int,
    n_ctx_slot: int,
    state_size_max: Callable[[int], int] | None = None,
) -> tuple[list[int], bytes, int]:
    """(tokens, KV state, bytes read) of slot file ``name`` in ``folder``, or a 400 saying what is wrong.
    ``state_size_max(n_tokens)``: the most KV state bytes a sequence of that many tokens has."""

    def bad(why: str) -> APIError:
        return bad_request(f"cannot restore {name!r}: {why}", "filename")

    dfd = _open_folder(folder)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except FileNotFoundError:
        raise bad("no such file in the slot save folder") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise bad(
                "it is a symbolic link; only regular files in the slot save folder are restored"
            ) from None
        raise bad(f"it cannot be opened ({e.strerror})") from None
    finally:
        os.close(dfd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise bad("not a regular file")
        head = _read_exact(fd, len(MAGIC) + 4)
        if len(head) < len(MAGIC) + 4 or head[: len(MAGIC)] != MAGIC:
            raise bad("not a llamapy slot file (bad magic)")
        (n_header,) = struct.unpack_from("<I", head, len(MAGIC))
        off = len(head) + n_header
        if n_header > MAX_HEADER_BYTES or off > st.st_size:
            raise bad("the header is truncated or too large")
        try:
            header = json.loads(_read_exact(fd, n_header))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            raise bad("the header is not valid JSON") from None
        n_tokens, n_state = _check_header(header, identity, n_ctx_slot, bad)
        n_body = 4 * n_tokens + n_state
        if st.st_size != off + n_body:
            raise bad(f"its size is {st.st_size} bytes, the header says {off + n_body}")
        if state_size_max is not None and n_state > state_size_max(n_tokens):
            raise bad(f"its KV state of {n_state} bytes is larger than {n_tokens} tokens can have")
        body = _read_exact(fd, n_body)
        if len(body) != n_body or os.read(fd, 1):
            raise bad("the file changed while it was read")
    except OSError as e:
        raise bad(f"it cannot be read ({e.strerror})") from None
    finally:
        os.close(fd)
    tokens = np.frombuffer(body, dtype="<i4", count=n_tokens)
    if n_tokens and (int(tokens.min()) < 0 or int(tokens.max()) >= n_vocab):
        raise bad(f"it holds token ids outside [0, {n_vocab})")
    return [int(t) for t in tokens], body[4 * n_tokens :], off + n_body


def _check_header(
    header: Any, identity: dict[str, Any], n_ctx_slot: int, bad: Callable[[str], APIError]
) -> tuple[int, int]:
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
    return n_tokens, n_state


def _apply(engine: Engine, id_slot: int, tokens: list[int], state: bytes, name: str) -> None:
    """Put the restored tokens and KV state into the slot (on the engine thread); the slot is left
    empty when the backend refuses the state."""
    s = _slot(engine, id_slot, "restore")
    b = engine.backend
    b.seq_rm(s.id, -1, -1)
    s.cache.clear()
    try:
        n_read = b.state_seq_set(state, s.id, n_tokens=len(tokens))
        if n_read != len(state):
            raise ValueError(f"{len(state) - n_read} bytes after the end of the KV state")
    except Exception as e:
        b.seq_rm(s.id, -1, -1)
        raise bad_request(f"cannot restore {name!r}: the KV state is invalid ({e})", "filename") from None
    s.cache[:] = tokens


async def _save(engine: Engine, id_slot: int, folder: str, name: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    tokens, state = await asyncio.wrap_future(engine.call(lambda e: _snapshot(e, id_slot)))
    header = json.dumps(
        {"model": engine.backend.identity(), "n_tokens": len(tokens), "n_state": len(state)}
    ).encode()
    data = MAGIC + struct.pack("<I", len(header)) + header + tokens.tobytes() + state
    await asyncio.to_thread(_write_file, folder, name, data)
    return {
        "id_slot": id_slot,
        "filename": name,
        "n_saved": len(tokens),
        "n_written": len(data),
        "timings": {"save_ms": (time.perf_counter() - t0) * 1e3},
    }


async def _restore(engine: Engine, id_slot: int, folder: str, name: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    b = engine.backend
    size_max = getattr(b, "state_seq_size_max", None)
    n_ctx_slot = engine.slots[id_slot].n_ctx
    tokens, state, n_read = await asyncio.to_thread(
        read_slot_file, folder, name, b.identity(), b.n_vocab, n_ctx_slot, size_max
    )
    await asyncio.wrap_future(engine.call(lambda e: _apply(e, id_slot, tokens, state, name)))
    return {
        "id_slot": id_slot,
        "filename": name,
        "n_restored": len(tokens),
        "n_read": n_read,
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
        return await asyncio.wrap_future(engine.call(lambda e: _erase(e, sid)))
    if action in ("save", "restore"):
        if not isinstance(body, dict):
            raise bad_request("the body must be an object with a 'filename'")
        name = validate_filename(body.get("filename"))
        op = _save if action == "save" else _restore
        return await op(engine, sid, save_path, name)
    raise bad_request(f"Invalid action {action!r}: use save, restore or erase", "action")
