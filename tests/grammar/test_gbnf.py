"""GBNF: llama.cpp's tests/test-grammar-integration.cpp cases, errors, limits and the Lark it becomes."""

from __future__ import annotations

import time

import pytest

from llamapy.grammar import GrammarError, LlamaGrammar
from llamapy.grammar.gbnf import parse_gbnf
from llamapy.grammar.lark_writer import gbnf_lark
from llamapy.grammar.limits import MAX_RULE_CHAIN
from tests.grammar.conftest import END_THINK, EOS, PAD, THINK, TOOL_CALL, check_cases, matches

JSON_GBNF = r"""
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-7]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
"""

CASES = [
    (
        "simple grammar",
        'root ::= expr\nexpr ::= term ("+" term)*\nterm ::= number\nnumber ::= [0-9]+',
        ["42", "1+2+3+4+5", "123+456"],
        ["+", "/ 3", "1+2+3+4+5+", "12a45"],
    ),
    (
        "medium complexity grammar",
        r"""
            root ::= expression
            expression ::= term ws (("+"|"-") ws term)*
            term ::= factor ws (("*"|"/") ws factor)*
            factor ::= number | variable | "(" expression ")" | function-call
            number ::= [0-9]+
            variable ::= [a-zA-Z_][a-zA-Z0-9_]*
            function-call ::= variable ws "(" (expression ("," ws expression)*)? ")"
            ws ::= [ \t\n\r]?""",
        ["42", "1*2*3*4*5", "x", "x+10", "x1+y2", "(a+b)*(c-d)", "func()", "func(x,y+2)", "a*(b+c)-d/e",
         "f(g(x),h(y,z))", "x + 10", "x1 + y2", "(a + b) * (c - d)", "func(x, y + 2)", "a * (b + c) - d / e",
         "f(g(x), h(y, z))", "123+456", "123*456*789-123/456+789*123",
         "123+456*789-123/456+789*123-456/789+123*456-789/123+456*789-123/456+789*123-456"],
        ["+", "/ 3x", "x + + y", "a * / b", "func(,)", "func(x y)", "(a + b", "x + y)", "a + b * (c - d", "42 +",
         "x +", "x + 10 +", "(a + b) * (c - d", "func(", "func(x, y + 2", "a * (b + c) - d /", "f(g(x), h(y, z)",
         "123+456*789-123/456+789*123-456/789+123*456-789/123+456*789-123/456+789*123-456/"],
    ),
    (
        "special characters",
        'root ::= ... "abc" ...',
        ["abcabcabc", "aaaabcccc", "🔵🟠✅abc❌🟠🔵"],
        ["aaabcccc", "aaaaabcccc", "aaaabccc", "aaaabccccc", "🔵🟠✅❌abc❌✅🟠🔵", "🔵🟠abc🟠🔵"],
    ),
    ("* quantifier", 'root ::= "a"*', ["", "a", "aaaaa", "a" * 18, "a" * 62], ["b", "ab", "aab", "ba", "a" * 62 + "b"]),
    ("+ quantifier", 'root ::= "a"+', ["a", "aaaaa", "a" * 18], ["", "b", "ab", "aab", "ba", "a" * 62 + "b"]),
    ("? quantifier", 'root ::= "a"?', ["", "a"], ["b", "ab", "aa", "ba"]),
    (
        "mixed quantifiers",
        "root ::= cons+ vowel* cons? (vowel cons)*\nvowel ::= [aeiouy]\ncons ::= [bcdfghjklmnpqrstvwxyz]",
        ["yes", "no", "noyes", "crwth", "four", "bryyyy"],
        ["yess", "yesno", "forty", "catyyy"],
    ),
    ("simple exact repetition", "root ::= [ab]{4}", ["aaaa", "bbbb", "abab"], ["a", "b", "aaaaa"]),
    ("simple min repetition", "root ::= [ab]{4,}", ["aaaa", "aaaaab", "bbbb", "ababab"], ["", "aba"]),
    ("simple max repetition", "root ::= [ab]{0,4}", ["", "a", "aa", "aaa", "aaab"], ["aaaaa"]),
    (
        "min / max repetition",
        'root ::= ("0x" [A-F0-9]{2} " "?){3,5}',
        ["0xFF 0x12 0xAB", "0xFF 0x12 0xAB 0x00 0x00"],
        ["", "0xFF", "0xFF 0x12", "0xFF 0x12 0xAB 0x00 0x00 0x00"],
    ),
    ("segfault", "root ::= ( [x]* )*", ["", "x", "xx"], ["y", "yy"]),
    # where greedy lexing would go wrong: the Lark written for GBNF must not
    ("greedy class", 'root ::= [a-z]+ "x"', ["abx", "x" * 5, "ax"], ["ab", "abxy", "x"]),
    ("greedy alternatives", 'root ::= ("a" | "ab") "bc"', ["abc", "abbc"], ["ab", "abcc", "bc"]),
    ("greedy rule", 'root ::= word "s"\nword ::= [a-z]+', ["cats", "ss"], ["cat", "s"]),
    ("shared prefix", 'root ::= "a" | key\nkey ::= [a-z]+ "="', ["a", "abc=", "a="], ["ab", "=", "abc"]),
    ("optional space", 'root ::= "{" ws "}"\nws ::= | " " | "\\n" [ \\t]{0,3}', ["{}", "{ }", "{\n\t }"],
     ["{  }", "{\n    }", "{\n\n}"]),
    ("escapes", r'root ::= "\x41\u00e9\U0001F535\t\n\r\\\"\[\]\-"', ["Aé🔵\t\n\r\\\"[]-"], ["Ae"]),
    ("class escapes", r"root ::= [\x41-\x43\]\-]+", ["ABC]-", "]"], ["D", "^"]),
    ("negated class", r'root ::= [^a-c"]+', ["xyz", "é🔵", "\n"], ["a", "x\"", ""]),
    ("any char", "root ::= . .", ["ab", "é🔵", "\n\t"], ["a", "abc"]),
    ("empty alternative", 'root ::= "a" x "b"\nx ::= | "c"', ["ab", "acb"], ["acc", "a"]),
    ("left recursion (llama.cpp refuses it; Earley parses it)", 'root ::= "a" | root "a"', ["a", "aaa"], ["", "b"]),
    ("comments and CRLF", 'root ::= "a" | # one\r\n  "b" # two\r\nx ::= "c"\r\n', ["a", "b"], ["ab", ""]),
    ("later definition wins", 'root ::= x\nx ::= "a"\nx ::= "b"', ["b"], ["a"]),
    ("multiline groups", 'root ::= (\n  "a"\n  | "b"\n)', ["a", "b"], ["ab"]),
    ("json", JSON_GBNF, ['{"a": 1}', '{"a":[1,2,{"b":null}],"c":"x\\u00e9"}', "{}", '{"a" :true }'],
     ['{"a": 01}', '{"a" 1}', "[]", '{"a": "\x01"}', '{"a": tru}']),
]  # fmt: skip


