"""Grammar compilation cannot take the process down (issue 33 §2.1, §2.9): the deepest JSON schema, GBNF and
Lark grammar that pass the limits of llamapy.grammar.limits compile; one past them is a GrammarError that
states the limit; grammars llguidance accepted but could not follow are refused before any decoding.

The near-limit and past-limit compilations run in a subprocess: a native stack overflow would kill it,
not the test run, and the test would say so."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from llamapy.grammar import GrammarError, LlamaGrammar
from llamapy.grammar.limits import (
    MAX_REPEAT_EXPANSION,
    MAX_RULE_CHAIN,
    MAX_RULES,
    MAX_SCHEMA_CHAIN,
    chain_bound,
    regex_cost,
    run_deep,
)
from tests.grammar.conftest import check_cases

# --- the hostile shapes of the issue, at a chosen depth ---------------------------------------------------------


def defs_chain(n: int) -> dict:
    """The issue's schema: d0 .. d{n-1} each null or an array of the next, d{n} an integer (3 nodes a level)."""
    defs: dict = {
        f"d{i}": {"anyOf": [{"type": "null"}, {"type": "array", "items": {"$ref": f"#/$defs/d{i + 1}"}}]}
        for i in range(n)
    }
    defs[f"d{n}"] = {"type": "integer"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def gbnf_chain(n: int) -> str:
    """root -> r0 -> ... -> r{n}: n + 2 rules in one chain."""
    return "root ::= r0\n" + "".join(f'r{i} ::= "a" r{i + 1}\n' for i in range(n)) + f'r{n} ::= "b"\n'


def lark_chain(n: int) -> str:
    return "%llguidance {}\nstart: r0\n" + "".join(f'r{i}: "a" r{i + 1}\n' for i in range(n)) + f'r{n}: "b"\n'


# the deepest that pass: the schema chain is the root, 3 nodes a level and the last; a rule chain n + 2 rules
SCHEMA_OK = (MAX_SCHEMA_CHAIN - 2) // 3
RULES_OK = MAX_RULE_CHAIN - 2

_CHILD = """
import json, sys
from llamapy.grammar import GrammarError, LlamaGrammar
from tests.grammar.test_limits import defs_chain, gbnf_chain, lark_chain
kind, n = sys.argv[1], int(sys.argv[2])
try:
    if kind == "schema":
        g = LlamaGrammar.from_json_schema(json.dumps(defs_chain(n)))
    elif kind == "gbnf":
        g = LlamaGrammar.from_string(gbnf_chain(n))
    else:
        g = LlamaGrammar.from_string(lark_chain(n))
    print("compiled", g.kind)
except GrammarError as e:
    print("GrammarError:", e)
"""


def _compile_in_child(kind: str, n: int) -> str:
    p = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_CHILD), kind, str(n)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, f"the compiling process died (rc {p.returncode}): {p.stderr[-2000:]}"
    return p.stdout.strip()


@pytest.mark.parametrize(
    ("kind", "ok", "limit"),
    [
        ("schema", SCHEMA_OK, MAX_SCHEMA_CHAIN),
        ("gbnf", RULES_OK, MAX_RULE_CHAIN),
        ("lark", RULES_OK, MAX_RULE_CHAIN),
    ],
)
def test_deepest_accepted_compiles_and_one_past_is_refused(kind, ok, limit):
    assert _compile_in_child(kind, ok).startswith("compiled")
    out = _compile_in_child(kind, ok + 1)
    assert out.startswith("GrammarError:") and f"limit of {limit}" in out, out


@pytest.mark.parametrize(("kind", "n"), [("schema", 700), ("schema", 1000), ("gbnf", 3800), ("lark", 3000)])
def test_the_issues_crashers_are_refused_quickly(kind, n):
    t = time.perf_counter()
    out = _compile_in_child(kind, n)
    assert out.startswith("GrammarError:") and "deeper than the limit" in out, out
    assert time.perf_counter() - t < 60  # the child imports llamapy; the check itself takes ~0.2 s


def test_compiles_on_a_thread_with_a_large_stack():
    """Each llguidance compilation runs on its own thread with a 256 MiB stack; the process-wide default
    for new threads is left as it was."""
    before = threading.stack_size()
    seen = run_deep(lambda: (threading.current_thread().name, threading.stack_size()))
    assert seen[0] == "llamapy-grammar-compile"
    assert threading.stack_size() == before
    with pytest.raises(ZeroDivisionError):
        run_deep(lambda: 1 / 0)  # exceptions come back to the caller
    assert run_deep(lambda: run_deep(lambda: 7)) == 7  # nested: runs inline


