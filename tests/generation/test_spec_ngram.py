"""n-gram self-speculative drafts (llama.cpp's ``--spec-type ngram-simple`` / ``ngram-map-k``): the
lookups against a literal port of ``common_ngram_simple_draft``, and through the one token loop the
same output as without a draft, with fewer decodes on repetitive text (fake model and SmolLM2)."""

from __future__ import annotations

import numpy as np
import pytest

from llamapy import Llama
from llamapy.generation.mtp import MtpError
from llamapy.generation.ngram import NgramError, NgramMapK, NgramSimple, ngram_simple_draft
from llamapy.generation.speculative import make_spec_draft
from tests.test_speculative import PROMPT, REPETITIVE, _count_decodes, fake


def port_of_llamacpp(tokens: list[int], sampled: int, n: int, m: int) -> list[int]:
    """common/ngram-map.cpp's common_ngram_simple_draft, loop for loop."""
    cur_len = len(tokens)
    if cur_len <= n + m + 1:
        return []
    pattern = [tokens[j] for j in range(cur_len - n + 1, cur_len)] + [sampled]
    match_pos = 0
    j = cur_len - n - 1
    while j > 0:
        if all(tokens[j + k] == pattern[k] for k in range(len(pattern))):
            match_pos = j
            break
        j -= 1
    if match_pos == 0:
        return []
    copy_max = min(m, cur_len - (match_pos + n))
    if copy_max < n:
        return []
    return [tokens[match_pos + n + j] for j in range(copy_max)]


def test_ngram_simple_is_llamacpps_lookup() -> None:
    rng = np.random.default_rng(0)
    n_found = 0
    for _ in range(400):
        vocab = int(rng.integers(2, 6))
        hist = [int(t) for t in rng.integers(0, vocab, int(rng.integers(0, 60)))]
        sampled = int(rng.integers(0, vocab))
        n, m = int(rng.integers(1, 4)), int(rng.integers(1, 8))
        want = port_of_llamacpp(hist, sampled, n, m)
        assert ngram_simple_draft([*hist, sampled], n, m) == want, (hist, sampled, n, m)
        n_found += bool(want)
    assert n_found > 50


def test_ngram_map_k_drafts_and_forgets_a_rewritten_tail() -> None:
    d = NgramMapK(size_n=2, size_m=3)
    seq = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2]
    assert d(np.array(seq)).tolist() == [3, 4, 5]
    assert d.n_drafted == 3
    # a rewritten history: the key (1, 2) now continues with 7 9 9
    seq2 = [1, 2, 7, 9, 9, 0, 0, 0, 0, 0, 0, 1, 2]
    assert d(np.array(seq2)).tolist() == [7, 9, 9]
    assert d(np.array([5, 6])).tolist() == []  # too short: nothing
    hits = NgramMapK(size_n=2, size_m=3, min_hits=2)
    assert hits(np.array(seq)).tolist() == []  # first sight of the key
    assert hits(np.array(seq)).tolist() == [3, 4, 5]


def test_bad_parameters_are_typed_errors() -> None:
    for kw in (dict(size_n=0), dict(size_m=0), dict(min_hits=0), dict(size_n=5000)):
        with pytest.raises(NgramError):
            NgramSimple(**kw)
    with pytest.raises(ValueError, match="unknown speculative"):
        make_spec_draft("ngram-lol")


@pytest.mark.parametrize("spec", ["ngram-simple", "ngram-map-k"])
@pytest.mark.parametrize("kw", [dict(max_tokens=64), dict(max_tokens=5), dict(max_tokens=30, stop="ld!")])
def test_same_output_as_without_a_draft(spec: str, kw: dict) -> None:
    plain, ctx0 = fake()
    spec_llm, ctx1 = fake(make_spec_draft(spec, size_n=2, size_m=8))
    want = plain(PROMPT, temperature=0, **kw)
    got = spec_llm(PROMPT, temperature=0, **kw)
    assert got["choices"] == want["choices"] and got["usage"] == want["usage"]
    if kw["max_tokens"] > 5:
        assert ctx1.n_decode_calls < ctx0.n_decode_calls
    n = len(spec_llm._seq)
    assert [ctx1.memory.cells[p] for p in range(n)] == spec_llm._seq.tokens  # no leftover guesses


@pytest.mark.slow
def test_real_model_by_spec_type_name(smollm2_path) -> None:
    """``Llama(draft_model="ngram-simple")``: SmolLM2's greedy text unchanged, fewer decodes."""
    llm = Llama(str(smollm2_path), n_ctx=256, n_batch=64, verbose=False, draft_model="ngram-simple")
    assert isinstance(llm.draft_model, NgramSimple)
    calls = _count_decodes(llm)
    out = {}
    for name, draft in (("spec", llm.draft_model), ("plain", None)):
        llm.draft_model = draft
        llm.reset()
        calls[0] = 0
        r = llm(REPETITIVE, max_tokens=32, temperature=0)
        out[name] = (r["choices"][0]["text"], calls[0])
    assert out["spec"][0] == out["plain"][0]
    assert out["spec"][1] < 0.7 * out["plain"][1], out
    with pytest.raises(MtpError, match="MTP"):
        Llama(str(smollm2_path), n_ctx=256, verbose=False, draft_model="mtp")
