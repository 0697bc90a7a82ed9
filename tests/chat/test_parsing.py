"""Parsing per family (llama.cpp tests/test-chat.cpp style), and the streaming invariant: any split of
the output into ``feed`` calls gives the same message, and the deltas reassemble to it."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llamapy.chat import ChatSyntax
from llamapy.chat.command_r7b import CommandR7BFormat
from llamapy.chat.deepseek_r1 import DeepSeekR1Format
from llamapy.chat.functionary import FunctionaryV31Format, FunctionaryV32Format
from llamapy.chat.generic import ContentOnlyFormat, GenericFormat
from llamapy.chat.gpt_oss import GptOssFormat
from llamapy.chat.granite import GraniteFormat
from llamapy.chat.hermes import HermesFormat
from llamapy.chat.llama3 import Llama3Format
from llamapy.chat.mistral import MistralFormat
from llamapy.chat.phi4 import Phi4Format
from llamapy.chat.qwen3_coder import Qwen3CoderFormat
from tests.chat.conftest import TOOLS, run_pieces, summary

HERMES = HermesFormat("<tool_call> <think>")
QWEN3_CODER = Qwen3CoderFormat("<tool_call> <function= <parameter= <think>")
LLAMA3 = Llama3Format("<|start_header_id|>ipython<|end_header_id|> <|python_tag|>")
NEMO = MistralFormat("[TOOL_CALLS]")
SMALL32 = MistralFormat("[TOOL_CALLS] [CALL_ID] [ARGS]")
MAGISTRAL = MistralFormat("[TOOL_CALLS] [ARGS] [THINK] [/THINK]")
PHI4 = Phi4Format("<|tool|> <|/tool|>")
GRANITE = GraniteFormat("elif thinking <|tool_call|>")
R1 = DeepSeekR1Format("<｜tool▁calls▁begin｜>")
V31 = DeepSeekR1Format("<｜tool▁calls▁begin｜>", v31=True)
R7B = CommandR7BFormat("<|END_THINKING|><|START_ACTION|>")
FV32 = FunctionaryV32Format(">>>all")
FV31 = FunctionaryV31Format("<|start_header_id|> <function=")
GPT_OSS = GptOssFormat("<|channel|>")
GENERIC = GenericFormat("")
CONTENT = ContentOnlyFormat("")

HELLO = "Hello, world!\nWhat's up?"
PARIS = ("get_weather", {"location": "Paris"})
TOKYO = ("get_time", {"timezone": "Asia/Tokyo"})
W = '{"name": "get_weather", "arguments": {"location": "Paris"}}'
T = '{"name": "get_time", "arguments": {"timezone": "Asia/Tokyo"}}'
DS_W = (
    "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
    '{"location": "Paris"}\n```<｜tool▁call▁end｜>'
)
DS_T = '<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{"timezone": "Asia/Tokyo"}\n```<｜tool▁call▁end｜>'

# (id, format, syntax, output text, (content, reasoning, [(name, arguments)]))
CASES = [
    # --- Hermes 2 Pro / Qwen ---
    ("hermes-plain", HERMES, {}, HELLO, (HELLO, None, [])),
    ("hermes-call", HERMES, {}, f"<tool_call>\n{W}\n</tool_call>", ("", None, [PARIS])),
    ("hermes-text-before", HERMES, {}, f"Let me check.\n<tool_call>\n{W}\n</tool_call>", ("Let me check.\n", None, [PARIS])),
    ("hermes-parallel", HERMES, {}, f"<tool_call>\n{W}\n</tool_call>\n<tool_call>\n{T}\n</tool_call>", ("", None, [PARIS, TOKYO])),
    ("hermes-text-after", HERMES, {}, f"<tool_call>{W}</tool_call>\n\nDone.", ("Done.", None, [PARIS])),
    ("hermes-malformed", HERMES, {}, '<tool_call>\n{"name": "get_weather", "arguments": {"location": </tool_call>',
     ('<tool_call>\n{"name": "get_weather", "arguments": {"location": </tool_call>', None, [])),
    ("hermes-truncated", HERMES, {}, '<tool_call>\n{"name": "get_weather", "argu',
     ('<tool_call>\n{"name": "get_weather", "argu', None, [])),
    ("hermes-unclosed-at-end", HERMES, {}, f"<tool_call>\n{W}\n", ("", None, [PARIS])),  # lenient: EOS ate the tag
    ("hermes-second-malformed", HERMES, {}, f"<tool_call>{W}</tool_call>\n<tool_call>{{oops</tool_call>", ("<tool_call>{oops</tool_call>", None, [PARIS])),
    ("hermes-not-a-call-tag", HERMES, {}, "<tool_call>nah</tool_call>", ("<tool_call>nah</tool_call>", None, [])),
    ("hermes-bare-json", HERMES, {}, f"This is not a tool call:\n{W}", ("This is not a tool call:", None, [PARIS])),
    ("hermes-function-tag", HERMES, {}, '<function=get_weather>{"location": "Paris"}</function>', ("", None, [PARIS])),
    ("hermes-function-name", HERMES, {}, '<function name="get_weather">\n{"location": "Paris"}\n</function>', ("", None, [PARIS])),
    ("hermes-fenced", HERMES, {}, f"```xml\n<response>\n    {W}\n</response>\n```", ("", None, [PARIS])),
    ("hermes-think", HERMES, {}, f"<think>I'm\nthinking</think>{HELLO}", (HELLO, "I'm\nthinking", [])),
    ("hermes-think-call", HERMES, {}, f"<think>\nLet me see.\n</think>\n\n<tool_call>\n{W}\n</tool_call>", ("", "Let me see.", [PARIS])),
    ("hermes-think-none", HERMES, {"reasoning_format": "none"}, f"<think>I'm\nthinking</think>{HELLO}",
     (f"<think>I'm\nthinking</think>{HELLO}", None, [])),
    ("hermes-think-deepseek", HERMES, {"reasoning_format": "deepseek"}, f"<think>I'm\nthinking</think>{HELLO}", (HELLO, "I'm\nthinking", [])),
    ("hermes-forced-open", HERMES, {"thinking_forced_open": True}, f"I'm\nthinking</think>\n\n{HELLO}", (HELLO, "I'm\nthinking", [])),
    ("hermes-forced-open-call", HERMES, {"thinking_forced_open": True}, f"hmm</think>\n<tool_call>\n{W}\n</tool_call>", ("", "hmm", [PARIS])),
    ("hermes-unopened", HERMES, {}, f"I'm\nthinking</think>{HELLO}", (f"I'm\nthinking</think>{HELLO}", None, [])),
    ("hermes-unclosed-think", HERMES, {}, "<think><tool_call>nah uhg</tool_call>", ("", "<tool_call>nah uhg</tool_call>", [])),
    ("hermes-think-in-content", HERMES, {}, "Use <think> tags", ("Use <think> tags", None, [])),
    ("hermes-no-parse", HERMES, {"parse_tool_calls": False}, f"<tool_call>\n{W}\n</tool_call>", (f"<tool_call>\n{W}\n</tool_call>", None, [])),
    ("hermes-string-args", HERMES, {}, '<tool_call>{"name": "get_weather", "arguments": "{\\"location\\": \\"Paris\\"}"}</tool_call>', ("", None, [PARIS])),
    # --- Qwen3-Coder XML ---
    ("qwen3c-plain", QWEN3_CODER, {}, HELLO, (HELLO, None, [])),
    ("qwen3c-call", QWEN3_CODER, {}, "<tool_call>\n<function=get_weather>\n<parameter=location>\nParis\n</parameter>\n</function>\n</tool_call>", ("", None, [PARIS])),
    ("qwen3c-text-before", QWEN3_CODER, {}, "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=location>\nParis\n</parameter>\n</function>\n</tool_call>", ("Checking.\n", None, [PARIS])),
    ("qwen3c-parallel", QWEN3_CODER, {},
     "<tool_call>\n<function=get_weather>\n<parameter=location>\nParis\n</parameter>\n</function>\n</tool_call>\n"
     "<tool_call>\n<function=get_time>\n<parameter=timezone>\nAsia/Tokyo\n</parameter>\n</function>\n</tool_call>", ("", None, [PARIS, TOKYO])),
    ("qwen3c-typed", QWEN3_CODER, {"tools": TOOLS},
     "<tool_call>\n<function=get_weather>\n<parameter=location>\n123\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
     ("", None, [("get_weather", {"location": "123", "days": 3})])),
    ("qwen3c-untyped", QWEN3_CODER, {},
     "<tool_call>\n<function=f>\n<parameter=a>\n123\n</parameter>\n<parameter=b>\n[1, 2]\n</parameter>\n<parameter=c>\nline 1\nline 2\n</parameter>\n</function>\n</tool_call>",
     ("", None, [("f", {"a": 123, "b": [1, 2], "c": "line 1\nline 2"})])),
    ("qwen3c-malformed", QWEN3_CODER, {}, "<tool_call>\n<function=get_weather>\n<parameter=location>\nParis\n</function>\n</tool_call>",
     ("<tool_call>\n<function=get_weather>\n<parameter=location>\nParis\n</function>\n</tool_call>", None, [])),
    ("qwen3c-forced-open", QWEN3_CODER, {"thinking_forced_open": True}, f"hmm\n</think>\n\n{HELLO}", (HELLO, "hmm", [])),
    ("qwen3c-think", QWEN3_CODER, {}, "<think>\nWeather?\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=location>\nParis\n</parameter>\n</function>\n</tool_call>", ("", "Weather?", [PARIS])),
    # --- Llama 3.x ---
    ("llama-plain", LLAMA3, {}, HELLO, (HELLO, None, [])),
    ("llama-call", LLAMA3, {}, '{"name": "get_weather", "parameters": {"location": "Paris"}}', ("", None, [PARIS])),
    ("llama-call-type", LLAMA3, {}, '{"type": "function", "name": "get_weather", "parameters": {"location": "Paris"}}', ("", None, [PARIS])),
    ("llama-parallel", LLAMA3, {}, '{"name": "get_weather", "parameters": {"location": "Paris"}}; {"name": "get_time", "parameters": {"timezone": "Asia/Tokyo"}}', ("", None, [PARIS, TOKYO])),
    ("llama-json-later-is-content", LLAMA3, {}, 'Sure: {"name": "get_weather", "parameters": {}}', ('Sure: {"name": "get_weather", "parameters": {}}', None, [])),
    ("llama-text-before-tag", LLAMA3, {}, 'Searching.<|python_tag|>brave_search.call(query="today\'s news")', ("Searching.", None, [("brave_search", {"query": "today's news"})])),
    ("llama-builtin-2args", LLAMA3, {}, '<|python_tag|>wolfram_alpha.call(query="2+2", n=1)', ("", None, [("wolfram_alpha", {"query": "2+2", "n": 1})])),
    ("llama-tag-json", LLAMA3, {}, '<|python_tag|>{"name": "get_weather", "parameters": {"location": "Paris"}}', ("", None, [PARIS])),
    ("llama-raw-code", LLAMA3, {}, "<|python_tag|>print('hey')", ("", None, [("python", {"code": "print('hey')"})])),
    ("llama-malformed", LLAMA3, {}, '{"name": "get_weather", "parameters": {"location": }}', ('{"name": "get_weather", "parameters": {"location": }}', None, [])),
    ("llama-think", LLAMA3, {}, f"<think>hmm</think>{HELLO}", (HELLO, "hmm", [])),
    # --- Mistral ---
    ("nemo-plain", NEMO, {}, HELLO, (HELLO, None, [])),
    ("nemo-call", NEMO, {}, '[TOOL_CALLS][{"name": "get_weather", "arguments": {"location": "Paris"}, "id": "abcDEF123"}]', ("", None, [PARIS])),
    ("nemo-text-before", NEMO, {}, 'Sure.[TOOL_CALLS][{"name": "get_weather", "arguments": {"location": "Paris"}}]', ("Sure.", None, [PARIS])),
    ("nemo-parallel", NEMO, {}, f"[TOOL_CALLS][{W}, {T}]", ("", None, [PARIS, TOKYO])),
    ("nemo-malformed", NEMO, {}, '[TOOL_CALLS][{"name": "get_weather", "arguments": {"location": "Paris"}', ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"location": "Paris"}', None, [])),
    ("small32-call", SMALL32, {}, '[TOOL_CALLS]get_weather[CALL_ID]abcDEF123[ARGS]{"location": "Paris"}', ("", None, [PARIS])),
    ("v11-parallel", SMALL32, {}, '[TOOL_CALLS]get_weather[ARGS]{"location": "Paris"}[TOOL_CALLS]get_time[ARGS]{"timezone": "Asia/Tokyo"}', ("", None, [PARIS, TOKYO])),
    ("v11-malformed", SMALL32, {}, "[TOOL_CALLS]get_weather[ARGS]oops", ("[TOOL_CALLS]get_weather[ARGS]oops", None, [])),
    ("magistral-think", MAGISTRAL, {}, f"[THINK]Let me think.[/THINK]{HELLO}", (HELLO, "Let me think.", [])),
    ("magistral-forced-open", MAGISTRAL, {"thinking_forced_open": True}, f"hmm[/THINK]{HELLO}", (HELLO, "hmm", [])),
    ("magistral-malformed", MAGISTRAL, {}, "[TOOL_CALLS]get_weather[ARGS]{]", ("[TOOL_CALLS]get_weather[ARGS]{]", None, [])),
    ("magistral-think-call", MAGISTRAL, {}, '[THINK]Weather.[/THINK][TOOL_CALLS]get_weather[ARGS]{"location": "Paris"}', ("", "Weather.", [PARIS])),
    # --- Phi-4-mini ---
    ("phi4-plain", PHI4, {}, HELLO, (HELLO, None, [])),
    ("phi4-call", PHI4, {}, f"<|tool_call|>[{W}]<|/tool_call|>", ("", None, [PARIS])),
    ("phi4-text-before", PHI4, {}, f"One moment. <|tool_call|>[{W}]<|/tool_call|>", ("One moment. ", None, [PARIS])),
    ("phi4-parallel", PHI4, {}, f"<|tool_call|>[{W}, {T}]<|/tool_call|>", ("", None, [PARIS, TOKYO])),
    ("phi4-object", PHI4, {}, f"<|tool_call|>{W}<|/tool_call|>", ("", None, [PARIS])),
    ("phi4-malformed", PHI4, {}, "<|tool_call|>[{]<|/tool_call|>", ("<|tool_call|>[{]<|/tool_call|>", None, [])),
    # --- Granite ---
    ("granite-plain", GRANITE, {}, HELLO, (HELLO, None, [])),
    ("granite-response", GRANITE, {}, f"<think>I'm\nthinking</think><response>{HELLO}</response>", (HELLO, "I'm\nthinking", [])),
    ("granite-forced-open", GRANITE, {"thinking_forced_open": True}, f"hmm</think>{HELLO}", (HELLO, "hmm", [])),
    ("granite-call", GRANITE, {}, f"<|tool_call|>[{W}]", ("", None, [PARIS])),
    ("granite-parallel", GRANITE, {}, f"Calling.<|tool_call|>[{W}, {T}]", ("Calling.", None, [PARIS, TOKYO])),
    ("granite-malformed", GRANITE, {}, '<|tool_call|>[{"name": "get_weather"', ('<|tool_call|>[{"name": "get_weather"', None, [])),
    # --- DeepSeek R1 / V3.1 ---
    ("r1-plain", R1, {}, HELLO, (HELLO, None, [])),
    ("r1-forced-open", R1, {"thinking_forced_open": True}, f"I'm\nthinking</think>\n\n{HELLO}", (HELLO, "I'm\nthinking", [])),
    ("r1-think", R1, {}, f"<think>I'm\nthinking</think>{HELLO}", (HELLO, "I'm\nthinking", [])),
    ("r1-call", R1, {}, f"<｜tool▁calls▁begin｜>{DS_W}<｜tool▁calls▁end｜>", ("", None, [PARIS])),
    ("r1-text-before", R1, {"thinking_forced_open": True}, f"Weather.</think>\n\nChecking.<｜tool▁calls▁begin｜>{DS_W}<｜tool▁calls▁end｜>", ("Checking.", "Weather.", [PARIS])),
    ("r1-parallel", R1, {}, f"<｜tool▁calls▁begin｜>{DS_W}\n{DS_T}<｜tool▁calls▁end｜>", ("", None, [PARIS, TOKYO])),
    ("r1-variant-open", R1, {}, "<｜tool▁calls｜>function<｜tool▁sep｜>get_weather\n```json\n{\"location\": \"Paris\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>", ("", None, [PARIS])),
    ("r1-malformed", R1, {}, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"location\": ```<｜tool▁call▁end｜>",
     ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"location\": ```<｜tool▁call▁end｜>", None, [])),
    ("r1-mention-in-reasoning", R1, {"thinking_forced_open": True}, "It starts with <｜tool▁calls▁begin｜> and ends with",
     ("", "It starts with <｜tool▁calls▁begin｜> and ends with", [])),
    ("v31-call", V31, {}, '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"location": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>', ("", None, [PARIS])),
    ("v31-malformed", V31, {}, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>nope<｜tool▁call▁end｜>",
     ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>nope<｜tool▁call▁end｜>", None, [])),
    ("v31-think-call", V31, {"thinking_forced_open": True}, 'hmm</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"location": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>', ("", "hmm", [PARIS])),
    # --- Command R7B ---
    ("r7b-plain", R7B, {}, HELLO, (HELLO, None, [])),
    ("r7b-response", R7B, {}, f"<|START_RESPONSE|>{HELLO}<|END_RESPONSE|>", (HELLO, None, [])),
    ("r7b-thoughts", R7B, {}, f"<|START_THINKING|>I'm\nthinking<|END_THINKING|><|START_RESPONSE|>{HELLO}<|END_RESPONSE|>", (HELLO, "I'm\nthinking", [])),
    ("r7b-thoughts-none", R7B, {"reasoning_format": "none"}, f"<|START_THINKING|>I'm\nthinking<|END_THINKING|><|START_RESPONSE|>{HELLO}<|END_RESPONSE|>",
     (f"<|START_THINKING|>I'm\nthinking<|END_THINKING|>{HELLO}", None, [])),
    ("r7b-call", R7B, {}, '<|START_THINKING|>I need the weather.<|END_THINKING|><|START_ACTION|>[\n    {"tool_call_id": "0", "tool_name": "get_weather", "parameters": {"location": "Paris"}}\n]<|END_ACTION|>',
     ("", "I need the weather.", [PARIS])),
    ("r7b-parallel", R7B, {}, '<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "get_weather", "parameters": {"location": "Paris"}}, {"tool_call_id": "1", "tool_name": "get_time", "parameters": {"timezone": "Asia/Tokyo"}}]<|END_ACTION|>',
     ("", None, [PARIS, TOKYO])),
    ("r7b-text-before", R7B, {}, 'Let me look.<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "get_weather", "parameters": {"location": "Paris"}}]<|END_ACTION|>', ("Let me look.", None, [PARIS])),
    ("r7b-forced-open", R7B, {"thinking_forced_open": True}, f"hmm<|END_THINKING|>{HELLO}", (HELLO, "hmm", [])),
    ("r7b-malformed", R7B, {}, '<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "get_weather", "param', ('<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "get_weather", "param', None, [])),
    # --- Functionary v3.2 / v3.1 ---
    ("fv32-all", FV32, {}, f"all\n{HELLO}", (HELLO, None, [])),
    ("fv32-no-recipient", FV32, {}, HELLO, (HELLO, None, [])),
    ("fv32-call", FV32, {}, 'get_weather\n{"location": "Paris"}', ("", None, [PARIS])),
    ("fv32-text-before", FV32, {}, 'all\nHello, world!\nnono\nWhat\'s up?>>>get_weather\n{"location": "Paris"}\n', ("Hello, world!\nnono\nWhat's up?", None, [PARIS])),
    ("fv32-parallel", FV32, {}, 'get_weather\n{"location": "Paris"}\n>>>get_time\n{"timezone": "Asia/Tokyo"}', ("", None, [PARIS, TOKYO])),
    ("fv32-python", FV32, {}, "python\n# This is a program:\nprint('hey')", ("", None, [("python", {"code": "# This is a program:\nprint('hey')"})])),
    ("fv32-malformed", FV32, {}, 'get_weather\n{"location": }', ('get_weather\n{"location": }', None, [])),
    ("fv31-call", FV31, {}, '<function=get_weather>{"location": "Paris"}</function>', ("", None, [PARIS])),
    ("fv31-text-before", FV31, {}, 'Sure.<function=get_weather>{"location": "Paris"}</function>', ("Sure.", None, [PARIS])),
    ("fv31-malformed", FV31, {}, '<function=get_weather>{"location": "Paris"}<function>', ('<function=get_weather>{"location": "Paris"}<function>', None, [])),
    ("fv31-python", FV31, {}, "<|python_tag|>print(1)", ("", None, [("python", {"code": "print(1)"})])),
    # --- gpt-oss (harmony) ---
    ("oss-analysis-final", GPT_OSS, {}, f"<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant<|channel|>final<|message|>{HELLO}", (HELLO, "I'm\nthinking", [])),
    ("oss-unfinished-analysis", GPT_OSS, {}, "<|channel|>analysis<|message|>I'm\nthink", ("", "I'm\nthink", [])),
    ("oss-call", GPT_OSS, {}, '<|channel|>analysis<|message|>I\'m\nthinking<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"location": "Paris"}',
     ("", "I'm\nthinking", [PARIS])),
    ("oss-call-analysis", GPT_OSS, {}, '<|channel|>analysis to=functions.get_weather<|message|>{"location": "Paris"}<|call|>', ("", None, [PARIS])),
    ("oss-preamble-call", GPT_OSS, {}, '<|channel|>analysis<|message|>hm<|end|><|start|>assistant<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"location": "Paris"}',
     ("Checking.", "hm", [PARIS])),
    ("oss-recipient-in-role", GPT_OSS, {}, ' to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{"location": "Paris"}', ("", None, [PARIS])),
    ("oss-recipient-in-role-2", GPT_OSS, {}, '<|channel|>analysis<|message|>x<|end|><|start|>assistant to=functions.get_weather<|channel|>analysis <|constrain|>json<|message|>{"location": "Paris"}', ("", "x", [PARIS])),
    ("oss-reasoning-none", GPT_OSS, {"reasoning_format": "none"}, f"<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant<|channel|>final<|message|>{HELLO}",
     (f"<|channel|>analysis<|message|>I'm\nthinking<|end|>{HELLO}", None, [])),
    ("oss-no-parse", GPT_OSS, {"parse_tool_calls": False}, '<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather<|message|>{"location": "Paris"}', ("", "x", [])),
    ("oss-malformed", GPT_OSS, {}, "<|channel|>commentary to=functions.get_weather<|message|>{oops}", ("{oops}", None, [])),
    ("oss-builtin-dropped", GPT_OSS, {}, '<|channel|>analysis to=browser.search<|message|>{"q": 1}<|call|>', ("", None, [])),
    ("oss-no-header", GPT_OSS, {}, HELLO, (HELLO, None, [])),
    # --- generic JSON / content-only ---
    ("generic-call", GENERIC, {}, f'{{"tool_call": {W}}}', ("", None, [PARIS])),
    ("generic-parallel", GENERIC, {}, '{"tool_calls": [{"name": "get_weather", "arguments": {"location": "Paris"}, "id": "call_1"}, ' + T + "]}", ("", None, [PARIS, TOKYO])),
    ("generic-response", GENERIC, {}, '{\n  "response": "Hello, world!\\nWhat\'s up? \\ud83d\\ude00 \\"q\\" \\\\ \\u00e9"\n}', ("Hello, world!\nWhat's up? \U0001f600 \"q\" \\ é", None, [])),
    ("generic-plain", GENERIC, {}, HELLO, (HELLO, None, [])),
    ("generic-malformed", GENERIC, {}, '{"tool_call": {"name": "get_weather", "arguments": ', ('{"tool_call": {"name": "get_weather", "arguments": ', None, [])),
    ("generic-other-json", GENERIC, {}, '{"a": 1}', ('{"a": 1}', None, [])),
    ("content-think", CONTENT, {}, f"<think>I'm\nthinking</think>{HELLO}", (HELLO, "I'm\nthinking", [])),
    ("content-forced-open", CONTENT, {"thinking_forced_open": True}, f"hmm</think>{HELLO}", (HELLO, "hmm", [])),
    ("content-tags-kept", CONTENT, {}, f"<tool_call>\n{W}\n</tool_call>", (f"<tool_call>\n{W}\n</tool_call>", None, [])),
    ("content-whitespace", CONTENT, {}, "  \n", ("  \n", None, [])),
]  # fmt: skip

IDS = [c[0] for c in CASES]


@pytest.mark.parametrize(("name", "fmt", "syntax", "text", "expected"), CASES, ids=IDS)
def test_parse(name, fmt, syntax, text, expected):
    whole = run_pieces(fmt, [text], **syntax)
    assert summary(whole) == expected
    per_char = run_pieces(fmt, list(text), **syntax)
    assert summary(per_char) == expected


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_any_split_reassembles(data):
    name, fmt, syntax, text, expected = data.draw(st.sampled_from(CASES), label="case")
    cuts = sorted(data.draw(st.sets(st.integers(0, len(text)), max_size=8), label="cuts"))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    assert summary(run_pieces(fmt, pieces, **syntax)) == expected, name


def test_ids():
    msg = run_pieces(HERMES, [f"<tool_call>{W}</tool_call><tool_call>{T}</tool_call>"])
    a, b = (c.id for c in msg.tool_calls)
    assert a != b and a.startswith("call_") and len(a) == 29 and a[5:].isalnum()
    nemo = run_pieces(
        NEMO, ['[TOOL_CALLS][{"name": "get_weather", "arguments": {}, "id": "abcDEF123"}, ' + T + "]"]
    )
    assert nemo.tool_calls[0].id == "abcDEF123"
    assert len(nemo.tool_calls[1].id) == 9 and nemo.tool_calls[1].id.isalnum()


def test_arguments_are_normalized():
    msg = run_pieces(
        HERMES, ['<tool_call>{"name": "f", "arguments": {\n  "a" :  1,"b":"é\\u00e9"}}</tool_call>']
    )
    assert msg.tool_calls[0].arguments == '{"a": 1, "b": "éé"}'


def test_held_back_until_decided():
    p = HERMES.parser(ChatSyntax("hermes-2-pro"))
    assert [d.content for d in p.feed("Hi <tool")] == ["Hi "]
    assert p.feed("_ca") == []
    assert [d.content for d in p.feed("t>")] == ["<tool_cat>"]
    assert [d.content for d in p.feed("<think")] == ["<think"]  # a tag only at the start
    assert [d.content for d in p.feed("\n<")] == ["\n"]  # "\n<..." might open a call
    last, msg = p.finish()
    assert [d.content for d in last] == ["<"]
    assert msg.content == "Hi <tool_cat><think\n<"


def test_reasoning_deltas_stream():
    p = HERMES.parser(ChatSyntax("hermes-2-pro"))
    out = p.feed("<think>one two ")
    assert [d.reasoning_content for d in out] == ["one two"]
    out = p.feed("three</thi")
    assert [d.reasoning_content for d in out] == [" three"]
    out = p.feed("nk>\n\nAnswer")
    assert [d.content for d in out] == ["Answer"]


FRAGMENTS = [
    "<think>", "</think>", "<tool_call>", "</tool_call>", "\n", " ", "{", "}", '"name"', ": ", '"get_weather"', ", ",
    '"arguments"', '{"location": "Paris"}', "[", "]", "Hello", "<function=get_weather>", "</function>",
    "<parameter=location>", "</parameter>", "<|python_tag|>", "[TOOL_CALLS]", "[ARGS]", "<|tool_call|>",
    "<|/tool_call|>", "<|START_ACTION|>", "<|END_ACTION|>", "<|START_THINKING|>", "<|END_THINKING|>",
    "<|START_RESPONSE|>", "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "function<｜tool▁sep｜>",
    "```json\n", "```", "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>", ">>>", "all\n", "get_weather\n",
    "<|channel|>", "analysis", "final", "commentary to=functions.get_weather", "<|message|>", "<|end|>",
    "<|start|>assistant", '{"response": "', '\\"', '\\u00e9', '"', "brave_search.call(", 'query="x"', ")",
]  # fmt: skip
FORMATS = [
    HERMES,
    QWEN3_CODER,
    LLAMA3,
    NEMO,
    SMALL32,
    MAGISTRAL,
    PHI4,
    GRANITE,
    R1,
    V31,
    R7B,
    FV32,
    FV31,
    GPT_OSS,
    GENERIC,
    CONTENT,
]


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_text_split_invariance(data):
    fmt = data.draw(st.sampled_from(FORMATS), label="format")
    syntax = data.draw(
        st.fixed_dictionaries(
            {"reasoning_format": st.sampled_from(["auto", "none"]), "thinking_forced_open": st.booleans()}
        ),
        label="syntax",
    )
    text = "".join(data.draw(st.lists(st.sampled_from(FRAGMENTS), max_size=14), label="fragments"))
    cuts = sorted(data.draw(st.sets(st.integers(0, len(text)), max_size=10), label="cuts"))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    assert summary(run_pieces(fmt, pieces, **syntax)) == summary(run_pieces(fmt, [text], **syntax))
