"""The chain, SamplingParams/build_chain, state (accept/reset/clone) and bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from llamapy.errors import LlamapyError
from llamapy.sampling import (
    DistSampler,
    DRYSampler,
    GreedySampler,
    LogitBiasSampler,
    MinPSampler,
    PenaltiesSampler,
    SamplerChain,
    SamplingError,
    SamplingParams,
    TokenDataArray,
    TopKSampler,
    TopPSampler,
    build_chain,
    greedy_chain,
    sampler_chars,
    sampler_names,
)
from llamapy.sampling.dry import breakers_from_vocab

finite_logits = hnp.arrays(
    np.float32,
    st.integers(1, 300),
    elements=st.floats(-30, 30, width=32),
)


def test_default_chain_matches_llama_cpp():
    chain = build_chain(SamplingParams(seed=1), n_vocab=100)
    assert chain.describe() == (
        "logits -> ?penalties -> ?dry -> ?top-n-sigma -> top-k -> ?typical -> top-p -> min-p -> ?xtc "
        "-> temp-ext -> dist "
    )
    assert SamplingParams().top_k == 40 and SamplingParams().min_p == pytest.approx(0.05)


def test_sampler_names_and_chars():
    assert sampler_names("top_k;TOP-P;nucleus;temp;typ;min_p") == [
        "top_k",
        "top_p",
        "top_p",
        "temperature",
        "typ_p",
        "min_p",
    ]
    assert sampler_chars("edskypmxt") == list(SamplingParams().samplers)
    with pytest.raises(SamplingError, match="unknown sampler name 'topk2'"):
        sampler_names("top_k;topk2")
    with pytest.raises(SamplingError, match="letter 'z'"):
        sampler_chars("kz")


def test_custom_order():
    chain = build_chain(SamplingParams(samplers=["min_p", "top_k"], seed=3), n_vocab=10)
    assert [s.name for s in chain] == ["min-p", "top-k", "dist"]


@settings(max_examples=60, deadline=None)
@given(finite_logits)
def test_temp_zero_is_greedy(logits):
    expected = int(np.argmax(logits))
    chain = build_chain(SamplingParams(temp=0.0, seed=5), n_vocab=len(logits))
    assert chain.sample(logits) == expected
    assert greedy_chain().sample(logits) == expected


@settings(max_examples=60, deadline=None)
@given(finite_logits, st.integers(0, 2**32 - 2))
def test_sample_is_a_kept_candidate(logits, seed):
    chain = build_chain(SamplingParams(seed=seed, top_k=5, top_p=0.9, min_p=0.1), n_vocab=len(logits))
    tok = chain.sample(logits)
    assert 0 <= tok < len(logits)
    kept = set(chain.cur.ids.tolist())
    assert tok in kept and len(kept) <= 5
    # never worse than the 5th best logit
    assert logits[tok] >= np.sort(logits)[::-1][min(4, len(logits) - 1)]


@settings(max_examples=40, deadline=None)
@given(finite_logits, st.floats(0.0, 0.999))
def test_top_p_adaptive_path_equals_full_sort(logits, p):
    big = np.tile(logits, 2000 // len(logits) + 2)  # > 1024 candidates: the partial-sort path
    a = TokenDataArray.from_logits(big)
    TopPSampler(p, 1).apply(a)
    b = TokenDataArray.from_logits(big)
    b.sort_desc()
    TopPSampler(p, 1).apply(b)
    if len(a.ids) != len(b.ids):
        # b's softmax sums in sorted order, a's in id order, and both cut where a float32 running sum
        # reaches p: the cuts may part only where the exact mass is within that rounding of p
        short, long_ = sorted((a.ids, b.ids), key=len)
        np.testing.assert_array_equal(long_[: len(short)], short)
        probs = np.exp(big.astype(np.float64) - big.max())
        probs /= probs.sum()
        tol = 1e-3  # float32 sums over ~2000 candidates, normalized in two orders
        assert probs[short].sum() >= np.float32(p) - tol  # the shorter one kept enough
        assert probs[long_[:-1]].sum() < np.float32(p) + tol  # the longer one no more than needed
        return
    np.testing.assert_array_equal(a.ids, b.ids)


def test_same_seed_same_tokens_and_clone_reset():
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((30, 500)).astype(np.float32)
    params = SamplingParams(seed=1234, temp=1.0, top_k=0, top_p=1.0, min_p=0.0)
    a = build_chain(params, n_vocab=500)
    first = [a.sample(r) for r in rows[:10]]
    b = a.clone()
    assert [a.sample(r) for r in rows[10:]] == [b.sample(r) for r in rows[10:]]
    a.reset()
    assert [a.sample(r) for r in rows[:10]] == first
    assert [build_chain(params, n_vocab=500).sample(r) for r in rows[:1]] == first[:1]
    assert len(set(first)) > 3  # actually random, not greedy


def test_dist_frequencies():
    p = np.array([0.5, 0.3, 0.15, 0.05])
    s = DistSampler(77)
    counts = np.zeros(4)
    n = 4000
    for _ in range(n):
        cur = TokenDataArray.from_logits(np.log(p))
        s.apply(cur)
        counts[cur.ids[cur.selected]] += 1
    chi2 = (((counts - n * p) ** 2) / (n * p)).sum()
    assert chi2 < 16.3  # p = 0.001 for 3 degrees of freedom


def test_penalties_window_and_accept():
    s = PenaltiesSampler(2, 2.0, 0.0, 0.0)
    chain = SamplerChain().add(s).add(GreedySampler())
    logits = np.array([4.0, 3.0, 1.0, -1.0], np.float32)
    for t in (0, 1):
        chain.accept(t)
    cur = TokenDataArray.from_logits(logits)
    chain.apply(cur)
    np.testing.assert_allclose(cur.logits, [2.0, 1.5, 1.0, -1.0])
    chain.accept(3)  # window of 2: token 0 drops out
    cur = TokenDataArray.from_logits(logits)
    chain.apply(cur)
    np.testing.assert_allclose(cur.logits, [4.0, 1.5, 1.0, -2.0])
    chain.reset()
    cur = TokenDataArray.from_logits(logits)
    chain.apply(cur)
    np.testing.assert_allclose(cur.logits, logits)


def test_penalties_on_sorted_candidates():
    s = PenaltiesSampler(4, 1.0, 1.0, 0.5)
    s.accept(7)
    s.accept(7)
    cur = TokenDataArray.from_logits(np.arange(10, dtype=np.float32))
    TopKSampler(5).apply(cur)  # ids 9..5, no longer the identity layout
    s.apply(cur)
    assert cur.logits[list(cur.ids).index(7)] == pytest.approx(7 - 2.5)


def test_logit_bias_bans_and_validates():
    logits = np.array([1.0, 5.0, 2.0], np.float32)
    chain = build_chain(SamplingParams(temp=0.0, logit_bias={1: -math.inf}), n_vocab=3)
    assert chain.sample(logits) == 2
    with pytest.raises(SamplingError, match="token 3"):
        LogitBiasSampler(3, {3: 1.0})
    cur = TokenDataArray.from_logits(logits)
    MinPSampler(0.5).apply(cur)
    cur.take(np.array([0]), True)  # only token 1 left, not in identity layout
    # llama.cpp searches moved candidates once per candidate: a repeated token gets its first bias only
    LogitBiasSampler(3, [(1, 1.0), (1, 1.0), (0, 5.0)]).apply(cur)
    assert cur.logits.tolist() == [6.0]


def test_mirostat_chains_sample_and_adapt():
    rng = np.random.default_rng(1)
    logits = rng.standard_normal(1000).astype(np.float32) * 3
    for version in (1, 2):
        chain = build_chain(SamplingParams(mirostat=version, seed=9, temp=1.0), n_vocab=1000)
        assert [s.name for s in chain][-1] == ("mirostat" if version == 1 else "mirostat-v2")
        mu0 = chain[-1].mu
        toks = [chain.sample(logits) for _ in range(5)]
        assert all(0 <= t < 1000 for t in toks)
        assert chain[-1].mu != mu0
        clone = chain.clone()
        assert chain.sample(logits) == clone.sample(logits)


def test_other_samplers_build_and_run():
    params = SamplingParams(
        seed=2,
        typ_p=0.9,
        top_n_sigma=2.0,
        xtc_probability=0.5,
        xtc_threshold=0.1,
        dynatemp_range=0.5,
        penalty_repeat=1.1,
        penalty_freq=0.1,
        penalty_present=0.1,
        dry_multiplier=0.8,
        min_keep=2,
    )
    chain = build_chain(params, n_vocab=300)
    assert not any(s.name.startswith("?") for s in chain)
    logits = np.random.default_rng(2).standard_normal(300).astype(np.float32)
    for _ in range(20):
        chain.accept(chain.sample(logits))
    adaptive = build_chain(
        SamplingParams(samplers=["top_k", "adaptive_p"], adaptive_target=0.3, seed=1), n_vocab=300
    )
    assert adaptive[-1].name == "adaptive-p"
    adaptive.accept(adaptive.sample(logits))


class FakeVocab:
    """Token texts for DRY breakers and end-of-generation tokens for ignore_eos."""

    pieces = [b"a", b"b", b"\n", b"x:", b"<eos>", b'"', b"*y", b"c"]
    n_tokens = len(pieces)

    def token_to_piece(self, token: int, special: bool = False) -> bytes:
        return self.pieces[token]

    def tokenize(self, text, add_special=True, parse_special=False):
        return [self.pieces.index(bytes([c])) for c in text]

    def is_eog(self, token: int) -> bool:
        return token == 4


def test_dry_breakers_from_vocab_and_ignore_eos():
    vocab = FakeVocab()
    br = breakers_from_vocab(vocab, ["\n", ":", "ab"])
    assert br[2] == [()] and br[3] == [()]
    assert br[0] == [(1,)]  # "a" starts the breaker "ab"; the tail "b" is token 1
    dry = DRYSampler(1.0, 1.75, 2, 64, ["\n"], vocab)
    for t in [0, 7, 1, 0, 7]:
        dry.accept(t)
    cur = TokenDataArray.from_logits(np.zeros(8, np.float32))
    dry.apply(cur)
    assert cur.logits[1] < 0 and cur.logits[0] == 0  # "a c" repeats: "b" would extend it
    chain = build_chain(SamplingParams(ignore_eos=True, temp=0.0), vocab=vocab)
    logits = np.zeros(8, np.float32)
    logits[4] = 10
    assert chain.sample(logits) != 4
    with pytest.raises(SamplingError, match="ignore_eos needs the vocabulary"):
        build_chain(SamplingParams(ignore_eos=True), n_vocab=8)


@pytest.mark.parametrize(
    "params,match",
    [
        (SamplingParams(penalty_repeat=0.0), "penalty_repeat"),
        (SamplingParams(penalty_freq=math.nan), "penalty_freq"),
        (SamplingParams(mirostat=3), "mirostat"),
        (SamplingParams(samplers=["top_k", "bogus"]), "bogus"),
        (SamplingParams(penalty_last_n=-1, penalty_repeat=1.1), "n_ctx"),
    ],
)
def test_bad_params(params, match):
    with pytest.raises(SamplingError, match=match):
        build_chain(params, n_vocab=10)


def test_bad_logits():
    chain = build_chain(SamplingParams(seed=1), n_vocab=4)
    with pytest.raises(SamplingError, match="NaN"):
        chain.sample(np.array([0, np.nan, 1, 2], np.float32))
    with pytest.raises(SamplingError, match="vocabulary has 4"):
        chain.sample(np.zeros(5, np.float32))
    with pytest.raises(SamplingError, match="row 3 out of range"):
        chain.sample(np.zeros((2, 4), np.float32), idx=3)
    with pytest.raises(SamplingError, match="selected no token"):
        SamplerChain().add(TopKSampler(2)).sample(np.zeros(4, np.float32))
    with pytest.raises(SamplingError, match="every token banned"):
        SamplerChain().add(DistSampler(1)).sample(np.full(4, -np.inf, np.float32))
    assert issubclass(SamplingError, LlamapyError)


def test_sample_accept_flag():
    chain = build_chain(SamplingParams(seed=1, penalty_repeat=1.5), n_vocab=4)
    tok = chain.sample(np.arange(4, dtype=np.float32), accept=True)
    assert chain[0]._count == {tok: 1}
    assert chain.n_sample == 1


def _naive_breakers(pieces, tokenize, breakers, max_tail_len=20):
    """llama.cpp's get_overlapping_token_sequences, loop for loop."""
    out = {}
    for s in breakers:
        bs = s.encode()
        for tok, word in enumerate(pieces):
            if bs in word:
                out.setdefault(tok, []).append(())
                continue
            pos = word.find(bs[:1])
            while pos != -1:
                i, match = 1, True
                while i < len(bs) and i + pos < len(word):
                    if word[pos + i] != bs[i]:
                        match = False
                        break
                    i += 1
                if match:
                    tail = tuple(tokenize(bs[i:]))[:max_tail_len]
                    if tail not in out.setdefault(tok, []):
                        out[tok].append(tail)
                pos = word.find(bs[:1], pos + 1)
    return out


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.binary(min_size=1, max_size=5).map(lambda b: bytes(b"ab:\n"[x % 4] for x in b)), max_size=30),
    st.lists(st.text(alphabet="ab:\n", min_size=1, max_size=4), min_size=1, max_size=3),
)
def test_breakers_match_llama_cpp_loop(extra, breakers):
    class V:
        pieces = [b"a", b"b", b":", b"\n", *extra]
        n_tokens = len(pieces)

        def token_to_piece(self, t, special=False):
            return self.pieces[t]

        def tokenize(self, text, add_special=True, parse_special=False):
            return [self.pieces.index(bytes([c])) for c in text]

    v = V()
    got = breakers_from_vocab(v, breakers)
    want = _naive_breakers(V.pieces, v.tokenize, breakers)
    assert {k: sorted(x) for k, x in got.items()} == {k: sorted(x) for k, x in want.items()}


