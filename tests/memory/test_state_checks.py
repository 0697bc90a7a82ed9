"""Saved KV / recurrent state is checked before it is used (issue 33 §2.10): positions a decode could not
have left are refused, and with ``n_pos`` (a server slot file's token count) the cells must be the
positions ``0..n_pos-1``; a refused state changes nothing."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from llamapy.ggml.types import GGMLType
from llamapy.memory import KVCache, StateError
from llamapy.memory.kv_cache import MAX_POS, LayerShape
from llamapy.memory.recurrent import RecurrentCache, RecurrentLayer

HDR = struct.calcsize("<4sIIII")


def cache(n: int = 16, n_seq: int = 2, n_swa: int = 0) -> KVCache:
    t = GGMLType.F32
    return KVCache([LayerShape(0, 32, 32), LayerShape(1, 32, 32)], n, t, t, n_seq, n_swa)


def put(c: KVCache, seq: int, positions) -> None:
    pos = np.asarray(positions, dtype=np.int64)
    bits = np.full(len(pos), 1 << seq, dtype=np.uint64)
    c.apply(c.find_slot(pos, bits), pos, bits)


def with_positions(state: bytes, positions) -> bytes:
    n = struct.unpack_from("<I", state, 4)[0]
    assert len(positions) == n
    return state[:HDR] + np.asarray(positions, "<i8").tobytes() + state[HDR + 8 * n :]


def saved(n: int, n_swa: int = 0) -> bytes:
    c = cache(n_swa=n_swa)
    put(c, 0, range(n))
    return c.state_write(0)


def test_a_good_state_restores_with_its_token_count():
    s = saved(6)
    c = cache()
    assert c.state_read(s, 1, 0, n_pos=6) == len(s)
    assert (c.seq_pos_min(1), c.seq_pos_max(1), c.used()) == (0, 5, 6)
    assert cache().state_read(saved(0), 0, 0, n_pos=0) == len(saved(0))


@pytest.mark.parametrize(
    "positions, n_pos, why",
    [
        ([0, 0, 0, 0, 0, 0], None, "share a position"),
        ([0, 1, 2, 3, 4, 1 << 62], None, "outside"),
        ([-1, 1, 2, 3, 4, 5], None, "outside"),
        ([0, 1, 2, 3, 4, MAX_POS], None, "outside"),
        ([0, 1, 2, 3, 4, 5], 3, "6 cells up to position 5 for a sequence of 3 tokens"),
        ([0, 1, 2, 3, 4, 6], 6, "up to position 6"),
        ([0, 1, 2, 3, 4, 5], 7, "6 cells for a sequence of 7 tokens"),
    ],
)
def test_bad_cells_are_refused_and_nothing_changes(positions, n_pos, why):
    c = cache()
    put(c, 0, range(4))
    before = c.snapshot()
    with pytest.raises(StateError, match=why):
        c.state_read(with_positions(saved(6), positions), 0, 0, n_pos=n_pos)
    for a, b in zip(before[:3], c.snapshot()[:3], strict=True):
        np.testing.assert_array_equal(a, b)


def test_more_cells_than_the_cache_or_the_bytes_hold():
    s = saved(6)
    forged = s[:4] + struct.pack("<I", 1 << 31) + s[8:]
    with pytest.raises(StateError, match="this cache has 16"):
        cache().state_read(forged, 0)
    forged = s[:4] + struct.pack("<I", 10) + s[8:]
    with pytest.raises(StateError, match="truncated"):
        cache().state_read(forged, 0)
    assert cache().state_nbytes(6) == len(s)


def test_all_sequence_state_checks_sequence_sets():
    c = cache(n_seq=2)
    put(c, 0, range(3))
    put(c, 1, range(2))
    s = c.state_write(-1)
    n = 5
    bits_at = HDR + 8 * n
    forged = s[:bits_at] + np.full(n, 1 << 5, "<u8").tobytes() + s[bits_at + 8 * n :]
    with pytest.raises(StateError, match="outside 0..1"):
        cache(n_seq=2).state_read(forged, -1)
    assert cache(n_seq=2).state_read(s, -1) == len(s)


def test_a_sliding_window_may_hold_fewer_cells():
    c = cache(n_swa=4)
    put(c, 0, range(4))
    put(c, 0, range(4, 8))  # the first cells left the window: reused
    s = c.state_write(0)
    assert struct.unpack_from("<I", s, 4)[0] <= 8
    assert cache(n_swa=4).state_read(s, 0, 0, n_pos=8) == len(s)
    with pytest.raises(StateError, match="for a sequence of 5 tokens"):
        cache(n_swa=4).state_read(s, 0, 0, n_pos=5)


def test_recurrent_state_must_end_at_the_last_token():
    rc = RecurrentCache([RecurrentLayer(0, 6, 4)], 2)
    rc.pos_min[0], rc.pos_max[0] = 0, 9
    s = rc.state_write(0)
    assert RecurrentCache([RecurrentLayer(0, 6, 4)], 2).state_read(s, 1, 0, n_pos=10) == len(s)
    for n_pos, why in ((9, "ends at position 9"), (0, "1 sequences for a sequence of 0 tokens")):
        with pytest.raises(StateError, match=why):
            RecurrentCache([RecurrentLayer(0, 6, 4)], 2).state_read(s, 1, 0, n_pos=n_pos)
    rc.pos_min[0], rc.pos_max[0] = 5, 1 << 62
    with pytest.raises(StateError, match="spans positions"):
        RecurrentCache([RecurrentLayer(0, 6, 4)], 2).state_read(rc.state_write(0), 0)
    assert rc.state_nbytes(1) == len(s)
