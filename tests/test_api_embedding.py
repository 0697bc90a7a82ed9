"""``Llama.embed`` / ``create_embedding`` / ``rerank`` on tiny random-weight models that carry a real
vocabulary (copied from ../shared/vocab), and the pieces they share with the CLI and the server
(normalization as ``common_embd_normalize``, ``format_rerank``, packing inputs into decodes).

``write_tiny_embedder`` is imported by tests/cli/test_embed.py and tests/server/test_embeddings.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llamapy import Llama
from llamapy.api.embedding import (
    EmbeddingError,
    embedding_inputs,
    format_rerank,
    normalize_embedding,
    pack_inputs,
    rerank_results,
)
from llamapy.gguf import GGUFValueType
from llamapy.gguf.reader import GGUFReader
from llamapy.gguf.writer import GGUFWriter
from tests.model.tiny import llama_config, random_llama_weights
from tests.util import shared_path

VOCAB = "ggml-vocab-llama-spm.gguf"  # SPM, 32000 tokens, BOS added


def write_tiny_embedder(
    path: Path,
    arch: str = "llama",
    pooling: int | None = None,
    vocab: str = VOCAB,
    seed: int = 0,
    n_ctx: int = 256,
    extra: dict[str, Any] | None = None,
    rank: bool = False,
) -> Path:
    """A 2-layer decoder (``llama``, or ``qwen3`` with q/k norms) with ``vocab``'s tokenizer copied
    exactly, ``<arch>.pooling_type`` when given (qwen3 + last = Qwen3-Embedding's layout); ``rank``
    adds Qwen3-Reranker's head: ``cls.output.weight`` (yes/no rows) and pooling type rank."""
    src = GGUFReader(shared_path("vocab", vocab))
    n_vocab = len(src.get("tokenizer.ggml.tokens"))
    cfg = llama_config(n_vocab=n_vocab, n_embd=32, n_ff=64, n_head=2, n_head_kv=1, n_ctx=n_ctx)
    w = random_llama_weights(cfg, seed=seed, tied=True)
    hd = cfg["n_embd"] // cfg["n_head"]
    if arch == "qwen3":
        rng = np.random.default_rng(seed + 1)
        for il in range(cfg["n_layer"]):
            w[f"blk.{il}.attn_q_norm.weight"] = (1 + 0.1 * rng.standard_normal(hd)).astype(np.float32)
            w[f"blk.{il}.attn_k_norm.weight"] = (1 + 0.1 * rng.standard_normal(hd)).astype(np.float32)
    if rank:
        w["cls.output.weight"] = (
            np.random.default_rng(seed + 2).standard_normal((2, cfg["n_embd"])).astype(np.float32)
        )
        pooling = 4
        extra = {f"{arch}.classifier.output_labels": ["yes", "no"], **(extra or {})}
    out = GGUFWriter(path, arch=arch)
    u32 = GGUFValueType.UINT32
    meta: dict[str, Any] = {
        f"{arch}.context_length": (cfg["n_ctx"], u32),
        f"{arch}.embedding_length": (cfg["n_embd"], u32),
        f"{arch}.block_count": (cfg["n_layer"], u32),
        f"{arch}.feed_forward_length": (cfg["n_ff"], u32),
        f"{arch}.attention.head_count": (cfg["n_head"], u32),
        f"{arch}.attention.head_count_kv": (cfg["n_head_kv"], u32),
        f"{arch}.rope.freq_base": (10000.0, GGUFValueType.FLOAT32),
        f"{arch}.attention.layer_norm_rms_epsilon": (1e-5, GGUFValueType.FLOAT32),
        f"{arch}.vocab_size": (n_vocab, u32),
    }
    if pooling is not None:
        meta[f"{arch}.pooling_type"] = (pooling, u32)
    for k, (v, t) in meta.items():
        out.add_key_value(k, v, t)
    for k, f in src.fields.items():
        if k.startswith("tokenizer."):
            out.add_key_value_raw(k, f.type, src.raw_value(k))
    for k, v in (extra or {}).items():
        out.add_key_value(k, v)
    for name, arr in w.items():
        out.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))
    out.write()
    out.close()
    src.close()
    return Path(path)


