"""ALiBi over the KV cache (MPT, Refact), Llama 4's chunked attention, PhiMoE's routing: the cache
masks themselves, and the distinctive feature of each family shown to matter (the oracle misses when it
is switched off) and to hold through the cache paths (f16 cache, token by token, ubatches, seq_rm)."""

from __future__ import annotations

import zlib
from collections.abc import Callable

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from llamapy.batch import Batch  # noqa: E402
from llamapy.context import Context, ContextParams  # noqa: E402
from llamapy.errors import LlamapyError  # noqa: E402
from llamapy.ggml.types import GGMLType  # noqa: E402
from llamapy.memory import KVCache, Memory  # noqa: E402
from llamapy.memory.kv_cache import LayerShape  # noqa: E402
from llamapy.model.model import Model  # noqa: E402
from tests.model import hf_tiny  # noqa: E402
from tests.model.hf_tiny import FAMILIES, TinyModel  # noqa: E402

F32 = GGMLType.F32
MISS = 2e-2  # a switched-off feature must miss HF by at least this (20x the float tolerance)


def _tokens(name: str, n: int = 20) -> list[int]:
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    return [int(t) for t in rng.integers(0, hf_tiny.N_VOCAB, n)]


def _rel(got: np.ndarray, ref: np.ndarray) -> float:
    assert got.shape == ref.shape and np.isfinite(got).all()
    return float(np.abs(got - ref).max() / np.abs(ref).max())


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], TinyModel]:
    cache: dict[str, TinyModel] = {}
    root = tmp_path_factory.mktemp("alibi_chunked")

    def get(name: str) -> TinyModel:
        if name not in cache:
            torch.set_num_threads(1)
            cache[name] = hf_tiny.make_tiny(FAMILIES[name], root, seed=zlib.crc32(name.encode()) % 10_000)
        return cache[name]

    return get


def _ctx(tm: TinyModel, **kw) -> Context:
    kw = dict(n_ctx=256, type_k="f32", type_v="f32") | kw
    return Context(Model.load(tm.write(F32)), ContextParams(**kw))


def _stepwise(ctx: Context, tokens: list[int], n0: int) -> np.ndarray:
    ctx.decode(Batch.from_tokens(tokens[:n0], logits_all=True))
    rows = [ctx.get_logits().copy()]
    for t in tokens[n0:]:
        ctx.decode(Batch.from_tokens([t]))
        rows.append(ctx.get_logits().copy())
    return np.concatenate(rows)


# -- the cache masks ------------------------------------------------------------------------------
def _cache(n_swa: int = 0, swa_type: str = "standard", alibi: bool = False, n: int = 16) -> KVCache:
    return KVCache([LayerShape(0, 32, 32)], n, F32, F32, 1, n_swa, True, "t", swa_type, alibi)


def test_alibi_mask_holds_the_distance() -> None:
    c = _cache(alibi=True)
    pos = np.arange(6)
    c.apply(c.find_slot(pos, np.ones(6, np.uint64)), pos, np.ones(6, np.uint64))
    m = c.mask(np.array([4, 5]), np.zeros(2, np.int64), 8)
    want = np.full((2, 8), -np.inf, np.float32)
    want[0, :5] = -(4 - np.arange(5))
    want[1, :6] = -(5 - np.arange(6))
    np.testing.assert_array_equal(m, want)


def test_chunked_mask_and_cell_reuse() -> None:
    c = _cache(n_swa=4, swa_type="chunked", n=8)
    bits = np.ones(10, np.uint64)
    pos = np.arange(10)
    idx = c.find_slot(pos[:6], bits[:6])
    c.apply(idx, pos[:6], bits[:6])
    m = c.mask(np.array([3, 4, 5]), np.zeros(3, np.int64), 8)
    ok = np.isfinite(m)
    assert ok[0, :4].all() and not ok[0, 4:].any()  # chunk 0: positions 0..3
    assert ok[1].tolist() == [False] * 4 + [True] + [False] * 3  # chunk 1 starts at 4
    assert ok[2].tolist() == [False] * 4 + [True, True] + [False] * 2
    # the next token (6) is in chunk 1: positions 0..3 are free again, 4, 5 are kept
    idx = c.find_slot(pos[6:10], bits[6:10])
    assert set(idx.tolist()).isdisjoint(np.flatnonzero(c.pos >= 4).tolist())
    assert c.window_start(7) == 4 and c.window_start(8) == 8
    assert _cache(n_swa=4).window_start(7) == 4 and _cache(n_swa=4).window_start(2) == -1


def test_bad_window_type_is_refused() -> None:
    with pytest.raises(LlamapyError, match="sliding-window type"):
        _cache(n_swa=4, swa_type="symmetric")


def test_memory_seq_rm_checks_the_chunk_not_the_window() -> None:
    from llamapy.model.hparams import HParams

    hp = HParams(arch="t", n_vocab=8, n_ctx_train=64, n_embd=32, n_layer=2, n_head=[1, 1], n_head_kv=[1, 1],
                 n_ff=[8, 8], n_embd_head_k=32, n_embd_head_v=32, n_rot=32)  # fmt: skip
    hp.n_swa, hp.swa_type, hp.swa_layers = 4, "chunked", [True, False]
    mem = Memory(hp, 64, 8, 1, "f32", "f32")
    swa = next(c for c in mem.caches if c.n_swa)
    assert swa.swa_type == "chunked"
    pos, bits = np.arange(8), np.ones(8, np.uint64)
    for p in range(8):  # one token at a time: cells of past chunks are reused
        mem.place(pos[p : p + 1], bits[:1])
    swa.seq_rm(0, 0, 4)  # what reuse would have dropped: chunk 0
    assert mem.seq_rm(0, 6, -1)  # chunk 1 (4, 5) is there: p0 = 6 can be restored
    assert not mem.seq_rm(0, 3, -1)  # chunk 0 is gone


