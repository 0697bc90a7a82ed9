"""GrammarSampler: masks on full and partial candidate arrays, EOG, finishing, bad tokens, reset, rollback,
clone, the chain, and random walks whose outputs an independent parser checks."""

from __future__ import annotations

import json
import re
import time

import lark
import numpy as np
import pytest

from llamapy.grammar import GrammarError, GrammarSampler, LlamaGrammar
from llamapy.sampling import GreedySampler, Sampler, SamplerChain, SamplingParams, TokenDataArray, build_chain
from tests.grammar.conftest import EOS, EOT, PAD, allowed, apply_full, is_allowed, matches, random_walk
from tests.grammar.test_gbnf import JSON_GBNF

EXPR = r"""
root ::= expr
expr ::= term (ws [-+] ws term)*
term ::= factor (ws [*/] ws factor)*
factor ::= [0-9]+ | "(" ws expr ws ")" | name "(" args? ")"
args ::= expr ("," ws expr)*
name ::= [a-z] [a-z0-9]*
ws ::= " "?
"""

EXPR_LARK = r"""
start: expr
expr: term (WS? /[-+]/ WS? term)*
term: factor (WS? /[*\/]/ WS? factor)*
factor: /[0-9]+/ | "(" WS? expr WS? ")" | NAME "(" args? ")"
args: expr ("," WS? expr)*
NAME: /[a-z][a-z0-9]*/
WS: " "
"""


def test_is_a_sampler(toy):
    s = LlamaGrammar.from_string('root ::= "a"').sampler(toy)
    assert isinstance(s, Sampler) and isinstance(s, GrammarSampler) and s.name == "llguidance"
    assert s.active and not s.is_accepting() and not s.is_finished()


def test_apply_full_and_partial_candidates(toy):
    s = LlamaGrammar.from_string('root ::= [a-c] "x"').sampler(toy)
    ok = set(allowed(s).tolist())
    assert ok >= {97, 98, 99} and 100 not in ok and EOS not in ok
    lg = apply_full(s, toy.n_tokens)
    assert set(np.flatnonzero(np.isfinite(lg)).tolist()) == ok
    # a subset in another order, with ids past the vocabulary
    ids = np.array([300, 99, 5, 97, toy.n_tokens + 7, 264], dtype=np.int32)
    cur = TokenDataArray(ids, np.zeros(len(ids), np.float32))
    s.apply(cur)
    assert np.isfinite(cur.logits).tolist() == [i in ok for i in ids.tolist()]
    # more logits than the vocabulary has tokens: the extra ones are banned
    lg = apply_full(s, toy.n_tokens + 40)
    assert not np.isfinite(lg[toy.n_tokens :]).any()
    # the caller's logits are not written
    row = np.zeros(toy.n_tokens, np.float32)
    cur = TokenDataArray.from_logits(row)
    s.apply(cur)
    assert (row == 0).all() and np.isinf(cur.logits).any()


def test_eog_allowed_exactly_when_accepting(toy):
    g = LlamaGrammar.from_string('root ::= "a"+ ("b" "c"?)?')
    s = g.sampler(toy)
    for t in [97, 97, 98, 99]:
        for eog in (EOS, EOT):
            assert is_allowed(s, eog) == s.is_accepting()
        assert not is_allowed(s, PAD)
        s.accept(t)
    assert s.is_accepting() and s.is_finished()
    assert set(allowed(s).tolist()) == {EOS, EOT}  # finished: only end-of-generation
    lg = apply_full(s, toy.n_tokens)
    assert set(np.flatnonzero(np.isfinite(lg)).tolist()) == {EOS, EOT}
    s.accept(EOT)
    assert s.is_finished()


def test_forbidden_token_raises_and_keeps_the_state(toy):
    s = LlamaGrammar.from_string('root ::= "ab" | "ac"').sampler(toy)
    s.accept(97)
    before = allowed(s).tolist()
    with pytest.raises(GrammarError, match=r"token 120 \(b'x'\) is not allowed"):
        s.accept(120)
    with pytest.raises(GrammarError, match="out of range"):
        s.accept(toy.n_tokens)
    with pytest.raises(GrammarError, match="not complete"):
        s.accept(EOS)
    assert allowed(s).tolist() == before
    s.accept(99)
    assert s.is_finished()
    with pytest.raises(GrammarError, match="finished"):
        s.accept(97)


def _masks(s: GrammarSampler, toks: list[int]) -> list[list[int]]:
    out = [allowed(s).tolist()]
    for t in toks:
        s.accept(t)
        out.append(allowed(s).tolist())
    return out