def write_bert(
    path: Path,
    n_layer: int = 2,
    n_embd: int = 32,
    n_head: int = 2,
    n_ff: int = 64,
    n_ctx: int = 128,
    pooling: int = 1,
    rank: bool = False,
    seed: int = 0,
    ggml_type: str = "f32",
) -> Path:
    """A random-weight ``bert`` encoder (llama.cpp's tensor names and keys) with the bge vocabulary
    (WPM, [CLS] ... [SEP]); ``rank`` adds bge-reranker's ``cls`` + ``cls.output`` head (pooling rank).
    BERT-base is ``n_layer=12, n_embd=768, n_head=12, n_ff=3072, n_ctx=512``."""
    from llamapy.ggml.types import GGMLType

    src = GGUFReader(shared_path("vocab", "ggml-vocab-bert-bge.gguf"))
    n_vocab = len(src.get("tokenizer.ggml.tokens"))
    rng = np.random.default_rng(seed)

    def r(*shape: int, s: float = 0.05) -> np.ndarray:
        return (rng.standard_normal(shape) * s).astype(np.float32)

    def ln() -> tuple[np.ndarray, np.ndarray]:
        return 1.0 + r(n_embd, s=0.1), r(n_embd, s=0.1)

    w: dict[str, np.ndarray] = {
        "token_embd.weight": r(n_vocab, n_embd, s=0.5),
        "token_types.weight": r(2, n_embd, s=0.5),
        "position_embd.weight": r(n_ctx, n_embd, s=0.5),
    }
    w["token_embd_norm.weight"], w["token_embd_norm.bias"] = ln()
    for il in range(n_layer):
        p = f"blk.{il}."
        for name, rows, cols in (("attn_q", n_embd, n_embd), ("attn_k", n_embd, n_embd),
                                 ("attn_v", n_embd, n_embd), ("attn_output", n_embd, n_embd),
                                 ("ffn_up", n_ff, n_embd), ("ffn_down", n_embd, n_ff)):  # fmt: skip
            w[p + name + ".weight"] = r(rows, cols, s=1.0 / np.sqrt(cols))
            w[p + name + ".bias"] = r(rows, s=0.1)
        w[p + "attn_output_norm.weight"], w[p + "attn_output_norm.bias"] = ln()
        w[p + "layer_output_norm.weight"], w[p + "layer_output_norm.bias"] = ln()
    if rank:
        w["cls.weight"], w["cls.bias"] = r(n_embd, n_embd, s=1.0 / np.sqrt(n_embd)), r(n_embd, s=0.1)
        w["cls.output.weight"], w["cls.output.bias"] = r(1, n_embd, s=1.0), r(1, s=0.1)
        pooling = 4
    out = GGUFWriter(path, arch="bert")
    u32 = GGUFValueType.UINT32
    for k, v, t in (("bert.context_length", n_ctx, u32), ("bert.embedding_length", n_embd, u32),
                    ("bert.block_count", n_layer, u32), ("bert.feed_forward_length", n_ff, u32),
                    ("bert.attention.head_count", n_head, u32), ("bert.pooling_type", pooling, u32),
                    ("bert.attention.layer_norm_epsilon", 1e-12, GGUFValueType.FLOAT32),
                    ("bert.attention.causal", False, GGUFValueType.BOOL)):  # fmt: skip
        out.add_key_value(k, v, t)
    if rank:
        out.add_key_value("bert.classifier.output_labels", ["LABEL_0"])
    for k, f in src.fields.items():
        if k.startswith("tokenizer."):
            out.add_key_value_raw(k, f.type, src.raw_value(k))
    wt = GGMLType[ggml_type.upper()]
    for name, arr in w.items():
        big = arr.ndim == 2 and name not in ("token_types.weight", "position_embd.weight")
        out.add_tensor(name, arr, ggml_type=wt if big else GGMLType.F32)
    out.write()
    out.close()
    src.close()
    return Path(path)


@pytest.fixture(scope="module")
def embedder(tmp_path_factory) -> Path:
    """Qwen3-Embedding's layout: qwen3 with last-token pooling in its metadata."""
    return write_tiny_embedder(tmp_path_factory.mktemp("emb") / "qwen3-emb.gguf", arch="qwen3", pooling=3)