@pytest.mark.parametrize("name,gbnf,passing,failing", CASES, ids=[c[0] for c in CASES])
def test_llama_cpp_cases(toy, name, gbnf, passing, failing):
    check_cases(LlamaGrammar.from_string(gbnf), toy, passing, failing)


def test_same_cases_on_a_real_vocabulary(smollm2):
    for _, gbnf, passing, failing in CASES[:4] + CASES[-1:]:
        check_cases(LlamaGrammar.from_string(gbnf), smollm2, passing, failing)


def test_tokens(toy):
    g = LlamaGrammar.from_string(f"root ::= <[{TOOL_CALL}]> content <[{PAD}]>\ncontent ::= (!<[{PAD}]>)*")
    tc = [TOOL_CALL]
    check_cases(
        g,
        toy,
        [tc + toy.tokenize("hello world") + [PAD], tc + [PAD], tc + [THINK, END_THINK, 97] + [PAD]],
        [tc + toy.tokenize("missing end"), tc, toy.tokenize("no start") + [PAD], tc + [PAD, PAD], [PAD] + tc],
    )


def test_complex_grammar_with_tokens(toy):
    a, b, c, d, e = 65, 66, 67, 68, 69  # single-byte tokens used as markers here: "A".."E"
    g = LlamaGrammar.from_string(
        f"""root ::= reasoning+ content tool-call*
            reasoning ::= <[{THINK}]> (!<[{END_THINK}]>)* <[{END_THINK}]>
            content ::= <[{TOOL_CALL}]> (!<[{PAD}]>)* <[{PAD}]>
            tool-call ::= <[{a}]> name <[{b}]> args <[{c}]>
            name ::= (!<[{b}]>)+
            args ::= (!<[{c}]>)*"""
    )
    t = toy.tokenize
    ok1 = [THINK, *t("thinking"), END_THINK, TOOL_CALL, *t("hello"), PAD, a, *t("search"), b, *t("q=1"), c]
    ok2 = [THINK, END_THINK, THINK, 100, END_THINK, TOOL_CALL, PAD]
    bad = [TOOL_CALL, *t("content"), PAD]
    check_cases(g, toy, [ok1, ok2], [bad, [THINK, END_THINK, TOOL_CALL, *t("x")], ok2 + [a, *t("x"), b]])
    _ = (d, e)


