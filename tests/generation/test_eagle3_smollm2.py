"""EAGLE-3 on SmolLM2 through the user-facing doors: ``Llama(draft_model="head.gguf")`` detects the head
by its architecture, and ``llamapy serve -md head.gguf`` (the server backend) gives each slot an EAGLE-3
draft verified in the shared batch; greedy text identical to decoding without it (a random head: its
guesses are mostly rejected, the verification is what is checked)."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest

from llamapy import Llama
from llamapy.generation.eagle3 import Eagle3Draft, Eagle3Error
from llamapy.gguf.reader import GGUFReader
from llamapy.server.app import ServerSettings
from llamapy.server.backend import ContextBackend
from tests.generation.eagle3_head import write_head
from tests.server.conftest import start_live, stop_live, wait_ready

PROMPT = "The three primary colors are red, blue and"
N_PREDICT = 12


@pytest.fixture(scope="module")
def head(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    md = GGUFReader(str(smollm2_path)).metadata
    a = md["general.architecture"]
    n, n_layer = int(md[f"{a}.embedding_length"]), int(md[f"{a}.block_count"])
    n_vocab = len(md["tokenizer.ggml.tokens"])
    path = tmp_path_factory.mktemp("eagle3-smollm2") / "head.gguf"
    # HF's default extract layers (2, N/2, N-3); 9 heads of 64 as SmolLM2-135M; 1024 draft tokens
    return write_head(
        path, n, (2, n_layer // 2, n_layer - 3), 1024, n=n, nh=9, nkv=3, ff=256, n_vocab=n_vocab
    )


@pytest.fixture(scope="module")
def plain_text(smollm2_path: Path) -> str:
    llm = Llama(str(smollm2_path), n_ctx=512, verbose=False)
    return llm.create_completion(PROMPT, max_tokens=N_PREDICT, temperature=0)["choices"][0]["text"]


@pytest.mark.slow
def test_llama_detects_an_eagle3_head(smollm2_path: Path, head: Path, plain_text: str) -> None:
    llm = Llama(str(smollm2_path), n_ctx=512, draft_model=str(head), verbose=False)
    assert isinstance(llm.draft_model, Eagle3Draft)
    llm.draft_model.p_min, llm.draft_model.n_draft = 0.0, 3  # draft every step (a random head is unsure)
    out = llm.create_completion(PROMPT, max_tokens=N_PREDICT, temperature=0)["choices"][0]["text"]
    assert out == plain_text
    assert llm.draft_model.n_calls > 0 and llm.draft_model.n_drafted > 0


@pytest.mark.slow
def test_server_model_draft_eagle3_head(smollm2_path: Path, head: Path, plain_text: str) -> None:
    draft = {"model": str(head), "n_draft": 4, "p_min": 0.0}
    backend = ContextBackend(str(smollm2_path), n_ctx=512, n_seq_max=2, n_batch=64, n_ubatch=64, draft=draft)
    srv, thread = start_live(ServerSettings(model_path=str(smollm2_path), warmup=False), backend)
    try:
        wait_ready(srv.base_url, timeout=120)
        c = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0, timeout=300)
        out = c.completions.create(model="m", prompt=PROMPT, max_tokens=N_PREDICT, temperature=0)
        assert out.choices[0].text == plain_text
        r = httpx.post(srv.base_url + "/completion", timeout=300,
                       json={"prompt": PROMPT, "n_predict": N_PREDICT, "temperature": 0})  # fmt: skip
        assert r.status_code == 200 and r.json()["content"] == plain_text, r.text
        assert r.json()["timings"]["draft_n"] > 0, r.json()["timings"]
    finally:
        stop_live(srv, thread)


def test_a_head_for_another_model_refused_at_start(smollm2_path: Path, tmp_path: Path) -> None:
    """``serve -md`` of an EAGLE-3 head trained for another hidden size: a typed error before serving."""
    bad = write_head(tmp_path / "bad.gguf", 64, (1, 2, 3), 100, n=64, nh=4, nkv=2, ff=128, n_vocab=1000)
    with pytest.raises(Eagle3Error, match="hidden states of size 64"):
        ContextBackend(str(smollm2_path), n_ctx=256, draft={"model": str(bad)})
    with pytest.raises(Eagle3Error, match="hidden states of size 64"):
        Llama(str(smollm2_path), n_ctx=256, draft_model=str(bad), verbose=False)
