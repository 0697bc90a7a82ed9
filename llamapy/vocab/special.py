"""Splitting text on special-token text, exactly as llama.cpp's tokenizer_st_partition.

llama.cpp walks the special tokens from the longest text to the shortest, and for each one cuts every
raw-text fragment at its occurrences (left to right, non-overlapping), honouring the token's
lstrip/rstrip attributes. Walking thousands of special tokens over a long text is slow, so only the
tokens that occur in the text at all are walked (found through a prefix trie of ``in`` checks), and
each walk touches only the fragments that hold an occurrence. The result is the same.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

# C isspace() in the "C" locale
_C_SPACE = " \t\n\v\f\r"


class _Node:
    __slots__ = ("prefix", "here", "children", "leaves")

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.here: list[int] = []  # tokens whose text is exactly this prefix
        self.children: list[_Node] = []
        self.leaves: list[tuple[str, int]] = []  # small groups checked directly


def _build(prefix: str, items: list[tuple[str, int]]) -> _Node:
    node = _Node(prefix)
    depth = len(prefix)
    groups: dict[str, list[tuple[str, int]]] = {}
    for s, i in items:
        if len(s) == depth:
            node.here.append(i)
        else:
            groups.setdefault(s[: depth + 1], []).append((s, i))
    for p, g in groups.items():
        if len(g) <= 3:
            node.leaves.extend(g)
        else:
            node.children.append(_build(p, g))
    return node


class SpecialPartitioner:
    """Special tokens in llama.cpp's order (longest text first), with their attributes."""

    def __init__(self, ids: Sequence[int], texts: Sequence[str]):
        self.ids = list(ids)
        self.texts = {i: texts[i] for i in self.ids}
        self.order = {tid: k for k, tid in enumerate(self.ids)}
        self.trie = _build("", [(texts[i], i) for i in self.ids])

    def present(self, text: str) -> list[int]:
        """The special tokens whose text occurs in ``text``, in partition order."""
        found: list[int] = []
        stack = [self.trie]
        while stack:
            node = stack.pop()
            found.extend(node.here)
            for s, i in node.leaves:
                if s in text:
                    found.append(i)
            for child in node.children:
                if child.prefix in text:
                    stack.append(child)
        found.sort(key=self.order.__getitem__)
        return found

    def partition(
        self, text: str, attrs: Sequence[int], skip_attr: int, lstrip_attr: int, rstrip_attr: int
    ) -> list[tuple[int, int, int]]:
        """Fragments ``(start, end, token)`` covering ``text``; token -1 is raw text.

        Special tokens whose attributes intersect ``skip_attr`` are not split out.
        """
        if not text:
            return []
        frags: list[tuple[int, int, int]] = [(0, len(text), -1)]
        starts = [0]
        for tid in self.present(text):
            attr = attrs[tid]
            if attr & skip_attr:
                continue
            s = self.texts[tid]
            ls = len(s)
            # every occurrence (overlapping), grouped by the raw fragment holding it
            by_frag: dict[int, list[int]] = {}
            p = text.find(s)
            while p != -1:
                # (stripped whitespace leaves holes between fragments: check p lies in fragment k)
                k = bisect_right(starts, p) - 1
                if k >= 0:
                    f0, f1, ft = frags[k]
                    if ft == -1 and f0 <= p and p + ls <= f1:
                        by_frag.setdefault(k, []).append(p)
                p = text.find(s, p + 1)
            if not by_frag:
                continue
            new_frags: list[tuple[int, int, int]] = []
            last = 0
            for k in sorted(by_frag):
                new_frags.extend(frags[last:k])
                last = k + 1
                f0, f1, _ = frags[k]
                cur = f0
                for p in by_frag[k]:
                    if p < cur:
                        continue
                    left_end = p
                    if attr & lstrip_attr:
                        while left_end > cur and text[left_end - 1] in _C_SPACE:
                            left_end -= 1
                    if left_end > cur:
                        new_frags.append((cur, left_end, -1))
                    new_frags.append((p, p + ls, tid))
                    cur = p + ls
                    if attr & rstrip_attr:
                        while cur < f1 and text[cur] in _C_SPACE:
                            cur += 1
                if cur < f1:
                    new_frags.append((cur, f1, -1))
            new_frags.extend(frags[last:])
            frags = new_frags
            starts = [f[0] for f in frags]
        return frags
