"""The limits of :mod:`.limits` on GBNF (parsed) and llguidance Lark (scanned) grammars."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from typing import Any

from .errors import GrammarError
from .gbnf import Cls, Grammar, Item, Lit, Ref, Rep, Tok
from .limits import (
    COUNTED,
    MAX_REPEAT_EXPANSION,
    MAX_RULE_CHAIN,
    MAX_RULES,
    chain_bound,
    chain_error,
    close_levels,
    components,
    regex_cost,
)


def _too_many_rules(what: str, n: int) -> GrammarError:
    return GrammarError(f"{what}: {n} rules, more than the limit of {MAX_RULES}")


def _repeat_error(what: str, rule: str, total: int) -> GrammarError:
    return GrammarError(
        f"{what}: a repetition in rule '{rule}' expands to {total} characters (the limit is "
        f"{MAX_REPEAT_EXPANSION}, nested repetitions multiplied)"
    )


def _rule_graph(
    what: str, names: list[str], refs: Callable[[str], Iterable[str]]
) -> tuple[dict[str, int], list[int], list[list[int]]]:
    """GrammarError for too many rules or too deep a chain of rules (``refs(name)``: the rules a rule
    uses); else each rule's index, its strongly connected component, and the components (the rules a rule
    uses first)."""
    if len(names) > MAX_RULES:
        raise _too_many_rules(what, len(names))
    idx = {name: k for k, name in enumerate(names)}
    edges = [sorted({idx[r] for r in refs(name) if r in idx}) for name in names]
    bound, path = chain_bound(len(names), edges, range(len(names)))
    if bound > MAX_RULE_CHAIN:
        raise chain_error(what, bound, [names[k] for k in path], MAX_RULE_CHAIN, "rules")
    comp, comps = components(len(names), edges, range(len(names)))
    return idx, comp, comps


def _gbnf_refs(body: list[list[Item]]) -> Iterable[str]:
    for seq in body:
        for it in seq:
            while isinstance(it, Rep):
                it = it.item
            if isinstance(it, Ref):
                yield it.name


def check_gbnf(g: Grammar) -> None:
    """GrammarError if ``g`` has too many rules, too deep a chain of rules, or a repetition too large."""
    what = "GBNF grammar"
    names = list(g.rules)
    idx, comp, comps = _rule_graph(what, names, lambda name: _gbnf_refs(g.rules[name]))
    # expanded sizes, the rules a rule uses first; a rule in a cycle counts 1 where it is used
    cost = [1] * len(names)
    for c, members in enumerate(comps):
        for v in members:
            name = names[v]

            def item_cost(it: Item, name: str = name, c: int = c) -> int:
                if isinstance(it, Lit):
                    return len(it.cps)
                if isinstance(it, (Cls, Tok)):
                    return 1
                if isinstance(it, Ref):
                    w = idx.get(it.name)
                    return 1 if w is None or comp[w] == c else cost[w]
                inner = item_cost(it.item)
                total = inner * max(it.lo, it.hi or 0, 1)
                if total > MAX_REPEAT_EXPANSION:
                    raise _repeat_error(what, name.split("#")[0], total)
                return total

            cost[v] = max((sum(item_cost(it) for it in seq) for seq in g.rules[name]), default=0)


# --- llguidance Lark -----------------------------------------------------------------------------------------

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DEF_TAIL = re.compile(r"\s*(?:\[[^\]\n]*\]\s*|\{[^}\n]*\}\s*|\.-?\d+\s*)*(::?)")
_REGEX = re.compile(r"/((?:\\.|[^/\\\n])*)/[imslux]*")
_STRING = re.compile(r"\"((?:\\.|[^\"\\\n])*)\"i?|'((?:\\.|[^'\\\n])*)'i?")
_TILDE = re.compile(r"~\s*(\d+)(?:\s*\.\.\s*(\d+))?")


def _is_terminal(name: str) -> bool:
    return name.lstrip("_")[:1].isupper()


def check_lark(text: str) -> None:
    """GrammarError if the llguidance Lark ``text`` has too many rules, too deep a chain of rules, a
    terminal or regex whose repetitions expand too far, or an embedded ``%json`` schema past the limits."""
    from .limits_schema import check_schema

    what = "Lark grammar"
    # each definition: name -> list of body items: ("atom", cost) | ("ref", name) | ("open",) | ("close",)
    # | ("alt",) | ("rep", factor, text)
    defs: dict[str, list[tuple[Any, ...]]] = {}
    cur: list[tuple[Any, ...]] | None = None
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if c == "\n":
            line_start = True
            i += 1
            continue
        if c in " \t\r":
            i += 1
            continue
        at_start, line_start = line_start, False
        if text.startswith("//", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        if c in "\"'":
            m = _STRING.match(text, i)
            if m is None:
                i += 1
                continue
            if cur is not None:
                cur.append(("atom", max(1, len(m.group(1) or m.group(2) or ""))))
            i = m.end()
            continue
        if c == "/":
            m = _REGEX.match(text, i)
            if m is None:
                i += 1
                continue
            cost = regex_cost(m.group(1), f"{what}: regex /{m.group(1)[:40]}/")
            if cur is not None:
                cur.append(("atom", max(1, cost)))
            i = m.end()
            continue
        if c == "%":
            m = _NAME.match(text, i + 1)
            word = m.group(0) if m else ""
            i = m.end() if m else i + 1
            j = i
            while j < n and text[j] in " \t":
                j += 1
            if word in ("json", "llguidance", "regex") and j < n and text[j] == "{":
                try:
                    value, end = json.JSONDecoder().raw_decode(text, j)
                except (ValueError, RecursionError) as e:
                    raise GrammarError(f"{what}: %{word} is not followed by valid JSON: {e}") from e
                if word == "json":
                    check_schema(value, f"{what}: %json schema")
                if cur is not None:
                    cur.append(("atom", 1))
                i = end
            continue
        if c == "<":
            end = text.find(">", i)
            i = n if end < 0 else end + 1
            if cur is not None:
                cur.append(("atom", 1))
            continue
        m = _NAME.match(text, i)
        if m is not None:
            name = m.group(0)
            t = _DEF_TAIL.match(text, m.end()) if at_start else None
            if t is not None and t.group(1) == ":":
                cur = defs.setdefault(name, [])
                if cur:
                    cur.append(("alt",))
                i = t.end()
                continue
            if cur is not None:
                cur.append(("ref", name))
            i = m.end()
            continue
        if cur is None:
            i += 1
            continue
        if c in "([":
            cur.append(("open",))
        elif c in ")]":
            cur.append(("close",))
        elif c == "|":
            cur.append(("alt",))
        elif c == "{":
            m = COUNTED.match(text, i)
            if m is not None:
                hi = int(m.group(3)) if m.group(3) else 0
                cur.append(("rep", max(int(m.group(1)), hi, 1), m.group(0)))
                i = m.end()
                continue
        elif c == "~":
            m = _TILDE.match(text, i)
            if m is not None:
                cur.append(("rep", max(int(m.group(1)), int(m.group(2) or 0), 1), m.group(0)))
                i = m.end()
                continue
        i += 1
    _check_lark_rules(what, defs)


def _check_lark_rules(what: str, defs: dict[str, list[tuple[Any, ...]]]) -> None:
    names = list(defs)
    idx, comp, comps = _rule_graph(what, names, lambda name: [it[1] for it in defs[name] if it[0] == "ref"])
    # terminals are inlined into lexemes: their repetitions expand (rule repetitions do not)
    cost = [1] * len(names)
    for c, members in enumerate(comps):
        for v in members:
            if not _is_terminal(names[v]):
                continue
            levels: list[list[int]] = [[0, 0, 0]]
            for it in defs[names[v]]:
                kind = it[0]
                atom = -1
                if kind == "atom":
                    atom = it[1]
                elif kind == "ref":
                    w = idx.get(it[1])
                    atom = 1 if w is None or comp[w] == c else cost[w]
                elif kind == "open":
                    levels.append([0, 0, 0])
                elif kind == "close" and len(levels) > 1:
                    alt, seq, _ = levels.pop()
                    atom = max(alt, seq)
                elif kind == "alt":
                    lv = levels[-1]
                    lv[0], lv[1], lv[2] = max(lv[0], lv[1]), 0, 0
                elif kind == "rep":
                    lv = levels[-1]
                    total = lv[2] * it[1]
                    if total > MAX_REPEAT_EXPANSION:
                        raise _repeat_error(what, names[v], total)
                    lv[1] += total - lv[2]
                    lv[2] = total
                if atom >= 0:
                    lv = levels[-1]
                    lv[1] += atom
                    lv[2] = atom
            cost[v] = close_levels(levels)
