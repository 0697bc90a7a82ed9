"""Fixtures for the grammar tests: a small made-up vocabulary, the real SmolLM2 one, and helpers."""

from __future__ import annotations

import numpy as np
import pytest

from llamapy.grammar import GrammarSampler, LlamaGrammar
from llamapy.sampling import TokenDataArray
from llamapy.vocab import TokenAttr

EOS = 256
TOOL_CALL = 257  # control "<|tool_call|>"
THINK, END_THINK = 258, 259  # user-defined "<think>", "</think>"
PAD = 260  # control "<pad>", not end-of-generation
EOT = 261  # control "<|eot|>", end-of-generation
SPECIALS = {
    EOS: (b"<eos>", TokenAttr.CONTROL),
    TOOL_CALL: (b"<|tool_call|>", TokenAttr.CONTROL),
    THINK: (b"<think>", TokenAttr.USER_DEFINED),
    END_THINK: (b"</think>", TokenAttr.USER_DEFINED),
    PAD: (b"<pad>", TokenAttr.CONTROL),
    EOT: (b"<|eot|>", TokenAttr.CONTROL),
}
MULTI = [b"ab", b"abc", b'{"', b'":', b'", "', b"true", b"false", b"null", b"  ", b"\n  ", b"hello", b" world",
         "é".encode(), "🔵".encode(), b"12", b"345", b"<tool", b"_call>", b'"}', b"aaaa", b"0x", b"{}", b"[]",
         b'"name"', b"<|tool", b"_call|>", b"x=1", b"func(", b"), "]  # fmt: skip


class ToyVocab:
    """Duck-typed like ``llamapy.vocab.Vocab``: every byte is a token (ids 0-255, byte 255 included),
    then six special tokens (see the constants above), then some multi-byte pieces. ``tokenize`` is
    greedy longest match."""

    def __init__(self, multi: list[bytes] = MULTI) -> None:
        self.pieces: list[bytes] = [bytes([b]) for b in range(256)]
        self.attrs: list[TokenAttr] = [TokenAttr.BYTE] * 256
        for t in sorted(SPECIALS):
            self.pieces.append(SPECIALS[t][0])
            self.attrs.append(SPECIALS[t][1])
        for p in multi:
            self.pieces.append(p)
            self.attrs.append(TokenAttr.NORMAL)
        self.bos = -1
        self.eos = EOS
        self._normal = {p: i for i, p in enumerate(self.pieces) if i not in SPECIALS}
        self._special = {p: i for i, p in enumerate(self.pieces) if i in SPECIALS}
        self._maxlen = max(len(p) for p in self.pieces)

    @property
    def n_tokens(self) -> int:
        return len(self.pieces)

    def token_to_piece(self, t: int, special: bool = False) -> bytes:
        if self.attrs[t] & TokenAttr.CONTROL and not special:
            return b""
        return self.pieces[t]

    def token_attr(self, t: int) -> TokenAttr:
        return self.attrs[t]

    def is_eog(self, t: int) -> bool:
        return t in (EOS, EOT)

    def tokenize(
        self, text: str | bytes, add_special: bool = False, parse_special: bool = False
    ) -> list[int]:
        data = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else bytes(text)
        out, i = [], 0
        while i < len(data):
            for n in range(min(self._maxlen, len(data) - i), 0, -1):
                chunk = data[i : i + n]
                t = self._special.get(chunk) if parse_special else None
                if t is None:
                    t = self._normal.get(chunk)
                if t is not None:
                    out.append(t)
                    i += n
                    break
        return out


@pytest.fixture(scope="session")
def toy() -> ToyVocab:
    return ToyVocab()


@pytest.fixture(scope="session")
def bytes_vocab() -> ToyVocab:
    """Single bytes and the special tokens only: feeding text byte by byte is its canonical tokenization."""
    return ToyVocab(multi=[])


@pytest.fixture(scope="session")
def smollm2(smollm2_path):
    from llamapy.vocab import load_vocab

    return load_vocab(smollm2_path)


# --- helpers -------------------------------------------------------------------------------------------------


def allowed(s: GrammarSampler) -> np.ndarray:
    """Ids of the tokens the sampler allows now."""
    if not s.active:
        return np.arange(s._info.n_vocab)
    bits = np.unpackbits(s.allowed_mask().view(np.uint8), bitorder="little")[: s._info.n_vocab]
    return np.flatnonzero(bits)


def is_allowed(s: GrammarSampler, t: int) -> bool:
    m = s.allowed_mask()
    return bool((int(m[t >> 5]) >> (t & 31)) & 1)


def tokens_of(vocab, x: str | bytes | list) -> list[int]:
    """Token ids for ``x``: a list is taken as is (ints), text is tokenized (special tokens parsed)."""
    if isinstance(x, list):
        return x
    return vocab.tokenize(x, add_special=False, parse_special=True)


def matches(grammar: LlamaGrammar, vocab, x: str | bytes | list) -> bool:
    """llama.cpp's match_string: every token allowed by the mask in turn, and the grammar accepts at the end."""
    s = grammar.sampler(vocab)
    for t in tokens_of(vocab, x):
        if not is_allowed(s, t):
            return False
        s.accept(t)
    return s.is_accepting() and is_allowed(
        s, EOS if vocab.n_tokens > EOS and vocab.is_eog(EOS) else vocab.eos
    )


def check_cases(grammar: LlamaGrammar, vocab, passing, failing) -> None:
    bad = [x for x in passing if not matches(grammar, vocab, x)]
    assert not bad, f"should match but do not: {bad}"
    bad = [x for x in failing if matches(grammar, vocab, x)]
    assert not bad, f"should not match but do: {bad}"


def random_walk(s: GrammarSampler, vocab, rng: np.random.Generator, max_steps: int = 300, eog_weight=0.05):
    """Sample random allowed tokens until the grammar is finished or an EOG token is sampled.

    Returns (token ids, finished: True if it ended by EOG or is_finished)."""
    out: list[int] = []
    eog = [t for t in range(vocab.n_tokens) if vocab.is_eog(t)] if not hasattr(vocab, "eog_ids") else None
    eog_set = set(eog) if eog is not None else set(vocab.eog_ids)
    for _ in range(max_steps):
        if s.is_finished():
            return out, True
        ids = allowed(s)
        assert len(ids) > 0, "no token allowed: the grammar is stuck"
        ends = [t for t in ids if t in eog_set]
        if ends and (rng.random() < eog_weight or len(ends) == len(ids)):
            assert s.is_accepting()
            return out, True
        rest = ids[~np.isin(ids, list(eog_set))]
        t = int(rng.choice(rest))
        s.accept(t)
        out.append(t)
    return out, False


def apply_full(s: GrammarSampler, n: int, rng: np.random.Generator | None = None) -> np.ndarray:
    """``apply`` on a fresh full-vocabulary array; the resulting logits."""
    rng = rng or np.random.default_rng(0)
    cur = TokenDataArray.from_logits(rng.standard_normal(n).astype(np.float32))
    s.apply(cur)
    return cur.logits