# -- ALiBi: MPT and Refact ------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["mpt", "refact"])
def test_alibi_is_needed(tiny: Callable[[str], TinyModel], name: str) -> None:
    tm = tiny(name)
    tokens = _tokens(name)
    ref = tm.logits(tokens, F32)
    ctx = _ctx(tm)
    ctx.model.impl.hp.f_max_alibi_bias = 0.0  # the graph then scales the -|i - j| mask by 1 on every head
    ctx.decode(Batch.from_tokens(tokens, logits_all=True))
    assert _rel(ctx.get_logits(), ref) > MISS


@pytest.mark.parametrize("flash_attn", [True, False], ids=["flash", "unfused"])
@pytest.mark.parametrize("name", ["mpt", "refact"])
def test_alibi_over_an_f16_cache_token_by_token(
    tiny: Callable[[str], TinyModel], name: str, flash_attn: bool
) -> None:
    tm = tiny(name)
    tokens = _tokens(name)
    got = _stepwise(_ctx(tm, type_k="f16", type_v="f16", flash_attn=flash_attn), tokens, 3)
    assert _rel(got, tm.logits(tokens, F32)) < 5e-3


def test_alibi_two_sequences_and_seq_rm(tiny: Callable[[str], TinyModel]) -> None:
    tm = tiny("refact")
    a, b = _tokens("refact/a", 15), _tokens("refact/b", 9)
    ctx = _ctx(tm, n_seq_max=2)
    batch = Batch()
    for i, t in enumerate(a):
        batch.add(t, i + 30, [0], True)  # positions from 30: ALiBi is relative, HF starts at 0
    for i, t in enumerate(b):
        batch.add(t, i, [1], True)
    ctx.decode(batch)
    got = ctx.get_logits()
    assert _rel(got[: len(a)], tm.logits(a, F32)) < 1e-3
    assert _rel(got[len(a) :], tm.logits(b, F32)) < 1e-3
    assert ctx.memory.seq_rm(1, 5, -1)
    other = _tokens("refact/c", 4)
    ctx.decode(Batch.from_tokens(other, pos0=5, seq_id=1, logits_all=True))
    assert _rel(ctx.get_logits(), tm.logits(b[:5] + other, F32)[5:]) < 1e-3


# -- Llama 4's chunked attention ------------------------------------------------------------------
def test_llama4_chunks_matter_and_hold_through_the_cache(tiny: Callable[[str], TinyModel]) -> None:
    tm = tiny("llama4")
    cfg = tm.hf.config
    assert cfg.attention_chunk_size < 20 // 2  # the prompt spans more than two chunks
    tokens = _tokens("llama4")
    ref = tm.logits(tokens, F32)
    chunk = cfg.attention_chunk_size
    cfg.attention_chunk_size = 10_000  # HF without chunks differs: the chunks are exercised
    try:
        unchunked = tm.logits(tokens, F32)
    finally:
        cfg.attention_chunk_size = chunk
    assert _rel(unchunked, ref) > MISS
    one = _ctx(tm)
    one.decode(Batch.from_tokens(tokens, logits_all=True))
    assert _rel(one.get_logits(), ref) < 1e-3
    assert _rel(_stepwise(_ctx(tm, type_k="f16", type_v="f16"), tokens, 5), ref) < 5e-3
    ub = _ctx(tm, n_ubatch=3, flash_attn=False)
    ub.decode(Batch.from_tokens(tokens, logits_all=True))
    assert _rel(ub.get_logits(), ref) < 1e-3
    # drop the tail inside the third chunk and continue differently
    assert one.memory.seq_rm(0, 18, -1)
    other = _tokens("llama4/other", 5)
    one.decode(Batch.from_tokens(other, pos0=18, logits_all=True))
    assert _rel(one.get_logits(), tm.logits(tokens[:18] + other, F32)[18:]) < 1e-3


# -- PhiMoE's routing -----------------------------------------------------------------------------
def test_phimoe_routing_is_llamacpps_not_sparsemixer(tiny: Callable[[str], TinyModel]) -> None:
    """The family module patches HF's router to llama.cpp's softmax-top-k-renormalized routing; HF's own
    sparsemixer routing gives other logits, so the patch is what the oracle checks."""
    import transformers

    tm = tiny("phimoe")
    tokens = _tokens("phimoe")
    ctx = _ctx(tm)
    ctx.decode(Batch.from_tokens(tokens, logits_all=True))
    got = ctx.get_logits()
    assert _rel(got, tm.logits(tokens, F32)) < 1e-3
    plain = transformers.PhimoeForCausalLM(tm.hf.config).eval()
    hf_tiny.load_state_dict(plain, hf_tiny.effective_state_dict(tm.state, F32))
    assert _rel(got, hf_tiny.hf_logits(plain, tokens)) > MISS
