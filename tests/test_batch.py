"""Batch validation (messages say what and where), filling of missing fields, ubatch splits."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llamapy.batch import Batch, BatchError, allocate


def alloc(batch, cache_max=None, n_batch=64, n_seq_max=4, **kw):
    cache_max = cache_max or {}
    return allocate(batch, 100, 8, n_seq_max, n_batch, lambda s: cache_max.get(s, -1), **kw)


def test_from_tokens_defaults():
    b = Batch.from_tokens([1, 2, 3])
    ab = alloc(b, {0: 9})
    assert ab.pos.tolist() == [10, 11, 12] and ab.output.tolist() == [False, False, True]
    assert ab.out_rows.tolist() == [-1, -1, 0]
    ab = alloc(Batch.from_tokens([1, 2], pos0=0, logits_all=True))
    assert ab.pos.tolist() == [0, 1] and ab.n_outputs == 2
    assert alloc(Batch(token=np.array([4, 5]))).seq_id == [[0], [0]]


def test_positions_fill_per_sequence():
    b = Batch(token=np.array([1, 2, 3, 4]), seq_id=[[0], [1], [0], [0, 2]])
    ab = alloc(b, {0: 4, 1: -1, 2: 9})
    assert ab.pos.tolist() == [5, 0, 6, 7]


@pytest.mark.parametrize(
    "batch, kw, msg",
    [
        (Batch(token=np.array([], np.int32)), {}, "empty"),
        (Batch.from_tokens([1, 100]), {}, r"batch.token\[1\] = 100 is not a valid token id"),
        (Batch.from_tokens([1, -1]), {}, r"batch.token\[1\] = -1"),
        (Batch.from_tokens([1] * 65), {}, "more than n_batch = 64"),
        (Batch.from_tokens([1], seq_id=4), {}, r"seq_id\[0\] holds 4, not in 0..3"),
        (Batch(token=np.array([1]), seq_id=[[]]), {}, "empty: every token needs"),
        (Batch(token=np.array([1, 2]), seq_id=[[0]]), {}, "1 entries for 2 tokens"),
        (Batch.from_tokens([1, 2], pos0=3), {"cache_max": {0: 5}}, "expected 6"),
        (Batch(token=np.array([1, 2]), pos=np.array([0, 2])), {}, "not consecutive"),
        (Batch(token=np.array([1]), pos=np.array([-2])), {}, "negative"),
        (Batch(token=np.array([1]), logits=[True, False]), {}, "2 flags for 1 tokens"),
        (Batch(embd=np.zeros((2, 5))), {}, r"must be \[n_tokens, 8\]"),
        (Batch(embd=np.full((1, 8), np.nan)), {}, "NaN"),
    ],
)
def test_invalid_batches(batch, kw, msg):
    with pytest.raises(BatchError, match=msg):
        alloc(batch, **kw)


def test_add_builds_multi_sequence_batch():
    b = Batch()
    b.add(5, 0, [0], False)
    b.add(6, 0, [1, 2], True)
    ab = alloc(b)
    assert ab.seq_bits.tolist() == [1, 6] and ab.output.tolist() == [False, True]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=40), st.integers(1, 9))
def test_splits_cover_every_token_once(seqs, n_ubatch):
    b = Batch(token=np.arange(len(seqs)) % 100, seq_id=[[s] for s in seqs])
    ab = alloc(b)
    for split in (ab.split_simple, ab.split_seq, ab.split_equal):
        ubs = split(n_ubatch)
        idx = np.concatenate([u.idx for u in ubs])
        assert sorted(idx.tolist()) == list(range(len(seqs)))
        assert all(0 < u.n_tokens <= n_ubatch for u in ubs)
        for u in ubs:  # order within a sequence is kept
            for s in set(u.seq_first.tolist()):
                assert np.all(np.diff(u.pos[u.seq_first == s]) > 0)
    for u in ab.split_seq(n_ubatch):
        assert len(set(u.seq_bits.tolist())) == 1
    for u in ab.split_equal(n_ubatch):
        counts = [int((u.seq_bits == b).sum()) for b in set(u.seq_bits.tolist())]
        assert len(set(counts)) == 1


def test_mpos_carried_into_ubatches():
    mpos = np.array([[5, 5, 5, 0], [6, 6, 6, 0], [6, 7, 8, 0], [6, 7, 9, 0], [9, 9, 9, 0]], np.int32)
    ab = alloc(Batch(token=np.arange(5), mpos=mpos), {0: 4}, n_pos_per_embd=4)
    assert ab.pos.tolist() == [5, 6, 6, 6, 9]  # t is the memory's position; it may repeat and jump
    for split in (ab.split_simple, ab.split_equal):
        ubs = split(2)
        assert np.array_equal(
            np.concatenate([u.mpos for u in ubs]), mpos[np.concatenate([u.idx for u in ubs])]
        )
    assert alloc(Batch.from_tokens([1, 2]), n_pos_per_embd=4).mpos is None
    b = Batch.from_embd(np.zeros((2, 8)), pos0=7, mpos=mpos[:2])
    assert alloc(b, n_pos_per_embd=4).pos.tolist() == [5, 6]
    # embeddings may start at the memory's last position (llama.cpp: X <= Y), text only after it
    assert alloc(Batch(embd=np.zeros((1, 8)), mpos=mpos[:1]), {0: 5}, n_pos_per_embd=4).pos.tolist() == [5]


@pytest.mark.parametrize(
    "mpos, kw, msg",
    [
        (np.zeros((2, 3), np.int32), {}, r"batch.mpos must be int32\[2, 4\]"),
        (np.zeros((2, 4), np.float32), {}, r"batch.mpos must be int32\[2, 4\]"),
        (np.array([[0, 0, 0, 0], [1, -1, 1, 0]]), {}, r"batch.mpos\[1, 1\] = -1 is negative"),
        (np.array([[4, 4, 4, 0], [5, 5, 5, 0]]), {"cache_max": {0: 4}}, "must start after it"),
        (np.zeros((2, 4), np.int32), {"n_pos_per_embd": 1}, "one position per token"),
    ],
)
def test_invalid_mpos(mpos, kw, msg):
    kw.setdefault("n_pos_per_embd", 4)
    with pytest.raises(BatchError, match=msg):
        alloc(Batch(token=np.array([1, 2]), mpos=mpos), **kw)


def _fields(ab):
    return (
        None if ab.token is None else (ab.token.dtype.str, ab.token.tolist()),
        ab.embd,
        (ab.pos.dtype.str, ab.pos.tolist()),
        ab.seq_id,
        (ab.seq_first.dtype.str, ab.seq_first.tolist()),
        (ab.seq_bits.dtype.str, ab.seq_bits.tolist()),
        (ab.output.dtype.str, ab.output.tolist()),
        (ab.out_rows.dtype.str, ab.out_rows.tolist()),
        ab.mpos,
    )


def _one_or_error(batch, cache_max, **kw):
    try:
        return _fields(alloc(batch, cache_max, **kw))
    except BatchError as e:
        return ("error", str(e))


@pytest.mark.parametrize(
    "batch, cache_max, kw",
    [
        (Batch.from_tokens([7]), {0: 4}, {}),
        (Batch.from_tokens([7], pos0=5), {0: 4}, {}),
        (Batch.from_tokens([7], pos0=0), {}, {"output_all": True}),
        (Batch.from_tokens([7], pos0=3), {0: 4}, {}),  # does not continue the sequence
        (Batch.from_tokens([7], pos0=-1), {}, {}),
        (Batch.from_tokens([100]), {}, {}),
        (Batch.from_tokens([-2]), {}, {}),
        (Batch(token=np.array([3], np.uint16), pos=np.array([2], np.int64), seq_id=[[2, 0]], logits=[False]),
         {0: 1, 2: 1}, {}),
        (Batch(token=np.array([3]), seq_id=[[1, 3]]), {1: 6, 3: 2}, {}),
        (Batch(token=np.array([3]), seq_id=[np.int64(2)], logits=np.array([True])), {}, {}),
        (Batch(token=np.array([3]), seq_id=[[4]]), {}, {}),
        (Batch(token=np.array([3]), seq_id=[[]]), {}, {}),
        (Batch(token=np.array([3]), seq_id=[[0], [0]]), {}, {}),
        (Batch(token=np.array([3]), logits=[True, False]), {}, {}),
        (Batch(token=np.array([3.0])), {}, {}),
        (Batch(token=np.array([3]), pos=np.array([1.0])), {}, {}),
        (Batch(token=np.array([3]), pos=[2]), {0: 1}, {}),
    ],
)  # fmt: skip
def test_one_token_fast_path_matches_general(monkeypatch, batch, cache_max, kw):
    """A decode step's batch takes a short path in ``allocate``: same fields, dtypes and errors."""
    import llamapy.batch as B

    fast = _one_or_error(batch, cache_max, **kw)
    monkeypatch.setattr(B, "_allocate_one_token", lambda *a: None)
    assert fast == _one_or_error(batch, cache_max, **kw)
