"""Bounds that keep llguidance's native compiler safe, checked before it sees a grammar.

llguidance compiles and validates grammars recursively in Rust: a chain of rules or ``$ref``\\ s deep enough
overflows the native stack and kills the process (measured on llguidance 1.9 with an 8 MiB stack: about
3,500 chained GBNF rules, 2,700 Lark rules, 2,000 JSON-schema nodes, roughly 2.3, 3 and 4.4 KiB a level).
Two defences:

- the limits below, checked on the grammar's own structure (a typed :class:`GrammarError` that states
  the limit), set so that the deepest accepted grammar uses under 5 MiB of native stack;
- :func:`run_deep`: every llguidance compilation runs on a thread with a :data:`COMPILE_STACK` stack, so
  even a grammar whose cost per level is ten times the measured one cannot reach the end of it.

A rule *chain* is a path of references; rules that refer to each other in a cycle may all be on one path,
so a cycle counts as the number of its members (the bound holds whatever order a compiler walks them in).

Bounded repetitions expand in llguidance's lexer (``(x{1000}){1000}`` is a million-state regex: seconds
per token and hundreds of MB), so the expanded size of any repetition is bounded, nested ones multiplied.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from .errors import GrammarError

MAX_RULE_CHAIN = 2000  # GBNF rules and groups, or Lark rules, in one chain of references
MAX_RULES = 20_000  # rules (GBNF groups included) in one grammar
MAX_SCHEMA_CHAIN = 1000  # JSON-schema nodes (subschemas and $ref hops) in one chain
MAX_JSON_NESTING = 100  # objects and arrays nested in a JSON schema's text (llguidance's parser stops at 128)
MAX_REPEAT_EXPANSION = 10_000  # characters a bounded repetition expands to, nested repetitions multiplied
MAX_REGEX_NESTING = 200  # groups nested in a regex
COMPILE_STACK = 256 << 20  # native stack of the thread that compiles grammars

T = TypeVar("T")

# --- a thread with a large stack ---------------------------------------------------------------------------

_stack_lock = threading.Lock()
_deep = threading.local()


def _no_panic(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, a panic in llguidance's Rust code (pyo3's ``PanicException``, a ``BaseException``
    that no ``except Exception`` catches) turned into a :class:`GrammarError`."""
    try:
        return fn(*args)
    except (Exception, KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except BaseException as e:
        what = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise GrammarError(f"llguidance failed on this grammar: {what}") from None


def run_deep(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on a fresh thread with a :data:`COMPILE_STACK` stack; its result or its exception.

    ``threading.stack_size`` is process-wide: it is set only while this thread is created, then restored.
    Called from such a thread already, or where no thread can be started, ``fn`` runs here."""
    if getattr(_deep, "active", False):
        return _no_panic(fn, *args)
    box: dict[str, Any] = {}

    def target() -> None:
        _deep.active = True
        try:
            box["result"] = _no_panic(fn, *args)
        except BaseException as e:  # handed to the caller
            box["error"] = e

    th = threading.Thread(target=target, name="llamapy-grammar-compile", daemon=True)
    with _stack_lock:
        try:
            old = threading.stack_size(COMPILE_STACK)
        except (ValueError, RuntimeError):
            return _no_panic(fn, *args)
        try:
            th.start()
        except RuntimeError:
            return _no_panic(fn, *args)
        finally:
            threading.stack_size(old)
    th.join()
    if "error" in box:
        raise box.pop("error")
    return box["result"]


# --- the longest chain of references -------------------------------------------------------------------------


def components(n: int, edges: list[list[int]], roots: Iterable[int]) -> tuple[list[int], list[list[int]]]:
    """Strongly connected components of the nodes reachable from ``roots`` (Tarjan's algorithm, iterative):
    each node's component (-1: unreachable) and the components, successors before their predecessors."""
    index = [-1] * n
    low = [0] * n
    on_stack = [False] * n
    comp = [-1] * n
    stack: list[int] = []
    comps: list[list[int]] = []
    counter = 0
    for root in roots:
        if index[root] >= 0:
            continue
        work: list[tuple[int, int]] = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on_stack[v] = True
            succ = edges[v]
            descended = False
            while i < len(succ):
                w = succ[i]
                i += 1
                if index[w] < 0:
                    work.append((v, i))
                    work.append((w, 0))
                    descended = True
                    break
                if on_stack[w]:
                    low[v] = min(low[v], index[w])
            if descended:
                continue
            if low[v] == index[v]:
                members = []
                while True:
                    w = stack.pop()
                    on_stack[w] = False
                    comp[w] = len(comps)
                    members.append(w)
                    if w == v:
                        break
                comps.append(members)
            if work:
                u = work[-1][0]
                low[u] = min(low[u], low[v])
    return comp, comps


def chain_bound(n: int, edges: list[list[int]], roots: Iterable[int] = (0,)) -> tuple[int, list[int]]:
    """An upper bound on the nodes of any simple path from ``roots`` in a graph of ``n`` nodes (``edges[v]``:
    v's successors): the longest path through its strongly connected components, each weighing its size;
    and one node of each component on that path (for messages)."""
    roots = list(roots)
    comp, comps = components(n, edges, roots)
    best = [0] * len(comps)
    nxt = [-1] * len(comps)
    for c, members in enumerate(comps):
        tail, arg = 0, -1
        for v in members:
            for w in edges[v]:
                d = comp[w]
                if d != c and best[d] > tail:
                    tail, arg = best[d], d
        best[c] = len(members) + tail
        nxt[c] = arg
    top = max((comp[r] for r in roots if comp[r] >= 0), key=lambda c: best[c], default=-1)
    if top < 0:
        return 0, []
    path: list[int] = []
    c = top
    while c >= 0:
        path.append(min(comps[c]))
        c = nxt[c]
    return best[top], path


def chain_error(what: str, bound: int, names: list[str], limit: int, unit: str) -> GrammarError:
    shown = " -> ".join(names[:4]) + (" -> ..." if len(names) > 4 else "")
    return GrammarError(
        f"{what}: a chain of {bound} {unit}, each referring to the next ({shown}), is deeper than the limit "
        f"of {limit} ({unit} in a reference cycle all count)"
    )


# --- regular expressions (Rust ``regex`` syntax) ---------------------------------------------------------------

COUNTED = re.compile(r"\{\s*(\d+)\s*(?:(,)\s*(\d*)\s*)?\}")
_ESC_BRACED = "xuUpP"


def regex_cost(rx: str, what: str) -> int:
    """The expanded size of ``rx`` (longest alternative; bounded repetitions multiplied, unbounded ones
    counted once); GrammarError where a repetition expands past :data:`MAX_REPEAT_EXPANSION` or groups nest
    past :data:`MAX_REGEX_NESTING`."""
    # each level: [alternatives' best, current sequence sum, cost of the last atom]
    levels: list[list[int]] = [[0, 0, 0]]
    i, n = 0, len(rx)
    while i < n:
        c = rx[i]
        atom = -1
        if c == "\\":
            e = rx[i + 1 : i + 2]
            if e in _ESC_BRACED and rx[i + 2 : i + 3] == "{":
                end = rx.find("}", i + 3)
                i = end + 1 if end > 0 else n
            elif e == "x":
                i += 4
            elif e in ("p", "P"):
                i += 3
            else:
                i += 2
            atom = 1
        elif c == "[":
            i = _class_end(rx, i)
            atom = 1
        elif c == "(":
            if rx.startswith("(?", i):
                j = i + 2
                while j < n and rx[j] not in ":)<P'":
                    j += 1
                if j < n and rx[j] == ")":  # (?flags): not a group
                    i = j + 1
                    continue
            if len(levels) > MAX_REGEX_NESTING:
                raise GrammarError(f"{what}: groups nested more than {MAX_REGEX_NESTING} deep (the limit)")
            levels.append([0, 0, 0])
            i += 1
            if rx.startswith("?", i):
                close = {"P": ">", "<": ">", "'": "'"}
                while i < n and rx[i] not in ":" + "".join(close):
                    i += 1
                if i < n and rx[i] in close:
                    end = rx.find(close[rx[i]] if rx[i] != "P" else ">", i + 1)
                    i = end + 1 if end > 0 else n
                else:
                    i += 1
            continue
        elif c == ")":
            if len(levels) == 1:
                i += 1
                continue
            alt, seq, _ = levels.pop()
            atom = max(alt, seq)
            i += 1
        elif c == "|":
            lv = levels[-1]
            lv[0], lv[1], lv[2] = max(lv[0], lv[1]), 0, 0
            i += 1
            continue
        elif c in "*+?":
            i += 1
            if rx[i : i + 1] in ("?", "+"):
                i += 1
            continue
        elif c == "{":
            m = COUNTED.match(rx, i)
            if m is not None:
                lo = int(m.group(1))
                hi = int(m.group(3)) if m.group(3) else None
                lv = levels[-1]
                total = lv[2] * max(lo, hi or 0, 1)
                if total > MAX_REPEAT_EXPANSION:
                    raise GrammarError(
                        f"{what}: the repetition {m.group(0)!r} at offset {i} expands to {total} characters "
                        f"(the limit is {MAX_REPEAT_EXPANSION}, nested repetitions multiplied)"
                    )
                lv[1] += total - lv[2]
                lv[2] = total
                i = m.end()
                if rx[i : i + 1] in ("?", "+"):
                    i += 1
                continue
            atom = 1
            i += 1
        else:
            atom = 1
            i += 1
        lv = levels[-1]
        lv[1] += atom
        lv[2] = atom
    return close_levels(levels)


def close_levels(levels: list[list[int]]) -> int:
    """The longest expansion of a pattern scanned into ``levels`` (per open group: the longest closed
    alternative, the current sequence's length, its last atom's), closing the groups left open."""
    while len(levels) > 1:
        alt, seq, _ = levels.pop()
        levels[-1][1] += max(alt, seq)
    return max(levels[0][0], levels[0][1])


def _class_end(rx: str, i: int) -> int:
    """The index after the ``[...]`` class that starts at ``i`` (nested classes included)."""
    n = len(rx)
    depth = 0
    j = i
    while j < n:
        c = rx[j]
        if c == "\\":
            j += 2
            continue
        if c == "[":
            depth += 1
            j += 1
            if rx[j : j + 1] == "^":
                j += 1
            if rx[j : j + 1] == "]":  # a literal ']' first in the class
                j += 1
            continue
        if c == "]":
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return n


def check_regex(rx: str, what: str) -> None:
    regex_cost(rx, what)
