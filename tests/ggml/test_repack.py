"""``cpu.repack.copy_rows``: every 2-D layout's repack of a memory-mapped weight made in chunks of rows (the
source pages of each dropped once copied) gives the same bytes as one copy of the weight in memory, with
chunk boundaries anywhere (a last chunk of fewer rows included); the mapped bytes stay readable after."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pytest

from llamapy.ggml.cpu import repack
from llamapy.ggml.types import TRAITS, GGMLType

# (layout module, type, columns): every 2-D repack of ``repack.LAYOUTS``
CASES = [
    ("q4k_x8", GGMLType.Q4_K, 512),
    ("q5k_x8", GGMLType.Q5_K, 512),
    ("q6k_x8", GGMLType.Q6_K, 512),
    ("q40_x8", GGMLType.Q4_0, 256),
    ("q40_x8", GGMLType.Q4_1, 256),
    ("q50_x8", GGMLType.Q5_0, 256),
    ("q80_x8", GGMLType.Q8_0, 256),
]


def test_every_layout_is_covered() -> None:
    assert {(m, t) for m, t, _ in CASES} >= {(m, t) for t, m in repack.LAYOUTS.items()}


def _mapped(tmp_path: Path, raw: np.ndarray) -> np.ndarray:
    p = tmp_path / "w.bin"
    pad = 4096 + 160  # not at the start of a page
    p.write_bytes(b"\0" * pad + raw.tobytes())
    mm = np.memmap(p, mode="r", dtype=np.uint8)
    return mm[pad : pad + raw.nbytes].reshape(raw.shape)


@pytest.mark.parametrize("chunk_rows", [8, 24, 40])
@pytest.mark.parametrize(("module", "t", "K"), CASES, ids=[f"{m}-{t.name}" for m, t, _ in CASES])
def test_chunked_repack_of_a_mapped_weight_is_the_same_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str, t: GGMLType, K: int, chunk_rows: int
) -> None:
    mod = importlib.import_module(f"llamapy.ggml.cpu.{module}")
    tr = TRAITS[t]
    N, rb = 64, K // tr.block_size * tr.type_size
    rng = np.random.default_rng(chunk_rows)
    raw = rng.integers(0, 256, (N, rb), dtype=np.uint8)
    view = _mapped(tmp_path, raw)
    assert repack.mapped_source(view) is not None
    whole = mod.repack(raw.copy(), t)  # in memory: one call
    calls: list[int] = []
    real = repack.copy_rows

    def spy(A: np.ndarray, group_bytes: int, copy) -> np.ndarray:  # type: ignore[no-untyped-def]
        calls.append(A.shape[0])
        return real(A, group_bytes, lambda a, r: (calls.append(-a.shape[0]), copy(a, r)))

    monkeypatch.setattr(repack, "CHUNK_BYTES", chunk_rows * rb)
    monkeypatch.setattr(mod, "copy_rows", spy)
    chunked = mod.repack(view, t)
    assert chunked.tobytes() == whole.tobytes()
    parts = [-c for c in calls if c < 0]
    assert sum(parts) == N and len(parts) == -(-N // chunk_rows), parts  # it did go in chunks
    assert np.array_equal(view, raw)  # dropped pages read back from the file


def test_small_or_unmapped_weights_are_one_call() -> None:
    A = np.arange(16 * 18, dtype=np.uint8).reshape(16, 18) % 7
    seen: list[tuple[int, int]] = []
    repack.copy_rows(A, 144, lambda a, r: seen.append((a.shape[0], r.shape[0])))
    assert seen == [(16, 2)]


def test_small_copies_share_a_huge_page_arena() -> None:
    """Copies up to ARENA_MAX come from one 2 MiB-aligned chunk (huge pages need an aligned 2 MiB of one
    mapping), 64-byte aligned and disjoint; larger ones get their own mapping, 2 MiB-aligned too; a chunk
    is freed once no copy in it is left."""
    import gc
    import weakref

    gc.collect()
    repack._arena[:] = [None, 0, 0]
    sizes = [1000, 70_000, 3, 202_752, 1 << 20]
    parts = [repack.anonymous(n) for n in sizes]
    first = parts[0].ctypes.data
    assert first % (2 << 20) == 0
    spans = sorted((p.ctypes.data, p.ctypes.data + p.size) for p in parts)
    assert all(a % 64 == 0 for a, _ in spans)
    assert all(e <= s for (_, e), (s, _) in zip(spans, spans[1:], strict=False))  # disjoint
    assert spans[-1][1] - first <= repack.ARENA_CHUNK  # one chunk
    for i, p in enumerate(parts):
        p[:] = i + 1
    assert [int(p[0]) for p in parts] == [1, 2, 3, 4, 5] and [int(p[-1]) for p in parts] == [1, 2, 3, 4, 5]
    big = repack.anonymous(repack.ARENA_MAX + 1)
    assert not (first <= big.ctypes.data < first + repack.ARENA_CHUNK)
    assert big.ctypes.data % (2 << 20) == 0  # its own mapping, starting on a huge page too
    full = [repack.anonymous(repack.ARENA_MAX) for _ in range(repack.ARENA_CHUNK // repack.ARENA_MAX + 1)]
    assert full[-1].ctypes.data % (2 << 20) == 0  # the first chunk full: a new one
    chunk = repack._arena[0]
    assert chunk is not None and chunk() is not None
    ref = weakref.ref(chunk())
    del parts, full, big, chunk
    gc.collect()
    assert ref() is None


def test_a_decode_step_says_what_weight_it_reads() -> None:
    """The one-row step of an 8-row kernel carries ``weight`` (``repack.X8Weight``: name, type, shape,
    repacked bytes, kernel; ``benchmarks/decode_steps.py`` reads it); the several-rows steps do not."""
    from llamapy.ggml import ops
    from llamapy.ggml.cpu import q40_x8
    from llamapy.ggml.cpu.backend import CPUBackend
    from llamapy.ggml.quants import quantize

    rng = np.random.default_rng(0)
    raw = quantize(rng.standard_normal((16, 512)).astype(np.float32), GGMLType.Q4_0).reshape(16, -1)
    a = ops.weight("blk.3.attn_q.weight", GGMLType.Q4_0, (16, 512), raw)
    be = CPUBackend(n_threads=1)
    steps = []
    for m in (1, 4):
        x = rng.standard_normal((m, 512)).astype(np.float32)
        out = np.zeros((m, 16), np.float32)
        steps.append(q40_x8.mul_mat_step(be, a, raw, x, out, None, any_memory=True))
    w = steps[0].weight
    assert isinstance(w, repack.X8Weight)
    assert w == ("blk.3.attn_q.weight", "Q4_0", 16, 512, raw.nbytes, "mm_q4_0_x8")
    assert not hasattr(steps[1], "weight")
