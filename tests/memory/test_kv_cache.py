"""KV cache bookkeeping: cells, sequence sets, positions, sliding window, masks, state bytes."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llamapy.errors import LlamapyError
from llamapy.ggml.types import GGMLType
from llamapy.memory import ContextFullError, KVCache, Memory, StateError
from llamapy.memory.kv_cache import LayerShape


def cache(n=16, n_seq=4, n_swa=0, t=GGMLType.F32) -> KVCache:
    return KVCache([LayerShape(0, 32, 32), LayerShape(1, 32, 32)], n, t, t, n_seq, n_swa)


def put(c: KVCache, seq: int, positions) -> np.ndarray:
    pos = np.asarray(positions, dtype=np.int64)
    bits = np.full(len(pos), 1 << seq, dtype=np.uint64)
    idx = c.find_slot(pos, bits)
    c.apply(idx, pos, bits)
    return idx


def test_seq_operations():
    c = cache()
    put(c, 0, range(5))
    put(c, 1, range(3))
    assert (c.seq_pos_min(0), c.seq_pos_max(0), c.seq_pos_max(1), c.used()) == (0, 4, 2, 8)
    c.seq_cp(0, 2, 1, 3)  # shares cells, no new ones
    assert c.used() == 8 and (c.seq_pos_min(2), c.seq_pos_max(2)) == (1, 2)
    c.seq_rm(0, 2, -1)
    assert c.seq_pos_max(0) == 1 and c.seq_pos_max(2) == 2  # cell of pos 2 still held by seq 2
    c.seq_add(1, 0, -1, 10)
    assert (c.seq_pos_min(1), c.seq_pos_max(1)) == (10, 12) and c.has_shift
    c.seq_add(1, 11, -1, -12)  # pushed below 0: freed
    assert c.seq_pos_max(1) == 10
    c.seq_div(2, 0, -1, 2)
    assert (c.seq_pos_min(2), c.seq_pos_max(2)) == (0, 1)
    c.seq_keep(2)
    assert c.seq_pos_max(0) == -1 and c.seq_pos_max(1) == -1 and c.used() == 2
    c.seq_rm(-1)
    assert c.used() == 0
    with pytest.raises(LlamapyError, match="seq_id 4 is out of range"):
        c.seq_rm(4)


def test_full_and_padding():
    c = KVCache([LayerShape(0, 32, 32)], 300, GGMLType.F16, GGMLType.F16)
    put(c, 0, range(10))
    assert c.n_kv() == 256
    put(c, 0, range(10, 260))
    assert c.n_kv() == 300
    with pytest.raises(ContextFullError, match="50 tokens need cells, 40 of 300 are free"):
        put(c, 0, range(260, 310))


def test_mask_causal_sequences_and_window():
    c = cache(n_swa=3)
    c.apply(np.arange(4), np.arange(4), np.full(4, 1, np.uint64))
    c.apply(np.arange(4, 6), np.arange(2), np.full(2, 2, np.uint64))
    m = c.mask(np.array([3, 1]), np.array([0, 1]), 8)
    ok = np.isfinite(m)
    # token of seq 0 at pos 3 sees its positions 1..3 (window 3); seq 1 token at pos 1 sees 0..1
    assert ok[0].tolist() == [False, True, True, True, False, False, False, False]
    assert ok[1].tolist() == [False, False, False, False, True, True, False, False]
    assert set(np.unique(m)) <= {0.0, -np.inf}


def test_swa_cache_reuses_cells_out_of_the_window():
    c = cache(n=6, n_seq=1, n_swa=4)
    for p in range(40):  # far more tokens than cells
        put(c, 0, [p])
    assert c.seq_pos_max(0) == 39 and c.seq_pos_min(0) >= 39 - 5
    full = cache(n=6, n_seq=1)
    with pytest.raises(ContextFullError):
        for p in range(7):
            put(full, 0, [p])


def test_state_roundtrip_and_errors():
    c = cache(t=GGMLType.Q8_0)
    rng = np.random.default_rng(0)
    for t in (*c.k.values(), *c.v.values()):
        t.data[:] = rng.integers(0, 255, t.data.size, dtype=np.uint8)
    put(c, 1, range(5))
    data = c.state_write(1)
    d = cache(t=GGMLType.Q8_0)
    put(d, 3, range(2))
    d.state_read(data, 2)
    assert (d.seq_pos_min(2), d.seq_pos_max(2), d.seq_pos_max(3)) == (0, 4, 1)
    src = np.flatnonzero(c.seq != 0)
    dst = np.flatnonzero(d.seq & np.uint64(1 << 2))
    for il in (0, 1):
        a = c._rows(c.k[il])[src[np.argsort(c.pos[src])]]
        b = d._rows(d.k[il])[dst[np.argsort(d.pos[dst])]]
        assert np.array_equal(a, b)
    with pytest.raises(StateError, match="truncated"):
        cache(t=GGMLType.Q8_0).state_read(data[:50], 0)
    with pytest.raises(StateError, match="types"):
        cache(t=GGMLType.F16).state_read(data, 0)


def test_memory_splits_swa_layers():
    hp = SimpleNamespace(n_layer=6, n_swa=8, has_swa=True, causal_attn=True, n_embd_head_k=32, n_embd_head_v=32,
                         n_embd_k_gqa=lambda il: 32, n_embd_v_gqa=lambda il: 32, is_swa=lambda il: il % 3 != 2)  # fmt: skip
    mem = Memory(hp, n_ctx=4096, n_ubatch=64, n_seq_max=2)
    full, swa = mem.caches
    assert [ls.il for ls in full.layers] == [2, 5] and full.n_cells == 4096
    assert [ls.il for ls in swa.layers] == [0, 1, 3, 4] and swa.n_cells == 256  # pad(8 * 2 + 64, 256)
    with pytest.raises(LlamapyError, match="multiple of 32"):
        Memory(SimpleNamespace(**{**hp.__dict__, "n_embd_head_k": 16}), 256, 64, type_k="q4_0")


# a model of the cache: {cell: (pos, set of seqs)} as plain Python, checked against KVCache
ops_st = st.lists(
    st.tuples(
        st.sampled_from(["add_tokens", "rm", "cp", "keep", "shift"]),
        st.integers(0, 2),
        st.integers(0, 2),
        st.integers(0, 8),
        st.integers(-3, 3),
    ),  # fmt: skip
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(ops_st)
def test_against_a_simple_model(ops):
    c = cache(n=64, n_seq=3)
    model: dict[int, tuple[int, set]] = {}
    nxt = [0, 0, 0]
    for op, s, s2, p, d in ops:
        if op == "add_tokens":
            idx = put(c, s, range(nxt[s], nxt[s] + 2))
            for k, i in enumerate(idx):
                model[int(i)] = (nxt[s] + k, {s})
            nxt[s] += 2
        elif op == "rm":
            c.seq_rm(s, p, -1)
            for i, (pp, ss) in list(model.items()):
                if s in ss and pp >= p:
                    ss.discard(s)
                    if not ss:
                        del model[i]
        elif op == "cp":
            c.seq_cp(s, s2, -1, -1)
            for _pp, ss in model.values():
                if s in ss:
                    ss.add(s2)
        elif op == "keep":
            c.seq_keep(s)
            model = {i: (pp, {s}) for i, (pp, ss) in model.items() if s in ss}
        else:
            c.seq_add(s, p, -1, d)
            for i, (pp, ss) in list(model.items()):
                if s in ss and pp >= p:
                    model[i] = (pp + d, ss)
                    if pp + d < 0:
                        del model[i]
        for q in range(3):
            ps = [pp for pp, ss in model.values() if q in ss]
            assert c.seq_pos_max(q) == (max(ps) if ps else -1)
            assert c.seq_pos_min(q) == (min(ps) if ps else -1)
            nxt[q] = max(ps) + 1 if ps else 0
        assert c.used() == len(model)


def test_swa_partial_removal_refused_when_window_is_gone():
    hp = SimpleNamespace(n_layer=2, n_swa=4, has_swa=True, causal_attn=True, n_embd_head_k=32, n_embd_head_v=32,
                         n_embd_k_gqa=lambda il: 32, n_embd_v_gqa=lambda il: 32, is_swa=lambda il: il == 0)  # fmt: skip
    mem = Memory(hp, n_ctx=256, n_ubatch=1, n_seq_max=1)
    for p in range(200):
        mem.place(np.array([p]), np.array([1], np.uint64))
    assert mem.seq_pos_max(0) == 199
    assert mem.seq_rm(0, 199, -1)  # decoding 199 again needs 196..198: still there
    assert mem.seq_pos_max(0) == 198
    assert not mem.seq_rm(0, 20, -1)  # positions 17..19 were dropped by the window: refused, unchanged
    assert mem.seq_pos_max(0) == 198
    assert mem.seq_rm(0, -1, -1) and mem.seq_pos_max(0) == -1


def _hp(n_layer=2, **kw) -> SimpleNamespace:
    base = dict(n_layer=n_layer, has_swa=False, causal_attn=True, n_embd_head_k=32, n_embd_head_v=32,
                n_head_kv=[1] * n_layer, n_embd_k_gqa=lambda il: 32, n_embd_v_gqa=lambda il: 32,
                is_swa=lambda il: False)  # fmt: skip
    return SimpleNamespace(**{**base, **kw})


def test_memory_inputs_fill_themselves():
    """The memory's graph inputs: per cache a mask and the placed cells, read from the placed ubatch."""
    from llamapy.batch import Batch, allocate
    from llamapy.model.blocks import Inputs

    mem = Memory(_hp(), n_ctx=256, n_ubatch=8, n_seq_max=2)
    ab = allocate(Batch(token=np.arange(5), seq_id=[[0], [0], [1], [0], [1]]), 10, 8, 2, 8, mem.seq_pos_max)
    (ub,) = ab.split_simple(8)
    mem.place_ubatch(ub)
    (c,) = mem.caches
    inp = Inputs(5, 5, None)
    (ki,) = mem.build_inputs(inp, causal=None)
    assert inp.kv[0] is ki and inp.kv[1] is ki and mem.graph_key() == (256,)
    assert [t.name for t in ki.tensors()] == ["kq_mask_0", "kv_idx_0"] and ki.mask.shape == (5, 256)
    vals = ki.set_input(ub)
    assert vals[ki.idx].tolist() == [0, 1, 2, 3, 4]
    np.testing.assert_array_equal(vals[ki.mask], c.mask(ub.pos, ub.seq_first, 256))
    assert vals[ki.mask][1, 3] == -np.inf and vals[ki.mask][3, 1] == 0  # causal within sequence 0
    assert vals[ki.mask][2, 0] == -np.inf  # not across sequences
    (nc,) = mem.build_inputs(Inputs(5, 5, None), causal=False)  # llama_set_causal_attn(ctx, false)
    assert nc.set_input(ub)[nc.mask][1, 3] == 0 and nc.set_input(ub)[nc.mask][2, 0] == -np.inf