@pytest.fixture(scope="module")
def llm(embedder) -> Llama:
    return Llama(str(embedder), embedding=True, n_ctx=256, n_batch=64, n_seq_max=4, verbose=False)


TEXTS = ["Paris is the capital of France.", "bananas", "a much longer sentence about the weather today", "x"]


# ------------------------------------------------------------------------------------ normalization
@pytest.mark.parametrize("mode", [-1, 0, 1, 2, 3, 5])
def test_normalize_matches_common_embd_normalize(mode):
    rng = np.random.default_rng(1)
    v = rng.standard_normal((3, 17)).astype(np.float32)
    out = normalize_embedding(v, mode)
    for row, o in zip(v, out, strict=True):  # the C++ loop, written out
        x = row.astype(np.float64)
        if mode == -1:
            s = 1.0
        elif mode == 0:
            s = np.abs(x).max() / 32760.0
        elif mode == 2:
            s = np.sqrt((x * x).sum())
        else:
            s = (np.abs(x) ** mode).sum() ** (1.0 / mode)
        np.testing.assert_allclose(o, x / s, rtol=1e-6)
    assert np.abs(normalize_embedding(v[0], 0)).max() == pytest.approx(32760.0)
    assert np.abs(normalize_embedding(v[0], 1)).sum() == pytest.approx(1.0, rel=1e-6)
    assert not normalize_embedding(np.zeros(4), 2).any()  # zero stays zero, no NaN


@pytest.mark.parametrize("bad", [-2, 1.5, "l2", None])
def test_normalize_rejects_bad_modes(bad):
    with pytest.raises(EmbeddingError, match="normalize"):
        normalize_embedding(np.ones(3), bad)


# ------------------------------------------------------------------------------------ input shapes
def test_input_shapes():
    assert embedding_inputs("hi") == (["hi"], True)
    assert embedding_inputs(["a", "b"]) == (["a", "b"], False)
    assert embedding_inputs([1, 2, 3]) == ([[1, 2, 3]], True)
    assert embedding_inputs([[1, 2], [3]]) == ([[1, 2], [3]], False)
    for bad, match in [([], "empty list"), ([1.5], r"input\[0\]"), ({"a": 1}, "must be a text"),
                       (["a", 3, [True]], r"input\[1\]")]:  # fmt: skip
        with pytest.raises(EmbeddingError, match=match):
            embedding_inputs(bad)


def test_pack_inputs_respects_n_batch_and_n_seq_max():
    assert pack_inputs([10, 10, 10], n_batch=25, n_seq_max=8) == [[0, 1], [2]]
    assert pack_inputs([1] * 5, n_batch=100, n_seq_max=2) == [[0, 1], [2, 3], [4]]
    assert pack_inputs([25, 1], n_batch=25, n_seq_max=8) == [[0], [1]]


# ------------------------------------------------------------------------------------ embed
def test_embed_pooled_last_batched_equals_one_at_a_time(llm):
    assert llm.ctx.pooling_type == 3  # from qwen3.pooling_type
    calls = []
    orig = llm.ctx.decode
    llm.ctx.decode = lambda b: (calls.append(b.n_tokens), orig(b))[1]
    try:
        many = np.array(llm.embed(TEXTS * 2))  # 8 inputs, n_seq_max 4 -> at least 2 decodes
        n_many = len(calls)
        one = np.array([llm.embed(t) for t in TEXTS * 2])
    finally:
        llm.ctx.decode = orig
    assert many.shape == (8, 32)
    assert 2 <= n_many < 8
    np.testing.assert_allclose(many, one, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(many, axis=1), 1.0, rtol=1e-5)
    assert not np.allclose(many[0], many[1], atol=1e-3)


