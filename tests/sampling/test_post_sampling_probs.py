"""llama-server's ``post_sampling_probs``: the probabilities of the chain's final candidates
(``llamapy.sampling.logprobs.post_sampling_probs``) and the token loop reporting them."""

from __future__ import annotations

import numpy as np
import pytest

from llamapy.generation import Generation, GenerationParams
from llamapy.sampling import SamplingParams, TokenDataArray, build_chain
from llamapy.sampling.logprobs import post_sampling_probs

LOGITS = np.array([1.0, 4.0, 2.0, 3.0, 0.5, 3.0], np.float32)


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x.astype(np.float64) - x.max())
    return e / e.sum()


def chain(**kw):
    p = SamplingParams(top_p=1.0, min_p=0.0, seed=7, **kw)
    return build_chain(p, n_vocab=len(LOGITS))


def test_greedy_keeps_one_candidate_with_probability_one():
    for c in (chain(temp=0.0), chain(top_k=1, temp=1.0)):
        tok = c.sample(LOGITS)
        assert tok == 1
        assert post_sampling_probs(c.cur, tok, 5) == (1.0, [(1, 1.0)])  # zero probabilities left out


def test_top_k_candidates_renormalized_and_sorted():
    c = chain(top_k=3, temp=1.0)
    tok = c.sample(LOGITS)
    prob, top = post_sampling_probs(c.cur, tok, 10)
    want = softmax(np.array([4.0, 3.0, 3.0]))
    assert [t for t, _ in top] == [1, 3, 5]  # ties in the chain's order (lower id first here)
    assert [p for _, p in top] == pytest.approx(want, rel=1e-6)
    assert prob == dict(top)[tok]
    prob2, top2 = post_sampling_probs(c.cur, tok, 2)
    assert top2 == top[:2] and prob2 == prob


def test_untruncated_chain_reports_the_whole_softmax_at_temperature():
    c = chain(top_k=0, temp=2.0)
    tok = c.sample(LOGITS)
    prob, top = post_sampling_probs(c.cur, tok, 3)
    want = softmax(LOGITS / 2.0)
    assert [t for t, _ in top] == [1, 3, 5]
    assert [p for _, p in top] == pytest.approx(want[[1, 3, 5]], rel=1e-5)
    assert prob == pytest.approx(want[tok], rel=1e-5)


def test_a_token_outside_the_candidates_gets_llama_servers_default():
    cur = TokenDataArray(
        np.array([3, 1]), np.array([2.0, 1.0]), np.array([0.7, 0.3]), sorted=True, selected=0
    )
    assert post_sampling_probs(cur, 1, 0) == (pytest.approx(0.3), [])
    assert post_sampling_probs(cur, 9, 1) == (1.0, [(3, pytest.approx(0.7))])
    cur = TokenDataArray(np.array([0, 1]), np.array([0.0, 0.0]))  # no probabilities computed (p = 0)
    assert post_sampling_probs(cur, 0, 2) == (0.0, [])


class Vocab:
    n_tokens = len(LOGITS)

    def token_to_piece(self, token: int, special: bool = False) -> bytes:
        return b"abcdef"[token : token + 1]

    def is_eog(self, token: int) -> bool:
        return False


def test_generation_reports_post_sampling_probabilities():
    p = GenerationParams(n_probs=2, post_sampling_probs=True)
    gen = Generation(Vocab(), chain(top_k=3, temp=1.0), p)
    step = gen.step(LOGITS)
    lp = step.logprob
    assert lp.post_sampling and lp.token == step.token and len(lp.top) == 2
    assert lp.top[0] == (1, pytest.approx(softmax(np.array([4.0, 3.0, 3.0]))[0], rel=1e-6))
    # without it: log-probabilities of the raw logits, as before
    gen = Generation(Vocab(), chain(top_k=3, temp=1.0), GenerationParams(n_probs=2))
    lp = gen.step(LOGITS).logprob
    assert not lp.post_sampling and lp.top[0][1] == pytest.approx(float(np.log(softmax(LOGITS)[1])), rel=1e-5)


def test_generation_needs_a_chain_for_post_sampling_probs():
    class Callable:
        def sample(self, z):
            return int(np.argmax(z))

        def accept(self, t):
            pass

    with pytest.raises(ValueError, match="post_sampling_probs"):
        Generation(Vocab(), Callable(), GenerationParams(n_probs=1, post_sampling_probs=True))
