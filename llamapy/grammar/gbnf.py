"""llama.cpp's GBNF, parsed as ``src/llama-grammar.cpp`` parses it, into a small syntax tree.

The parser follows llama.cpp's: names, escapes, ``[...]`` classes, ``.``, groups, ``* + ? {m} {m,} {m,n}``
with its repetition limits (``MAX_REPETITION_THRESHOLD``), ``<[id]>``/``<token>`` references and their
``!`` negations, ``#`` comments, a later definition of a rule replacing an earlier one. It does not
recurse: nesting depth is bounded by :data:`MAX_NESTING`. Each group becomes a rule of its own (as in
llama.cpp), named ``<rule>#<n>``, which no GBNF name can clash with. :mod:`.lark_writer` writes the tree
as llguidance Lark.
"""

from __future__ import annotations

from dataclasses import field

from .._dataclass import dataclass
from .errors import GrammarError

MAX_NESTING = 200  # groups inside groups (llama.cpp has no limit, but recurses)
MAX_QUANTIFIERS = 32  # quantifiers applied to one item in a row (``"a"*+?``)
MAX_REPETITION_THRESHOLD = 2000  # as llama.cpp's MAX_REPETITION_THRESHOLD


class Lit:
    """A string literal (code points); ``unit``: written as one lexeme (decided by the writer)."""

    __slots__ = ("cps", "unit")

    def __init__(self, cps: tuple[int, ...]) -> None:
        self.cps = cps
        self.unit = True


class Cls:
    """A character class ``[...]`` (inclusive code point ranges), or ``.`` when ``ranges`` is None."""

    __slots__ = ("negated", "ranges")

    def __init__(self, negated: bool, ranges: tuple[tuple[int, int], ...] | None) -> None:
        self.negated = negated
        self.ranges = ranges


class Tok:
    """A token reference: an id, or the text of ``<...>`` (resolved with the vocabulary)."""

    __slots__ = ("value", "negated")

    def __init__(self, value: int | str, negated: bool) -> None:
        self.value = value
        self.negated = negated


class Ref:
    """A reference to a rule (``unit``: written as one lexeme when the rule is made of characters only)."""

    __slots__ = ("name", "unit")

    def __init__(self, name: str) -> None:
        self.name = name
        self.unit = True


class Rep:
    """``item{lo,hi}`` (``hi`` None: no maximum)."""

    __slots__ = ("item", "lo", "hi", "unit")

    def __init__(self, item: Item, lo: int, hi: int | None) -> None:
        self.item = item
        self.lo = lo
        self.hi = hi
        self.unit = True


Item = Lit | Cls | Tok | Ref | Rep
Body = list[list[Item]]  # alternatives, each a sequence


@dataclass
class Grammar:
    """Parsed GBNF: ``rules`` in definition order (groups after their rule), ``root`` the start rule."""

    rules: dict[str, Body]
    root: str


@dataclass
class _Frame:
    nested: bool
    open_pos: int
    n_before: int
    alts: Body = field(default_factory=list)
    seq: list[Item] = field(default_factory=list)
    weight: int = 1  # llama.cpp's n_prev_rules for the last item of seq
    n_quant: int = 0  # quantifiers applied to the last item of seq


def _is_word(c: str) -> bool:
    return c.isascii() and (c.isalnum() or c in "-_")