def test_embed_last_pooling_is_the_last_hidden_state(embedder, llm):
    """Pooled 'last' equals the per-token output's last row of a pooling-none context."""
    raw = np.array(llm.embed(TEXTS[0], normalize=False))
    tok = Llama(str(embedder), embedding=True, pooling_type="none", n_ctx=256, n_batch=64, verbose=False)
    rows = np.array(tok.embed(TEXTS[0], normalize=False))
    n = len(tok.tokenize(TEXTS[0].encode(), add_bos=True, special=True))
    assert rows.shape == (n, 32)
    np.testing.assert_allclose(raw, rows[-1], rtol=1e-4, atol=1e-5)
    # per token, batched with others, normalized per row
    many = tok.embed([TEXTS[0], TEXTS[1]], normalize=2)
    assert len(many) == 2 and len(many[0]) == n
    np.testing.assert_allclose(
        np.array(many[0]), rows / np.linalg.norm(rows, axis=1, keepdims=True), rtol=1e-4
    )


def test_embed_token_ids_and_normalize_modes(llm):
    toks = llm.tokenize(TEXTS[1].encode(), add_bos=True, special=True)
    a = np.array(llm.embed(TEXTS[1], normalize=False))
    np.testing.assert_allclose(np.array(llm.embed(toks, normalize=False)), a, rtol=1e-5)
    b = np.array(llm.embed([toks, toks], normalize=0))
    assert b.shape == (2, 32) and np.abs(b).max() == pytest.approx(32760.0, rel=1e-5)
    np.testing.assert_allclose(b[0], a / np.abs(a).max() * 32760.0, rtol=1e-4, atol=0.5)
    c = np.array(llm.embed(TEXTS[1], normalize=1))
    assert np.abs(c).sum() == pytest.approx(1.0, rel=1e-5)


def test_embed_too_long_truncates_or_raises(llm):
    long_text = " ".join(["word"] * 200)  # > n_batch 64 tokens
    with pytest.raises(EmbeddingError, match=r"more than the 64"):
        llm.embed(long_text, truncate=False)
    v, n = llm.embed(long_text, truncate=True, return_count=True)
    assert n == 64 and len(v) == 32
    toks = llm.tokenize(long_text.encode(), add_bos=True, special=True)
    np.testing.assert_allclose(np.array(v), np.array(llm.embed(toks[:64])), rtol=1e-4, atol=1e-5)


def test_embed_errors(llm, embedder):
    with pytest.raises(EmbeddingError, match="empty list"):
        llm.embed([])
    with pytest.raises(EmbeddingError, match="empty"):
        llm.embed([[]])
    with pytest.raises(EmbeddingError, match="out of range"):
        llm.embed([[1, 10**6]])
    plain = Llama(str(embedder), n_ctx=256, verbose=False)
    with pytest.raises(Exception, match="embedding=True"):
        plain.embed("hi")


def test_create_embedding_is_openai_shaped(llm):
    r = llm.create_embedding(["a b", "c"], model="m")
    assert r["object"] == "list" and r["model"] == "m"
    assert [d["index"] for d in r["data"]] == [0, 1] and all(d["object"] == "embedding" for d in r["data"])
    n = sum(len(llm.tokenize(t.encode(), add_bos=True, special=True)) for t in ["a b", "c"])
    assert r["usage"] == {"prompt_tokens": n, "total_tokens": n}
    one = llm.create_embedding("a b")
    assert len(one["data"]) == 1 and len(one["data"][0]["embedding"]) == 32


# ------------------------------------------------------------------------------------ rerank
class _Vocab:
    def __init__(self, add_bos=True, add_eos=False, add_sep=False, eos=2, sep=-1):
        self.bos, self.eos, self.sep = 1, eos, sep
        self.add_bos, self.add_eos, self.add_sep = add_bos, add_eos, add_sep
        self.calls: list[tuple] = []

    def tokenize(self, text, add_special=True, parse_special=False):
        self.calls.append((text, add_special, parse_special))
        return [100 + len(w) for w in text.split()]


def test_format_rerank_layouts():
    # bert-style (WPM: add_bos, add_sep, no eos): [CLS] q [SEP] d
    v = _Vocab(add_sep=True, eos=-1, sep=102)
    assert format_rerank(v, {}, "ab c", "d") == [1, 102, 101, 102, 101]
    # XLM-R style (add_eos, eos and sep): [BOS] q [EOS] [SEP] d [EOS]
    v = _Vocab(add_eos=True, add_sep=True, eos=2, sep=3)
    assert format_rerank(v, {}, "q", "d") == [1, 101, 2, 3, 101, 2]
    # a rerank template (Qwen3-Reranker): substituted, special tokens parsed, none added
    v = _Vocab()
    tmpl = "<q> {query} <d> {document} end"
    toks = format_rerank(v, {"tokenizer.chat_template.rerank": tmpl}, "aa", "bbb")
    assert v.calls == [("<q> aa <d> bbb end", False, True)]
    assert toks == [103, 102, 103, 103, 103]