def test_token_by_text(toy):
    g = LlamaGrammar.from_string('root ::= <think> [a-z]* </think> "x" !<|tool_call|>')
    check_cases(
        g, toy, [[THINK, *toy.tokenize("abc"), END_THINK, 120, 97]], [[THINK, END_THINK, 120, TOOL_CALL], "x"]
    )
    bad = LlamaGrammar.from_string('root ::= <nope> "a"')  # parses; needs the vocabulary to resolve
    with pytest.raises(GrammarError, match="<nope>"):
        bad.check(toy)
    with pytest.raises(GrammarError, match="<nope>"):
        bad.sampler(toy)


def test_token_by_text_that_is_not_one_token(toy):
    g = LlamaGrammar.from_string('root ::= "a" <tool>')  # "<tool" is a token, "<tool>" is not
    with pytest.raises(GrammarError, match="not one token"):
        g.check(toy)


@pytest.mark.parametrize("src", ["root ::= <[100000]>", 'root ::= "a" !<[99999999]>', "root ::= <[291]>"])
def test_token_id_out_of_range(toy, src):
    g = LlamaGrammar.from_string(src)
    g.check()  # without a vocabulary nothing to check against
    with pytest.raises(GrammarError, match=r"<\[\d+\]> is out of range: this vocabulary has 291 tokens") as e:
        g.check(toy)
    assert "start:" not in str(e.value)  # the user's grammar, not the Lark written from it
    LlamaGrammar.from_string("root ::= <[290]> !<[0]>").check(toy)  # the last id and the first are fine


ERRORS = [
    ("root ::= expr\nexpr ::= term\nterm ::= numero\nnumber ::= [0-9]+", "undefined rule 'numero' at line 3"),
    ("rot ::= expr\nexpr ::= [0-9]+", "no 'root' rule"),
    ('root ::= "a', "unterminated string literal at line 1, column 10"),
    ("root ::= [a-", "unexpected end of input"),
    ('root ::= "a" )', "expecting a newline or the end"),
    ('root ::= ("a"', "expecting '\\)'"),
    ('root = "a"', "expecting '::='"),
    ('root ::= "\\q"', "unknown escape"),
    ('root ::= "\\x4"', "hex digits"),
    ("root ::= * ", "expecting an item before '\\*'"),
    ('root ::= "a"{3000}', "more than 2000 repetitions"),
    ('root ::= "a"{5,2}', "below its minimum"),
    ('root ::= "a"{2', "expecting ',' or '}'"),
    ("root ::= <[12", "expecting ']'"),
    ("root ::= <[2147483648]>", "token id 2147483648 is too large at line 1, column 12"),
    ("root ::= <abc", "expecting '>'"),
    ("root ::= !x", "expecting '<'"),
    ("root ::= (((((([^x]*){0,99}){0,99}){0,99}){0,99}){0,99}){0,99}", "beyond llama.cpp's limit"),
    ('root ::= "a"\n  | "b"', "expecting a rule name at line 2"),  # as llama.cpp: '|' ends no line
    ("", "no rules"),
    ("# only a comment\n", "no rules"),
]


@pytest.mark.parametrize("gbnf,message", ERRORS)
def test_errors(gbnf, message):
    with pytest.raises(GrammarError, match=message):
        LlamaGrammar.from_string(gbnf)


@pytest.mark.parametrize("n", [60_000, 1000])
def test_deep_nesting_is_refused_quickly(n):
    t = time.perf_counter()
    with pytest.raises(GrammarError, match="nested more than"):
        LlamaGrammar.from_string("root ::= " + "(" * n + '"a"' + ")" * n)
    with pytest.raises(GrammarError, match="nested"):
        LlamaGrammar.from_string("%llguidance {}\nstart: " + "(" * n + '"a"' + ")" * n)
    assert time.perf_counter() - t < 1.0