def test_mrope_cache_orders_one_position_by_rows_then_columns():
    mem = Memory(_hp(rope_sections=(2, 1, 1, 0)), n_ctx=256, n_ubatch=8)
    assert mem.n_pos_per_embd == 4
    (c,) = mem.caches
    mem.place(np.array([0]), np.ones(1, np.uint64))  # text at 0, then a 2 x 2 image at t = 1
    yx = np.array([[1, 1], [1, 2], [2, 1], [2, 2]])
    mpos = np.concatenate([np.ones((4, 1), int), yx, np.zeros((4, 1), int)], axis=1)
    mem.place(np.ones(4, np.int64), np.ones(4, np.uint64), mpos=mpos)
    m = c.mask(np.ones(4, np.int64), np.zeros(4, np.int32), 8, yx)[:, :5]
    assert (m == 0).tolist() == [[True, True, False, False, False], [True, True, True, False, False],
                                 [True, True, True, True, False], [True, True, True, True, True]]  # fmt: skip
    assert (c.mask(np.ones(4, np.int64), np.zeros(4, np.int32), 8, yx, causal=False)[:, :5] == 0).all()
    data = c.state_write(0)  # the (h, w) of the cells travel with the state
    c.clear()
    c.state_read(data, 0)
    np.testing.assert_array_equal(c.mask(np.ones(4, np.int64), np.zeros(4, np.int32), 8, yx)[:, :5], m)