def test_format_rerank_with_the_bert_vocab():
    m = Llama(shared_path("vocab", "ggml-vocab-bert-bge.gguf"), vocab_only=True, verbose=False)
    q = m.tokenize(b"what is panda?", add_bos=False)
    d = m.tokenize(b"hi", add_bos=False)
    assert format_rerank(m.vocab, m.model.metadata, "what is panda?", "hi") == [101, *q, 102, *d]


def test_rerank_results_sorting_and_top_n():
    r = rerank_results([0.1, 2.0, -1.0], ["a", "b", "c"], top_n=2, return_documents=True)
    assert r == [{"index": 1, "relevance_score": 2.0, "document": {"text": "b"}},
                 {"index": 0, "relevance_score": 0.1, "document": {"text": "a"}}]  # fmt: skip
    assert [x["index"] for x in rerank_results([0.1, 2.0, -1.0], ["a"] * 3, None, False)] == [1, 0, 2]
    with pytest.raises(EmbeddingError, match="top_n"):
        rerank_results([1.0], ["a"], -1, False)


def test_rerank_needs_a_rank_model(llm):
    with pytest.raises(EmbeddingError, match="rank head"):
        llm.rerank("q", ["a", "b"])


RERANK_TMPL = "<|im_start|>system\nJudge the document.<|im_end|>\n<Query>: {query}\n<Document>: {document}\n"


@pytest.fixture(scope="module")
def reranker(tmp_path_factory) -> Path:
    """Qwen3-Reranker's layout: qwen3, a yes/no ``cls.output`` head, a rerank template."""
    d = tmp_path_factory.mktemp("rank")
    return write_tiny_embedder(
        d / "qwen3-rank.gguf", arch="qwen3", rank=True, extra={"tokenizer.chat_template.rerank": RERANK_TMPL}
    )


DOCS = ["The giant panda is a bear.", "hi", "Paris is in France.", "pandas eat bamboo"]


def test_rerank_scores_are_the_heads_yes_probability(reranker):
    """Independent of the rank graph: softmax(cls.output @ last hidden state)[yes] from a pooling-none
    context over the template-formatted pair."""
    rr = Llama(str(reranker), embedding=True, pooling_type="rank", n_ctx=256, n_batch=128, verbose=False)
    assert rr.ctx.pooling_type == 4
    res = rr.rerank("what is a panda?", DOCS)
    assert sorted(r["index"] for r in res) == [0, 1, 2, 3]
    scores = {r["index"]: r["relevance_score"] for r in res}
    assert [r["relevance_score"] for r in res] == sorted(scores.values(), reverse=True)
    plain = Llama(str(reranker), embedding=True, pooling_type="none", n_ctx=256, n_batch=128, verbose=False)
    w = GGUFReader(reranker).tensor_index["cls.output.weight"].array().astype(np.float64)
    for i, d in enumerate(DOCS):
        toks = format_rerank(rr.vocab, rr.model.metadata, "what is a panda?", d)
        assert toks == rr.tokenize(
            RERANK_TMPL.format(query="what is a panda?", document=d).encode(), False, True
        )
        h = np.array(plain.embed(toks, normalize=False))[-1]
        logits = w @ h
        p_yes = np.exp(logits[0]) / np.exp(logits).sum()
        assert scores[i] == pytest.approx(p_yes, rel=1e-3, abs=1e-5)
    one = rr.rerank("what is a panda?", [DOCS[2]])[0]["relevance_score"]  # alone = batched
    assert one == pytest.approx(scores[2], rel=1e-4, abs=1e-6)
    top = rr.create_rerank("what is a panda?", DOCS, top_n=2, return_documents=True, model="r")
    assert top["object"] == "list" and top["model"] == "r" and len(top["results"]) == 2
    assert top["results"][0]["document"] == {"text": DOCS[top["results"][0]["index"]]}
    assert top["usage"]["prompt_tokens"] == sum(
        len(format_rerank(rr.vocab, rr.model.metadata, "what is a panda?", d)) for d in DOCS
    )
    with pytest.raises(EmbeddingError, match="empty list"):
        rr.rerank("q", [])