class _Parser:
    def __init__(self, src: str) -> None:
        self.src = src
        self.n = len(src)
        self.rules: dict[str, Body] = {}
        self.groups: dict[str, list[tuple[str, Body]]] = {}  # rule -> its groups (name, body)
        self.refs: list[tuple[str, int]] = []
        self.n_generated = 0  # llama.cpp's symbol count: rule names, groups and repetition rules so far
        self.symbols: set[str] = set()

    # --- errors and lexing helpers ---

    def error(self, pos: int, msg: str) -> GrammarError:
        line = self.src.count("\n", 0, pos) + 1
        col = pos - (self.src.rfind("\n", 0, pos) + 1) + 1
        near = self.src[pos : pos + 20]
        where = f"near {near!r}" if near else "at the end of the grammar"
        return GrammarError(f"GBNF grammar: {msg} at line {line}, column {col} ({where})")

    def ch(self, pos: int) -> str:
        return self.src[pos] if pos < self.n else ""

    def space(self, pos: int, newline_ok: bool) -> int:
        src, n = self.src, self.n
        while pos < n:
            c = src[pos]
            if c == " " or c == "\t" or (newline_ok and (c == "\r" or c == "\n")):
                pos += 1
            elif c == "#":
                while pos < n and src[pos] not in "\r\n":
                    pos += 1
            else:
                break
        return pos

    def name(self, pos: int) -> tuple[str, int]:
        end = pos
        while end < self.n and _is_word(self.src[end]):
            end += 1
        if end == pos:
            raise self.error(pos, "expecting a rule name")
        return self.src[pos:end], end

    def integer(self, pos: int) -> tuple[int, int]:
        end = pos
        while end < self.n and self.src[end].isascii() and self.src[end].isdigit():
            end += 1
        if end == pos:
            raise self.error(pos, "expecting an integer")
        return int(self.src[pos:end]), end

    def char(self, pos: int) -> tuple[int, int]:
        """One (possibly escaped) character of a literal or class: (code point, next position)."""
        c = self.ch(pos)
        if c == "":
            raise self.error(pos, "unexpected end of input")
        if c != "\\":
            return ord(c), pos + 1
        e = self.ch(pos + 1)
        size = {"x": 2, "u": 4, "U": 8}.get(e)
        if size is not None:
            digits = self.src[pos + 2 : pos + 2 + size]
            if len(digits) != size or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise self.error(pos, f"expecting {size} hex digits after \\{e}")
            return int(digits, 16), pos + 2 + size
        simple = {"t": 9, "r": 13, "n": 10, "\\": 92, '"': 34, "[": 91, "]": 93, "-": 45}
        if e in simple:
            return simple[e], pos + 2
        raise self.error(pos, f"unknown escape '\\{e}'")

    # --- grammar ---

    def parse(self) -> None:
        pos = self.space(0, True)
        while pos < self.n:
            pos = self.rule(pos)

    def symbol(self, name: str) -> None:
        if name not in self.symbols:
            self.symbols.add(name)
            self.n_generated += 1

    def rule(self, pos: int) -> int:
        name, pos = self.name(pos)
        self.symbol(name)
        pos = self.space(pos, False)
        if self.src[pos : pos + 3] != "::=":
            raise self.error(pos, "expecting '::='")
        pos = self.space(pos + 3, True)
        self.groups[name] = []  # a later definition replaces an earlier one, as in llama.cpp
        body, pos = self.alternates(pos, name)
        self.rules[name] = body
        c = self.ch(pos)
        if c == "\r":
            pos += 2 if self.ch(pos + 1) == "\n" else 1
        elif c == "\n":
            pos += 1
        elif c:
            raise self.error(pos, "expecting a newline or the end after the rule")
        return self.space(pos, True)

    def alternates(self, pos: int, rule_name: str) -> tuple[Body, int]:
        stack = [_Frame(False, pos, 0)]
        while True:
            f = stack[-1]
            c = self.ch(pos)
            if c == '"':
                start = pos
                pos += 1
                cps = []
                while self.ch(pos) != '"':
                    if self.ch(pos) == "":
                        raise self.error(start, "unterminated string literal")
                    cp, pos = self.char(pos)
                    cps.append(cp)
                self.push(f, Lit(tuple(cps)))
                pos = self.space(pos + 1, f.nested)
            elif c == "[":
                start = pos
                pos += 1
                negated = self.ch(pos) == "^"
                if negated:
                    pos += 1
                ranges = []
                while self.ch(pos) != "]":
                    if self.ch(pos) == "":
                        raise self.error(start, "unterminated character class")
                    lo, pos = self.char(pos)
                    hi = lo
                    if self.ch(pos) == "-" and self.ch(pos + 1) != "]":
                        if self.ch(pos + 1) == "":
                            raise self.error(pos, "unexpected end of input")
                        hi, pos = self.char(pos + 1)
                    ranges.append((lo, hi))
                self.push(f, Cls(negated, tuple(ranges)))
                pos = self.space(pos + 1, f.nested)
            elif c == "<" or c == "!":
                item, pos = self.token(pos)
                self.push(f, item)
                pos = self.space(pos, f.nested)
            elif c and _is_word(c):
                start = pos
                ref, pos = self.name(pos)
                self.refs.append((ref, start))
                self.symbol(ref)
                self.push(f, Ref(ref))
                pos = self.space(pos, f.nested)
            elif c == "(":
                if len(stack) > MAX_NESTING:
                    raise self.error(pos, f"groups nested more than {MAX_NESTING} deep")
                self.n_generated += 1
                stack.append(_Frame(True, pos, self.n_generated - 1))
                pos = self.space(pos + 1, True)
            elif c == ".":
                self.push(f, Cls(False, None))
                pos = self.space(pos + 1, f.nested)
            elif c and c in "*+?{":
                pos = self.repetition(pos, f)
            elif c == "|":
                f.alts.append(f.seq)
                f.seq = []
                pos = self.space(pos + 1, True)
            else:
                f.alts.append(f.seq)
                if not f.nested:
                    return f.alts, pos
                if c != ")":
                    raise self.error(pos, f"expecting ')' to close the group opened at offset {f.open_pos}")
                stack.pop()
                parent = stack[-1]
                groups = self.groups[rule_name]
                name = f"{rule_name}#{len(groups) + 1}"
                groups.append((name, f.alts))
                self.push(parent, Ref(name))
                parent.weight = max(1, self.n_generated - f.n_before)
                pos = self.space(pos + 1, parent.nested)

    @staticmethod
    def push(f: _Frame, item: Item) -> None:
        f.seq.append(item)
        f.weight = 1
        f.n_quant = 0

    def token(self, pos: int) -> tuple[Tok, int]:
        start = pos
        negated = self.ch(pos) == "!"
        if negated:
            pos += 1
        if self.ch(pos) != "<":
            raise self.error(pos, "expecting '<' (a token reference)")
        pos += 1
        if self.ch(pos) == "[":
            tid, end = self.integer(pos + 1)
            if tid >= 2**31:  # llama.cpp's token ids are int32
                raise self.error(pos + 1, f"token id {tid} is too large")
            pos = end
            if self.ch(pos) != "]":
                raise self.error(pos, "expecting ']'")
            if self.ch(pos + 1) != ">":
                raise self.error(pos + 1, "expecting '>'")
            return Tok(tid, negated), pos + 2
        end = self.src.find(">", pos)
        if end < 0:
            raise self.error(start, "expecting '>' to end the token reference")
        return Tok(self.src[pos - 1 : end + 1], negated), end + 1

    def repetition(self, pos: int, f: _Frame) -> int:
        op = self.src[pos]
        at = pos
        if op == "{":
            pos = self.space(pos + 1, f.nested)
            lo, pos = self.integer(pos)
            pos = self.space(pos, f.nested)
            hi: int | None
            if self.ch(pos) == "}":
                hi = lo
            elif self.ch(pos) == ",":
                pos = self.space(pos + 1, f.nested)
                hi = None
                if self.ch(pos).isascii() and self.ch(pos).isdigit():
                    hi, pos = self.integer(pos)
                    pos = self.space(pos, f.nested)
                if self.ch(pos) != "}":
                    raise self.error(pos, "expecting '}'")
            else:
                raise self.error(pos, "expecting ',' or '}'")
            pos += 1
            if lo > MAX_REPETITION_THRESHOLD:
                raise self.error(at, f"more than {MAX_REPETITION_THRESHOLD} repetitions")
            if hi is not None and hi > MAX_REPETITION_THRESHOLD:
                hi = None  # llama.cpp: a maximum above the threshold means no maximum
            if hi is not None and hi < lo:
                raise self.error(at, f"repetition maximum {hi} is below its minimum {lo}")
        else:
            pos += 1
            lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[op]
        pos = self.space(pos, f.nested)
        if not f.seq:
            raise self.error(at, f"expecting an item before '{op}'")
        total = hi if hi is not None and hi > 0 else (lo if lo > 0 else 1)
        if f.weight * total >= MAX_REPETITION_THRESHOLD:
            raise self.error(
                at, "the repetition multiplies the rules of its item beyond llama.cpp's limit (2000)"
            )
        f.n_quant += 1
        if f.n_quant > MAX_QUANTIFIERS:
            raise self.error(at, f"more than {MAX_QUANTIFIERS} quantifiers on one item")
        self.n_generated += 1 if hi is None else hi - lo
        f.weight *= total
        f.seq[-1] = Rep(f.seq[-1], lo, hi)
        return pos


def parse_gbnf(src: str, root: str = "root") -> Grammar:
    """Parse GBNF ``src``; GrammarError with line and column on a syntax error or an undefined rule."""
    p = _Parser(src)
    p.parse()
    if not p.rules:
        raise GrammarError("GBNF grammar: no rules (expecting 'root ::= ...')")
    for ref, pos in p.refs:
        if ref not in p.rules:
            raise p.error(pos, f"undefined rule '{ref}'")
    if root not in p.rules:
        names = ", ".join(list(p.rules)[:10])
        raise GrammarError(f"GBNF grammar: no '{root}' rule (the rules are: {names})")
    rules: dict[str, Body] = {}
    for name, body in p.rules.items():
        rules[name] = body
        for gname, gbody in p.groups[name]:
            rules[gname] = gbody
    return Grammar(rules, root)
