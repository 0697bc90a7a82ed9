"""``dataclass``: the standard library's decorator, with the methods it generates compiled once per
machine instead of once per process.

``dataclasses.dataclass`` writes each class's ``__init__``, ``__repr__``, ``__eq__`` (and the others
asked for) as source text and compiles it with ``exec`` on every import: ~150 compiles for the ~40
classes a ``llamapy run`` imports, 19-21 ms of its 26-30 ms of dataclass creation (the AMD VM), in a
0.45 s run. Here, while llamapy's own classes are decorated, the decorator's ``exec`` takes the compiled
code of the same text from a per-user cache (``<llamapy cache>/pycode``, one file per Python bytecode
version, each record found by the CRC-32 of its text and checked against the whole text), and compiles
and appends it when the text is new. The code is what
``exec`` would compile from that text (same file name, no inherited ``__future__`` flags), so the class
is the same.

A missing, unreadable, damaged or unwritable cache only means compiling as the standard library does.
Use ``from llamapy._dataclass import dataclass`` (``field`` and the rest still from ``dataclasses``).
"""

# no ``from __future__ import annotations`` here: the cached code must not differ from what dataclasses'
# own ``exec`` compiles, and ``compile`` below passes dont_inherit=True for the same reason

import builtins
import dataclasses
import marshal
import os
import struct
import sys
import threading
import zlib
from importlib.util import MAGIC_NUMBER
from types import CodeType
from typing import TYPE_CHECKING, Any

#: a cache file past this size starts again from this process's entries (old class texts accumulate)
MAX_BYTES = 4 << 20

_MAGIC = b"llamapy dataclass code 2\n"  # the file's first bytes
# a record: the CRC-32 of the text's UTF-8 bytes, their length, the code's length; the text; marshal(code)
_HEAD = struct.Struct("<III")
_lock = threading.RLock()
_data = b""  # the cache file as read (on the first class)
# CRC -> (text offset, text length, code length) of each record; read on the first class
_index: "dict[int, list[tuple[int, int, int]]] | None" = None
_codes: "dict[str, CodeType]" = {}  # this process's: found in the file or compiled
_rewrite = False  # the file is damaged or too large: the next new entry rewrites it whole


def cache_path() -> str:
    """The cache file of this Python's bytecode version."""
    from .hub.common import cache_dir

    tag = sys.implementation.cache_tag or "python"
    return os.path.join(str(cache_dir()), "pycode", f"dataclasses-v2-{tag}-{MAGIC_NUMBER.hex()}.bin")


def _read() -> "dict[int, list[tuple[int, int, int]]]":
    """The file's records by CRC, from their headers alone: a process unmarshals only the code of the
    texts it meets (a ``run``: ~140 of the ~400 a machine that ran the tests and the server holds)."""
    global _rewrite, _data
    index: dict[int, list[tuple[int, int, int]]] = {}
    try:
        with open(cache_path(), "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError:
        return index
    if len(data) > MAX_BYTES or not data.startswith(_MAGIC):
        _rewrite = True
        return index
    pos, end = len(_MAGIC), len(data)
    while pos < end:
        if pos + _HEAD.size > end:
            _rewrite = True  # a cut record: keep the ones before it
            break
        crc, n_text, n_code = _HEAD.unpack_from(data, pos)
        at = pos + _HEAD.size
        if at + n_text + n_code > end:
            _rewrite = True
            break
        index.setdefault(crc, []).append((at, n_text, n_code))
        pos = at + n_text + n_code
    _data = data
    return index


def _lookup(key: bytes) -> CodeType | None:
    global _rewrite
    assert _index is not None
    entries = _index.get(zlib.crc32(key), [])
    for e in entries:
        at, n_text, n_code = e
        if _data[at : at + n_text] != key:
            continue
        try:
            code = marshal.loads(_data[at + n_text : at + n_text + n_code])
        except (EOFError, ValueError, TypeError):
            code = None
        if isinstance(code, CodeType):
            return code
        entries.remove(e)  # a damaged record: compiled again, and the file rewritten without it
        _rewrite = True
        return None
    return None


def _record(key: bytes, code_bytes: bytes) -> bytes:
    return _HEAD.pack(zlib.crc32(key), len(key), len(code_bytes)) + key + code_bytes


def _store(key: bytes, code: CodeType) -> None:
    """Append one record (one ``write`` of an ``O_APPEND`` file, so concurrent processes do not
    interleave records), or rewrite the file whole (a temporary file renamed over it): the records read
    and not found damaged, then this process's."""
    global _rewrite
    path = cache_path()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if _rewrite:
            assert _index is not None
            parts, kept = [], set()
            for entries in _index.values():
                for at, n_text, n_code in entries:
                    kept.add(_data[at : at + n_text])
                    parts.append(_data[at - _HEAD.size : at + n_text + n_code])  # the record as read
            for text, c in _codes.items():
                k = text.encode("utf-8", "surrogatepass")
                if k not in kept:
                    parts.append(_record(k, marshal.dumps(c)))
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "wb") as f:
                f.write(b"".join([_MAGIC, *parts]))
            os.replace(tmp, path)
            _rewrite = False
            return
        head = b""
        try:  # the process that makes the file writes its first bytes, with its record
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o644)
            head = _MAGIC
        except FileExistsError:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, head + _record(key, marshal.dumps(code)))
        finally:
            os.close(fd)
    except (OSError, ValueError):
        pass  # no cache: the next process compiles again


def _cached_exec(source: Any, globals: Any = None, locals: Any = None, /) -> None:
    """``exec`` for dataclasses' generated source: its code from the cache, compiled and stored once."""
    global _index
    if globals is None:  # as ``exec`` itself: the caller's namespaces, not this module's
        frame = sys._getframe(1)
        globals = frame.f_globals
        if locals is None:
            locals = frame.f_locals
    if not isinstance(source, str):
        return builtins.exec(source, globals, locals)
    code = _codes.get(source)
    if code is None:
        if _index is None:
            _index = _read()
        key = source.encode("utf-8", "surrogatepass")
        code = _lookup(key)
        if code is None:
            code = compile(source, "<string>", "exec", dont_inherit=True)
            _codes[source] = code
            _store(key, code)
        else:
            _codes[source] = code
    return builtins.exec(code, globals, locals)


def _decorate(cls: type, kwargs: "dict[str, Any]") -> type:
    with _lock:  # dataclasses' module global, set only while one of llamapy's classes is made
        prior = dataclasses.__dict__.get("exec", _lock)
        dataclasses.exec = _cached_exec  # type: ignore[attr-defined]
        try:
            return dataclasses.dataclass(cls, **kwargs)
        finally:
            if prior is _lock:
                del dataclasses.exec  # type: ignore[attr-defined]
            else:  # pragma: no cover - someone else's exec was there
                dataclasses.exec = prior  # type: ignore[attr-defined]


if TYPE_CHECKING:
    from dataclasses import dataclass
else:

    def dataclass(cls=None, /, **kwargs):
        """``dataclasses.dataclass(cls, **kwargs)``, its generated methods' code from the cache."""
        if cls is None:
            return lambda c: _decorate(c, kwargs)
        return _decorate(cls, kwargs)


__all__ = ["dataclass", "cache_path", "MAX_BYTES"]