@settings(max_examples=30, deadline=None)
@given(finite_logits, st.integers(0, 2**32 - 2))
def test_dist_pass_matches_reference(logits, seed):
    """llama.cpp's dist: float32 exp(l - max), a double running sum, the first index reaching total * u."""
    from llamapy.sampling import MT19937

    u = MT19937(seed).uniform_double()
    p = np.exp(logits - logits.max()).astype(np.float32)
    run = np.cumsum(p.astype(np.float64))
    expected = min(int(np.searchsorted(run, run[-1] * u, side="left")), len(p) - 1)
    if len(logits) == 1:
        expected = 0
    cur = TokenDataArray.from_logits(logits)
    DistSampler(seed).apply(cur)
    assert cur.selected == expected
    np.testing.assert_allclose(cur.p, p / run[-1], rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("model", ["smollm2-135m-q4_1", "gemma3-270m-q4_k_m"])
def test_real_logits_greedy_and_default_chain(model):
    """llama.cpp's last-position logits of the reference prompts: temp 0 picks llama.cpp's first greedy
    token; the default chain keeps at most 40 candidates with probabilities summing to 1."""
    from tests.util import shared_path

    z = np.load(shared_path("reference", model, "logits.npz"))
    prompts = sorted({k.split("_")[0] for k in z.files})
    assert prompts
    for p in prompts:
        logits = z[f"{p}_last_logits"]
        first = int(z[f"{p}_greedy"][0])
        assert build_chain(SamplingParams(temp=0.0), n_vocab=len(logits)).sample(logits) == first
        assert greedy_chain().sample(logits) == first
        chain = build_chain(SamplingParams(seed=11), n_vocab=len(logits))
        tok = chain.sample(logits)
        assert tok in chain.cur.ids and chain.cur.size <= 40
        assert abs(float(chain.cur.p.sum()) - 1.0) < 1e-5


def test_grammar_goes_after_bias_and_penalties_and_sees_generated_tokens_only():
    from llamapy.sampling import Sampler, SamplingParams, build_chain

    class Recorder(Sampler):
        name = "grammar"

        def __init__(self):
            self.accepted = []

        def accept(self, token):
            self.accepted.append(token)

    g = Recorder()
    params = SamplingParams(penalty_repeat=1.1, logit_bias={1: 2.0}, seed=1)
    chain = build_chain(params, n_vocab=8, grammar=g)
    names = [s.name for s in chain.samplers]
    assert names[: names.index("grammar")] == ["logit-bias", "penalties", "?dry"]
    chain.accept_prompt([3, 4])
    chain.accept(5)
    assert g.accepted == [5]
    clone = chain.clone()
    assert clone.grammar is not g and clone.grammar in clone.samplers
    chain.set_grammar(None)
    assert "grammar" not in [s.name for s in chain.samplers] and chain.grammar is None
