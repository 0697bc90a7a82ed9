"""Parsed GBNF (:mod:`.gbnf`) written as llguidance Lark with the same meaning, fast where that is safe.

Rules become Lark rules; every lexeme is one character, one token, or a unit that :mod:`.units` proved
safe to read greedily (a grammar made of characters only is one lexeme). ``<text>`` token references
stay placeholders until :func:`bind_tokens` resolves them with a vocabulary.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from .._dataclass import dataclass
from .errors import GrammarError
from .gbnf import Body, Cls, Grammar, Item, Lit, Ref, Rep, Tok
from .units import (
    EMPTY,
    EPS,
    MAX_ROUNDS,
    Analysis,
    CharInfo,
    alt_info,
    class_ranges,
    class_regex,
    first_bytes,
    lark_string,
    lead_byte,
    rep_info,
    seq_info,
    valid_cp,
    words_info,
)

_PLACEHOLDER = re.compile("\x00(\\d+)\x00")


@dataclass
class Converted:
    """GBNF written as Lark; ``tokens``: the ``<text>``/``<[id]>`` references to resolve with a vocabulary;
    ``units``: lexemes kept whole."""

    lark: str
    tokens: list[tuple[str | int, bool]]  # (text such as "<think>", or an id; negated)
    units: int


# --- the writer -------------------------------------------------------------------------------------------------


class LarkWriter:
    """Chooses the units of a parsed grammar, then writes it as Lark."""

    def __init__(self, g: Grammar) -> None:
        self.g = g
        self._prune()
        self.chars = self._char_rules()
        self._ci: dict[str, CharInfo] = {}
        for name in self.chars:  # in dependency order
            self._ci[name] = self._body_ci(g.rules[name])
        self.used: set[str] = set()
        self.rule_names: dict[str, str] = {}
        self.term_names: dict[str, str] = {}
        self.terms: list[str] = []
        self.extra: list[str] = []
        self.term_exprs: dict[str, str] = {}
        self.tokens: list[tuple[str | int, bool]] = []
        self.term_todo: list[str] = []

    def _prune(self) -> None:
        """Drop what can never complete (rules without a finite derivation, empty classes, code points no
        text has): it matches nothing, and left in, llguidance would let the model start it and get stuck."""
        g = self.g
        alts = [(name, seq) for name, body in g.rules.items() for seq in body]
        need: list[set[str]] = []
        users: dict[str, list[int]] = {}
        alive: set[str] = set()
        queue: list[str] = []
        for k, (name, seq) in enumerate(alts):
            refs: set[str] = set()
            dead = False
            for it in seq:
                while isinstance(it, Rep) and it.lo > 0:
                    it = it.item
                if isinstance(it, Ref):
                    refs.add(it.name)
                elif isinstance(it, Lit):
                    dead = dead or not all(valid_cp(cp) for cp in it.cps)
                elif isinstance(it, Cls):
                    dead = dead or not class_ranges(it)
            need.append(refs if not dead else {"\x00dead"})
            for r in refs:
                users.setdefault(r, []).append(k)
            if not refs and not dead and name not in alive:
                alive.add(name)
                queue.append(name)
        while queue:
            r = queue.pop()
            for k in users.get(r, ()):
                need[k].discard(r)
                name = alts[k][0]
                if not need[k] and name not in alive:
                    alive.add(name)
                    queue.append(name)
        if g.root not in alive:
            raise GrammarError(
                f"GBNF grammar: rule '{g.root}' can never be completed (each of its alternatives needs a rule "
                "that cannot complete, an empty character class or an invalid code point)"
            )

        def clean(it: Item) -> Item | None:  # None: it only matches the empty string here
            if isinstance(it, Rep):
                inner = clean(it.item) if _live(it.item) else None
                if inner is None:
                    return None
                it.item = inner
            return it

        def _live(it: Item) -> bool:
            while isinstance(it, Rep):
                if it.lo == 0 and not _live(it.item):
                    return True  # matches the empty string only; clean() drops it
                it = it.item
            if isinstance(it, Ref):
                return it.name in alive
            if isinstance(it, Lit):
                return all(valid_cp(cp) for cp in it.cps)
            if isinstance(it, Cls):
                return bool(class_ranges(it))
            return True

        for name in list(g.rules):
            if name not in alive:
                del g.rules[name]
                continue
            body = []
            for seq in g.rules[name]:
                if all(_live(it) for it in seq):
                    body.append([c for c in (clean(it) for it in seq) if c is not None])
            g.rules[name] = body

    def _char_rules(self) -> list[str]:
        """Rules made of characters only with no rule recursion, each after the rules it uses."""
        deps: dict[str, set[str]] = {}
        users: dict[str, list[str]] = {}
        for name, body in self.g.rules.items():
            refs: set[str] = set()
            ok = True
            for seq in body:
                for it in seq:
                    while isinstance(it, Rep):
                        it = it.item
                    if isinstance(it, Tok):
                        ok = False
                    elif isinstance(it, Ref):
                        refs.add(it.name)
            if ok:
                deps[name] = refs
                for r in refs:
                    users.setdefault(r, []).append(name)
        pending = {n: len(d) for n, d in deps.items()}
        order = [n for n, k in pending.items() if k == 0]
        i = 0
        while i < len(order):
            for u in users.get(order[i], ()):
                if u in pending:
                    pending[u] -= 1
                    if pending[u] == 0:
                        order.append(u)
            i += 1
        return order

    def _body_ci(self, body: Body) -> CharInfo:
        if len(body) > 1 and all(isinstance(it, Lit) for seq in body for it in seq):
            # a set of words (an enum): continuations exactly, since they all may share first bytes
            words = sorted({"".join(chr(cp) for it in seq for cp in it.cps).encode() for seq in body})
            if all(all(valid_cp(cp) for it in seq for cp in it.cps) for seq in body):
                return words_info(words)
        return alt_info([seq_info([self.item_ci(it) for it in seq]) for seq in body])

    def is_chars(self, it: Item) -> bool:
        while isinstance(it, Rep):
            it = it.item
        return isinstance(it, (Lit, Cls)) or (isinstance(it, Ref) and it.name in self._ci)

    def item_ci(self, it: Item) -> CharInfo:
        if isinstance(it, Lit):
            if not it.cps:
                return EPS
            if not all(valid_cp(cp) for cp in it.cps):
                return EMPTY
            return CharInfo(1 << lead_byte(it.cps[0]), False, 0, len(it.cps) > 1)
        if isinstance(it, Cls):
            return CharInfo(first_bytes(class_ranges(it)), False, 0, False)
        if isinstance(it, Ref):
            return self._ci[it.name]
        if isinstance(it, Rep):
            return rep_info(self.item_ci(it.item), it.lo, it.hi)
        raise TypeError(it)

    def choose_units(self) -> None:
        for _ in range(MAX_ROUNDS):
            try:
                failing = Analysis(self).run()
            except OverflowError:
                break
            if not failing:
                return
            for it in failing:
                it.unit = False
        for body in self.g.rules.values():  # give up on units: one character per lexeme is always right
            for seq in body:
                for it in seq:
                    while isinstance(it, Rep):
                        it.unit = False
                        it = it.item
                    if isinstance(it, (Lit, Ref)):
                        it.unit = False

    # --- names ---

    def fresh(self, base: str, upper: bool) -> str:
        s = re.sub(r"[^A-Za-z0-9_]", "_", base.replace("#", "_g"))
        s = s.upper() if upper else s.lower()
        if not s or s[0].isdigit() or s in ("start", "START"):
            s = ("T_" if upper else "r_") + s
        cand, k = s, 1
        while cand in self.used:
            k += 1
            cand = f"{s}_{k}"
        self.used.add(cand)
        return cand

    def rule_name(self, name: str, todo: list[str]) -> str:
        if name not in self.rule_names:
            self.rule_names[name] = "start" if name == self.g.root else self.fresh(name, False)
            todo.append(name)
        return self.rule_names[name]

    def term_name(self, name: str) -> str:
        t = self.term_names.get(name)
        if t is None:
            t = self.term_names[name] = self.fresh(name, True)
            self.term_todo.append(name)  # written by write(): no recursion along chains of rules
        return t

    # --- expressions ---

    def term_expr(self, it: Item, atomic: bool = False) -> str:
        """``it`` (made of characters only) as part of one lexeme."""
        if isinstance(it, Lit):
            return lark_string(it.cps)
        if isinstance(it, Cls):
            return class_regex(it)
        if isinstance(it, Ref):
            return self.term_name(it.name)
        if it.hi == 0:  # x{0}, x{0,0}: the empty string (llguidance refuses a range that ends at 0)
            return '""'
        inner = it.item
        if isinstance(inner, Rep):
            key = self.term_expr(inner)
            t = self.term_exprs.get(key)
            if t is None:
                t = self.term_exprs[key] = self.fresh("rep", True)
                self.terms.append(f"{t}: {key}")
            body = t
        else:
            body = self.term_expr(inner)
            if isinstance(inner, Lit) and len(inner.cps) != 1:
                body = f"({body})"
        return body + _quant(it.lo, it.hi)

    def rule_expr(self, it: Item, todo: list[str]) -> str:
        """``it`` inside a (non-terminal) rule."""
        if isinstance(it, Lit):
            if not it.cps:
                return '""'
            if it.unit or len(it.cps) == 1:
                return lark_string(it.cps)
            return "(" + " ".join(lark_string((cp,)) for cp in it.cps) + ")"
        if isinstance(it, Cls):
            return class_regex(it)
        if isinstance(it, Tok):  # ids too: a vocabulary checks their range
            self.tokens.append((it.value, it.negated))
            return f"\x00{len(self.tokens) - 1}\x00"
        if self.is_chars(it) and it.unit:
            if isinstance(it, Ref):
                return self.term_name(it.name)
            key = self.term_expr(it)
            t = self.term_exprs.get(key)
            if t is None:
                t = self.term_exprs[key] = self.fresh("rep", True)
                self.terms.append(f"{t}: {key}")
            return t
        if isinstance(it, Ref):
            return self.rule_name(it.name, todo)
        if it.hi == 0:
            return '""'
        inner = it.item
        body = self.rule_expr(inner, todo)
        if isinstance(inner, Rep):
            name = self.fresh("rep", False)
            self.extra.append(f"{name}: {body}")
            body = name
        return body + _quant(it.lo, it.hi)

    def write(self) -> Converted:
        todo: list[str] = []
        rules = []
        if self.g.root in self._ci:  # made of characters only: one lexeme, nothing before or after it
            rules.append(f"start: {self.term_name(self.g.root)}")
        else:
            self.choose_units()
            self.rule_name(self.g.root, todo)
        while todo:
            name = todo.pop(0)
            alts = [" ".join(self.rule_expr(it, todo) for it in seq) or '""' for seq in self.g.rules[name]]
            rules.append(f"{self.rule_names[name]}: {' | '.join(alts)}")
        i = 0
        while i < len(self.term_todo):
            name = self.term_todo[i]
            alts = [" ".join(self.term_expr(it) for it in seq) or '""' for seq in self.g.rules[name]]
            self.terms.append(f"{self.term_names[name]}: {' | '.join(alts)}")
            i += 1
        lark = "\n".join(["%llguidance {}", "", *rules, *self.extra, *self.terms]) + "\n"
        return Converted(lark, self.tokens, len(self.terms))


def _quant(lo: int, hi: int | None) -> str:
    if (lo, hi) == (0, None):
        return "*"
    if (lo, hi) == (1, None):
        return "+"
    if (lo, hi) == (0, 1):
        return "?"
    return "{" + str(lo) + "," + ("" if hi is None else str(hi)) + "}"


def gbnf_lark(g: Grammar) -> Converted:
    """Write parsed GBNF as llguidance Lark (see the module docstring)."""
    return LarkWriter(g).write()


def bind_tokens(conv: Converted, resolve: Callable[[str | int], int]) -> str:
    """The Lark of ``conv`` with each ``<text>`` or ``<[id]>`` reference replaced by ``<[resolve(it)]>``
    (``<[^...]>`` if negated)."""

    def sub(m: re.Match[str]) -> str:
        text, negated = conv.tokens[int(m.group(1))]
        return f"<[{'^' if negated else ''}{resolve(text)}]>"

    return _PLACEHOLDER.sub(sub, conv.lark)


__all__ = ["Converted", "LarkWriter", "bind_tokens", "gbnf_lark"]