def test_chain_bound_counts_cycles_whole():
    assert chain_bound(4, [[1], [2], [3], []]) == (4, [0, 1, 2, 3])
    assert chain_bound(4, [[1], [2], [0, 3], []])[0] == 4  # the cycle 0-1-2, then 3
    assert chain_bound(100_000, [[i + 1] for i in range(99_999)] + [[]])[0] == 100_000  # no recursion


# --- expansion blow-ups and grammars llguidance only fails on while sampling --------------------------------------


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (
            lambda: LlamaGrammar.from_json_schema({"type": "string", "pattern": "^(x{1000}){1000}$"}),
            "expands to",
        ),
        (lambda: LlamaGrammar.from_regex("(x{1000}){1000}"), "expands to"),
        (lambda: LlamaGrammar.from_string('root ::= ("a"{1000}){1000}'), "expands to"),
        (lambda: LlamaGrammar.from_string('root ::= r{1000}\nr ::= "a"{1000}'), "expands to"),
        (lambda: LlamaGrammar.from_string('%llguidance {}\nstart: X\nX: ("ab"{1000}){1000}'), "expands to"),
        (lambda: LlamaGrammar.from_string("%llguidance {}\nstart: /(x{1000}){1000}/"), "expands to"),
        (lambda: LlamaGrammar.from_json_schema({"$ref": "#"}), "no value can ever match #"),
        (
            lambda: LlamaGrammar.from_json_schema(
                {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
            ),
            "no value can ever match",
        ),
        (
            lambda: LlamaGrammar.from_json_schema(
                {"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]}
            ),
            "no value can ever match",
        ),
        (
            lambda: LlamaGrammar.from_string(f"%llguidance {{}}\nstart: %json {json.dumps(defs_chain(400))}"),
            "limit",
        ),
    ],
)
def test_refused_at_once(make, match):
    t = time.perf_counter()
    with pytest.raises(GrammarError, match=match):
        make()
    assert time.perf_counter() - t < 5  # measured: well under 0.1 s each


def test_repetition_limit_is_the_product():
    host = r"^([a-z0-9]{1,63}\.){1,127}[a-z]{2,63}$"  # a host name: fine
    assert regex_cost(host, "x") == 64 * 127 + 63 + 2
    assert regex_cost("(x{100}){100}", "x") == MAX_REPEAT_EXPANSION
    with pytest.raises(GrammarError, match=f"the limit is {MAX_REPEAT_EXPANSION}"):
        regex_cost("(x{100}){101}", "x")
    LlamaGrammar.from_string('root ::= ("ab"{50}){100}')  # 10,000: accepted
    LlamaGrammar.from_string('root ::= (r " "){500}\nr ::= "a" | "(" root ")"')  # recursion: counts 1


def test_recursive_schemas_with_a_way_out_still_work(toy):
    tree = {
        "type": "object",
        "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#"}}},
    }
    g = LlamaGrammar.from_json_schema(tree)
    check_cases(g, toy, ['{"v": 1}', '{"kids": [{"v": 2}, {}]}'], ['{"kids": [1]}'])
    linked = {
        "$defs": {"n": {"anyOf": [{"type": "null"}, {"type": "array", "items": {"$ref": "#/$defs/n"}}]}}
    }
    g = LlamaGrammar.from_json_schema({**linked, "$ref": "#/$defs/n"})
    check_cases(g, toy, ["null", "[[null]]", "[]"], ["[1]"])


def test_too_ambiguous_is_refused_before_decoding(toy):
    """2000 nullable rules in a row: llguidance accepts the grammar but cannot compute a mask for it."""
    n = 2000
    src = (
        "root ::= "
        + " ".join(f"r{i}" for i in range(n))
        + "\n"
        + "".join(f'r{i} ::= "a"? "b"?\n' for i in range(n))
    )
    g = LlamaGrammar.from_string(src)
    t = time.perf_counter()
    with pytest.raises(GrammarError, match="too complex|too ambiguous|cannot be followed"):
        g.check(toy)
    assert time.perf_counter() - t < 30  # measured ~1.5 s on SmolLM2's vocabulary, less on this one


def test_a_ref_we_cannot_follow_counts_every_subschema():
    deep = defs_chain(700)
    deep["$ref"] = "other.json#/$defs/d0"
    with pytest.raises(GrammarError, match="cannot be followed here.*limit of 1000"):
        LlamaGrammar.from_json_schema(deep)


def test_too_many_rules():
    n = MAX_RULES + 1
    src = (
        "root ::= "
        + " | ".join(f"r{i}" for i in range(n))
        + "\n"
        + "".join(f'r{i} ::= "a"\n' for i in range(n))
    )
    with pytest.raises(GrammarError, match=f"more than the limit of {MAX_RULES}"):
        LlamaGrammar.from_string(src)
