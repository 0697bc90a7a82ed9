"""Gemma 4: detection on the real templates, the prompt side, parsing (streamed in any split), the
grammar (typed arguments, lazy trigger outside thought blocks) on a byte vocabulary with Gemma's special
tokens and on the real Gemma 4 vocabulary, read back by the parser."""

from __future__ import annotations

import json
import random
import re

import pytest

from llamapy.chat import ChatSyntax, detect_format
from llamapy.chat.gemma4 import PARTIAL_VALUE, Gemma4Format, fold_tool_responses, read_gemma_value
from llamapy.vocab.chat_template import ChatTemplate
from tests.chat.conftest import TOOLS, run_pieces, summary
from tests.util import shared_path

TEMPLATES = ("google-gemma-4-31B-it", "google-gemma-4-31B-it-interleaved")
Q = '<|"|>'
SPECIALS = ("<|tool_call>", "<tool_call|>", "<|channel>", "<channel|>", Q, "<|turn>", "<|tool_response>")


def _source(name: str) -> str:
    return shared_path("templates", f"{name}.jinja").read_text()


@pytest.fixture(scope="module")
def fmt() -> Gemma4Format:
    f = detect_format(_source(TEMPLATES[0]))
    assert isinstance(f, Gemma4Format)
    return f


def call(name: str, body: str) -> str:
    return f"<|tool_call>call:{name}{{{body}}}<tool_call|>"


WEATHER = call("get_weather", f"location:{Q}Paris{Q},days:3")
TIME = call("get_time", f"timezone:{Q}UTC{Q}")


# --- detection ---


@pytest.mark.parametrize("name", TEMPLATES)
def test_detect(name):
    src = _source(name)
    assert detect_format(src).name == "gemma4"
    assert detect_format(src, tools_requested=False).name == "gemma4"
    assert detect_format(_source("google-gemma-2-2b-it")).name == "generic"


# --- parsing ---

CASES = [
    ("Hello, world!", ("Hello, world!", None, [])),
    ("<|channel>thought\nI'm\nthinking<channel|>Hello, world!", ("Hello, world!", "I'm\nthinking", [])),
    ("<|channel>thought<channel|>Hello", ("Hello", None, [])),
    ("<|turn>model\n<|channel>thought\n<channel|>Hi<|channel>thought\n<channel|><channel|>", ("Hi", None, [])),
    ("<|channel><|channel>thought\n<channel|>Hello", ("Hello", None, [])),
    (WEATHER, ("", None, [("get_weather", {"location": "Paris", "days": 3})])),
    ("Let me check." + WEATHER + "\n" + TIME, ("Let me check.", None, [
        ("get_weather", {"location": "Paris", "days": 3}), ("get_time", {"timezone": "UTC"})])),
    ("<|channel>thought\nhmm <|tool_call> no<channel|>" + TIME, ("", "hmm <|tool_call> no", [
        ("get_time", {"timezone": "UTC"})])),
    (call("f", "") + call("g", "a:-7,b:3.14,c:true,d:false,e:null"), ("", None, [
        ("f", {}), ("g", {"a": -7, "b": 3.14, "c": True, "d": False, "e": None})])),
    (call("todo", f"todos:[{Q}buy milk{Q},{Q}walk dog{Q}],x:[],cfg:{{theme:{Q}dark{Q},n:{{}}}}"),
     ("", None, [("todo", {"todos": ["buy milk", "walk dog"], "x": [], "cfg": {"theme": "dark", "n": {}}})])),
    (call("f", f"s:{Q}a \"quoted\" {{x:1}}, line\nbreak{Q}"), ("", None, [
        ("f", {"s": 'a "quoted" {x:1}, line\nbreak'})])),
    ("<|tool_call>call:f{a:1}", ("", None, [("f", {"a": 1})])),  # the end tag cut off by the stop
    # not calls: kept as content
    ("I use <|tool_call> tags", ("I use <|tool_call> tags", None, [])),
    ("x <|tool_call>call:f{a:1,}<tool_call|>", ("x <|tool_call>call:f{a:1,}<tool_call|>", None, [])),
    ("<|tool_call>call:f{a:<|\"|>open", ("<|tool_call>call:f{a:<|\"|>open", None, [])),
    ("<|tool_call>call:f{a:bare}<tool_call|>", ("<|tool_call>call:f{a:bare}<tool_call|>", None, [])),
]  # fmt: skip


def _splits(text: str, seed: int) -> list[list[str]]:
    rng = random.Random(seed)
    out = [[text], list(text)]
    for _ in range(3):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, 5))) if len(text) > 1 else []
        out.append([text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)])
    return out