def test_moderate_nesting_works(toy):
    n = 150
    g = LlamaGrammar.from_string("root ::= " + "(" * n + '"a" [b-c]' + ")*" * n)
    check_cases(g, toy, ["", "ab", "acab"], ["a", "ba"])


def test_long_rule_chain(toy):
    n = MAX_RULE_CHAIN - 10  # root, r0 ... rn: just inside the limit (tests/grammar/test_limits.py)
    rules = [f"r{i} ::= r{i + 1} | " + f'"{i % 10}"' for i in range(n)] + [f'r{n} ::= "x"']
    t = time.perf_counter()
    g = LlamaGrammar.from_string("root ::= r0 r0\n" + "\n".join(rules))
    assert time.perf_counter() - t < 10
    check_cases(g, toy, ["xx", "0x", "91"], ["x", "xxx"])


def test_lark_is_passed_as_is(toy):
    g = LlamaGrammar.from_string('%llguidance {}\nstart: "a" B\nB: /[0-9]+/')
    assert g.kind == "lark"
    check_cases(g, toy, ["a1", "a123"], ["a", "1"])
    with pytest.raises(GrammarError, match="unknown name"):
        LlamaGrammar.from_string('%llguidance {}\nstart: "a" b')
    g = LlamaGrammar.from_lark("start: <think> /[a-z]+/ </think>")  # llguidance's special-token syntax
    check_cases(g, toy, [[THINK, 97, END_THINK]], [toy.tokenize("<think>a</think>")])
    with pytest.raises(GrammarError, match="unknown special token"):
        LlamaGrammar.from_lark("start: <nope>").check(toy)


def test_units_keep_masks_cheap():
    """json.gbnf's strings and whitespace are single lexemes; the ambiguous pieces are not."""
    conv = gbnf_lark(parse_gbnf(JSON_GBNF))
    lark = conv.lark
    assert "\nSTRING: " in lark and "\nWS: " in lark and '"true" | "false" | "null"' in lark
    conv = gbnf_lark(parse_gbnf('root ::= ("a" | "ab") "bc" root | "."'))
    assert '"ab"' not in conv.lark and '"bc"' not in conv.lark  # written one character per lexeme
    conv = gbnf_lark(parse_gbnf('root ::= ("a" | "ab") "bc"'))  # characters only: one regex, always right
    assert conv.lark.splitlines()[2:] == ["start: ROOT", 'ROOT: ROOT_G1 "bc"', 'ROOT_G1: "a" | "ab"']


def test_from_file(tmp_path, toy):
    p = tmp_path / "g.gbnf"
    p.write_text('root ::= "hi"\n', encoding="utf-8")
    g = LlamaGrammar.from_file(p)
    assert g.kind == "gbnf" and g.source == 'root ::= "hi"\n'
    check_cases(g, toy, ["hi"], ["h"])
    with pytest.raises(GrammarError, match="cannot read"):
        LlamaGrammar.from_file(tmp_path / "missing.gbnf")


def test_eos_only_at_the_end(toy):
    s = LlamaGrammar.from_string('root ::= "ab"').sampler(toy)
    s.accept(97)
    assert not s.is_accepting()
    with pytest.raises(GrammarError, match="not complete"):
        s.accept(EOS)
    s.accept(98)
    assert s.is_accepting() and s.is_finished()
    s.accept(EOS)


@pytest.mark.parametrize(
    "gbnf, yes, no",
    [
        ('root ::= "a"{0} "b"', ["b"], ["ab", "a", ""]),
        ('root ::= [a-z]{0,0} "b" x{0}\nx ::= "c" x | "d"', ["b"], ["ab", "bd", "bcd"]),
        ('root ::= ("a" root){0} "b" | "c"', ["b", "c"], ["ab", "abb", "cb"]),
    ],
)
def test_zero_repetitions_are_the_empty_string(bytes_vocab, gbnf: str, yes: list[str], no: list[str]) -> None:
    """x{0} and x{0,0} match nothing but the empty string, as in llama.cpp (llguidance refuses a range
    ending at 0: such a grammar was a GrammarError quoting the generated Lark)."""
    g = LlamaGrammar.from_string(gbnf)
    assert all(matches(g, bytes_vocab, s) for s in yes)
    assert not any(matches(g, bytes_vocab, s) for s in no)
