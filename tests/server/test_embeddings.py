"""The embedding and rerank endpoints over a real socket (in-process uvicorn), on tiny Qwen3-Embedding-
and Qwen3-Reranker-like models with a real vocabulary: the official ``openai`` client's
``embeddings.create``, llama.cpp's native ``/embedding``, ``/rerank`` with httpx; answers checked against
``Llama.embed`` / ``Llama.rerank`` on the same file."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest

from llamapy import Llama
from llamapy.server.app import ServerSettings
from llamapy.server.embeddings import EmbeddingBackend
from tests.server.conftest import start_live, stop_live, wait_ready
from tests.server.fake_backend import FakeBackend
from tests.test_api_embedding import RERANK_TMPL, write_tiny_embedder

TEXTS = ["Paris is the capital of France.", "bananas", "hello world", "a b c d e f", "x"]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("srv-emb")
    return {
        "emb": str(write_tiny_embedder(d / "emb.gguf", arch="qwen3", pooling=3)),
        "rank": str(
            write_tiny_embedder(
                d / "rank.gguf",
                arch="qwen3",
                rank=True,
                extra={"tokenizer.chat_template.rerank": RERANK_TMPL},
            )
        ),
    }


def _serve(path: str, pooling: str | None = None, backend=None) -> Iterator[str]:
    backend = backend or EmbeddingBackend(
        path, n_ctx=1024, n_seq_max=4, n_batch=128, embeddings=True, pooling=pooling
    )
    settings = ServerSettings(model_path=path)
    settings.warmup = False  # (the tests run the kernels themselves)
    srv, thread = start_live(settings, backend)
    try:
        wait_ready(srv.base_url, timeout=120)
        yield srv.base_url
    finally:
        stop_live(srv, thread)


@pytest.fixture(scope="module")
def emb_url(files) -> Iterator[str]:
    yield from _serve(files["emb"])


@pytest.fixture(scope="module")
def ref(files) -> Llama:
    return Llama(files["emb"], embedding=True, n_ctx=256, n_batch=128, verbose=False)


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)


def test_openai_client_embeddings(emb_url, ref):
    c = client(emb_url)
    r = c.embeddings.create(model="m", input=TEXTS)  # 5 inputs over 4 slots
    assert [d.index for d in r.data] == list(range(5))
    got = np.array([d.embedding for d in r.data])
    np.testing.assert_allclose(got, np.array(ref.embed(TEXTS)), rtol=1e-4, atol=1e-5)
    one = np.array([c.embeddings.create(model="m", input=t).data[0].embedding for t in TEXTS])
    np.testing.assert_allclose(got, one, rtol=1e-4, atol=1e-5)  # many in one request = one at a time
    n = sum(len(ref.tokenize(t.encode(), add_bos=True, special=True)) for t in TEXTS)
    assert r.usage.prompt_tokens == n and r.usage.total_tokens == n
    toks = ref.tokenize(TEXTS[0].encode(), add_bos=True, special=True)
    single = c.embeddings.create(model="m", input=toks).data  # one token array
    assert len(single) == 1
    np.testing.assert_allclose(single[0].embedding, got[0], rtol=1e-4, atol=1e-5)
    two = c.embeddings.create(model="m", input=[toks, toks[:3]]).data
    np.testing.assert_allclose(two[0].embedding, got[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(two[1].embedding, ref.embed(toks[:3]), rtol=1e-4, atol=1e-5)
    raw = httpx.post(
        emb_url + "/v1/embeddings", json={"input": "bananas", "encoding_format": "base64"}
    ).json()
    vec = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), "<f4")
    np.testing.assert_allclose(vec, got[1], rtol=1e-4, atol=1e-5)


def test_embedding_errors(emb_url, ref):
    c = client(emb_url)
    with pytest.raises(openai.BadRequestError, match="empty list"):
        c.embeddings.create(model="m", input=[])
    long_text = " ".join(["word"] * 300)  # longer than a batch (128)
    with pytest.raises(openai.BadRequestError, match="truncate"):
        c.embeddings.create(model="m", input=["ok", long_text])
    r = httpx.post(emb_url + "/v1/embeddings", json={"input": long_text, "truncate": True})
    assert r.status_code == 200, r.text
    toks = ref.tokenize(long_text.encode(), add_bos=True, special=True)[:128]
    np.testing.assert_allclose(r.json()["data"][0]["embedding"], ref.embed(toks), rtol=1e-4, atol=1e-5)
    for body, match in [({"input": "x", "encoding_format": "xml"}, "encoding_format"),
                        ({"input": [[1, 10**7]]}, "out of range"), ({}, "input"),
                        ({"input": "x", "dimensions": 8}, "dimensions"), ({"input": [1.5]}, "input")]:  # fmt: skip
        r = httpx.post(emb_url + "/v1/embeddings", json=body)
        assert r.status_code == 400 and match in r.json()["error"]["message"], (body, r.text)
    r = httpx.post(emb_url + "/rerank", json={"query": "q", "documents": ["a"]})
    assert r.status_code == 501 and "--reranking" in r.json()["error"]["message"]


def test_native_embedding(emb_url, ref):
    r = httpx.post(emb_url + "/embedding", json={"content": ["bananas", "hello world"]})
    assert r.status_code == 200, r.text
    out = r.json()
    assert [o["index"] for o in out] == [0, 1] and len(out[0]["embedding"]) == 1  # one pooled vector
    np.testing.assert_allclose(out[0]["embedding"][0], ref.embed("bananas"), rtol=1e-4, atol=1e-5)
    r = httpx.post(emb_url + "/embeddings", json={"input": "bananas", "embd_normalize": -1})
    np.testing.assert_allclose(r.json()[0]["embedding"][0], ref.embed("bananas", normalize=False), rtol=1e-4)


def test_pooling_none_per_token(files):
    ref = Llama(files["emb"], embedding=True, pooling_type="none", n_ctx=256, verbose=False)
    for url in _serve(files["emb"], pooling="none"):
        r = httpx.post(url + "/embedding", json={"content": ["hello world", "bananas"]})
        assert r.status_code == 200, r.text
        for o, t in zip(r.json(), ["hello world", "bananas"], strict=True):
            want = np.array(ref.embed(t, normalize=False))  # raw per token, as llama-server
            assert np.array(o["embedding"]).shape == want.shape
            np.testing.assert_allclose(o["embedding"], want, rtol=1e-4, atol=1e-5)
        with pytest.raises(openai.BadRequestError, match="not OpenAI-compatible"):
            client(url).embeddings.create(model="m", input="x")


def test_rerank(files):
    ref = Llama(files["rank"], embedding=True, pooling_type="rank", n_ctx=256, verbose=False)
    q, docs = "what is a panda?", ["hi", "The giant panda is a bear.", "pandas eat bamboo", "Paris", "x y"]
    want = ref.rerank(q, docs)
    for url in _serve(files["rank"]):
        for path in ("/rerank", "/v1/rerank", "/v1/reranking", "/reranking"):
            r = httpx.post(url + path, json={"model": "m", "query": q, "documents": docs}, timeout=120)
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["object"] == "list" and body["usage"]["prompt_tokens"] > 0
            got = body["results"]
            assert [g["index"] for g in got] == [w["index"] for w in want]
            for g, w in zip(got, want, strict=True):
                assert g["relevance_score"] == pytest.approx(w["relevance_score"], rel=1e-4, abs=1e-6)
                assert "document" not in g
        r = httpx.post(url + "/v1/rerank", json={"query": q, "documents": docs, "top_n": 2,
                                                  "return_documents": True}).json()  # fmt: skip
        assert [x["index"] for x in r["results"]] == [w["index"] for w in want[:2]]
        assert r["results"][0]["document"] == {"text": docs[want[0]["index"]]}
        tei = httpx.post(url + "/rerank", json={"query": q, "texts": docs, "return_text": True}).json()
        assert [t["index"] for t in tei] == [w["index"] for w in want] and tei[0]["text"] == docs[
            want[0]["index"]
        ]
        assert tei[0]["score"] == pytest.approx(want[0]["relevance_score"], rel=1e-4)
        for body, match in [({"query": q, "documents": []}, "non-empty"), ({"documents": ["a"]}, "query"),
                            ({"query": q, "documents": ["a"], "top_n": -1}, "top_n"),
                            ({"query": q, "documents": [" ".join(["w"] * 300)]}, "truncate")]:  # fmt: skip
            r = httpx.post(url + "/v1/rerank", json=body)
            assert r.status_code == 400 and match in r.json()["error"]["message"], (body, r.text)


def test_not_an_embedding_server():
    fake = FakeBackend()
    for url in _serve("/m/fake.gguf", backend=fake):
        for path in ("/embedding", "/v1/rerank"):
            r = httpx.post(url + path, json={"content": "x", "query": "q", "documents": ["a"]})
            msg = r.json()["error"]["message"]
            assert r.status_code == 501 and ("--embeddings" in msg or "--reranking" in msg), r.text


def test_serve_flags():
    from llamapy.cli import build_parser

    a = build_parser().parse_args(["serve", "-m", "x.gguf", "--embedding", "--pooling", "none"])
    assert a.embeddings and a.pooling == "none" and not a.reranking
    a = build_parser().parse_args(["serve", "-m", "x.gguf", "--reranking"])
    assert a.reranking


def test_bert_encoder_embeddings_and_rerank(tmp_path):
    """The encoder path through the engine (several slots per decode): bert mean pooling and a
    bge-reranker-style head, as ``Llama`` computes them."""
    from tests.test_api_embedding import write_bert

    mean, rank = write_bert(tmp_path / "bert.gguf"), write_bert(tmp_path / "rank.gguf", rank=True)
    ref = Llama(str(mean), embedding=True, n_ctx=128, verbose=False)
    for url in _serve(str(mean)):
        got = [d.embedding for d in client(url).embeddings.create(model="m", input=TEXTS).data]
        np.testing.assert_allclose(got, ref.embed(TEXTS), rtol=1e-4, atol=1e-5)
    rr = Llama(str(rank), embedding=True, pooling_type="rank", n_ctx=128, verbose=False)
    q, docs = "what is panda?", ["hi", "it's a bear", "The giant panda is a bear species endemic to China."]
    want = rr.rerank(q, docs)
    for url in _serve(str(rank)):
        got = httpx.post(url + "/v1/rerank", json={"query": q, "documents": docs}).json()["results"]
        assert [g["index"] for g in got] == [w["index"] for w in want]
        assert [g["relevance_score"] for g in got] == pytest.approx(
            [w["relevance_score"] for w in want], rel=1e-4
        )
