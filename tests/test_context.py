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


# -- M-RoPE positions (Batch.mpos) on a tiny Qwen3.5 (interleaved multi-section rope) ---------------------
@pytest.fixture(scope="module")
def qwen35(tmp_path_factory) -> Model:
    pytest.importorskip("torch")
    from llamapy.ggml.types import GGMLType
    from tests.model import hf_tiny

    tm = hf_tiny.make_tiny(hf_tiny.FAMILIES["qwen35"], tmp_path_factory.mktemp("mrope"), seed=3)
    return Model.load(tm.write(GGMLType.F32))


def _close(a: np.ndarray, b: np.ndarray) -> None:  # (chunked and recurrent delta rule differ by rounding)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-4 * np.abs(b).max())


def _text_mpos(pos: np.ndarray) -> np.ndarray:
    return np.stack([pos, pos, pos, np.zeros_like(pos)], axis=1).astype(np.int32)


def test_mpos_text_equals_plain_positions(qwen35):
    toks = TOKS * 2
    ref = full_logits(qwen35, toks)
    assert qwen35.hparams.rope_sections and ctx_of(qwen35).memory.n_pos_per_embd == 4
    pos = np.arange(len(toks), dtype=np.int32)
    for n_ubatch in (64, 7):  # one ubatch, then split
        c = ctx_of(qwen35, n_ubatch=n_ubatch)
        c.decode(Batch(token=np.array(toks), mpos=_text_mpos(pos), logits=[True] * len(toks)))
        _close(c.get_logits(), ref)
    # embeddings of the same tokens with explicit mpos, in two batches: the same logits
    e = qwen35.impl.w["token_embd.weight"].data.view(np.float32).reshape(-1, qwen35.hparams.n_embd)[toks]
    c = ctx_of(qwen35)
    c.decode(Batch.from_embd(e[:9], mpos=_text_mpos(pos[:9]), logits_all=True))
    first = c.get_logits().copy()
    c.decode(Batch.from_embd(e[9:], mpos=_text_mpos(pos[9:]), logits_all=True))
    _close(np.concatenate([first, c.get_logits()]), ref)


def test_mpos_image_like_positions(qwen35):
    toks = TOKS[:8]
    n = len(toks)
    mpos = _text_mpos(np.full(n, 2, np.int32))  # 8 "patches" at t = 2: a 2 x 4 grid
    mpos[:, 1] += np.arange(n) // 4
    mpos[:, 2] += np.arange(n) % 4
    ref = full_logits(qwen35, toks)

    def run(n_ubatch: int, **kw) -> np.ndarray:
        c = ctx_of(qwen35, n_ubatch=n_ubatch)
        c.decode(Batch.from_tokens([9, 4], pos0=0))
        c.decode(Batch(token=np.array(toks), mpos=mpos, logits=[True] * n, **kw))
        out = c.get_logits().copy()
        c.decode(Batch.from_tokens([11], pos0=int(mpos[:, 1:3].max()) + 1))  # text jumps past the grid
        return np.concatenate([out, c.get_logits()])

    a = run(64)
    assert not np.allclose(a[:n], ref, atol=1e-3)  # distinct h/w rotate differently than text positions
    _close(run(3), a)  # ubatch splits keep the 2-D causal order
    # the patches attend in raster order: the first one sees only itself among them, as its own decode
    c = ctx_of(qwen35)
    c.decode(Batch.from_tokens([9, 4], pos0=0))
    c.decode(Batch(token=np.array(toks[:1]), mpos=mpos[:1]))
    _close(c.get_logits()[0], a[0])


def test_mpos_errors(qwen35, tiny):
    c = ctx_of(qwen35)
    with pytest.raises(BatchError, match=r"batch.mpos must be int32\[2, 4\]"):
        c.decode(Batch(token=np.array([1, 2]), mpos=np.zeros((2, 3), np.int32)))
    with pytest.raises(BatchError, match=r"batch.mpos\[1, 2\] = -1 is negative"):
        c.decode(Batch(token=np.array([1, 2]), mpos=np.array([[0, 0, 0, 0], [1, 1, -1, 0]])))
    with pytest.raises(BatchError, match="differs from batch.mpos"):
        c.decode(Batch(token=np.array([1, 2]), pos=np.array([0, 1]), mpos=_text_mpos(np.array([0, 2]))))
    c.decode(Batch.from_tokens([1, 2], pos0=0))
    with pytest.raises(BatchError, match="must start after"):
        c.decode(Batch(token=np.array([3]), mpos=_text_mpos(np.array([1]))))
    with pytest.raises(BatchError, match="one position per token"):
        ctx_of(tiny).decode(Batch(token=np.array([1]), mpos=_text_mpos(np.array([0]))))


def test_set_causal_attn(tiny):
    ref = full_logits(tiny, TOKS)
    c = ctx_of(tiny)
    c.decode(Batch.from_tokens(TOKS[:4], logits_all=True))
    c.set_causal_attn(False)  # the next batch's tokens see each other both ways (and the cache)
    c.decode(Batch.from_tokens(TOKS[4:8], logits_all=True))
    nc = c.get_logits().copy()
    assert not c.causal_attn and c.n_graph_builds == 2  # (a graph of its own)
    assert np.abs(nc[0] - ref[4]).max() > 1e-3  # the first one saw the later ones
    c.set_causal_attn(True)
    c.memory.seq_rm(0, 4, -1)
    c.decode(Batch.from_tokens(TOKS[4:8], logits_all=True))
    np.testing.assert_allclose(c.get_logits(), ref[4:8], rtol=1e-5, atol=1e-5)
    assert c.n_graph_builds == 2 and c.n_graph_reuses >= 1  # the causal graph again


def test_repack_off_reads_the_file_rows(tmp_path):
    """``ContextParams(repack=False)`` (llama.cpp's ``--no-repack``): no weight gets an 8-row copy, and the
    logits are the plain kernels' (close to the repacked ones; another arithmetic, so not the same bits).
    Turning it on drops the compiled graphs, and the next decode repacks."""
    from llamapy.ggml.cpu import q40_x8
    from llamapy.ggml.types import GGMLType

    m = Model.load(tiny_llama(tmp_path / "q40.gguf", seed=3, ggml_type="q4_0"))
    ws = [t for n, t in m.impl.w.items() if t.type == GGMLType.Q4_0 and n != "token_embd.weight"]
    assert ws
    c = ctx_of(m, repack=False)
    assert c.repack is False and "repack=False" in repr(c.sched.backends[0])
    c.decode(Batch.from_tokens(TOKS[:6], logits_all=True))
    plain = c.get_logits().copy()
    assert not any(w in q40_x8._cache for w in ws)
    builds = c.n_graph_builds
    c.repack = True
    c.decode(Batch.from_tokens([TOKS[6]]))
    assert c.n_graph_builds == builds + 1 and all(w in q40_x8._cache for w in ws)
    repacked = full_logits(m, TOKS[:6], repack=True)
    np.testing.assert_allclose(plain, repacked, rtol=0, atol=2e-3 * np.abs(repacked).max())
    assert not np.array_equal(plain, repacked)
