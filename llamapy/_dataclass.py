"""``dataclass``: the standard library's decorator, with the methods it generates compiled once per
machine instead of once per process.

``dataclasses.dataclass`` writes each class's ``__init__``, ``__repr__``, ``__eq__`` (and the others
asked for) as source text and compiles it with ``exec`` on every import: ~150 compiles for the ~40
classes a ``llamapy run`` imports, 19-21 ms of its 26-30 ms of dataclass creation (the AMD VM), in a
0.45 s run. Here, while llamapy's own classes are decorated, the decorator's ``exec`` takes the compiled
code of the same text from a per-user cache (``<llamapy cache>/pycode``, one file per Python bytecode
version, keyed by the whole text), and compiles and appends it when the text is new. The code is what
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
from importlib.util import MAGIC_NUMBER
from types import CodeType
from typing import TYPE_CHECKING, Any

#: a cache file past this size starts again from this process's entries (old class texts accumulate)
MAX_BYTES = 4 << 20

_HEAD = struct.Struct("<I")
_lock = threading.RLock()
_codes: "dict[str, CodeType] | None" = None  # text -> compiled code, read on the first class
_rewrite = False  # the file is damaged or too large: the next new entry rewrites it whole


def cache_path() -> str:
    """The cache file of this Python's bytecode version."""
    from .hub.common import cache_dir

    tag = sys.implementation.cache_tag or "python"
    return os.path.join(str(cache_dir()), "pycode", f"dataclasses-{tag}-{MAGIC_NUMBER.hex()}.bin")


def _read() -> "dict[str, CodeType]":
    global _rewrite
    codes: dict[str, CodeType] = {}
    try:
        with open(cache_path(), "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError:
        return codes
    if len(data) > MAX_BYTES:
        _rewrite = True
        return codes
    pos = 0
    try:
        while pos < len(data):
            (n,) = _HEAD.unpack_from(data, pos)
            entry = marshal.loads(data[pos + _HEAD.size : pos + _HEAD.size + n])
            pos += _HEAD.size + n
            text, code = entry
            if not isinstance(text, str) or not isinstance(code, CodeType):
                raise ValueError("not a (text, code) entry")
            codes[text] = code
    except (struct.error, EOFError, ValueError, TypeError):
        _rewrite = True  # a cut or foreign record: keep the entries before it
    return codes


def _record(entry: bytes) -> bytes:
    return _HEAD.pack(len(entry)) + entry


def _store(text: str, code: CodeType) -> None:
    """Append one entry (one ``write`` of an ``O_APPEND`` file, so concurrent processes do not
    interleave records), or rewrite the file whole (a temporary file renamed over it)."""
    global _rewrite
    path = cache_path()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if _rewrite:
            assert _codes is not None
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "wb") as f:
                f.write(b"".join(_record(marshal.dumps((t, c))) for t, c in _codes.items()))
            os.replace(tmp, path)
            _rewrite = False
            return
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, _record(marshal.dumps((text, code))))
        finally:
            os.close(fd)
    except (OSError, ValueError):
        pass  # no cache: the next process compiles again


def _cached_exec(source: Any, globals: Any = None, locals: Any = None, /) -> None:
    """``exec`` for dataclasses' generated source: its code from the cache, compiled and stored once."""
    global _codes
    if globals is None:  # as ``exec`` itself: the caller's namespaces, not this module's
        frame = sys._getframe(1)
        globals = frame.f_globals
        if locals is None:
            locals = frame.f_locals
    if not isinstance(source, str):
        return builtins.exec(source, globals, locals)
    if _codes is None:
        _codes = _read()
    code = _codes.get(source)
    if code is None:
        code = compile(source, "<string>", "exec", dont_inherit=True)
        _codes[source] = code
        _store(source, code)
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
