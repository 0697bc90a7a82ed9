"""llama.cpp runs the GPT-2, Llama-3 and Qwen2 regexes through hand-written splitters
(unicode_regex_split_custom_*); we run the regexes themselves on the collapsed text. These tests port
those splitters as oracles and compare on arbitrary text, including the corner cases the vocab files
do not reach (lone apostrophes, mixed whitespace, unassigned and control codepoints)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from llamapy.vocab import unicode as U
from llamapy.vocab.pretokenize import GPT2, LLAMA3, QWEN2, compile_regexes, split

OOR = 0xFFFFFFFF
ALPHABET = [*"aZsStTdDmMlLrReEvVé中 \t\n\r\u00a0\u2003'1٣.!?😀\u0301\u0378\x85\x1c\x00-_<|", "\U000e0001"]


def _flags(cpts: list[int], p: int) -> int:
    return int(U.flags_table()[cpts[p]]) if 0 <= p < len(cpts) else 0


def _oracle(text: str, kind: str) -> list[int]:
    """Lengths of llama.cpp's custom splitter words (gpt2 / llama3 / qwen2)."""
    cpts = [ord(c) for c in text]
    n = len(cpts)
    out: list[int] = []
    prev = 0

    def cpt(p: int) -> int:
        return cpts[p] if 0 <= p < n else OOR

    def fl(p: int) -> int:
        return _flags(cpts, p)

    def add(end: int) -> int:
        nonlocal prev
        ln = end - prev
        if ln > 0:
            out.append(ln)
        prev = end
        return ln

    L, N, WS = U.LETTER, U.NUMBER, U.WHITESPACE
    pos = 0
    while pos < n:
        c, f = cpt(pos), fl(pos)
        if c == 0x27 and pos + 1 < n:
            c1 = cpt(pos + 1) if kind == "gpt2" else U.tolower(cpt(pos + 1))
            if chr(c1) in "stmd":
                pos += add(pos + 2)
                continue
            if pos + 2 < n:
                c2 = cpt(pos + 2) if kind == "gpt2" else U.tolower(cpt(pos + 2))
                if (chr(c1), chr(c2)) in (("r", "e"), ("v", "e"), ("l", "l")):
                    pos += add(pos + 3)
                    continue
        if kind == "gpt2":
            f2 = fl(pos + 1) if c == 0x20 else f
            done = False
            for cat in (L, N):
                if f2 & cat:
                    pos += c == 0x20
                    while f2 & cat:
                        pos += 1
                        f2 = fl(pos)
                    add(pos)
                    done = True
                    break
            if done:
                continue
            if not (f2 & (WS | L | N)) and f2:
                pos += c == 0x20
                while not (f2 & (WS | L | N)) and f2:
                    pos += 1
                    f2 = fl(pos)
                add(pos)
                continue
        else:
            if not (c in (13, 10) or f & N) and (f & L or fl(pos + 1) & L):
                pos += 1
                while fl(pos) & L:
                    pos += 1
                add(pos)
                continue
            if f & N:
                if kind == "qwen2":
                    pos += 1
                    add(pos)
                    continue
                ini = pos
                while fl(pos) & N:
                    pos += 1
                    if pos - ini >= 3:
                        add(pos)
                        ini = pos
                add(pos)
                continue
            f2 = fl(pos + 1) if c == 0x20 else f
            if not (f2 & (WS | L | N)) and f:
                pos += c == 0x20
                while not (f2 & (WS | L | N)) and f2:
                    pos += 1
                    f2 = fl(pos)
                while cpt(pos) in (13, 10):
                    pos += 1
                add(pos)
                continue
        num = 0
        last_rn = 0
        while fl(pos + num) & WS:
            if kind != "gpt2" and cpt(pos + num) in (13, 10):
                last_rn = pos + num + 1
            num += 1
        if last_rn > 0:
            pos = last_rn
            add(pos)
            continue
        if num > 1 and cpt(pos + num) != OOR:
            pos += num - 1
            add(pos)
            continue
        if num > 0:
            pos += num
            add(pos)
            continue
        pos += 1
        add(pos)
    return out


TEXT = st.lists(st.sampled_from(ALPHABET), max_size=30).map("".join)


@settings(max_examples=300, deadline=None)
@given(text=TEXT)
def test_regex_split_equals_llama_cpp_custom_splitters(text: str) -> None:
    for kind, expr in (("gpt2", GPT2), ("llama3", LLAMA3), ("qwen2", QWEN2)):
        got = [len(w) for w in split(text, compile_regexes([expr]))]
        assert got == _oracle(text, kind), kind
