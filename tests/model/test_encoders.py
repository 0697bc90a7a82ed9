"""Encoders, pooling and rank heads against Hugging Face transformers with the same random weights.

Every family registered with ``kind="encoder"`` (``tests/model/families/``) is checked for F32, F16 and
Q8_0 files: per-token embeddings (pooling none) vs the HF model's last hidden state, and the pooled
output of the file's pooling type vs the HF side: mean pooling as sentence-transformers does it
(mask-weighted mean over a padded batch, then L2 normalization), cls/last rows, or the
classification head's scores (rank). Float files within ``FLOAT_TOL``; the Q8_0 file within
``Q8_MARGIN`` times the deviation that rounding every linear layer's input to Q8_0 causes in the HF
model (the only legitimate difference, as in ``test_hf_oracle``).

Several sequences in one decode (block-diagonal mask over the ubatch) must equal one at a time and
the HF padded batch; sequences split across ubatches likewise; a text longer than the context, a
sequence longer than n_ubatch and rank pooling without a head are typed errors.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from llamapy.batch import Batch, BatchError  # noqa: E402
from llamapy.context import Context, ContextParams  # noqa: E402
from llamapy.errors import LlamapyError  # noqa: E402
from llamapy.ggml.types import GGMLType  # noqa: E402
from llamapy.model.model import Model  # noqa: E402
from tests.model import hf_tiny  # noqa: E402
from tests.model.families.qwen3_embedding import RANK_TOKENS  # noqa: E402
from tests.model.hf_tiny import FAMILIES, TinyModel  # noqa: E402

FLOAT_TOL = 1e-3
Q8_MARGIN = 2.0
FTYPES = [GGMLType.F32, GGMLType.F16, GGMLType.Q8_0]
ENCODERS = [n for n, f in FAMILIES.items() if f.kind == "encoder"]
LENGTHS = (9, 4, 13)  # three texts of different lengths


_torch_threads = pytest.fixture(scope="module", autouse=True)(hf_tiny.one_torch_thread)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], TinyModel]:
    return hf_tiny.family_models(tmp_path_factory.mktemp("encoders"))


def _texts(name: str, lengths: tuple[int, ...] = LENGTHS) -> list[list[int]]:
    """Random token ids (never the padding id, which RoBERTa's positions skip)."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    return [[int(t) for t in rng.integers(2, hf_tiny.N_VOCAB, n)] for n in lengths]


def _rel(got: np.ndarray, ref: np.ndarray) -> float:
    got, ref = np.asarray(got), np.asarray(ref)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    assert np.isfinite(got).all()
    return float(np.abs(got - ref).max() / np.abs(ref).max())


def _l2(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x)


def _pooling(tm: TinyModel) -> int:
    md = hf_tiny.metadata(tm.family, tm.hf.config, GGMLType.F32)
    return int(md[f"{tm.family.arch}.pooling_type"])


def hf_outputs(
    tm: TinyModel, texts: list[list[int]], ftype: GGMLType, q8_activations: bool = False
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per text: HF's last hidden state [T, E], and its pooled vector as llamapy's pooling type
    defines it (mean: sentence-transformers' mask-weighted mean over the padded batch; cls; last;
    rank: the classification head's logits)."""
    hf_tiny.load_state_dict(tm.hf, hf_tiny.effective_state_dict(tm.state, ftype))
    hooks = hf_tiny._round_linear_inputs(tm.hf) if q8_activations else []
    pad = tm.hf.config.pad_token_id or 0
    n = max(len(t) for t in texts)
    ids = torch.tensor([t + [pad] * (n - len(t)) for t in texts])
    mask = torch.tensor([[1] * len(t) + [0] * (n - len(t)) for t in texts])
    try:
        with torch.no_grad():
            base = getattr(tm.hf, tm.hf.base_model_prefix, tm.hf)
            hidden = base(input_ids=ids, attention_mask=mask).last_hidden_state.float()
            pooling = _pooling(tm)
            logits = tm.hf(input_ids=ids, attention_mask=mask).logits.float() if pooling == 4 else None
            post = getattr(tm.hf, "post_pool", None)  # EmbeddingGemma's dense projections
    finally:
        for h in hooks:
            h.remove()
    m = mask[..., None].float()
    if pooling == 1:  # sentence-transformers' Pooling(mean)
        pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
    elif pooling == 2:
        pooled = hidden[:, 0]
    elif pooling == 3:
        pooled = torch.stack([hidden[i, len(t) - 1] for i, t in enumerate(texts)])
    elif logits is not None and logits.ndim == 3:  # a causal LM's yes/no reranker (Qwen3-Reranker)
        last = torch.stack([logits[i, len(t) - 1] for i, t in enumerate(texts)])
        pooled = torch.softmax(last[:, list(RANK_TOKENS)], dim=-1)
    else:
        assert logits is not None
        pooled = logits
    if post is not None:  # after pooling, or on every token without pooling (as llama.cpp)
        with torch.no_grad():
            pooled, hidden = post(pooled), post(hidden)
    hid = [hidden[i, : len(t)].numpy() for i, t in enumerate(texts)]
    return hid, [p.numpy() for p in pooled]


def _ctx(path: Path, **kw: Any) -> Context:
    kw.setdefault("n_seq_max", 4)
    kw.setdefault("embeddings", True)
    return Context(Model.load(path), ContextParams(**kw))


def _decode_many(ctx: Context, texts: list[list[int]]) -> None:
    b = Batch()
    for s, t in enumerate(texts):
        for p, tok in enumerate(t):
            b.add(tok, p, [s], True)
    ctx.decode(b)


def _tolerance(tm: TinyModel, texts: list[list[int]], ftype: GGMLType) -> tuple[float, float]:
    """(per-token, pooled) bounds: FLOAT_TOL for float files, the measured Q8_0 deviation else."""
    if ftype != GGMLType.Q8_0:
        return FLOAT_TOL, FLOAT_TOL
    h, p = hf_outputs(tm, texts, ftype)
    hq, pq = hf_outputs(tm, texts, ftype, q8_activations=True)
    dev_h = max(_rel(a, b) for a, b in zip(hq, h, strict=True))
    dev_p = max(_rel(a, b) for a, b in zip(pq, p, strict=True))
    return max(FLOAT_TOL, Q8_MARGIN * dev_h), max(FLOAT_TOL, Q8_MARGIN * dev_p)


# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ftype", FTYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("name", ENCODERS)
def test_outputs_match_hf(tiny: Callable[[str], TinyModel], name: str, ftype: GGMLType) -> None:
    """One decode of three texts: per-token embeddings (pooling none) and pooled outputs == HF."""
    tm = tiny(name)
    texts = _texts(name)
    ref_h, ref_p = hf_outputs(tm, texts, ftype)
    tol_h, tol_p = _tolerance(tm, texts, ftype)
    path = tm.write(ftype)
    ctx = _ctx(path, pooling_type="none")
    _decode_many(ctx, texts)
    e = ctx.get_embeddings()
    off = 0
    for s, t in enumerate(texts):
        err = _rel(e[off : off + len(t)], ref_h[s])
        assert err < tol_h, f"{name} {ftype.name} seq {s}: per-token rel {err:.2e} >= {tol_h:.1e}"
        off += len(t)
    ctx = _ctx(path)  # the file's pooling type
    assert ctx.pooling_type == _pooling(tm)
    _decode_many(ctx, texts)
    for s in range(len(texts)):
        got = ctx.get_embeddings_seq(s)
        err = _rel(got, ref_p[s])
        assert err < tol_p, f"{name} {ftype.name} seq {s}: pooled rel {err:.2e} >= {tol_p:.1e}"
        if ctx.pooling_type == 1:  # and after sentence-transformers' normalization
            assert _rel(_l2(got), _l2(ref_p[s])) < tol_p
    print(f"{name} {ftype.name}: per-token < {tol_h:.1e}, pooled < {tol_p:.1e}")


@pytest.mark.parametrize("name", ENCODERS)
def test_batch_equals_one_at_a_time(tiny: Callable[[str], TinyModel], name: str) -> None:
    """Several texts in one ubatch (block-diagonal mask), across ubatches, and one per decode agree."""
    tm = tiny(name)
    texts = _texts(name)
    path = tm.write(GGMLType.F32)
    ctx = _ctx(path)
    _decode_many(ctx, texts)
    together = [ctx.get_embeddings_seq(s).copy() for s in range(len(texts))]
    alone = []
    for t in texts:
        ctx.memory.clear()  # (a causal model's KV cache keeps the texts; an encoder has none)
        ctx.decode(Batch.from_tokens(t))
        alone.append(ctx.get_embeddings_seq(0).copy())
    small = _ctx(path, n_ubatch=16, n_batch=64)  # 9 + 4 share a ubatch, 13 goes in the next one
    _decode_many(small, texts)
    split = [small.get_embeddings_seq(s).copy() for s in range(len(texts))]
    for s in range(len(texts)):
        np.testing.assert_allclose(together[s], alone[s], rtol=1e-4, atol=1e-5 * np.abs(alone[s]).max())
        np.testing.assert_allclose(split[s], alone[s], rtol=1e-4, atol=1e-5 * np.abs(alone[s]).max())
    assert small.n_graph_builds == 2
    if ctx.encoder:  # the same sequence id again in the next decode: no cache, positions restart
        ctx.decode(Batch.from_tokens(texts[0]))
        np.testing.assert_allclose(ctx.get_embeddings_seq(0), alone[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["jina-bert-v2", "modern-bert"])
def test_unfused_attention_and_numpy_backend(tiny: Callable[[str], TinyModel], name: str) -> None:
    """The same embeddings with mul_mat + soft_max attention (ALiBi, symmetric windows through the
    soft_max mask) and on the NumPy reference backend."""
    texts = _texts(name)
    path = tiny(name).write(GGMLType.F32)
    outs = []
    for kw in ({}, {"flash_attn": False}, {"backend": "numpy"}):
        ctx = _ctx(path, pooling_type="none", **kw)
        _decode_many(ctx, texts)
        outs.append(ctx.get_embeddings().copy())
    assert _rel(outs[1], outs[0]) < 1e-5 and _rel(outs[2], outs[0]) < 1e-5


@pytest.mark.parametrize("name", ENCODERS[:1])
def test_bad_input(tiny: Callable[[str], TinyModel], name: str) -> None:
    path = tiny(name).write(GGMLType.F32)
    ctx = _ctx(path, n_ctx=32, n_ubatch=16, n_batch=64)
    with pytest.raises(BatchError, match="longer than this encoder's context"):
        ctx.decode(Batch.from_tokens(list(range(2, 40))))
    with pytest.raises(BatchError, match="more than n_ubatch = 16"):
        ctx.decode(Batch.from_tokens(list(range(2, 22))))
    with pytest.raises(BatchError, match="empty"):
        ctx.decode(Batch())
    with pytest.raises(LlamapyError, match="encoder without logits"):
        ctx.get_logits()
    ctx.decode(Batch.from_tokens([5, 6, 7]))  # still usable
    with pytest.raises(LlamapyError, match="no pooled embedding for sequence 1"):
        ctx.get_embeddings_seq(1)
    if "rank" not in name:
        with pytest.raises(LlamapyError, match="rank needs a classification head"):
            _ctx(path, pooling_type="rank")


def _mutate_md(key: str, value: Any) -> Callable[[dict, dict], None]:
    def f(md: dict[str, Any], tensors: dict[str, np.ndarray]) -> None:
        md[key] = value

    return f


def _drop(name: str) -> Callable[[dict, dict], None]:
    def f(md: dict[str, Any], tensors: dict[str, np.ndarray]) -> None:
        del tensors[name]

    return f


def _unshift_positions(md: dict[str, Any], tensors: dict[str, np.ndarray]) -> None:
    p = tensors["position_embd.weight"]
    tensors["position_embd.weight"] = np.ascontiguousarray(np.roll(p, 2, axis=0))


# one convention broken per file: each must miss HF by far more than the tolerance
MUTATIONS = {
    "bert-no-token-type": ("bert", _drop("token_types.weight")),
    "xlmr-position-offset": ("xlmr-rank", _unshift_positions),
    "modern-bert-all-global": ("modern-bert", _mutate_md("modern-bert.attention.sliding_window_pattern", 1)),
    "modern-bert-one-rope-base": ("modern-bert", _mutate_md("modern-bert.rope.freq_base_swa", 160000.0)),
    "gemma-embedding-no-window": (
        "gemma-embedding",
        _mutate_md("gemma-embedding.attention.sliding_window", 64),
    ),
    "nomic-rope-base": ("nomic-bert", _mutate_md("nomic-bert.rope.freq_base", 10000.0)),
    "nomic-moe-one-expert": ("nomic-bert-moe", _mutate_md("nomic-bert-moe.expert_used_count", 1)),
    "jina-fused-halves-swapped": ("jina-bert-v2", None),
}


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_mutation_is_detected(tiny: Callable[[str], TinyModel], tmp_path: Path, mutation: str) -> None:
    name, fn = MUTATIONS[mutation]
    tm = tiny(name)
    texts = _texts(name)
    ref_h, _ = hf_outputs(tm, texts, GGMLType.F32)
    tm.write(GGMLType.F32)
    tensors = dict(tm.tensors[GGMLType.F32])
    md = hf_tiny.metadata(tm.family, tm.hf.config, GGMLType.F32)
    if fn is None:  # [gate | up] read as [up | gate]
        for k in [k for k in tensors if k.endswith("ffn_up.weight")]:
            a, b = np.split(tensors[k], 2)
            tensors[k] = np.ascontiguousarray(np.concatenate([b, a]))
    else:
        fn(md, tensors)
    path = hf_tiny.write_gguf(tmp_path / f"{mutation}.gguf", tm.family.arch, md, tensors, GGMLType.F32)
    ctx = _ctx(path, pooling_type="none")
    _decode_many(ctx, texts)
    e = ctx.get_embeddings()
    off, err = 0, 0.0
    for s, t in enumerate(texts):
        err = max(err, _rel(e[off : off + len(t)], ref_h[s]))
        off += len(t)
    assert err > 20 * FLOAT_TOL, f"{mutation}: the broken file still matches HF (rel {err:.2e})"


def test_wpm_vocab_of_a_bert_file(tiny: Callable[[str], TinyModel], tmp_path: Path) -> None:
    """A bert file with bge's WordPiece vocabulary (from ../shared/vocab): tokenization as llama.cpp
    (its .inp/.out cases), [CLS] ... [SEP] with special tokens, and the tokens run through the model."""
    from llamapy.gguf import GGUFReader
    from llamapy.gguf.writer import GGUFWriter
    from tests.util import shared_path
    from tests.vocab.test_vocab_files import _cases

    src = shared_path("vocab", "ggml-vocab-bert-bge.gguf")
    r = GGUFReader(src)
    n_vocab = len(r.get("tokenizer.ggml.tokens"))
    tm = tiny("bert")
    tm.write(GGMLType.F32)
    tensors = dict(tm.tensors[GGMLType.F32])
    rng = np.random.default_rng(0)
    tensors["token_embd.weight"] = rng.standard_normal((n_vocab, 64)).astype(np.float32) * 0.1
    md = hf_tiny.metadata(tm.family, tm.hf.config, GGMLType.F32)
    md["bert.vocab_size"] = n_vocab
    path = tmp_path / "bert-wpm.gguf"
    w = GGUFWriter(path, arch="bert")
    w.add_metadata(md, int_type=hf_tiny.GGUFValueType.UINT32)
    for k, f in r.fields.items():
        if k.startswith("tokenizer.") and k not in md:
            w.add_key_value_raw(k, f.type, r.raw_value(k))
    for k, a in tensors.items():
        w.add_tensor(k, np.ascontiguousarray(a, dtype=np.float32), ggml_type=GGMLType.F32)
    w.write()
    w.close()
    m = Model.load(path)
    bad = [(t, ids) for t, ids in _cases(src.name) if m.vocab.tokenize(t, add_special=False) != ids]
    assert not bad, f"{len(bad)} WPM mismatches, first {bad[0]!r}"
    ids = m.vocab.tokenize("Hello world, this is a test.", add_special=True)
    assert ids[0] == 101 and ids[-1] == 102 and len(ids) > 4
    ctx = Context(m, ContextParams(n_seq_max=1))
    ctx.decode(Batch.from_tokens(ids))
    e = ctx.get_embeddings_seq(0)
    assert e.shape == (64,) and np.isfinite(e).all()