@pytest.fixture(scope="module")
def berts(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("bert")
    return {"mean": write_bert(d / "bert.gguf"), "rank": write_bert(d / "bert-rank.gguf", rank=True, seed=1)}


def test_bert_encoder_mean_pooling_batched_and_truncated(berts):
    llm = Llama(str(berts["mean"]), embedding=True, n_ctx=128, n_batch=256, n_ubatch=256, verbose=False)
    tok = Llama(str(berts["mean"]), embedding=True, pooling_type="none", n_ctx=128, verbose=False)
    texts = ["what is a panda?", "hello world", "the giant panda is a bear", "x"]
    many = np.array(llm.embed(texts, normalize=False))
    for t, v in zip(texts, many, strict=True):
        rows = np.array(tok.embed(t, normalize=False))  # [CLS] ... [SEP], per token
        np.testing.assert_allclose(v, rows.mean(axis=0), rtol=1e-4, atol=1e-5)
    long_text = " ".join(["panda"] * 300)  # > n_ctx_train 128: cut, keeping the closing [SEP]
    toks = llm.tokenize(long_text.encode(), add_bos=True, special=True)
    assert toks[-1] == llm.vocab.sep
    v = llm.embed(long_text)
    np.testing.assert_allclose(v, llm.embed(toks[:127] + toks[-1:]), rtol=1e-5, atol=1e-6)
    with pytest.raises(EmbeddingError, match="more than the 128"):
        llm.embed(["ok", long_text], truncate=False)


def test_bert_rerank_is_the_cls_head_on_the_cls_token(berts):
    """bge-reranker's layout: [CLS] query [SEP] document, score = cls.output(tanh(cls(h[CLS])))."""
    rr = Llama(str(berts["rank"]), embedding=True, pooling_type="rank", n_ctx=128, verbose=False)
    tok = Llama(str(berts["rank"]), embedding=True, pooling_type="none", n_ctx=128, verbose=False)
    rd = GGUFReader(berts["rank"])
    t = {n: rd.tensor_index[n].array().astype(np.float64) for n in ("cls.weight", "cls.bias", "cls.output.weight", "cls.output.bias")}  # fmt: skip
    q, docs = "what is panda?", ["hi", "it's a bear", "The giant panda is a bear species endemic to China."]
    res = rr.rerank(q, docs, top_n=2)
    ranked = rr.rank(q, docs)  # document order
    assert [res[0]["relevance_score"], res[1]["relevance_score"]] == sorted(ranked, reverse=True)[:2]
    assert len(res) == 2 and res[0]["relevance_score"] >= res[1]["relevance_score"]
    scores = {r["index"]: r["relevance_score"] for r in rr.rerank(q, docs)}
    for i, d in enumerate(docs):
        toks = format_rerank(rr.vocab, rr.model.metadata, q, d)
        qd = rr.tokenize(q.encode(), add_bos=False)
        assert toks[: len(qd) + 2] == [rr.vocab.bos, *qd, rr.vocab.sep]
        h0 = np.array(tok.embed(toks, normalize=False))[0]
        want = (
            t["cls.output.weight"] @ np.tanh(t["cls.weight"] @ h0 + t["cls.bias"]) + t["cls.output.bias"]
        )[0]
        assert scores[i] == pytest.approx(want, rel=1e-3, abs=1e-5)


def test_pooled_inputs_must_fit_one_ubatch(embedder):
    llm = Llama(str(embedder), embedding=True, n_ctx=256, n_batch=64, n_ubatch=16, verbose=False)
    text = " ".join(["word"] * 40)
    with pytest.raises(EmbeddingError, match="more than the 16"):
        llm.embed(text, truncate=False)
    assert len(llm.embed([text, text])) == 2  # cut to 16 tokens each, one ubatch each
