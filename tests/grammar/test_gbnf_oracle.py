"""Random GBNF grammars against an independent parser: Python ``lark``'s Earley, one terminal per character.

The converted grammar must accept exactly the strings the oracle accepts (all strings over {a, b, c} up
to length 4, and some longer ones), fed byte by byte through the sampler's mask. This is what checks the
choice of units (lexemes written whole): an unsafe unit would refuse strings GBNF accepts.
"""

from __future__ import annotations

import itertools
import os

import lark
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from llamapy.grammar import GrammarError, LlamaGrammar
from tests.grammar.conftest import EOS, is_allowed

ALPHABET = "".join(sorted(os.environ.get("GRAMMAR_ALPHABET", "abc")))  # three characters
STRINGS = ["".join(p) for n in range(5) for p in itertools.product(ALPHABET, repeat=n)]

# an expression: ("lit", str) | ("cls", str, negated) | ("ref", i) | ("seq", [e]) | ("alt", [e]) | ("rep", e, lo, hi)
lit = st.text(ALPHABET, min_size=1, max_size=3).map(lambda s: ("lit", s))
_A, _B, _C = ALPHABET
cls = st.tuples(
    st.just("cls"), st.sampled_from([_A, _B, _C, _A + _B, f"{_A}-{_B}", f"{_B}-{_C}", _A + _C]), st.booleans()
)
any_char = st.just(("any",))


def exprs(n_rules: int):
    ref = st.integers(0, n_rules - 1).map(lambda i: ("ref", i))
    leaf = st.one_of(lit, lit, cls, ref, any_char)
    return st.recursive(
        leaf,
        lambda e: st.one_of(
            st.lists(e, min_size=2, max_size=3).map(lambda xs: ("seq", xs)),
            st.lists(e, min_size=2, max_size=3).map(lambda xs: ("alt", xs)),
            st.tuples(e, st.sampled_from([(0, None), (1, None), (0, 1), (2, 3), (1, 2), (2, None)])).map(
                lambda t: ("rep", t[0], t[1][0], t[1][1])
            ),
        ),
        max_leaves=6,
    )


@st.composite
def grammars(draw):
    n = draw(st.integers(1, 3))
    return [draw(exprs(n)) for _ in range(n)]


def to_gbnf(e) -> str:
    k = e[0]
    if k == "lit":
        return '"' + e[1] + '"'
    if k == "cls":
        return "[" + ("^" if e[2] else "") + e[1] + "]"
    if k == "ref":
        return f"r{e[1]}"
    if k == "any":
        return "."
    if k == "seq":
        return "(" + " ".join(to_gbnf(x) for x in e[1]) + ")"
    if k == "alt":
        return "(" + " | ".join(to_gbnf(x) for x in e[1]) + ")"
    lo, hi = e[2], e[3]
    q = {(0, None): "*", (1, None): "+", (0, 1): "?"}.get(
        (lo, hi), "{" + f"{lo}," + ("" if hi is None else str(hi)) + "}"
    )
    return "(" + to_gbnf(e[1]) + ")" + q


def to_lark(e) -> str:
    k = e[0]
    if k == "lit":
        return " ".join(f'"{c}"' for c in e[1])
    if k == "cls":
        return "/[" + ("^" if e[2] else "") + e[1] + "]/"
    if k == "ref":
        return f"r{e[1]}"
    if k == "any":
        return "/./"
    if k == "seq":
        return "(" + " ".join(to_lark(x) for x in e[1]) + ")"
    if k == "alt":
        return "(" + " | ".join(to_lark(x) for x in e[1]) + ")"
    lo, hi = e[2], e[3]
    inner = "(" + to_lark(e[1]) + ")"
    if hi is None:
        return f"({inner}~{lo} {inner}*)" if lo else f"{inner}*"
    return f"[{inner}]" if (lo, hi) == (0, 1) else f"{inner}~{lo}..{hi}"


def accepts(g: LlamaGrammar, vocab, s: str) -> bool:
    smp = g.sampler(vocab)
    for b in s.encode():
        if not is_allowed(smp, b):
            return False
        smp.accept(b)
    return smp.is_accepting() and is_allowed(smp, EOS)


@settings(
    max_examples=int(os.environ.get("GRAMMAR_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(grammars(), st.lists(st.text(ALPHABET, min_size=5, max_size=9), max_size=6))
def test_random_grammars_match_an_earley_oracle(bytes_vocab, rules, extra):
    gbnf = "root ::= r0\n" + "\n".join(f"r{i} ::= {to_gbnf(e)}" for i, e in enumerate(rules))
    larkg = "start: r0\n" + "\n".join(f"r{i}: {to_lark(e)}" for i, e in enumerate(rules))
    try:
        oracle = lark.Lark(larkg, parser="earley", lexer="dynamic")
    except lark.exceptions.GrammarError:
        assume(False)
        return

    def ok(s: str) -> bool:
        try:
            oracle.parse(s)
            return True
        except lark.exceptions.LarkError:
            return False
        except RecursionError:
            assume(False)
            return False

    try:
        g = LlamaGrammar.from_string(gbnf)
    except GrammarError as e:  # a grammar whose language is empty is refused
        assert "can never be completed" in str(e)
        assert not any(ok(s) for s in STRINGS + extra)
        return
    wrong = [s for s in STRINGS + extra if accepts(g, bytes_vocab, s) != ok(s)]
    assert not wrong, (
        f"{gbnf}\n{g._lark if isinstance(g._lark, str) else g._lark.lark}\ndiffer on {wrong[:8]}"
    )


@pytest.mark.parametrize(
    "gbnf",
    [
        'root ::= "a" [ab]* "b" | "ab" "c"+',
        'root ::= x x\nx ::= [ab]+ | "c" [a]*',
        'root ::= ("ab" | "a") ("bc" | "c")',
        'root ::= x "a"\nx ::= [a-c]* "b"',
        'root ::= ([ab] "c"?)+ "c"',
        'root ::= "a"{2,3} "a"?',
    ],
)
def test_fixed_grammars_match_an_earley_oracle(bytes_vocab, gbnf):
    rules = dict(line.split(" ::= ") for line in gbnf.splitlines())
    larkg = "\n".join(
        ("start" if k == "root" else k) + ": " + _gbnf_rule_to_lark(v) for k, v in rules.items()
    )
    oracle = lark.Lark(larkg, parser="earley", lexer="dynamic")
    g = LlamaGrammar.from_string(gbnf)
    strings = STRINGS + ["".join(np.random.default_rng(i).choice(list(ALPHABET), 7)) for i in range(20)]

    def ok(s: str) -> bool:
        try:
            oracle.parse(s)
            return True
        except lark.exceptions.LarkError:
            return False

    wrong = [s for s in strings if accepts(g, bytes_vocab, s) != ok(s)]
    assert not wrong, wrong


def _gbnf_rule_to_lark(body: str) -> str:
    import re

    def lit(m: re.Match[str]) -> str:
        return " ".join(f'"{c}"' for c in m.group(1))

    body = re.sub(r'"([a-c]+)"', lit, body)
    body = re.sub(r"\[([^\]]+)\]", r"/[\1]/", body)
    body = re.sub(r"\{(\d+),(\d+)\}", r"~\1..\2", body)
    return body
