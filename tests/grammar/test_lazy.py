"""Lazy grammars: nothing constrained before a trigger fires, the grammar from the trigger on after it."""

from __future__ import annotations

import numpy as np
import pytest

from llamapy.grammar import GrammarError, LlamaGrammar, Trigger
from tests.grammar.conftest import EOS, TOOL_CALL, allowed, apply_full, is_allowed

CALL = 'root ::= "<tool_call>" "{" [a-z]* "}"'


def feed(s, vocab, text_or_ids):
    ids = text_or_ids if isinstance(text_or_ids, list) else vocab.tokenize(text_or_ids)
    for t in ids:
        s.accept(t)


def test_word_trigger(toy):
    g = LlamaGrammar.from_string(CALL).lazy([Trigger("word", "<tool_call>")])
    assert g.triggers == (Trigger("word", "<tool_call>"),) and g.kind == "gbnf"
    s = g.sampler(toy)
    assert not s.active and s.is_accepting() and not s.is_finished()
    assert np.isfinite(apply_full(s, toy.n_tokens)).all()  # no constraint before the trigger
    feed(s, toy, "hello world, <tool")
    assert not s.active and np.isfinite(apply_full(s, toy.n_tokens)).all()
    feed(s, toy, "_call>")  # the trigger is complete
    assert s.active and not s.is_accepting() and not is_allowed(s, EOS)
    assert [toy.pieces[t] for t in allowed(s)] == [b"{"] or set(allowed(s).tolist()) >= {ord("{")}
    lg = apply_full(s, toy.n_tokens)
    assert not np.isfinite(lg[ord("x")])
    feed(s, toy, "{abc}")
    assert s.is_finished()


def test_trigger_inside_a_token(toy):
    # "call>" starts one byte into the token "_call>": that token is cut and re-tokenized
    g = LlamaGrammar.from_string('root ::= "call>" [0-9]').lazy([Trigger("word", "call>")])
    s = g.sampler(toy)
    feed(s, toy, [*toy.tokenize("<tool"), toy.tokenize("_call>")[0]])
    assert s.active and s._replayed == 5
    assert set(allowed(s).tolist()) == set(range(ord("0"), ord("9") + 1))


def test_pattern_trigger_starts_at_the_first_group(toy):
    g = LlamaGrammar.from_string('root ::= "{" [a-z]* "}"').lazy([Trigger("pattern", r"[a-z]+: *(\{)")])
    s = g.sampler(toy)
    feed(s, toy, "say: {")
    assert s.active
    feed(s, toy, "ok}")
    assert s.is_finished()
    # no group: the match start
    g = LlamaGrammar.from_string('root ::= "ab" [0-9]').lazy([Trigger("pattern", "a[b]")])
    s = g.sampler(toy)
    feed(s, toy, "xxab")
    assert s.active and set(allowed(s).tolist()) >= {ord("1")} and not is_allowed(s, ord("a"))


def test_pattern_full_trigger(toy):
    g = LlamaGrammar.from_string('root ::= "{" [a-z]* "}"').lazy([Trigger("pattern_full", r"\s*(\{.*)")])
    s = g.sampler(toy)
    feed(s, toy, "x {")  # does not match the whole output: stays inactive
    assert not s.active
    s = g.sampler(toy)
    feed(s, toy, "  {a")
    assert s.active and s._replayed == 1  # fired at "{": "a" came after, constrained
    feed(s, toy, "}")
    assert s.is_finished()


def test_token_trigger(toy):
    # the grammar starts with the special token itself
    g = LlamaGrammar.from_string(f'root ::= <[{TOOL_CALL}]> "{{}}"').lazy([Trigger("token", TOOL_CALL)])
    s = g.sampler(toy)
    feed(s, toy, "plain text <|tool_call|>")  # text spelling it out is not the token
    assert not s.active
    s.accept(TOOL_CALL)
    assert s.active and set(allowed(s).tolist()) <= {ord("{"), toy.tokenize("{}")[0]}
    # a grammar that spells the special token out as text gets it as text
    g = LlamaGrammar.from_string('root ::= "<|tool_call|>" [0-9]').lazy([Trigger("token", TOOL_CALL)])
    s = g.sampler(toy)
    s.accept(TOOL_CALL)
    assert s.active and is_allowed(s, ord("7")) and not is_allowed(s, ord("x"))


