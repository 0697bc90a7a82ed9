"""Which pieces of a parsed GBNF grammar (:mod:`.gbnf`) may be written as one llguidance lexeme.

llguidance reads text as lexemes (quoted strings, ``/regex/``, uppercase terminals) greedily: while the
lexeme being read can take the next byte it takes it, and a lexeme that could have ended there loses.
Written as one regex lexeme, ``[a-z]+ "x"`` would never end (the ``x`` is eaten) and ``("a" | "ab") "bc"``
would refuse ``abc``, where GBNF (llama.cpp's stacks) accepts both. So every lexeme :mod:`.lark_writer`
writes is one character, one token, or a *unit*: a piece made of characters only (a literal, a
repetition, a rule that uses no rule recursion) written as one lexeme because reading it greedily
accepts exactly what GBNF does:

(a) no different lexeme that can be expected at the same place shares a first byte with it, and
(b) no byte that can continue one of its complete matches can begin what may follow it.

Units keep masks fast: llguidance computes a lexeme's mask over the token trie without the Earley parser
(a JSON string's contents cost microseconds per mask instead of milliseconds on a 262k vocabulary). The
sets behind (a) and (b) are over-approximated (per grammar position, not per parse; bytes, not
characters), so a doubtful unit is split into smaller pieces, never kept wrongly; the analysis repeats
until every unit left passes. Too large an analysis gives up on units altogether (always correct).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .._dataclass import dataclass
from .gbnf import Cls, Item, Lit, Ref, Tok

if TYPE_CHECKING:
    from .lark_writer import LarkWriter

ALL = (1 << 256) - 1
_MAX_CP = 0x10FFFF
NEVER = r"/[^\x{0}-\x{10FFFF}]/"  # a lexeme that matches nothing
MAX_LEXEMES = 20000  # larger grammars get no units (correct, slower masks)
MAX_WORK = 3_000_000  # set elements visited by one analysis before it gives up the same way
MAX_ROUNDS = 64


def _bits(v: int) -> list[int]:
    """Positions of the set bits of ``v``."""
    if v.bit_count() <= 32:
        out = []
        while v:
            low = v & -v
            out.append(low.bit_length() - 1)
            v ^= low
        return out
    raw = np.frombuffer(v.to_bytes((v.bit_length() + 7) // 8, "little"), dtype=np.uint8)
    return np.flatnonzero(np.unpackbits(raw, bitorder="little")).tolist()


# --- code points and their UTF-8 first bytes ---------------------------------------------------------------


def class_ranges(c: Cls) -> list[tuple[int, int]]:
    """The code points of ``c`` as sorted disjoint ranges of Unicode scalar values."""
    if c.ranges is None:
        rs = [(0, _MAX_CP)]
    else:
        rs = sorted((max(lo, 0), min(hi, _MAX_CP)) for lo, hi in c.ranges if lo <= hi and lo <= _MAX_CP)
    merged: list[tuple[int, int]] = []
    for lo, hi in rs:
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    if c.negated:
        comp, nxt = [], 0
        for lo, hi in merged:
            if lo > nxt:
                comp.append((nxt, lo - 1))
            nxt = hi + 1
        if nxt <= _MAX_CP:
            comp.append((nxt, _MAX_CP))
        merged = comp
    out = []
    for lo, hi in merged:  # no surrogates: Rust regexes (and UTF-8) have none
        for a, b in ((lo, min(hi, 0xD7FF)), (max(lo, 0xE000), hi)):
            if a <= b:
                out.append((a, b))
    return out


def lead_byte(cp: int) -> int:
    if cp < 0x80:
        return cp
    if cp < 0x800:
        return 0xC0 | (cp >> 6)
    if cp < 0x10000:
        return 0xE0 | (cp >> 12)
    return 0xF0 | (cp >> 18)


_SEGMENTS = ((0, 0x7F), (0x80, 0x7FF), (0x800, 0xFFFF), (0x10000, _MAX_CP))


def first_bytes(ranges: list[tuple[int, int]]) -> int:
    m = 0
    for lo, hi in ranges:
        for a, b in _SEGMENTS:
            x, y = max(lo, a), min(hi, b)
            if x <= y:
                m |= ((1 << (lead_byte(y) + 1)) - 1) ^ ((1 << lead_byte(x)) - 1)
    return m


def valid_cp(cp: int) -> bool:
    return 0 <= cp <= _MAX_CP and not 0xD800 <= cp <= 0xDFFF


def class_regex(c: Cls) -> str:
    def one(cp: int) -> str:
        ch = chr(cp)
        return ch if ch.isascii() and ch.isalnum() else f"\\x{{{cp:X}}}"

    rs = class_ranges(c)
    if not rs:
        return NEVER
    if rs == [(0, 0xD7FF), (0xE000, _MAX_CP)]:
        return "/(?s:.)/"
    return "/[" + "".join(one(a) if a == b else f"{one(a)}-{one(b)}" for a, b in rs) + "]/"


def lark_string(cps: tuple[int, ...]) -> str:
    if not all(valid_cp(cp) for cp in cps):
        return NEVER  # no UTF-8 text holds this code point
    out = []
    for cp in cps:
        if cp == 0x22:
            out.append('\\"')
        elif cp == 0x5C:
            out.append("\\\\")
        elif cp < 0x20 or cp == 0x7F:
            out.append(f"\\x{cp:02x}")
        else:
            out.append(chr(cp))
    return '"' + "".join(out) + '"'


# --- what a piece made of characters can match: first bytes, empty match, continuation bytes ----------------


@dataclass(frozen=True)
class CharInfo:
    first: int  # first bytes of its non-empty matches
    null: bool  # matches the empty string
    ext: int  # bytes that can continue one of its complete matches into a longer one (ALL: unknown)
    multi: bool  # some match is longer than one character


EPS = CharInfo(0, True, 0, False)
EMPTY = CharInfo(0, False, 0, False)  # matches nothing


def seq_info(parts: list[CharInfo]) -> CharInfo:
    cur = EPS
    for b in parts:
        # a complete match of the prefix that a byte of b could also extend: the split is ambiguous
        ext = ALL if cur.ext & b.first else b.ext | ((b.first | cur.ext) if b.null else 0)
        multi = cur.multi or b.multi or bool(cur.first and b.first)
        cur = CharInfo(cur.first | (b.first if cur.null else 0), cur.null and b.null, ext, multi)
    return cur


def alt_info(parts: list[CharInfo]) -> CharInfo:
    first, ext, null, multi, clash = 0, 0, False, False, False
    for p in parts:
        clash = clash or bool(first & p.first)
        first |= p.first
        ext |= p.ext
        null = null or p.null
        multi = multi or p.multi
    if clash:
        ext = ALL
    elif null:
        ext |= first
    return CharInfo(first, null, ext, multi)


def words_info(words: list[bytes]) -> CharInfo:
    """The sorted set of strings ``words``: a continuation is the next byte of a longer word."""
    first, ext = 0, 0
    for i, w in enumerate(words):
        if w:
            first |= 1 << w[0]
        for w2 in words[i + 1 :]:
            if not w2.startswith(w):
                break
            if len(w2) > len(w):
                ext |= 1 << w2[len(w)]
    multi = any(len(w.decode()) > 1 for w in words)
    return CharInfo(first, b"" in words, ext, multi)


def rep_info(c: CharInfo, lo: int, hi: int | None) -> CharInfo:
    if hi == 0:
        return EPS
    many = hi is None or hi > 1
    if many and c.ext & c.first:
        ext = ALL
    else:
        ext = c.ext | (c.first if hi is None or hi > lo else 0)
    return CharInfo(c.first, lo == 0 or c.null, ext, c.multi or (many and bool(c.first)))


# --- the analysis over one choice of units -------------------------------------------------------------------


class _Lexeme:
    __slots__ = ("key", "first", "ext", "multi", "owner")

    def __init__(self, key: str, first: int, ext: int = 0, multi: bool = False, owner: Item | None = None):
        self.key = key
        self.first = first
        self.ext = ext
        self.multi = multi
        self.owner = owner  # the unit item (None: one character or one token)


class Analysis:
    """Lexeme-level FIRST/FOLLOW over the non-unit rules, and which lexemes may be expected together."""

    def __init__(self, w: LarkWriter) -> None:
        self.w = w
        self.lex: list[_Lexeme] = []
        self.body: dict[str, tuple] = {}
        self.users: dict[str, set[str]] = {}
        todo = [w.g.root]
        self.body[w.g.root] = ()
        while todo:
            r = todo.pop()
            self.cur_rule = r
            self.pending: list[str] = []
            self.body[r] = ("alt", [("seq", [self.node(it) for it in seq]) for seq in w.g.rules[r]])
            for x in self.pending:
                self.users.setdefault(x, set()).add(r)
                if x not in self.body:
                    self.body[x] = ()
                    todo.append(x)
            if len(self.lex) > MAX_LEXEMES:
                raise OverflowError

    def add(self, lx: _Lexeme) -> tuple:
        self.lex.append(lx)
        return ("lex", len(self.lex) - 1)

    def node(self, it: Item) -> tuple:
        w = self.w
        if isinstance(it, Lit):
            if not it.cps:
                return ("eps",)
            ci = w.item_ci(it)
            if it.unit and len(it.cps) > 1:
                return self.add(_Lexeme(lark_string(it.cps), ci.first, 0, True, it))
            return (
                "seq",
                [self.add(_Lexeme(lark_string((cp,)), w.item_ci(Lit((cp,))).first)) for cp in it.cps],
            )
        if isinstance(it, Cls):
            return self.add(_Lexeme(class_regex(it), w.item_ci(it).first))
        if isinstance(it, Tok):
            return self.add(_Lexeme(f"<{it.value}{it.negated}>", ALL if it.negated else 1 << 0xFF))
        if w.is_chars(it) and it.unit:
            ci = w.item_ci(it)
            key = f"T:{it.name}" if isinstance(it, Ref) else f"R:{id(it)}"
            n = self.add(_Lexeme(key, ci.first, ci.ext, ci.multi, it))
            return ("opt", n) if ci.null else n
        if isinstance(it, Ref):
            self.pending.append(it.name)
            return ("nt", it.name)
        return ("rep", self.node(it.item), it.lo, it.hi)

    # FIRST (as lexeme bitsets) and nullability
    def fn(self, n: tuple, fr: dict[str, tuple[int, bool]]) -> tuple[int, bool]:
        k = n[0]
        if k == "lex":
            return 1 << n[1], False
        if k == "opt":
            return 1 << n[1][1], True
        if k == "eps":
            return 0, True
        if k == "nt":
            return fr.get(n[1], (0, False))
        if k == "rep":
            if n[3] == 0:
                return 0, True
            f, z = self.fn(n[1], fr)
            return f, z or n[2] == 0
        if k == "seq":
            f, z = 0, True
            for c in n[1]:
                cf, cz = self.fn(c, fr)
                if z:
                    f |= cf
                z = z and cz
                if not z:
                    break
            return f, z
        f, z = 0, False
        for c in n[1]:
            cf, cz = self.fn(c, fr)
            f |= cf
            z = z or cz
        return f, z

    def run(self) -> list[Item]:
        """The unit items that fail (a) or (b) under this choice of units."""
        fr: dict[str, tuple[int, bool]] = {}
        queue, queued = list(self.body), set(self.body)
        while queue:
            r = queue.pop()
            queued.discard(r)
            v = self.fn(self.body[r], fr)
            if fr.get(r) != v:
                fr[r] = v
                for u in self.users.get(r, ()):
                    if u not in queued:
                        queued.add(u)
                        queue.append(u)
        n = len(self.lex)
        fl = [0] * n
        follow_r: dict[str, int] = dict.fromkeys(self.body, 0)
        queue, queued = list(self.body), set(self.body)

        def walk(node: tuple, f: int) -> None:
            k = node[0]
            if k == "lex":
                fl[node[1]] |= f
            elif k == "opt":
                fl[node[1][1]] |= f
            elif k == "nt":
                x = node[1]
                if follow_r[x] | f != follow_r[x]:
                    follow_r[x] |= f
                    if x not in queued:
                        queued.add(x)
                        queue.append(x)
            elif k == "seq":
                for c in reversed(node[1]):
                    walk(c, f)
                    cf, cz = self.fn(c, fr)
                    f = cf | (f if cz else 0)
            elif k == "alt":
                for c in node[1]:
                    walk(c, f)
            elif k == "rep" and node[3] != 0:
                again = node[3] is None or node[3] > 1
                walk(node[1], f | (self.fn(node[1], fr)[0] if again else 0))

        while queue:
            r = queue.pop()
            queued.discard(r)
            walk(self.body[r], follow_r[r])
        lex = self.lex
        byb = [0] * 256
        for i, lx in enumerate(lex):
            for b in _bits(lx.first):
                byb[b] |= 1 << i
        ovl = []
        for lx in lex:
            o = 0
            for b in _bits(lx.first):
                o |= byb[b]
            ovl.append(o)
        start = fr[self.w.g.root][0]
        co = [0] * n
        for x in _bits(start):
            co[x] = start
        work = 0
        for _ in range(4 * MAX_ROUNDS):
            after = []
            for i in range(n):  # what can be expected after lexeme i ends (with any lexeme ending with it)
                m = fl[i]
                js = _bits(co[i] & ovl[i] & ~(1 << i))
                for j in js:
                    m |= fl[j]
                after.append(m)
                work += len(js)
            changed = False
            for m in after:
                xs = _bits(m)
                work += len(xs)
                for x in xs:
                    if co[x] | m != co[x]:
                        co[x] |= m
                        changed = True
            if work > MAX_WORK:
                raise OverflowError
            if not changed:
                break
        else:
            raise OverflowError
        failing = []
        for i, lx in enumerate(lex):
            if lx.owner is None or not lx.multi:
                continue
            bad = any(lex[j].key != lx.key for j in _bits(co[i] & ovl[i] & ~(1 << i)))
            if not bad and lx.ext:
                nxt = 0
                for j in _bits(after[i]):
                    nxt |= lex[j].first
                bad = bool(lx.ext & nxt)
            if bad:
                failing.append(lx.owner)
        return failing
