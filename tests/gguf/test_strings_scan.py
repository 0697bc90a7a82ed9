"""scan_strings' vectorized path gives the loop's StringArray (or the loop's error) on every input."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from llamapy.gguf import strings as S


class Bad(Exception):
    pass


def _loop(buf: bytes, pos: int, n: int) -> S.StringArray:
    real = S._scan_vectorized
    try:
        S._scan_vectorized = lambda *a: None  # type: ignore[assignment]
        return S.scan_strings(buf, pos, len(buf), n, "tok", Bad)
    finally:
        S._scan_vectorized = real  # type: ignore[assignment]


def _encode(items: list[bytes]) -> bytes:
    return b"".join(struct.pack("<Q", len(p)) + p for p in items)


def _cases() -> dict[str, list[bytes]]:
    rng = np.random.default_rng(7)
    words = [bytes(rng.integers(33, 127, rng.integers(1, 12)).astype(np.uint8)) for _ in range(3000)]
    return {
        "text": words,
        "empty strings": [b"" if i % 3 == 0 else w for i, w in enumerate(words)],
        "zero bytes": [b"\0" * (i % 9) + w if i % 5 == 0 else w for i, w in enumerate(words)],
        "long string": [*words[:500], b"x" * 70000, *words[500:]],
        "binary": [bytes(rng.integers(0, 256, rng.integers(0, 20)).astype(np.uint8)) for _ in range(2000)],
        "lengths like fields": [struct.pack("<Q", 5) + b"abcde" for _ in range(1000)],
    }


@pytest.mark.parametrize("name", list(_cases()))
def test_vectorized_scan_equals_the_loop(name: str) -> None:
    items = _cases()[name]
    head, tail = b"\x07" * 13, b"\0" * 64 + b"\xff" * 40  # an array inside a file, zeros after it
    buf = head + _encode(items) + tail
    fast = S.scan_strings(buf, len(head), len(buf), len(items), "tok", Bad)
    slow = _loop(buf, len(head), len(items))
    assert fast.raw == slow.raw and np.array_equal(fast.offsets, slow.offsets)
    assert fast.tolist() == [p.decode("utf-8", "surrogateescape") for p in items]
    if name in ("text", "long string"):  # the vectorized path itself answered (a few breaks at most)
        assert S._scan_vectorized(buf, len(head), len(buf), len(items)) is not None


@pytest.mark.parametrize("cut", [1, 5, 9, 100])
def test_truncated_array_raises_as_the_loop(cut: int) -> None:
    items = _cases()["text"]
    buf = _encode(items)[:-cut]
    with pytest.raises(Bad) as fast:
        S.scan_strings(buf, 0, len(buf), len(items), "tok", Bad)
    with pytest.raises(Bad) as slow:
        _loop(buf, 0, len(items))
    assert str(fast.value) == str(slow.value)


def test_real_vocabulary_scans_as_the_loop(smollm2_path) -> None:
    from llamapy.gguf.reader import GGUFReader

    r = GGUFReader(smollm2_path)
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
        arr = r.fields[key].value if hasattr(r.fields[key], "value") else r.fields[key]
        assert isinstance(arr, S.StringArray) and len(arr) > 40000
        raw = arr.raw
        again = _loop(raw, 0, len(arr))
        assert np.array_equal(again.offsets, arr.offsets)
        assert S._scan_vectorized(raw, 0, len(raw), len(arr)) is not None