def test_earliest_trigger_wins(toy):
    g = LlamaGrammar.from_string('root ::= "ab" [a-z]*').lazy([Trigger("word", "bc"), Trigger("word", "ab")])
    s = g.sampler(toy)
    feed(s, toy, [ord("x"), toy.tokenize("abc")[0]])
    assert s.active and s.is_accepting()  # the grammar got "abc" (from "ab"), not "bc"


def test_text_that_does_not_match_is_dropped_and_the_grammar_constrains(toy):
    g = LlamaGrammar.from_string('root ::= "hellO" [0-9]').lazy([Trigger("word", "hello")])
    s = g.sampler(toy)
    feed(s, toy, [toy.tokenize("hello")[0]])  # "hello", one token: the grammar takes "hell", not "o"
    assert s.active and s._replayed == 4
    assert set(allowed(s).tolist()) == {ord("O")}  # constrained from the state after "hell"
    s.accept(ord("O"))
    s.accept(ord("1"))
    assert s.is_finished()


def test_reset_rollback_clone_of_lazy(toy):
    g = LlamaGrammar.from_string(CALL).lazy([Trigger("word", "<tool_call>")])
    s = g.sampler(toy)
    feed(s, toy, "hi ")
    c = s.clone()
    feed(s, toy, "<tool_call>{")
    assert s.active and not c.active
    feed(c, toy, "there")
    assert not c.active and c._buf == b"hi there"
    s.rollback(1)  # "{": after the activation
    assert s.active and is_allowed(s, ord("{"))
    s.rollback(1)  # "_call>": crosses the activation, replayed from the start
    assert not s.active
    feed(s, toy, "_call>")
    assert s.active
    s.reset()
    assert not s.active and s._buf == b""


def test_trigger_validation(toy):
    with pytest.raises(GrammarError, match="kind"):
        Trigger("regex", "x")
    with pytest.raises(GrammarError, match="not a valid regex"):
        Trigger("pattern", "(")
    with pytest.raises(GrammarError, match="token id"):
        Trigger("token", "5")
    with pytest.raises(GrammarError, match="non-empty"):
        Trigger("word", "")
    g = LlamaGrammar.from_string(CALL)
    with pytest.raises(GrammarError, match="at least one"):
        g.lazy([])
    with pytest.raises(GrammarError, match="expected a Trigger"):
        g.lazy([("word", "x")])
    with pytest.raises(GrammarError, match="out of range"):
        g.lazy([Trigger("token", 10**6)]).sampler(toy)
    assert g.triggers == ()  # lazy() made a copy


def test_lazy_on_a_real_vocabulary(smollm2):
    g = LlamaGrammar.from_json_schema(
        {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    )
    s = g.lazy([Trigger("pattern", r"<tool_call>\s*(\{)")]).sampler(smollm2)
    feed(s, smollm2, smollm2.tokenize("I will call it. <tool_call>\n{", add_special=False))
    assert s.active
    feed(s, smollm2, smollm2.tokenize('"n": 4}', add_special=False))
    assert s.is_finished()


def test_long_unconstrained_output_stays_cheap(toy):
    import time

    g = LlamaGrammar.from_string(CALL).lazy([Trigger("word", "<tool_call>"), Trigger("pattern", r"\bCALL\(")])
    s = g.sampler(toy)
    ids = toy.tokenize("hello world, no tool here. " * 150)  # ~4000 bytes
    t = time.perf_counter()
    feed(s, toy, ids)
    assert not s.active
    assert time.perf_counter() - t < 3.0
    feed(s, toy, "<tool_call>")
    assert s.active