@pytest.mark.parametrize("k", range(len(CASES)))
def test_parse(fmt, k):
    text, expected = CASES[k]
    for pieces in _splits(text, k):
        assert summary(run_pieces(fmt, pieces)) == expected, pieces


def test_parse_options(fmt):
    text = "<|channel>thought\nI'm\nthinking<channel|>Hello" + TIME
    raw = run_pieces(fmt, list(text), reasoning_format="none")
    assert (raw.content, raw.reasoning_content) == ("<|channel>thought\nI'm\nthinking<channel|>Hello", None)
    assert [c.name for c in raw.tool_calls] == ["get_time"]
    opened = run_pieces(fmt, list("I'm thinking<channel|>Hi"), thinking_forced_open=True)
    assert (opened.content, opened.reasoning_content) == ("Hi", "I'm thinking")
    plain = run_pieces(fmt, list(TIME), parse_tool_calls=False)
    assert (plain.content, plain.tool_calls) == (TIME, [])


def test_streamed_deltas(fmt):
    parser = fmt.parser(ChatSyntax("gemma4"))
    assert [d.reasoning_content for d in parser.feed("<|channel>thought\nstep one ")] == ["step one"]
    got = parser.feed("and two<channel|>Answer: <|tool_")
    assert "".join(d.reasoning_content for d in got) == " and two"
    assert "".join(d.content for d in got) == "Answer: "  # "<|tool_" held back
    assert parser.feed("call>call:get_time{timezone:" + Q + "U") == []
    got = parser.feed("TC" + Q + "}<tool_call|>")
    assert [(d.tool_call_name, json.loads(d.tool_call_arguments)) for d in got] == [
        ("get_time", {"timezone": "UTC"})
    ]


def test_read_gemma_value():
    assert read_gemma_value("{a:1.5e10}") == ('{"a": 1.5e10}', 10)
    assert read_gemma_value(f"{{ a : {Q}x{Q} , b :[ 1 , 2 ] }}")[0] == '{"a": "x", "b": [1, 2]}'
    for partial in ("{a:", "{a:1", "[1,", Q + "abc", "<|", "tr", "{ke"):
        assert read_gemma_value(partial) is PARTIAL_VALUE, partial
    assert read_gemma_value("{a:x}") is None and read_gemma_value("{:1}") is None
    assert read_gemma_value("[" * 100000) is None  # too deep: not a value, no crash


# --- prompt side ---

CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What's the weather in Paris?"},
    {
        "role": "assistant",
        "content": "Let me check.",
        "reasoning_content": "The user wants the weather.",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "arguments": json.dumps({"location": "Paris", "days": 2}),
                },
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 22}'},
]


@pytest.mark.parametrize("name", TEMPLATES)
def test_prompt(name):
    src = _source(name)
    f = detect_format(src)
    tmpl = ChatTemplate(src, "<bos>", "<eos>")
    before = json.dumps(CONVERSATION)
    msgs = f.prepare_messages(CONVERSATION, tools=TOOLS)
    assert json.dumps(CONVERSATION) == before
    out = tmpl.render(msgs, add_generation_prompt=True, tools=TOOLS)
    assert "<|tool>declaration:get_weather{" in out and "declaration:get_time{" in out
    assert '<|tool_call>call:get_weather{days:2,location:<|"|>Paris<|"|>}<tool_call|>' in out
    assert "<|tool_response>response:get_weather{" in out and "22" in out
    assert "<|channel>thought\nThe user wants the weather." in out
    out = f.finish_prompt(out, True)
    assert out.endswith("<|turn>model\n") or out.endswith("<|channel>thought\n<channel|>")
    assert not f.thinking_forced_open(out)
    assert f.thinking_forced_open(out + "<|channel>thought\n")
    assert f.finish_prompt("x<turn|>\n", False) == "x<turn|>\n"


def test_fold_tool_responses():
    folded = fold_tool_responses([*CONVERSATION, {"role": "assistant", "content": "22 degrees."}])
    assert [m["role"] for m in folded] == ["system", "user", "assistant"]
    last = folded[-1]
    assert last["tool_responses"] == [{"name": "get_weather", "response": {"temperature": 22}}]
    assert last["content"] == "22 degrees." and last["reasoning_content"] == "The user wants the weather."
    assert "tool_responses" not in detect_format(_source(TEMPLATES[0])).prepare_messages(CONVERSATION)[-1]


# --- grammar, byte vocabulary with Gemma's special tokens ---


