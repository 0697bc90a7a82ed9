"""Hand-built GGUF bytes for the validation tests: every field can be set to a bad value.

Independent of llamapy's writer on purpose, so the reader is tested against bytes laid out by hand.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)


def s(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def kv(key: str | bytes, vtype: int, payload: bytes) -> bytes:
    """One metadata record: key, type tag, already-encoded value."""
    return s(key) + struct.pack("<I", vtype) + payload


def kv_u32(key: str, v: int) -> bytes:
    return kv(key, U32, struct.pack("<I", v))


def kv_str(key: str, v: str) -> bytes:
    return kv(key, STR, s(v))


def tinfo(name: str | bytes, ne: list[int], ttype: int, offset: int, n_dims: int | None = None) -> bytes:
    n = len(ne) if n_dims is None else n_dims
    return (
        s(name) + struct.pack("<I", n) + struct.pack(f"<{len(ne)}q", *ne) + struct.pack("<IQ", ttype, offset)
    )


@dataclass
class Layout:
    """Bytes of a file and where each part starts."""

    data: bytes
    kv_offsets: list[int] = field(default_factory=list)
    tensor_offsets: list[int] = field(default_factory=list)
    data_offset: int = 0


def build(
    kvs: list[bytes] = (),
    tensors: list[bytes] = (),
    data: bytes = b"",
    *,
    magic: bytes = b"GGUF",
    version: int = 3,
    n_tensors: int | None = None,
    n_kv: int | None = None,
    alignment: int = 32,
) -> Layout:
    out = bytearray(magic + struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors,
                                        len(kvs) if n_kv is None else n_kv))  # fmt: skip
    lay = Layout(b"")
    for rec in kvs:
        lay.kv_offsets.append(len(out))
        out += rec
    for rec in tensors:
        lay.tensor_offsets.append(len(out))
        out += rec
    if tensors:
        out += b"\0" * (-len(out) % alignment)
    lay.data_offset = len(out)
    out += data
    lay.data = bytes(out)
    return lay
