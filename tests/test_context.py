"""Context decode on a tiny random llama: incremental KV, multi-sequence batches, cache operations,
state, graph reuse, errors. (Real-model reference checks are in tests/model/test_reference.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from llamapy.batch import Batch, BatchError
from llamapy.context import Context, ContextFullError, ContextParams, StateError
from llamapy.errors import LlamapyError
from llamapy.model import Model
from tests.model.tiny import tiny_llama

TOKS = [5, 17, 3, 42, 8, 21, 33, 1, 60, 7]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Model:
    return Model.load(tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny.gguf", seed=1))


def ctx_of(model: Model, **kw) -> Context:
    kw.setdefault("n_ctx", 256)
    kw.setdefault("type_k", "f32")
    kw.setdefault("type_v", "f32")
    return Context(model, ContextParams(**kw))


def full_logits(model: Model, tokens, **kw) -> np.ndarray:
    c = ctx_of(model, **kw)
    c.decode(Batch.from_tokens(tokens, logits_all=True))
    return c.get_logits().copy()


def test_incremental_decode_matches_one_batch(tiny):
    ref = full_logits(tiny, TOKS)
    c = ctx_of(tiny)
    c.decode(Batch.from_tokens(TOKS[:4], logits_all=True))
    rows = [c.get_logits()]
    for t in TOKS[4:]:
        c.decode(Batch.from_tokens([t]))
        rows.append(c.get_logits_ith(-1)[None])
    np.testing.assert_allclose(np.concatenate(rows), ref, rtol=1e-4, atol=1e-4)
    assert c.memory.seq_pos_max(0) == len(TOKS) - 1
    # single-token steps reuse one graph (n_kv padded to 256)
    assert c.n_graph_builds <= 3 and c.n_graph_reuses >= len(TOKS) - 6


def test_small_ubatches_match(tiny):
    ref = full_logits(tiny, TOKS)
    got = full_logits(tiny, TOKS, n_ubatch=3, n_batch=16)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_two_sequences_in_one_batch(tiny):
    a, b = TOKS[:6], TOKS[3:]
    ra, rb = full_logits(tiny, a), full_logits(tiny, b)
    c = ctx_of(tiny, n_seq_max=2)
    batch = Batch()
    # interleave the two sequences
    for i in range(max(len(a), len(b))):
        if i < len(a):
            batch.add(a[i], i, [0], True)
        if i < len(b):
            batch.add(b[i], i, [1], True)
    c.decode(batch)
    la = np.stack([c.get_logits_ith(j) for j, s in enumerate(batch.seq_id) if s == [0]])
    lb = np.stack([c.get_logits_ith(j) for j, s in enumerate(batch.seq_id) if s == [1]])
    np.testing.assert_allclose(la, ra, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(lb, rb, rtol=1e-4, atol=1e-4)


def test_seq_cp_shares_prefix_and_seq_rm_rewinds(tiny):
    ref = full_logits(tiny, TOKS)
    c = ctx_of(tiny, n_seq_max=2)
    c.decode(Batch.from_tokens(TOKS[:5]))
    c.memory.seq_cp(0, 1)
    c.decode(Batch.from_tokens(TOKS[5:], seq_id=1, logits_all=True))
    np.testing.assert_allclose(c.get_logits(), ref[5:], rtol=1e-4, atol=1e-4)
    # rewind sequence 0 to 3 tokens and continue differently
    assert c.memory.seq_rm(0, 3, -1)
    assert c.memory.seq_pos_max(0) == 2 and c.memory.seq_pos_max(1) == len(TOKS) - 1
    c.decode(Batch.from_tokens(TOKS[3:], seq_id=0, logits_all=True))
    np.testing.assert_allclose(c.get_logits(), ref[3:], rtol=1e-4, atol=1e-4)
    c.memory.seq_keep(1)
    assert c.memory.seq_pos_max(0) == -1 and c.memory.seq_pos_min(1) == 0


def test_seq_add_shift_rerotates_k(tiny, tmp_path):
    # moving every cached position by +5 must equal decoding at positions 5.. from the start
    fresh = ctx_of(tiny)
    fresh.decode(Batch.from_tokens(TOKS, pos0=5))
    c = ctx_of(tiny)
    c.decode(Batch.from_tokens(TOKS[:-1]))
    c.memory.seq_add(0, 0, -1, 5)
    assert c.memory.seq_pos_min(0) == 5
    c.decode(Batch.from_tokens(TOKS[-1:]))
    np.testing.assert_allclose(c.get_logits_ith(-1), fresh.get_logits_ith(-1), rtol=1e-4, atol=1e-4)
    # dropping the first tokens and shifting the rest down is exact for a one-layer model
    one = Model.load(tiny_llama(tmp_path / "one.gguf", seed=2, n_layer=1))
    ref = full_logits(one, TOKS[3:])
    c = ctx_of(one)
    c.decode(Batch.from_tokens(TOKS[:-1]))
    c.memory.seq_rm(0, 0, 3)
    c.memory.seq_add(0, 3, -1, -3)
    assert c.memory.seq_pos_min(0) == 0 and c.memory.seq_pos_max(0) == len(TOKS) - 5
    c.decode(Batch.from_tokens(TOKS[-1:]))
    np.testing.assert_allclose(c.get_logits_ith(-1), ref[-1], rtol=1e-4, atol=1e-4)
    # seq_div halves positions (as self-extend does)
    c.memory.seq_div(0, 0, -1, 2)
    assert c.memory.seq_pos_max(0) == (len(TOKS) - 4) // 2


def test_state_roundtrip(tiny, tmp_path):
    ref = full_logits(tiny, TOKS)
    c = ctx_of(tiny, n_seq_max=2, type_k="q8_0", type_v="f16")
    c.decode(Batch.from_tokens(TOKS[:6]))
    data = c.state_seq_get_data(0)
    path = tmp_path / "seq.bin"
    c.state_seq_save_file(path, 0, TOKS[:6])
    c2 = ctx_of(tiny, n_seq_max=2, type_k="q8_0", type_v="f16")
    c2.state_seq_set_data(data, 1)
    assert c2.memory.seq_pos_max(1) == 5 and c2.memory.seq_pos_max(0) == -1
    c2.decode(Batch.from_tokens(TOKS[6:], seq_id=1, logits_all=True))
    np.testing.assert_allclose(c2.get_logits(), ref[6:], rtol=0.05, atol=0.05)
    c3 = ctx_of(tiny, n_seq_max=2, type_k="q8_0", type_v="f16")
    assert c3.state_seq_load_file(path, 0) == TOKS[:6]
    c3.decode(Batch.from_tokens(TOKS[6:], logits_all=True))
    np.testing.assert_allclose(c3.get_logits(), c2.get_logits(), rtol=1e-5, atol=1e-5)
    with pytest.raises(StateError):
        ctx_of(tiny).state_seq_set_data(data, 0)  # f32 cache: other K/V types
    with pytest.raises(StateError):
        c3.state_seq_set_data(data[:-10], 0)


@pytest.mark.parametrize("tk", ["f16", "q8_0", "q4_0"])
def test_quantized_kv_close(tiny, tk):
    ref = full_logits(tiny, TOKS)
    got = full_logits(tiny, TOKS, type_k=tk, type_v=tk)
    tol = {"f16": 0.01, "q8_0": 0.05, "q4_0": 0.3}[tk]
    assert np.abs(got - ref).max() < tol * max(1.0, np.abs(ref).max())
    assert (got.argmax(-1) == ref.argmax(-1)).mean() >= 0.8


def test_context_full_leaves_cache_unchanged(tiny):
    c = ctx_of(tiny, n_ctx=256, n_batch=512)
    c.decode(Batch.from_tokens(list(range(60)) * 4))
    before = c.memory.seq_pos_max(0)
    with pytest.raises(ContextFullError, match="full"):
        c.decode(Batch.from_tokens([1] * 20))
    assert c.memory.seq_pos_max(0) == before == 239


def test_batch_errors(tiny):
    c = ctx_of(tiny)
    with pytest.raises(BatchError, match="not a valid token id"):
        c.decode(Batch.from_tokens([1, 64]))
    with pytest.raises(BatchError, match="n_seq_max"):
        c.decode(Batch.from_tokens([1], seq_id=1))
    c.decode(Batch.from_tokens([1, 2]))
    with pytest.raises(BatchError, match="continue"):
        c.decode(Batch.from_tokens([3], pos0=5))
    with pytest.raises(LlamapyError, match="no output"):
        c.get_logits_ith(0)
    assert c.get_logits_ith(1).shape == (64,)
    with pytest.raises(LlamapyError):
        Context(tiny, ContextParams(type_k="q5_1"))


def test_embeddings_mean_pooling(tiny):
    c = ctx_of(tiny, embeddings=True, pooling_type="mean", n_seq_max=2)
    batch = Batch.from_tokens(TOKS[:4])
    c.decode(batch)
    e = c.get_embeddings()
    assert e.shape == (4, tiny.n_embd)
    np.testing.assert_allclose(c.get_embeddings_seq(0), e.mean(axis=0), rtol=1e-5, atol=1e-6)
    c2 = ctx_of(tiny, embeddings=True, pooling_type="last")
    c2.decode(Batch.from_tokens(TOKS[:4]))
    np.testing.assert_allclose(c2.get_embeddings_seq(0), e[-1], rtol=1e-4, atol=1e-5)


def test_timings(tiny):
    c = ctx_of(tiny)
    c.decode(Batch.from_tokens(TOKS[:5]))
    c.decode(Batch.from_tokens([1]))
    t = c.timings()
    assert t["n_p_eval"] == 5 and t["n_eval"] == 1 and t["prompt_tps"] > 0 and t["gen_tps"] > 0


def test_sliding_window_cache_reuses_cells(tmp_path):
    from tests.model.tiny import llama_config, random_llama_weights, write_gguf

    cfg = llama_config(n_layer=3)
    w = random_llama_weights(cfg, seed=4)
    rng = np.random.default_rng(4)
    for il in range(3):
        for n in ("post_attention_norm", "post_ffw_norm"):
            w[f"blk.{il}.{n}.weight"] = 1.0 + 0.1 * rng.standard_normal(64).astype(np.float32)
        for n in ("attn_q_norm", "attn_k_norm"):
            w[f"blk.{il}.{n}.weight"] = 1.0 + 0.1 * rng.standard_normal(32).astype(np.float32)
    meta = {"gemma3.attention.sliding_window": 8, "gemma3.attention.sliding_window_pattern": 3}
    m = Model.load(write_gguf(tmp_path / "g3.gguf", "gemma3", cfg, w, "f32", meta))
    assert [m.hparams.is_swa(il) for il in range(3)] == [True, True, False]
    toks = np.random.default_rng(5).integers(0, 64, 288)
    outs = []
    for swa_full in (False, True):
        c = ctx_of(m, n_ctx=512, n_ubatch=16, n_batch=16, swa_full=swa_full)
        assert c.memory.caches[1].n_cells == (512 if swa_full else 256)
        rows = []
        for i in range(0, len(toks), 16):
            c.decode(Batch.from_tokens(toks[i : i + 16], logits_all=True))
            rows.append(c.get_logits().copy())
        outs.append(np.concatenate(rows))
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kv", ["f32", "f16"])
def test_unfused_attention_matches_flash(tiny, kv):
    ref = full_logits(tiny, TOKS, type_k=kv, type_v=kv)
    c = ctx_of(tiny, type_k=kv, type_v=kv, flash_attn=False)
    c.decode(Batch.from_tokens(TOKS[:6], logits_all=True))
    got = [c.get_logits().copy()]
    c.decode(Batch.from_tokens(TOKS[6:], logits_all=True))
    got.append(c.get_logits())
    np.testing.assert_allclose(np.concatenate(got), ref, rtol=1e-3, atol=1e-3)
    with pytest.raises(LlamapyError, match="needs flash_attn"):
        ctx_of(tiny, type_v="q8_0", flash_attn=False)
