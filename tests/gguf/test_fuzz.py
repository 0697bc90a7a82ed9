"""Property-based fuzzing: random bytes, and mutated/truncated real headers, never make the reader raise
anything but GGUFError, and never make it hang (each parse is timed)."""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llamapy.ggml.types import GGMLType
from llamapy.gguf import GGUFError, GGUFReader, GGUFWriter

HEAD = 64 * 1024  # bytes of each real header to mutate
MAX_SECONDS = 5.0  # a parse slower than this counts as a hang
# LLAMAPY_FUZZ_EXAMPLES=20000 for a deep run; the default keeps the three tests at ~5-10 s
FUZZ = settings(max_examples=int(os.environ.get("LLAMAPY_FUZZ_EXAMPLES", "250")), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@pytest.fixture(scope="module")
def seeds(smollm2_path, gemma3_path, fuzz_dir) -> list[bytes]:
    """The first 64 KiB of both real models, and a small complete file with every value type and tensors."""
    out = [Path(p).read_bytes()[:HEAD] for p in (smollm2_path, gemma3_path)]
    p = fuzz_dir / "seed.gguf"
    w = GGUFWriter(p, arch="llama", alignment=64)
    w.add_metadata({"a.i": 1, "a.f": 0.5, "a.b": True, "a.s": "x", "a.ints": [1, 2], "a.strs": ["p", "q"]})
    w.add_key_value("a.nested", [[1, 2], [3]])
    w.add_tensor("t0", np.zeros((2, 8), np.float32))
    w.add_tensor("t1", np.zeros((2, 34), np.uint8), ggml_type=GGMLType.Q8_0)
    w.add_tensor("t2", np.zeros((4,), np.float16))
    w.write()
    out.append(p.read_bytes())
    return out


def _parse(fuzz_dir: Path, data: bytes) -> None:
    p = fuzz_dir / "case.gguf"
    p.write_bytes(data)
    t0 = time.perf_counter()
    try:
        with GGUFReader(p) as r:
            for t in r.tensors:  # whatever was accepted must be usable
                assert t.offset + t.nbytes <= r.file_size
                t.array()
    except GGUFError as e:
        assert str(e)
    assert time.perf_counter() - t0 < MAX_SECONDS


@FUZZ
@given(
    prefix=st.sampled_from([b"", b"GGUF", b"GGUF\x03\x00\x00\x00", b"GGUF\x02\x00\x00\x00"]),
    body=st.binary(max_size=600),
)
def test_random_bytes(fuzz_dir, prefix, body):
    _parse(fuzz_dir, prefix + body)


_mutation = st.tuples(
    st.integers(0, HEAD - 1),
    st.one_of(
        st.binary(min_size=1, max_size=1),
        st.integers(0, (1 << 64) - 1).map(lambda v: struct.pack("<Q", v)),
        st.sampled_from([b"\xff" * 8, b"\x00" * 8, struct.pack("<Q", 1 << 63), struct.pack("<I", 13)]),
    ),
)


@FUZZ
@given(
    which=st.integers(0, 2),
    mutations=st.lists(_mutation, min_size=1, max_size=6),
    early=st.booleans(),
    cut=st.one_of(st.none(), st.integers(0, HEAD)),
)
def test_mutated_headers(fuzz_dir, seeds, which, mutations, early, cut):
    data = bytearray(seeds[which])
    for pos, val in mutations:
        if early:  # counts, key lengths and types live in the first few hundred bytes
            pos %= 512
        pos %= len(data)
        data[pos : pos + len(val)] = val[: len(data) - pos]
    if cut is not None:
        data = data[:cut]
    _parse(fuzz_dir, bytes(data))


@FUZZ
@given(cut=st.integers(0, HEAD))
def test_truncated_headers(fuzz_dir, seeds, cut):
    for seed in seeds:
        _parse(fuzz_dir, seed[:cut])