def test_reset_rollback_clone(toy):
    g = LlamaGrammar.from_string(EXPR)
    toks = toy.tokenize("12+f(3, g(1))*(4-5)")
    ref = _masks(g.sampler(toy), toks)
    s = g.sampler(toy)
    _masks(s, toks[:7])
    s.reset()
    assert _masks(s, toks) == ref
    for keep in (len(toks) - 1, 5, 0):
        s.rollback(len(s._history) - keep)
        assert allowed(s).tolist() == ref[keep]
        assert _masks(s, toks[keep:]) == ref[keep:]
    with pytest.raises(GrammarError, match="cannot roll back"):
        s.rollback(len(toks) + 1)
    c = g.sampler(toy)
    _masks(c, toks[:4])
    d = c.clone()
    _masks(c, toks[4:9])
    assert allowed(d).tolist() == ref[4] and allowed(c).tolist() == ref[9]
    assert _masks(d, toks[4:]) == ref[4:]


def test_rollback_of_end_of_generation(toy):
    s = LlamaGrammar.from_string('root ::= "a"+').sampler(toy)
    s.accept(97)
    s.accept(EOS)
    assert s.is_finished()
    s.rollback(1)
    assert not s.is_finished() and is_allowed(s, 97)


def test_in_a_sampler_chain(toy):
    g = LlamaGrammar.from_string('root ::= "yes" | "no"')
    chain = build_chain(SamplingParams(temp=0.0), n_vocab=toy.n_tokens)
    chain.set_grammar(g.sampler(toy))
    rng = np.random.default_rng(3)
    out = []
    for _ in range(10):
        t = chain.sample(rng.standard_normal(toy.n_tokens).astype(np.float32))
        if t in (EOS, EOT):
            break
        chain.accept(t)
        out.append(t)
    assert b"".join(toy.pieces[t] for t in out) in (b"yes", b"no")
    c = SamplerChain().add(g.sampler(toy)).add(GreedySampler()).clone()
    assert c.sample(np.zeros(toy.n_tokens, np.float32)) in (ord("y"), ord("n"))


def _text(vocab, toks):
    return b"".join(vocab.token_to_piece(t, special=True) for t in toks).decode("utf-8")


@pytest.mark.parametrize("seed", range(4))
def test_random_walks_parse(toy, smollm2, seed):
    rng = np.random.default_rng(seed)
    expr = LlamaGrammar.from_string(EXPR)
    oracle = lark.Lark(EXPR_LARK, parser="earley", lexer="dynamic")
    js = LlamaGrammar.from_string(JSON_GBNF)
    rx_src = r"(\+[0-9]{1,3} )?[0-9]{3}-[0-9]{4}( x[0-9]{1,4})?"  # (Rust's \d has every Unicode digit)
    rx = LlamaGrammar.from_regex(rx_src)
    for vocab in (toy, smollm2):
        toks, done = random_walk(expr.sampler(vocab), vocab, rng, max_steps=60, eog_weight=0.3)
        if done:
            oracle.parse(_text(vocab, toks))
        toks, done = random_walk(js.sampler(vocab), vocab, rng, max_steps=300, eog_weight=0.3)
        if done:
            json.loads(_text(vocab, toks))
        toks, done = random_walk(rx.sampler(vocab), vocab, rng, max_steps=60, eog_weight=0.3)
        assert done
        assert re.fullmatch(rx_src, _text(vocab, toks))


def test_deep_recursion_is_bounded(toy):
    """1000 steps deep into right recursion (the Earley state grows) stay quick; beyond llguidance's
    limits (2000 items in a row) the matcher fails with a GrammarError, neither hanging nor crashing."""
    g = LlamaGrammar.from_string('root ::= "a" root | "a" "b"')
    s = g.sampler(toy)
    t = time.perf_counter()
    for _ in range(1000):
        assert not is_allowed(s, EOS)
        s.accept(97)
    s.accept(98)
    assert s.is_finished()
    assert time.perf_counter() - t < 10
    s = g.sampler(toy)
    with pytest.raises(GrammarError, match="matcher failed"):
        for i in range(3000):
            if i > 1900:
                is_allowed(s, EOS)
            s.accept(97)
        s.accept(98)


def test_grammar_with_an_empty_language_is_refused():
    with pytest.raises(GrammarError, match="can never be completed"):
        LlamaGrammar.from_string('root ::= "(" root ")"')
    with pytest.raises(GrammarError, match="can never be completed"):
        LlamaGrammar.from_string("root ::= [] x\nx ::= x")


@pytest.mark.parametrize(
    "gbnf, text",
    [
        ('root ::= expr\nexpr ::= "(" ws (expr ws)* ")" | atom\natom ::= [^() \\n]+\nws ::= [ \\n]*', "(a (b c) (d (e f)))"),
        ('root ::= elem\nelem ::= "<" name ">" content "</" name ">"\ncontent ::= (elem | [^<]+)*\nname ::= [a-z]+',
         "<a>hi there<b>yo</b>x</a>"),
    ],
)  # fmt: skip
def test_recursive_free_text_grammars_follow_a_real_vocabulary(smollm2, gbnf: str, text: str) -> None:
    """Free text that cannot be one lexeme is written a character a lexeme; on SmolLM2's 49k tokens its
    masks visit more Earley items than llguidance's default 50k ('Too many items' after '(a' / '<a>')."""
    assert matches(LlamaGrammar.from_string(gbnf), smollm2, text)
