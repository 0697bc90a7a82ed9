"""The generation loop's text handling and KV bookkeeping, with a small fake model/context/vocab.

The fakes check the contract the loop relies on (positions contiguous after the cached ones, seq_rm
and seq_add used consistently), so these tests run without the real engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llamapy.generation import (
    ContextFullError,
    GenerationParams,
    IncrementalDetokenizer,
    PromptTooLongError,
    StopStrings,
    TokenSequence,
    generate,
)

# ------------------------------------------------------------------------------------ fakes


class FakeVocab:
    """Token i is ``pieces[i]``; ids in ``eog`` end generation."""

    def __init__(self, pieces: list[bytes], eog: tuple[int, ...] = ()) -> None:
        self.pieces = pieces
        self.eog = set(eog)

    @property
    def n_tokens(self) -> int:
        return len(self.pieces)

    def token_to_piece(self, token: int, special: bool = False) -> bytes:
        if token in self.eog and not special:
            return b""
        return self.pieces[token]

    def is_eog(self, token: int) -> bool:
        return token in self.eog


@dataclass
class FakeBatch:
    token: list[int]
    pos: list[int]
    seq_id: int
    logits: list[bool]


def fake_batch(tokens, pos0=None, seq_id=0, logits_all=False):
    n = len(tokens)
    return FakeBatch(
        list(tokens), list(range(pos0, pos0 + n)), seq_id, [logits_all or i == n - 1 for i in range(n)]
    )


@dataclass
class FakeMemory:
    cells: dict[int, int] = field(default_factory=dict)  # pos -> token (one sequence)

    def seq_rm(self, seq: int, p0: int, p1: int) -> bool:
        p0 = 0 if p0 < 0 else p0
        p1 = 1 << 30 if p1 < 0 else p1
        for p in [p for p in self.cells if p0 <= p < p1]:
            del self.cells[p]
        return True

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        moved = {p: t for p, t in self.cells.items() if p0 <= p < p1}
        for p in moved:
            del self.cells[p]
        for p, t in moved.items():
            assert p + delta not in self.cells
            self.cells[p + delta] = t


class FakeContext:
    """Next token = rule(tokens in the cache in position order); logits one-hot (10 vs 0)."""

    def __init__(self, n_vocab: int, rule, n_ctx: int = 64, n_batch: int = 8) -> None:
        self.n_vocab, self.rule, self.n_ctx, self.n_batch = n_vocab, rule, n_ctx, n_batch
        self.memory = FakeMemory()
        self.n_decode_calls = 0
        self._logits = np.zeros((0, n_vocab), np.float32)

    def decode(self, batch: FakeBatch) -> None:
        self.n_decode_calls += 1
        assert len(batch.token) <= self.n_batch
        expect = max(self.memory.cells, default=-1) + 1
        assert batch.pos[0] == expect, f"batch starts at {batch.pos[0]}, cache ends at {expect - 1}"
        assert sorted(self.memory.cells) == list(range(expect)), "cache positions are not contiguous"
        rows = []
        for t, p, out in zip(batch.token, batch.pos, batch.logits, strict=True):
            assert p < self.n_ctx
            self.memory.cells[p] = t
            if out:
                row = np.zeros(self.n_vocab, np.float32)
                history = [self.memory.cells[q] for q in sorted(self.memory.cells)]
                row[self.rule(history)] = 10.0
                rows.append(row)
        self._logits = np.array(rows)

    def get_logits(self) -> np.ndarray:
        return self._logits

    def get_logits_ith(self, i: int) -> np.ndarray:
        return self._logits[i]


def greedy(logits: np.ndarray) -> int:
    return int(np.argmax(logits))


LETTERS = [bytes([c]) for c in b"abcdefghij"]


def counter_ctx(n_vocab=10, **kw) -> FakeContext:
    return FakeContext(n_vocab, lambda h: (h[-1] + 1) % n_vocab, **kw)


def seq_of(ctx, **kw) -> TokenSequence:
    return TokenSequence(ctx, batch_factory=fake_batch, **kw)


def run(ctx, vocab, prompt, **params):
    seq = seq_of(ctx)
    steps = list(generate(seq, greedy, vocab, prompt, GenerationParams(**params)))
    return seq, steps, "".join(s.text for s in steps)


# ------------------------------------------------------------------------------------ detokenizer


def test_detokenizer_holds_split_characters():
    # "€" is e2 82 ac, "😀" is f0 9f 98 80: split over tokens
    pieces = [b"a", b"\xe2", b"\x82", b"\xac", b"\xf0\x9f", b"\x98\x80", b" b"]
    d = IncrementalDetokenizer(lambda t: pieces[t])
    out = [d.add(t) for t in range(len(pieces))]
    assert out == ["a", "", "", "€", "", "😀", " b"]
    assert d.text == "a€😀 b"
    assert d.flush() == ""


def test_detokenizer_invalid_and_truncated_bytes_become_replacement():
    d = IncrementalDetokenizer(lambda t: [b"\xff", b"x", b"\xe2\x82"][t])
    assert d.add(0) == "\ufffd"
    assert d.add(1) == "x"
    assert d.add(2) == ""
    assert d.pending
    assert d.flush() == "\ufffd"


def test_detokenizer_uses_vocab_special_flag():
    v = FakeVocab([b"x", b"<eos>"], eog=(1,))
    assert IncrementalDetokenizer(v).extend([0, 1]) == "x"
    assert IncrementalDetokenizer(v, special=True).extend([0, 1]) == "x<eos>"


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40), st.lists(st.integers(1, 5), min_size=1, max_size=50))
def test_detokenizer_any_split_equals_whole_decode(text, cuts):
    data = text.encode() + b"\xc3"  # also a dangling lead byte at the end
    chunks, i, k = [], 0, 0
    while i < len(data):
        n = cuts[k % len(cuts)]
        chunks.append(data[i : i + n])
        i, k = i + n, k + 1
    d = IncrementalDetokenizer(lambda t: chunks[t])
    streamed = "".join(d.add(t) for t in range(len(chunks))) + d.flush()
    assert streamed == data.decode("utf-8", errors="replace")


# ------------------------------------------------------------------------------------ stop strings


def test_stop_string_split_over_pieces():
    s = StopStrings(["\nUser:"])
    assert s.feed("Hello") == "Hello"
    assert s.feed("!\nUs") == "!"
    assert s.held == "\nUs"
    assert s.feed("er: more") == ""
    assert s.stopped and s.matched == "\nUser:"
    assert s.feed("ignored") == ""


def test_stop_string_false_start_is_released():
    s = StopStrings("###")
    assert s.feed("a#") == "a"
    assert s.feed("#b") == "##b"
    assert s.feed("##") == ""
    assert s.flush() == "##"
    assert not s.stopped


def test_first_completed_stop_wins_however_split():
    s = StopStrings(["world", "o w", "lo wor"])
    assert s.feed("hello world") == "hell"
    assert s.matched == "o w"
    for chunks in (["a:\n:b"], ["a:", "\n", ":b"]):
        s = StopStrings(["\n", ":\n:"])
        assert "".join(s.feed(c) for c in chunks) == "a:" and s.matched == "\n"
    s = StopStrings(["b", "ab"])
    assert s.feed("xab") == "x" and s.matched == "ab"


def test_stop_strings_validation():
    assert StopStrings(None).feed("x") == "x"
    assert StopStrings(["", ""]).feed("x") == "x"
    with pytest.raises(Exception, match="stop strings must be str"):
        StopStrings([b"x"])  # type: ignore[list-item]


@settings(max_examples=300, deadline=None)
@given(
    st.text(alphabet="ab\n:", max_size=30),
    st.lists(st.text(alphabet="ab\n:", min_size=1, max_size=4), min_size=1, max_size=3),
    st.lists(st.integers(1, 4), min_size=1, max_size=20),
)
def test_stop_strings_streaming_equals_whole_text(text, stops, cuts):
    s = StopStrings(stops)
    out, i, k = [], 0, 0
    while i < len(text) and not s.stopped:
        n = cuts[k % len(cuts)]
        out.append(s.feed(text[i : i + n]))
        i, k = i + n, k + 1
    out.append(s.flush())
    # oracle: the stop string that completes first (ties: the one starting first)
    hits = sorted((text.find(x) + len(x), text.find(x)) for x in stops if x in text)
    expect = text[: hits[0][1]] if hits else text
    assert "".join(out) == expect
    assert s.stopped == bool(hits)


# ------------------------------------------------------------------------------------ the loop


def test_generate_until_eog_and_text():
    vocab = FakeVocab([b"0", b"1", b"2", b"3", b"<e>"], eog=(4,))
    seq, steps, text = run(counter_ctx(5), vocab, [0])
    assert text == "123"
    assert [s.token for s in steps] == [1, 2, 3, None]
    assert steps[-1].finish_reason == "stop"
    assert seq.tokens == [0, 1, 2, 3]


def test_generate_max_tokens_and_ignore_eos():
    vocab = FakeVocab([b"0", b"1", b"2", b"3", b"<e>"], eog=(4,))
    _, steps, text = run(counter_ctx(5), vocab, [0], max_tokens=2)
    assert text == "12" and steps[-1].finish_reason == "length"
    _, _, text = run(counter_ctx(5), vocab, [0], max_tokens=0)
    assert text == ""
    # ignore_eos: the eog token is masked, the argmax falls to another token
    _, steps, text = run(counter_ctx(5), vocab, [0], max_tokens=6, ignore_eos=True)
    assert 4 not in [s.token for s in steps]
    assert steps[-1].finish_reason == "length" and len([s for s in steps if s.token is not None]) == 6


def test_generate_stop_string_not_emitted():
    _, steps, text = run(counter_ctx(10), FakeVocab(LETTERS), [0], stop=["ef"], max_tokens=20)
    assert text == "bcd"
    assert steps[-1].finish_reason == "stop"


def test_generate_utf8_split_across_tokens():
    pieces = [b"<s>", b"\xd0", b"\x9a", b"\xd0\xb8", b"\xd1", b"\x97", b"\xe2", b"\x80\x94"]
    _, steps, text = run(counter_ctx(len(pieces)), FakeVocab(pieces), [0], max_tokens=7)
    assert text == "Киї—"
    assert all("\ufffd" not in s.text for s in steps)
    assert [s.text for s in steps] == ["", "К", "и", "", "ї", "", "—", ""]
    _, _, text = run(counter_ctx(len(pieces)), FakeVocab(pieces), [0], max_tokens=6)
    assert text == "Киї\ufffd"  # a cut-off character at the end becomes U+FFFD once


def test_prompt_batched_and_prefix_reused():
    ctx = counter_ctx(10, n_batch=3)
    seq = seq_of(ctx)
    seq.prefill([1, 2, 3, 4, 5, 6, 7])
    assert ctx.n_decode_calls == 3
    assert greedy(seq.logits()) == 8
    ctx.n_decode_calls = 0
    assert seq.prefill([1, 2, 3, 4, 9]) == 4  # reuses 4 tokens, evaluates one
    assert ctx.n_decode_calls == 1 and seq.tokens == [1, 2, 3, 4, 9]
    assert greedy(seq.logits()) == 0
    ctx.n_decode_calls = 0
    assert seq.prefill([1, 2, 3, 4, 9]) == 5  # identical prompt, logits at hand: nothing to do
    assert ctx.n_decode_calls == 0
    seq.truncate(3)
    assert seq.prefill([1, 2, 3]) == 2  # all cached but no logits: the last token is re-evaluated
    assert ctx.n_decode_calls == 1 and greedy(seq.logits()) == 4
    assert sorted(ctx.memory.cells) == list(range(3))


def test_on_logits_hook_and_stopping_criteria():
    ctx = counter_ctx(10, n_batch=2)
    seq = seq_of(ctx)
    seen = []
    seq.on_logits = lambda pos, rows: seen.append((pos, list(rows.argmax(1))))
    seq.logits_all = True
    seq.eval([1, 2, 3])
    assert seen == [(0, [2, 3]), (2, [4])]
    seq.logits_all, seen[:] = False, []
    steps = list(
        generate(
            seq, greedy, FakeVocab(LETTERS), [1, 2, 3], stopping_criteria=lambda toks, lg: len(toks) >= 5
        )
    )
    assert [s.token for s in steps] == [4, 5, None] and steps[-1].finish_reason == "stop"
    assert seen == [(3, [5]), (4, [6])]


def test_logits_all_rows():
    ctx = counter_ctx(10, n_batch=2)
    rows = seq_of(ctx).eval([3, 4, 5], logits_all=True)
    assert rows.shape == (3, 10)
    assert list(rows.argmax(1)) == [4, 5, 6]


def test_context_full_error_and_prompt_too_long():
    ctx = counter_ctx(10, n_ctx=6)
    with pytest.raises(PromptTooLongError, match="context holds 6"):
        run(ctx, FakeVocab(LETTERS), [0] * 7)
    with pytest.raises(ContextFullError, match="context full"):
        run(counter_ctx(10, n_ctx=6), FakeVocab(LETTERS), [0, 1], max_tokens=20)


def test_context_shift_keeps_first_tokens_and_halves_the_rest():
    # the next token depends on the whole cache: sum of cached tokens mod 10
    ctx = FakeContext(10, lambda h: sum(h) % 10, n_ctx=8)
    seq = TokenSequence(ctx, context_shift=True, n_keep=2, batch_factory=fake_batch)
    prompt = [7, 3, 1]
    mirror = list(prompt)  # what the cache should hold, maintained independently
    steps = []
    for s in generate(seq, greedy, FakeVocab(LETTERS), prompt, GenerationParams(max_tokens=20)):
        steps.append(s)
        if s.token is not None:
            assert greedy(s.logits) == sum(mirror) % 10  # sampled from the logits of the shifted cache
            if len(mirror) == 8:  # full: drop (8 - 2) // 2 = 3 after the kept 2
                mirror = mirror[:2] + mirror[5:]
            mirror.append(s.token)
    assert steps[-1].finish_reason == "length"
    assert seq.n_shifted > 0
    assert seq.tokens[:2] == [7, 3]
    assert [ctx.memory.cells[p] for p in sorted(ctx.memory.cells)] == seq.tokens
    assert sorted(ctx.memory.cells) == list(range(len(seq.tokens)))


def test_context_shift_with_nothing_to_drop():
    ctx = counter_ctx(10, n_ctx=4)
    seq = TokenSequence(ctx, context_shift=True, n_keep=4, batch_factory=fake_batch)
    with pytest.raises(ContextFullError, match="--keep"):
        list(generate(seq, greedy, FakeVocab(LETTERS), [0, 1, 2], GenerationParams(max_tokens=5)))


# ------------------------------------------------------------------------------------ the token loop state


class CountingGrammar:
    """Stands in for a grammar sampler: finished after ``n`` accepted tokens."""

    def __init__(self, n: int) -> None:
        self.n, self.seen = n, []

    def is_finished(self) -> bool:
        return len(self.seen) >= self.n


class EchoParser:
    """Stands in for a chat parser: every text piece becomes a delta; ``calls`` tool calls at the end."""

    def __init__(self, calls: int = 0) -> None:
        self.text, self.calls = "", calls

    def feed(self, text):
        self.text += text
        return [("content", text)]

    def finish(self):
        from types import SimpleNamespace

        return [("end", "")], SimpleNamespace(content=self.text, tool_calls=["call"] * self.calls)


def test_generation_ends_when_the_grammar_is_finished():
    g = CountingGrammar(3)

    class Sampler:
        def sample(self, logits):
            return greedy(logits)

        def accept(self, t):
            g.seen.append(t)

    seq = seq_of(counter_ctx(10))
    steps = list(
        generate(seq, Sampler(), FakeVocab(LETTERS), [0], GenerationParams(max_tokens=10), grammar=g)
    )
    assert [s.token for s in steps] == [1, 2, 3]
    assert steps[-1].finish_reason == "stop" and steps[-1].stop_type == "eos"


def test_generation_parser_deltas_message_and_tool_calls_finish_reason():
    for calls, reason in ((0, "length"), (2, "length")):
        seq = seq_of(counter_ctx(10))
        steps = list(
            generate(
                seq, greedy, FakeVocab(LETTERS), [0], GenerationParams(max_tokens=3), parser=EchoParser(calls)
            )
        )
        deltas = [d for s in steps for d in s.deltas]
        assert deltas == [("content", "b"), ("content", "c"), ("content", "d"), ("end", "")]
        assert steps[-1].message.content == "bcd" and steps[-1].finish_reason == reason
    vocab = FakeVocab([b"0", b"1", b"2", b"<e>"], eog=(3,))
    steps = list(generate(seq_of(counter_ctx(4)), greedy, vocab, [0], parser=EchoParser(1)))
    assert steps[-1].finish_reason == "tool_calls" and steps[-1].eog_token == 3 and steps[-1].token is None


def test_generation_logprobs_of_the_raw_logits_and_eog_masking():
    from llamapy.generation import Generation
    from llamapy.sampling.logprobs import log_softmax

    vocab = FakeVocab([b"a", b"b", b"<e>"], eog=(2,))
    logits = np.array([1.0, 2.0, 5.0], np.float32)

    class Greedy:
        def sample(self, z):
            return greedy(z)

        def accept(self, t):
            pass

    gen = Generation(vocab, Greedy(), GenerationParams(ignore_eos=True, n_probs=2))
    step = gen.step(logits)
    assert step.token == 1  # EOG masked
    want = log_softmax(logits)
    assert step.logprob.logprob == pytest.approx(float(want[1]))
    assert [t for t, _ in step.logprob.top] == [2, 1]  # of the raw logits: the masked EOG is still reported
    gen = Generation(vocab, Greedy(), GenerationParams(max_tokens=0))
    end = gen.step(logits)
    assert end.token is None and end.finish_reason == "length" and gen.done
    with pytest.raises(RuntimeError, match="finished"):
        gen.step(logits)