class SpecialVocab:
    """A byte-level llguidance vocabulary with the special tokens ``specials`` (the last is the EOS) and
    ``match(grammar, text, specials=True)``: whether the grammar accepts exactly ``text``, tokenized with
    the special tokens (or, ``specials=False``, as bytes only)."""

    def __init__(self, specials: tuple[str, ...]) -> None:
        import llguidance
        from llguidance._tokenizer import TokenizerWrapper

        self.specials = specials
        self.tokens = [bytes([i]) for i in range(256)] + [b"\xff" + s.encode() for s in specials]
        self.eos_token_id = 256 + len(specials) - 1
        self.bos_token_id = None
        self.special_token_ids = list(range(256, 256 + len(specials)))
        self.tok = llguidance.LLTokenizer(TokenizerWrapper(self))

    def __call__(self, text: bytes | str) -> list[int]:
        return list(text.encode() if isinstance(text, str) else text)

    def special(self, text: str) -> int | None:
        return 256 + self.specials.index(text) if text in self.specials else None

    def tokenize(self, text: str, specials: bool = True) -> list[int]:
        out, i = [], 0
        while i < len(text):
            s = next((s for s in self.specials if specials and text.startswith(s, i)), None)
            if s:
                out.append(self.special(s))
                i += len(s)
            else:
                out.extend(text[i].encode())
                i += 1
        return out

    def match(self, g, text: str, specials: bool = True) -> bool:
        import llguidance

        compiled = llguidance.LLMatcher.grammar_from_lark(g.lark)
        err, msgs = llguidance.LLMatcher.validate_grammar_with_warnings(compiled, self.tok)
        assert not err, f"{msgs}\n{g.lark}"
        mt = llguidance.LLMatcher(self.tok, compiled, log_level=0)
        ok = mt.consume_tokens(self.tokenize(text, specials))
        return bool(ok) and not mt.is_error() and mt.is_accepting()


VOCAB = SpecialVocab(SPECIALS)
special = VOCAB.special


@pytest.fixture(scope="module")
def match():
    return VOCAB.match


def trigger_start(g, text: str) -> int | None:
    (kind, pattern) = g.triggers[0]
    assert kind == "pattern_full" and len(g.triggers) == 1
    m = re.fullmatch(pattern, text)
    return m.start(1) if m else None


BAD = call("get_weather", f"location:{Q}Paris{Q},days:{Q}three{Q}")


@pytest.mark.parametrize("specials", [True, False])
def test_grammar(fmt, match, specials):
    sp = special if specials else (lambda t: None)
    g = fmt.grammar(TOOLS, "auto", True, sp)
    assert match(g, WEATHER, specials) and match(g, TIME, specials)
    assert match(g, call("get_weather", f"days:3,location:{Q}Nice{Q}"), specials)  # any key order
    assert match(g, WEATHER + TIME, specials) and match(g, WEATHER + "\n" + TIME, specials)
    assert not match(g, BAD, specials), "bad arguments accepted"
    assert not match(g, call("get_weather", f"place:{Q}Paris{Q}"), specials), "unknown key accepted"
    assert not match(g, call("get_stock", f"symbol:{Q}X{Q}"), specials), "unknown tool accepted"
    single = fmt.grammar(TOOLS, "auto", False, sp)
    assert match(single, WEATHER, specials) and not match(single, WEATHER + TIME, specials)
    named = fmt.grammar(TOOLS, {"type": "function", "function": {"name": "get_time"}}, True, sp)
    assert match(named, TIME, specials) and not match(named, WEATHER, specials)
    required = fmt.grammar(TOOLS, "required", True, sp)
    assert required.triggers == ()
    assert match(required, TIME, specials) and not match(required, "Hello", specials)
    assert match(required, "<|channel>thought\nhmm<channel|>" + TIME, specials)
    forced = fmt.grammar(TOOLS, "required", True, sp, thinking_forced_open=True)
    assert match(forced, "hmm<channel|>" + TIME, specials) and not match(forced, TIME, specials)
    assert fmt.grammar(TOOLS, "none", True, sp) is None and fmt.grammar([], "auto", True, sp) is None


def test_grammar_types(fmt, match):
    tool = {
        "type": "function",
        "function": {
            "name": "f",
            "parameters": {
                "type": "object",
                "properties": {
                    "mode": {"enum": ["fast", "slow"]},
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "opt": {"type": ["number", "null"]},
                    "flag": {"type": "boolean"},
                    "cfg": {"type": "object", "properties": {"n": {"type": "integer"}}},
                    "any": {},
                },
            },
        },
    }
    g = fmt.grammar([tool], "required", True, special)
    ok = call(
        "f", f"mode:{Q}fast{Q},tags:[{Q}a{Q},{Q}b{Q}],opt:null,flag:true,cfg:{{n:-3}},any:{{k:[1,{Q}x{Q}]}}"
    )
    assert match(g, ok)
    assert match(g, call("f", "opt:2.5e3"))
    for bad in (f"mode:{Q}medium{Q}", "tags:[1]", "opt:true", "flag:1", "cfg:{n:1.5}", "cfg:{m:1}"):
        assert not match(g, call("f", bad)), bad
    assert summary(run_pieces(fmt, [ok]))[2] == [
        ("f", {"mode": "fast", "tags": ["a", "b"], "opt": None, "flag": True, "cfg": {"n": -3},
               "any": {"k": [1, "x"]}})
    ]  # fmt: skip


