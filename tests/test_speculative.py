"""Prompt-lookup speculative decoding (``Llama(draft_model=LlamaPromptLookupDecoding())``): the drafts,
the verification through the one token loop (same output as without a draft, fewer decodes on a
repetitive text), over the fake model and the real SmolLM2."""

from __future__ import annotations

import numpy as np
import pytest

from llamapy import Llama, LlamaPromptLookupDecoding
from tests.test_api import EOS, FakeModel, script_rule
from tests.test_generation import FakeContext, fake_batch


def find(ids, n=2, k=10):
    return LlamaPromptLookupDecoding.find_candidate_pred_tokens(np.array(ids), n, k).tolist()


def test_prompt_lookup_drafts():
    assert find([1, 2, 3, 4, 1, 2]) == [3, 4, 1, 2]  # the 2-gram (1, 2) first seen at 0
    assert find([1, 2, 3, 4, 1, 2], k=2) == [3, 4]
    assert find([5, 6, 7, 9, 7]) == [9, 7]  # no 2-gram match: the 1-gram (7)
    assert find([1, 2, 3]) == [] and find([1]) == [] and find([]) == []
    assert find([4, 4, 4]) == [4]  # the first match that has a continuation
    with pytest.raises(ValueError):
        LlamaPromptLookupDecoding(max_ngram_size=0)


class BadDraft:
    """Guesses that are mostly wrong, some out of the vocabulary."""

    def __call__(self, input_ids, **kw):
        return np.array([ord("H"), ord("x"), 10**6, -1, 3])


def fake(draft=None, n_ctx=128):
    ctx = FakeContext(258, script_rule, n_ctx=n_ctx, n_batch=16)
    return Llama._from_parts(FakeModel(), ctx, batch_factory=fake_batch, draft_model=draft), ctx


PROMPT = "Hello, world!\nQ: again\nHello, >"  # the model then spells it again: the lookup guesses right


@pytest.mark.parametrize("kw", [dict(max_tokens=64), dict(max_tokens=5), dict(max_tokens=12, stop=["Q:"]),
                                dict(max_tokens=30, stop="ld!")])  # fmt: skip
@pytest.mark.parametrize("draft", [LlamaPromptLookupDecoding(), LlamaPromptLookupDecoding(1, 3), BadDraft()])
def test_same_output_as_without_a_draft(kw, draft):
    plain, ctx0 = fake()
    spec, ctx1 = fake(draft)
    want = plain(PROMPT, temperature=0, **kw)
    got = spec(PROMPT, temperature=0, **kw)
    assert got["choices"] == want["choices"] and got["usage"] == want["usage"]
    if isinstance(draft, LlamaPromptLookupDecoding) and kw["max_tokens"] > 5:
        assert ctx1.n_decode_calls < ctx0.n_decode_calls
    # the cache holds exactly the evaluated tokens, no leftover guesses
    n = len(spec._seq)
    assert sorted(ctx1.memory.cells) == list(range(n))
    assert [ctx1.memory.cells[p] for p in range(n)] == spec._seq.tokens
    streamed = "".join(c["choices"][0]["text"] for c in spec(PROMPT, temperature=0, stream=True, **kw))
    assert streamed == want["choices"][0]["text"]


def test_seeded_sampling_and_hooks_are_unchanged():
    seen: dict[str, list[list[int]]] = {"plain": [], "spec": []}

    def run(llm, name):
        def proc(ids, z):
            seen[name].append(ids.tolist())
            return z

        out = llm(PROMPT, max_tokens=24, temperature=5.0, top_k=0, top_p=1.0, min_p=0.0, seed=7,
                  logits_processor=proc, logit_bias={EOS: float("-inf")})  # fmt: skip
        return out["choices"][0]["text"]

    assert run(fake()[0], "plain") == run(fake(LlamaPromptLookupDecoding())[0], "spec")
    assert seen["spec"] == seen["plain"]  # the hooks only ever see accepted tokens


def test_draft_never_overflows_the_context():
    plain, _ = fake(n_ctx=40)
    spec, ctx = fake(LlamaPromptLookupDecoding(num_pred_tokens=50), n_ctx=40)
    want = plain(PROMPT, max_tokens=0, temperature=0)
    assert spec(PROMPT, max_tokens=0, temperature=0)["choices"] == want["choices"]
    assert max(ctx.memory.cells) < 40


def test_draft_model_must_be_callable(smollm2_path):
    with pytest.raises(TypeError, match="draft_model"):
        Llama(str(smollm2_path), draft_model=42, verbose=False)


# ------------------------------------------------------------------------------------ the real model

REPETITIVE = "Repeat after me.\n" + "The cat sat on the mat, and the dog sat on the log.\n" * 4
NORMAL = "The capital of France is"


@pytest.fixture(scope="module")
def smollm2_llm(smollm2_path):
    return Llama(str(smollm2_path), n_ctx=512, n_batch=64, verbose=False)


def _count_decodes(llm):
    calls = [0]
    inner = llm.ctx.decode

    def decode(batch):
        calls[0] += 1
        return inner(batch)

    llm.ctx.decode = decode
    return calls


@pytest.mark.slow
@pytest.mark.parametrize("prompt", [REPETITIVE, NORMAL])
def test_real_greedy_identical_with_prompt_lookup(smollm2_llm, prompt):
    llm = smollm2_llm
    calls = _count_decodes(llm)
    try:
        out = {}
        for name, draft in (("plain", None), ("spec", LlamaPromptLookupDecoding(num_pred_tokens=10))):
            llm.draft_model = draft
            llm.reset()
            calls[0] = 0
            r = llm(prompt, max_tokens=48, temperature=0)
            out[name] = (r["choices"][0]["text"], r["usage"]["completion_tokens"], calls[0])
    finally:
        llm.draft_model = None
        del llm.ctx.decode
    assert out["spec"][:2] == out["plain"][:2], out
    if prompt is REPETITIVE:
        assert out["spec"][2] < 0.7 * out["plain"][2], out  # fewer decodes: guesses accepted in batches
