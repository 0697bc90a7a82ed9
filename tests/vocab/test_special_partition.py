"""The special-token split against a direct port of llama.cpp's tokenizer_st_partition (oracle), on
overlapping token texts and lstrip/rstrip attributes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from llamapy.vocab.special import SpecialPartitioner

LSTRIP, RSTRIP, SKIP = 128, 256, 8
TEXTS = ["<a>", "<a><b>", "a>", "<b>", "  ", " ", "\n\n", "ab", "<unused1>", "<unused12>"]
SPACE = " \t\n\v\f\r"


def _oracle(text: str, order: list[int], attrs: list[int]) -> list[tuple[int, int, int]]:
    frags: list[tuple[int, int, int]] = [(0, len(text), -1)] if text else []
    for tid in order:
        s, attr = TEXTS[tid], attrs[tid]
        if attr & SKIP:
            continue
        new = []
        for a, b, t in frags:
            if t != -1:
                new.append((a, b, t))
                continue
            base, length = a, b - a
            while True:
                m = text.find(s, base, base + length)
                if m == -1:
                    if length > 0:
                        new.append((base, base + length, -1))
                    break
                left = m - base
                if attr & LSTRIP:
                    while left > 0 and text[base + left - 1] in SPACE:
                        left -= 1
                if left > 0:
                    new.append((base, base + left, -1))
                new.append((m, m + len(s), tid))
                roff = m + len(s)
                rlen = length - (m - base) - len(s)
                if rlen <= 0:
                    break
                if attr & RSTRIP:
                    while rlen > 0 and text[roff] in SPACE:
                        roff += 1
                        rlen -= 1
                base, length = roff, rlen
        frags = new
    return frags


@settings(max_examples=400, deadline=None)
@given(
    parts=st.lists(st.sampled_from([*TEXTS, "x", "<", ">", "\t", "a", "b"]), max_size=14),
    attrs=st.lists(st.sampled_from([0, LSTRIP, RSTRIP, LSTRIP | RSTRIP, SKIP]), min_size=10, max_size=10),
)
def test_partition_matches_llama_cpp(parts: list[str], attrs: list[int]) -> None:
    text = "".join(parts)
    ids = list(range(len(TEXTS)))
    order = sorted(ids, key=lambda i: (-len(TEXTS[i].encode()), i))
    p = SpecialPartitioner(order, TEXTS)
    assert p.partition(text, attrs, SKIP, LSTRIP, RSTRIP) == _oracle(text, order, attrs)
