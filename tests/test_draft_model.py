"""Speculative decoding with a second model (``Llama(draft_model=path)``, llama.cpp's ``-md``): greedy
output identical to no draft with SmolLM2 drafting for itself (most guesses kept) and with a tiny
random-weight draft sharing its vocabulary (most guesses refused), and incompatible drafts refused."""

from __future__ import annotations

import numpy as np
import pytest

from llamapy import Llama, LlamaModelDraft
from llamapy.generation.draft_model import DraftModelError
from llamapy.model import Model
from tests.model.tiny import llama_config, random_llama_weights, write_gguf

PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n    return"


@pytest.fixture(scope="module")
def target(smollm2_path):
    return Llama(str(smollm2_path), n_ctx=512, n_batch=64, verbose=False)


@pytest.fixture(scope="module")
def random_draft_path(smollm2_path, tmp_path_factory):
    """A 2-layer random llama with SmolLM2's tokenizer (its vocabulary, so the drafts are comparable)."""
    md = Model.load(smollm2_path, vocab_only=True).metadata
    tok = {
        k: (list(v) if not isinstance(v, (str, int, float, bool)) else v)
        for k, v in md.items()
        if k.startswith("tokenizer.")
    }
    cfg = llama_config(n_vocab=len(md["tokenizer.ggml.tokens"]), n_embd=32, n_ff=64)
    return write_gguf(
        tmp_path_factory.mktemp("draft") / "d.gguf", "llama", cfg, random_llama_weights(cfg, 1), "f16", tok
    )


def _greedy(llm, n=24):
    llm.reset()
    return llm(PROMPT, max_tokens=n, temperature=0)["choices"][0]["text"]


@pytest.mark.slow
def test_self_draft_and_random_draft_give_the_same_greedy_text(target, smollm2_path, random_draft_path):
    plain = _greedy(target)
    try:
        for path, expect_kept in ((smollm2_path, True), (random_draft_path, False)):
            draft = LlamaModelDraft(path, n_draft=8, p_min=0.0 if not expect_kept else 0.5, n_ctx=512)
            target.draft_model = draft
            assert _greedy(target) == plain, path
            assert draft.n_calls > 0
            if expect_kept:  # the same model drafts what the target then samples: few calls, many tokens
                assert draft.n_drafted >= 12 and draft.n_calls < 20, (draft.n_drafted, draft.n_calls)
    finally:
        target.draft_model = None


def test_draft_model_by_path_is_checked(smollm2_path, gemma3_path):
    with pytest.raises(DraftModelError, match="tokenizer|vocabulary|token"):
        Llama(str(smollm2_path), draft_model=str(gemma3_path), n_ctx=256, verbose=False)
    with pytest.raises(DraftModelError, match="n_min"):
        LlamaModelDraft(smollm2_path, n_draft=2, n_min=3)
    with pytest.raises(DraftModelError, match="p_min"):
        LlamaModelDraft(smollm2_path, p_min=1.5)


def test_draft_call_reuses_its_cache(smollm2_path):
    d = LlamaModelDraft(smollm2_path, n_draft=4, p_min=0.0, n_ctx=256)
    ids = np.array(Model.load(smollm2_path, vocab_only=True).vocab.tokenize("The capital of France is"))
    first = d(ids).tolist()
    assert len(first) == 4 and d.tokens[: len(ids)] == ids.tolist()
    again = d(np.concatenate([ids, first[:2]])).tolist()  # a prefix of what it drafted: same continuation
    assert again[:2] == first[2:4]
    assert d(np.array([10**9])).tolist() == []  # a token it does not know: no guess, no error