def test_triggers(fmt):
    g = fmt.grammar(TOOLS, "auto", True, special)
    assert set(g.preserved_tokens) >= {"<|tool_call>", "<tool_call|>", "<|channel>", "<channel|>", Q}
    for prefix in ("", "Let me check.\n", "<|channel>thought\nmaybe <|tool_call> no<channel|>OK ",
                   "A<|channel>thought\nx<channel|>B<|channel>thought\ny<|tool_call><channel|>C "):  # fmt: skip
        assert trigger_start(g, prefix + WEATHER) == len(prefix), prefix
        assert trigger_start(g, prefix) is None
    assert trigger_start(g, "<|channel>thought\nI could <|tool_call>call:") is None
    forced = fmt.grammar(TOOLS, "auto", True, special, thinking_forced_open=True)
    text = "I could <|tool_call> here<channel|>\n" + TIME
    assert trigger_start(forced, text) == text.index("<|tool_call>call")


# --- the real Gemma 4 vocabulary, through the API's chat planning ---


@pytest.fixture(scope="module")
def gemma_vocab():
    from llamapy.vocab import load_vocab

    return load_vocab(shared_path("vocab", "ggml-vocab-gemma-4.gguf"))


def test_real_vocab_plan(gemma_vocab):
    from llamapy.api.chat_request import plan_chat

    tmpl = ChatTemplate(_source(TEMPLATES[0]), "<bos>", "<eos>")
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    plan = plan_chat(tmpl, gemma_vocab, ask, tools=TOOLS, tool_choice="required")
    assert plan.format.name == "gemma4" and "<|tool>declaration:get_weather" in plan.prompt
    assert {gemma_vocab.text_to_token(t) for t in ("<|tool_call>", "<tool_call|>", Q)} <= set(
        plan.preserved_tokens
    )

    def accepts(text: str) -> bool:
        m = plan.grammar.matcher(gemma_vocab)
        toks = gemma_vocab.tokenize(text, add_special=False, parse_special=True)
        return bool(m.consume_tokens(toks)) and not m.is_error() and m.is_accepting()

    toks = gemma_vocab.tokenize(WEATHER, add_special=False, parse_special=True)
    assert gemma_vocab.text_to_token(Q) in toks and toks[0] == gemma_vocab.text_to_token("<|tool_call>")
    assert accepts(WEATHER) and accepts(TIME)
    assert not accepts(BAD) and not accepts("Sure.")
    # the grammar's tokens detokenized as the server does, parsed back into the call
    parser = plan.format.parser(plan.syntax)
    for t in toks:
        parser.feed(gemma_vocab.token_to_piece(t).decode())
    _, msg = parser.finish()
    assert [(c.name, json.loads(c.arguments)) for c in msg.tool_calls] == [
        ("get_weather", {"location": "Paris", "days": 3})
    ]
    lazy = plan_chat(tmpl, gemma_vocab, ask, tools=TOOLS)
    assert lazy.grammar.triggers and lazy.grammar.triggers[0].kind == "pattern_full"

    def sample(text: str) -> tuple[bool, object]:  # every token allowed when fed? and the sampler
        s = lazy.grammar.sampler(gemma_vocab)
        for t in gemma_vocab.tokenize(text, add_special=False, parse_special=True):
            if s.active and not (int(s.allowed_mask()[t >> 5]) >> (t & 31)) & 1:
                return False, s
            s.accept(t)
        return True, s

    ok, s = sample("Let me check. " + WEATHER)
    eog = gemma_vocab.text_to_token("<|tool_response>")
    assert ok and s.active and s.is_accepting() and (int(s.allowed_mask()[eog >> 5]) >> (eog & 31)) & 1
    ok, s = sample("<|channel>thought\nmaybe <|tool_call> later<channel|>Plain answer.")
    assert ok and not s.active
    assert not sample("Let me check. " + BAD)[0]
    plain = plan_chat(tmpl, gemma_vocab, ask)
    assert plain.format.name == "gemma4" and plain.grammar is None
