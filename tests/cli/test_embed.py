"""``llamapy embed`` as a subprocess, on a tiny Qwen3-Embedding-like model (qwen3, last-token pooling)
with a real vocabulary: llama-embedding's output formats, against ``Llama.embed`` in-process."""

from __future__ import annotations

import json

import numpy as np
import pytest

from llamapy import Llama
from tests.cli.test_run import llamapy_cmd
from tests.test_api_embedding import write_tiny_embedder

TEXTS = ["hello world", "bananas are yellow", "hello world"]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_tiny_embedder(tmp_path_factory.mktemp("cli-emb") / "tiny-emb.gguf", arch="qwen3", pooling=3)


@pytest.fixture(scope="module")
def llm(model):
    return Llama(str(model), embedding=True, n_ctx=256, verbose=False)


def test_json_output_matches_the_api(model, llm):
    r = llamapy_cmd(
        "embed", "-m", str(model), "-c", "256", "-p", "\\n".join(TEXTS), "--embd-output-format", "json"
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["object"] == "list" and [d["index"] for d in doc["data"]] == [0, 1, 2]
    got = np.array([d["embedding"] for d in doc["data"]])
    np.testing.assert_allclose(got, np.array(llm.embed(TEXTS)), atol=2e-7 + 1e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert np.allclose(got[0], got[2]) and not np.allclose(got[0], got[1], atol=1e-2)


def test_file_input_raw_format_per_token_and_max_abs(model, llm, tmp_path):
    f = tmp_path / "texts.txt"
    f.write_text("\n".join(TEXTS[:2]) + "\n")  # the trailing newline is not a text, as llama.cpp's -f
    r = llamapy_cmd("embed", "-m", str(model), "-c", "256", "-f", str(f), "--pooling", "none",
                    "--embd-normalize", "0", "--embd-output-format", "raw")  # fmt: skip
    assert r.returncode == 0, r.stderr
    rows = np.array([[float(x) for x in line.split()] for line in r.stdout.strip().splitlines()])
    want = np.concatenate([np.array(v) for v in llm_none(model).embed(TEXTS[:2], normalize=0)])
    assert rows.shape == want.shape  # one line per token of both texts
    np.testing.assert_allclose(rows, want, atol=1.0)  # "%1.0f" of int16-scaled values
    assert np.abs(rows).max(axis=1) == pytest.approx(32760.0)


def llm_none(model):
    return Llama(str(model), embedding=True, pooling_type="none", n_ctx=256, verbose=False)


def test_summary_and_array_formats(model):
    r = llamapy_cmd("embed", "-m", str(model), "-c", "256", "-p", "a b\\nc d", "--embd-separator", "\n")
    assert r.returncode == 0, r.stderr
    assert "embedding 0:" in r.stdout and "embedding 1:" in r.stdout
    assert "cosine similarity matrix:" in r.stdout and "  1.00 " in r.stdout
    r = llamapy_cmd("embed", "-m", str(model), "-c", "256", "-p", "a b|c d", "--embd-separator", "|",
                    "--embd-output-format", "array")  # fmt: skip
    assert r.returncode == 0, r.stderr
    arr = json.loads(r.stdout)
    assert len(arr) == 2 and len(arr[0]) == 32


@pytest.mark.parametrize(
    "extra, match",
    [
        ([], "-p TEXT or -f FILE"),
        (["-p", " ".join(["word"] * 400)], "more than the 256"),
        (["-p", "x", "--pooling", "rank"], "classification head"),
    ],
)
def test_errors_are_one_line(model, extra, match):
    r = llamapy_cmd("embed", "-m", str(model), "-c", "256", *extra)
    assert r.returncode == 1, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("error: ") and match in r.stderr
    assert r.stdout == ""


def test_bad_flag_values_are_usage_errors(model):
    for bad in (["--embd-normalize", "-2"], ["--embd-output-format", "xml"], ["--pooling", "max"]):
        r = llamapy_cmd("embed", "-m", str(model), "-p", "x", *bad)
        assert r.returncode == 2 and "usage:" in r.stderr, bad


def test_rank_pairs_on_a_bert_reranker(tmp_path):
    """``query<TAB>document`` lines as llama-embedding joins them for a bert reranker (the text
    ``query[SEP]document`` tokenized with specials: [CLS] q [SEP] d [SEP]), scores printed raw."""
    from tests.test_api_embedding import write_bert

    path = write_bert(tmp_path / "rank.gguf", rank=True)
    r = llamapy_cmd("embed", "-m", str(path), "-c", "128", "--pooling", "rank",
                    "-p", "what is panda?\\thi\\nwhat is panda?\\tit's a bear")  # fmt: skip
    assert r.returncode == 0, r.stderr
    got = [float(line.split(":")[1]) for line in r.stdout.splitlines() if line.startswith("rerank score")]
    rr = Llama(str(path), embedding=True, pooling_type="rank", n_ctx=128, verbose=False)
    for s, d in zip(got, ["hi", "it's a bear"], strict=True):
        toks = rr.tokenize(f"what is panda?[SEP]{d}".encode(), add_bos=True, special=True)
        assert toks[0] == rr.vocab.bos and toks.count(rr.vocab.sep) == 2
        assert s == pytest.approx(rr.embed(toks, normalize=False)[0], abs=1e-3)  # "%8.3f"
    assert len(got) == 2
