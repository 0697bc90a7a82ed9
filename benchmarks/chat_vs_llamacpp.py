"""Differential fuzzing of llamapy's chat templates and tool-call/reasoning parsers against llama.cpp's
``common/chat.cpp`` (through a small C++ harness, ``benchmarks/chat_vs_llamacpp.cpp``, compiled with g++
against ``libllama-common.so`` into ``~/.cache/llamapy/chat_vs_llamacpp/``).

A diagnostic, not a test. For every chat template (default ``../shared/templates/*.jinja``):

- render: seeded conversations (system + user, multi-turn, assistant tool calls with one or two calls
  whose arguments hold nested objects, unicode, quotes and numbers, tool results as text or JSON,
  ``reasoning_content`` on past turns, typed content parts, tools given or not, add_generation_prompt
  on/off, ``enable_thinking`` false) go through llamapy's server path (``api.chat_request.plan_chat``:
  ``detect_format`` -> ``prepare_messages`` -> ``ChatTemplate.render``) and through llama-server's
  (``common_chat_msgs_parse_oaicompat`` -> ``common_chat_templates_apply``, reasoning_format deepseek,
  enable_thinking as the server decides it); the prompts are compared exactly. A mismatch is shrunk
  (messages, tools, options dropped while it stays) and rendered by Hugging Face transformers'
  ``render_jinja_template`` too, which says which side follows the template as written.
- parse: model outputs made from the template itself (what it renders for an assistant message with
  content, reasoning, one or two tool calls, after the prompt of the turns before it, end-of-turn marker
  cut), whole and cut at random points (``is_partial``), parsed by llama.cpp (``common_chat_parse`` with
  the parser ``common_chat_templates_apply`` chose) and by llamapy (``ChatFormat.parser(plan.syntax)``,
  ``feed`` + ``finish``; for a cut, the deltas of ``feed``). Compared: content, reasoning_content, tool
  call names, arguments (as parsed JSON) and ids where llama.cpp's format carries them.

The wall clock is pinned on both sides (2025-03-14 12:00 UTC) for ``strftime_now`` and llama.cpp's
``date_string``/``datetime`` variables.

    python benchmarks/chat_vs_llamacpp.py [--templates ../shared/templates] [--cases 12] [--seed 0]
        [--only NAME_SUBSTRING] [--partial 3] [--out /tmp/chatfuzz/results.json] [--lib DIR]

Exit status 0 whether or not differences were found (it is a report); the JSON has every detail.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import copy  # noqa: E402
import datetime as _dt  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402

from benchmarks.harness import CACHE, LLAMACPP_VERSION, llamacpp_bin  # noqa: E402

SHARED = ROOT.parent / "shared"
FIXED_NOW = _dt.datetime(2025, 3, 14, 12, 0, 0)  # = FIXED_NOW of the C++ harness, in UTC
BOS, EOS = "<s>", "</s>"

# --- llama.cpp ----------------------------------------------------------------------------------------------


def build_harness(lib_dir: Path) -> Path:
    """The harness binary, compiled from chat_vs_llamacpp.cpp when missing or older than its source."""
    src = Path(__file__).with_suffix(".cpp")
    out_dir = CACHE / "chat_vs_llamacpp" / LLAMACPP_VERSION
    exe = out_dir / "chat_vs_llamacpp"
    if exe.exists() and exe.stat().st_mtime >= src.stat().st_mtime:
        return exe
    out_dir.mkdir(parents=True, exist_ok=True)
    lc = lib_dir.parent.parent
    inc = [f"-I{lc / d}" for d in ("common", "include", "ggml/include", "vendor")]
    cmd = ["g++", "-O1", "-std=c++17", "-DLLAMA_SHARED", "-DGGML_SHARED", *inc, str(src), f"-L{lib_dir}",
           "-lllama-common", "-lllama", f"-Wl,-rpath,{lib_dir}", "-o", str(exe)]  # fmt: skip
    print("compiling:", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, timeout=600)
    return exe


class LlamaCppChat:
    """One harness process; ``ask(request) -> answer`` (restarted if it dies)."""

    def __init__(self, exe: Path) -> None:
        self.exe = exe
        self.proc: subprocess.Popen | None = None

    def _start(self) -> None:
        env = dict(os.environ, TZ="UTC")
        self.proc = subprocess.Popen([str(self.exe)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, encoding="utf-8", env=env)  # fmt: skip

    def ask(self, req: dict) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        assert self.proc is not None and self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps(req, ensure_ascii=False) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except (BrokenPipeError, OSError):
            line = ""
        if not line:
            self.proc = None
            return {"error": "harness crashed (abort/assert)", "crash": True}
        return json.loads(line)


# --- llamapy ------------------------------------------------------------------------------------------------


def pin_clock() -> None:
    """strftime_now and the date variables at FIXED_NOW in llamapy's and transformers' Jinja environments."""
    from llamapy.api import chat_request as cr
    from llamapy.vocab import chat_template as ct

    ct._ENV.globals["strftime_now"] = lambda fmt: FIXED_NOW.strftime(str(fmt))
    context = cr.template_context
    cr.template_context = lambda now=None: context(FIXED_NOW)  # type: ignore[assignment]
    try:
        from transformers.utils import chat_template_utils as hf

        class _Fixed(_dt.datetime):
            @classmethod
            def now(cls, tz=None):  # noqa: ANN001, ANN206
                return FIXED_NOW

        hf.datetime = _Fixed
        hf._compile_jinja_template.cache_clear()
    except Exception:  # noqa: BLE001 (transformers is only the oracle)
        pass


def py_plan(src: str, case: dict) -> tuple[object | None, str | None]:
    from llamapy.api.chat_request import plan_chat
    from llamapy.vocab.chat_template import ChatTemplate

    try:
        tmpl = ChatTemplate(src, BOS, EOS)
        plan = plan_chat(tmpl, None, copy.deepcopy(case["messages"]), tools=copy.deepcopy(case.get("tools")),
                         chat_template_kwargs=case.get("kwargs") or None,
                         add_generation_prompt=case.get("agp", True))  # fmt: skip
        return plan, None
    except Exception as e:  # noqa: BLE001
        return None, f"{type(e).__name__}: {e}"[:400]


def py_parse(plan, text: str, partial: bool) -> dict:  # noqa: ANN001
    try:
        parser = plan.format.parser(plan.syntax)
        parser.new_id = lambda: ""
        deltas = parser.feed(text)
        if not partial:
            more, _ = parser.finish()
            deltas = deltas + more
        content, reasoning, calls = "", "", []
        for d in deltas:
            if d.tool_call_index is not None:
                while len(calls) <= d.tool_call_index:
                    calls.append({"name": "", "arguments": "", "id": ""})
                c = calls[d.tool_call_index]
                c["name"] = c["name"] or (d.tool_call_name or "")
                c["id"] = c["id"] or (d.tool_call_id or "")
                c["arguments"] += d.tool_call_arguments
            content += d.content
            reasoning += d.reasoning_content
        return {"content": content, "reasoning_content": reasoning, "tool_calls": calls}
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}"[:400]}


def hf_render(src: str, case: dict) -> str | None:
    """transformers' rendering of the raw request (no llama.cpp/llamapy workarounds), or an error text."""
    try:
        from transformers.utils.chat_template_utils import render_jinja_template

        kw = dict(case.get("kwargs") or {})
        out, _ = render_jinja_template([copy.deepcopy(case["messages"])], tools=copy.deepcopy(case.get("tools")),
                                       chat_template=src, add_generation_prompt=case.get("agp", True),
                                       bos_token=BOS, eos_token=EOS, **kw)  # fmt: skip
        return out[0]
    except Exception as e:  # noqa: BLE001
        return f"<HF ERROR {type(e).__name__}: {str(e)[:200]}>"


# --- generated conversations --------------------------------------------------------------------------------

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the weather of a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name"},
            "days": {"type": "integer"},
            "units": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search_docs", "description": "Search documents",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string"},
            "filters": {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}},
                                                          "score": {"type": "number"}}},
            "exact": {"type": "boolean"}}, "required": ["query"]}}},
]  # fmt: skip

STRINGS = ["Paris", "Zürich", "東京", "naïve café ☕", 'say "hi"', "it's", "a\\b", "line1\nline2", "🚀 emoji",
           "<b>tag</b>", "{not json}", "  padded  "]  # fmt: skip


def rand_args(rng: random.Random, name: str) -> dict:
    if name == "get_weather":
        a: dict = {"city": rng.choice(STRINGS)}
        if rng.random() < 0.6:
            a["days"] = rng.choice([0, 3, 14, -1, 100000])
        if rng.random() < 0.4:
            a["units"] = rng.choice(["c", "f"])
        return a
    a = {"query": rng.choice(STRINGS)}
    if rng.random() < 0.6:
        a["filters"] = {
            "tags": rng.sample(STRINGS, rng.randint(0, 2)),
            "score": rng.choice([0.5, 1e-3, 2.0, 3]),
        }
    if rng.random() < 0.5:
        a["exact"] = rng.choice([True, False])
    return a


_ALNUM = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def call_id(rng: random.Random) -> str:
    return "".join(rng.choice(_ALNUM) for _ in range(9))  # 9 alphanumerics: what Mistral templates accept


def tool_call(rng: random.Random, name: str | None = None) -> dict:
    name = name or rng.choice(["get_weather", "search_docs"])
    return {"id": call_id(rng), "type": "function",
            "function": {"name": name, "arguments": json.dumps(rand_args(rng, name), ensure_ascii=False)}}  # fmt: skip


def text(rng: random.Random, typed: bool) -> object:
    s = rng.choice(["Hello!", "What's the weather in Zürich?", "Tell me about 東京.", 'He said "ok".',
                    "Two lines\nhere.", "Search the docs for 🚀"])  # fmt: skip
    if typed:
        return [{"type": "text", "text": s}] + (
            [{"type": "text", "text": "More."}] if rng.random() < 0.3 else []
        )
    return s


def gen_case(rng: random.Random, i: int) -> dict:
    """One request; ``i`` cycles through the shapes first so that small runs cover them all."""
    shape = ["user", "system_user", "multi_turn", "one_call", "two_calls", "reasoning_past", "typed",
             "one_call_no_tools", "two_calls_json_result"][i % 9] if i < 18 else rng.choice(
        ["user", "system_user", "multi_turn", "one_call", "two_calls", "reasoning_past", "typed",
         "two_calls_json_result"])  # fmt: skip
    typed = shape == "typed" or rng.random() < 0.1
    msgs: list[dict] = []
    if shape in ("system_user", "typed") or rng.random() < 0.4:
        msgs.append(
            {"role": "system", "content": text(rng, typed) if typed else "You are a helpful assistant."}
        )
    msgs.append({"role": "user", "content": text(rng, typed)})
    if shape in ("multi_turn", "reasoning_past"):
        a: dict = {"role": "assistant", "content": "Sure, here it is."}
        if shape == "reasoning_past" or rng.random() < 0.2:
            a["reasoning_content"] = "Let me think about it."
        msgs += [a, {"role": "user", "content": text(rng, typed)}]
    if shape.startswith("one_call") or shape.startswith("two_calls"):
        n = 1 if shape.startswith("one_call") else 2
        calls = [tool_call(rng) for _ in range(n)]
        a = {"role": "assistant", "content": rng.choice([None, "", "Let me check."]), "tool_calls": calls}
        if rng.random() < 0.3:
            a["reasoning_content"] = "I need a tool."
        msgs.append(a)
        for c in calls:
            if shape.endswith("json_result") or rng.random() < 0.3:
                res = json.dumps(
                    {"temperature": 21.5, "conditions": "sunny ☀", "ok": True}, ensure_ascii=False
                )
            else:
                res = rng.choice(["21 degrees and sunny", "No results.", 'Found "x"'])
            msgs.append({"role": "tool", "tool_call_id": c["id"], "content": res})
        if rng.random() < 0.4:
            msgs += [{"role": "assistant", "content": "It is sunny."}, {"role": "user", "content": "Thanks!"}]
    case = {"shape": shape, "messages": msgs}
    if shape != "one_call_no_tools" and (shape.startswith(("one_call", "two_calls")) or rng.random() < 0.5):
        case["tools"] = copy.deepcopy(TOOLS)
    case["agp"] = msgs[-1]["role"] != "assistant" and rng.random() < 0.85
    if rng.random() < 0.25:
        case["kwargs"] = {"enable_thinking": False}
    return case


# --- comparing ----------------------------------------------------------------------------------------------


def render_both(cpp: LlamaCppChat, src: str, case: dict) -> tuple[dict, object, str | None]:
    req = {"cmd": "render", "template": src, "bos": BOS, "eos": EOS, "messages": case["messages"],
           "tools": case.get("tools"), "add_generation_prompt": case.get("agp", True),
           "chat_template_kwargs": case.get("kwargs") or {}}  # fmt: skip
    lc = cpp.ask(req)
    plan, perr = py_plan(src, case)
    return lc, plan, perr


def render_outcome(lc: dict, plan: object, perr: str | None) -> str:
    if "error" in lc and perr:
        return "both_error"
    if "error" in lc:
        return "lc_error"
    if perr:
        return "py_error"
    return "match" if lc["prompt"] == plan.prompt else "mismatch"  # type: ignore[attr-defined]


def shrink(cpp: LlamaCppChat, src: str, case: dict, outcome: str) -> dict:
    """Drop messages, tools, options, parts of a conversation while the outcome stays the same."""

    def same(c: dict) -> bool:
        try:
            return render_outcome(*render_both(cpp, src, c)) == outcome
        except Exception:  # noqa: BLE001
            return False

    case = copy.deepcopy(case)
    changed = True
    while changed:
        changed = False
        cands = []
        for k in ("tools", "kwargs"):
            if case.get(k):
                cands.append({**case, k: None})
        if case.get("agp"):
            cands.append({**case, "agp": False})
        for j in range(len(case["messages"])):
            cands.append({**case, "messages": case["messages"][:j] + case["messages"][j + 1 :]})
            m = case["messages"][j]
            for key in ("reasoning_content", "tool_call_id"):
                if key in m:
                    cands.append({**case, "messages": case["messages"][:j] + [{k: v for k, v in m.items() if k != key}]
                                  + case["messages"][j + 1 :]})  # fmt: skip
            if m.get("tool_calls") and len(m["tool_calls"]) > 1:
                cands.append({**case, "messages": case["messages"][:j] + [{**m, "tool_calls": m["tool_calls"][:1]}]
                              + case["messages"][j + 1 :]})  # fmt: skip
        for c in cands:
            if c["messages"] and same(c):
                case, changed = c, True
                break
    return case


def first_diff(a: str, b: str, ctx: int = 60) -> dict:
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1
    return {"at": i, "llamacpp": a[max(0, i - 20) : i + ctx], "llamapy": b[max(0, i - 20) : i + ctx]}


def classify_render(lc: str, py: str) -> str:
    if "".join(lc.split()) == "".join(py.split()):
        return "whitespace"
    if lc.replace("14 Mar 2025", "26 Jul 2024") == py:
        return "date_string"
    try_lc, try_py = (
        lc.replace('", "', '","').replace('": ', '":'),
        py.replace('", "', '","').replace('": ', '":'),
    )
    if try_lc == try_py:
        return "json_separators"
    return "text"


END_MARKERS = ["<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "</s>", "<|END_OF_TURN_TOKEN|>",
               "<end_of_turn>", "<|return|>", "<|endoftext|>", "<｜end▁of▁sentence｜>", "<|end_of_text|>",
               "<turn|>", "<|im_end|>", "[/TOOL_CALLS]", "<|end_of_msg|>", "<|eot|>", "<|eom|>",
               "<end_of_utterance>", "<|message_sep|>", "</longcat_s>", "<|assistant_end|>",
               "<|end_of_message|>", "</turn>", "<seed:eos>", "<end_of_sentence>", "</assistant>", "<|role_end|>",
               "<|tool_response>", "<｜hy_eos:opensource｜>", "[e~["]  # fmt: skip


def cut_end(s: str) -> str:
    """The rendered assistant turn without what the model would stop at (end-of-turn markers)."""
    prev = None
    while prev != s:
        prev = s
        s = s.rstrip()
        for m in END_MARKERS:
            if s.endswith(m):
                s = s[: -len(m)]
    return s


def model_outputs(cpp: LlamaCppChat, src: str, rng: random.Random) -> list[tuple[str, dict, str]]:
    """(kind, request without the answer, answer text) made from the template's own rendering."""
    base = [{"role": "user", "content": "What's the weather in Zürich?"}]
    kinds = {
        "content": {"role": "assistant", "content": "It is sunny, 21 °C."},
        "reasoning_content": {"role": "assistant", "content": "It is sunny.", "reasoning_content": "The user asks."},
        "call": {"role": "assistant", "content": None, "tool_calls": [tool_call(rng, "get_weather")]},
        "content_call": {"role": "assistant", "content": "Let me check.", "tool_calls": [tool_call(rng)]},
        "reasoning_call": {"role": "assistant", "content": None, "reasoning_content": "I need the weather.",
                           "tool_calls": [tool_call(rng, "get_weather")]},
        "two_calls": {"role": "assistant", "content": None,
                      "tool_calls": [tool_call(rng, "get_weather"), tool_call(rng, "search_docs")]},
    }  # fmt: skip
    out = []
    for kind, amsg in kinds.items():
        for tools in [TOOLS, None] if kind in ("content", "reasoning_content") else [TOOLS]:
            prompt = cpp.ask({"cmd": "render", "template": src, "bos": BOS, "eos": EOS, "messages": base,
                              "tools": tools, "add_generation_prompt": True})  # fmt: skip
            full = cpp.ask({"cmd": "render", "template": src, "bos": BOS, "eos": EOS, "messages": base + [amsg],
                            "tools": tools, "add_generation_prompt": False})  # fmt: skip
            if "error" in prompt or "error" in full:
                continue
            p, f = prompt["prompt"], full["prompt"]
            gp = prompt["generation_prompt"]
            if gp and f.endswith(gp):  # (templates that default add_generation_prompt to true when undefined)
                f = f[: len(f) - len(gp)]
            else:  # (the same, where llama.cpp's generation prompt is empty: the prompt's text after its last
                # end-of-turn marker, which llama.cpp renders here too as it leaves the variable undefined)
                ends = [(p.rfind(m), m) for m in END_MARKERS if m in p]
                tail = p[max(ends)[0] + len(max(ends)[1]) :] if ends else ""
                if tail.strip() and f.endswith(tail) and not f.endswith(p[-1:] + tail):
                    f = f[: len(f) - len(tail)]
            if f.startswith(p):
                answer = f[len(p) :]
            else:  # the generation prompt is not the start of the rendered turn (e.g. <think> added)
                gp = prompt["generation_prompt"]
                q = p[: len(p) - len(gp)] if gp and p.endswith(gp) else p
                if not f.startswith(q):
                    continue
                answer = f[len(q) :]
                k = 0
                while k < min(len(gp), len(answer)) and gp[k] == answer[k]:
                    k += 1
                answer = answer[k:]
            answer = cut_end(answer)
            out.append((kind + ("" if tools else "_no_tools"), {"messages": base, "tools": tools}, answer))
    return out


def norm_args(a: str) -> object:
    try:
        return json.loads(a)
    except ValueError:
        return ("<not json>", a)


def compare_parse(lc: dict, py: dict, partial: bool) -> str | None:
    """None when equal, else a class."""
    if "error" in lc and "error" in py:
        return None if partial else "both_error"
    if "error" in lc:
        return "lc_error"
    if "error" in py:
        return "py_error"
    lcc = [(c["name"], norm_args(c["arguments"]), c["id"]) for c in lc["tool_calls"]]
    pyc = [(c["name"], norm_args(c["arguments"]), c["id"] if c_id else "") for c, c_id in
           zip(py["tool_calls"], [x["id"] for x in lc["tool_calls"]] + [""] * 9, strict=False)]  # fmt: skip
    same_calls = lcc == pyc
    same_c = lc["content"] == py["content"]
    same_r = (lc["reasoning_content"] or "") == (py["reasoning_content"] or "")
    if same_calls and same_c and same_r:
        return None
    if partial:
        # llamapy holds back undecided text and emits a call once it is whole; llama.cpp streams partial calls
        held = (
            lc["content"].startswith(py["content"])
            and (lc["reasoning_content"] or "").startswith(py["reasoning_content"] or "")
            and len(pyc) <= len(lcc)
            and all(a[0] == b[0] for a, b in zip(pyc, lcc, strict=False))
        )
        if held:
            return None
    if same_calls and same_r and lc["content"].strip() == py["content"].strip():
        return "content_whitespace"
    if (
        same_calls
        and same_c
        and (lc["reasoning_content"] or "").strip() == (py["reasoning_content"] or "").strip()
    ):
        return "reasoning_whitespace"
    if [c[0] for c in lcc] != [c[0] for c in pyc]:
        return "tool_calls"
    if [c[1] for c in lcc] != [c[1] for c in pyc]:
        return "arguments"
    if [c[2] for c in lcc] != [c[2] for c in pyc]:
        return "ids"
    if not same_r:
        return "reasoning"
    return "content"


# --- driver -------------------------------------------------------------------------------------------------


def run_template(cpp: LlamaCppChat, path: Path, n_cases: int, seed: int, n_partial: int) -> dict:
    src = path.read_text()
    rng = random.Random(f"{seed}:{path.name}")
    res: dict = {"template": path.name, "cases": 0, "render": Counter(), "parse": Counter(),
                 "render_examples": [], "parse_examples": []}  # fmt: skip
    seen_render: set = set()
    for i in range(n_cases):
        case = gen_case(rng, i)
        lc, plan, perr = render_both(cpp, src, case)
        res["cases"] += 1
        outcome = render_outcome(lc, plan, perr)
        key = outcome
        if outcome == "mismatch":
            key = "mismatch:" + classify_render(lc["prompt"], plan.prompt)  # type: ignore[attr-defined]
        res["render"][key] += 1
        if outcome != "match" and (key, case["shape"]) not in seen_render and len(res["render_examples"]) < 6:
            seen_render.add((key, case["shape"]))
            small = shrink(cpp, src, case, outcome)
            lc2, plan2, perr2 = render_both(cpp, src, small)
            ex = {"class": key, "shape": case["shape"], "case": small, "llamacpp_error": lc2.get("error"),
                  "llamapy_error": perr2, "format": lc2.get("format"),
                  "llamapy_format": getattr(getattr(plan2, "format", None), "name", None)}  # fmt: skip
            if outcome == "mismatch" and plan2 is not None and "prompt" in lc2:
                hf = hf_render(src, small)
                ex["diff"] = first_diff(lc2["prompt"], plan2.prompt)  # type: ignore[attr-defined]
                ex["hf_matches"] = ("llamacpp" if hf == lc2["prompt"] else "llamapy" if hf == plan2.prompt
                                    else "neither")  # type: ignore[attr-defined]  # fmt: skip
                if ex["hf_matches"] == "neither":
                    ex["hf_diff"] = first_diff(lc2["prompt"], hf or "")
            res["render_examples"].append(ex)
    # parsing
    for kind, req, answer in model_outputs(cpp, src, rng):
        case = {"messages": req["messages"], "tools": req["tools"], "agp": True}
        lc, plan, perr = render_both(cpp, src, case)
        if lc.get("template_thinking") and plan is not None and lc.get("prompt") != plan.prompt:
            # llama-server passes enable_thinking=true where it detects thinking, llamapy passes nothing (a
            # render difference reported above): parse with the prompts made equal where that does it
            case["kwargs"] = {"enable_thinking": True}
            lc, plan, perr = render_both(cpp, src, case)
        if "error" in lc or plan is None:
            res["parse"]["skipped_render_error"] += 1
            continue
        cuts = [(answer, False)] + [(answer[: rng.randint(1, max(1, len(answer) - 1))], True)
                                    for _ in range(n_partial if len(answer) > 2 else 0)]  # fmt: skip
        for text_, partial in cuts:
            lp = cpp.ask({"cmd": "parse", "syntax": lc["syntax"], "text": text_, "is_partial": partial})
            pp = py_parse(plan, text_, partial)
            cls = compare_parse(lp, pp, partial)
            tag = ("partial_" if partial else "") + (cls or "match")
            res["parse"][tag] += 1
            if cls and len(res["parse_examples"]) < 10:
                res["parse_examples"].append({"kind": kind, "class": cls, "partial": partial, "text": text_,
                                              "llamacpp": lp, "llamapy": pp, "lc_format": lc.get("format"),
                                              "py_format": plan.format.name,  # type: ignore[attr-defined]
                                              "gen_prompt": lc.get("generation_prompt")})  # fmt: skip
    res["render"], res["parse"] = dict(res["render"]), dict(res["parse"])
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--templates", type=Path, default=SHARED / "templates")
    ap.add_argument("--cases", type=int, default=12, help="render cases per template")
    ap.add_argument("--partial", type=int, default=3, help="cut points per model output")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", default=None, help="substring of the template file names to run")
    ap.add_argument("--lib", type=Path, default=llamacpp_bin("avx2"))
    ap.add_argument("--out", type=Path, default=Path("/tmp/chatfuzz/results.json"))
    a = ap.parse_args()

    os.environ["TZ"] = "UTC"
    time.tzset()
    pin_clock()
    cpp = LlamaCppChat(build_harness(a.lib))
    paths = sorted(a.templates.glob("*.jinja"))
    if a.only:
        paths = [p for p in paths if a.only in p.name]
    a.out.parent.mkdir(parents=True, exist_ok=True)
    results = []
    print(f"{'template':48s} {'cases':>5s} {'r.mism':>6s} {'r.lcE':>5s} {'r.pyE':>5s} {'r.both':>6s} "
          f"{'parses':>6s} {'p.mism':>6s} {'p.lcE':>5s} {'p.pyE':>5s}  secs", flush=True)  # fmt: skip
    tot = Counter()
    for p in paths:
        t0 = time.time()
        try:
            r = run_template(cpp, p, a.cases, a.seed, a.partial)
        except Exception as e:  # noqa: BLE001
            r = {
                "template": p.name,
                "error": f"{type(e).__name__}: {e}",
                "render": {},
                "parse": {},
                "cases": 0,
            }
        r["seconds"] = round(time.time() - t0, 1)
        results.append(r)
        rc, pc = Counter(r["render"]), Counter(r["parse"])
        row = {
            "cases": r["cases"],
            "r.mism": sum(v for k, v in rc.items() if k.startswith("mismatch")),
            "r.lcE": rc["lc_error"], "r.pyE": rc["py_error"], "r.both": rc["both_error"],
            "parses": sum(pc.values()),
            "p.mism": sum(v for k, v in pc.items() if not k.endswith(("match", "error", "render_error"))),
            "p.lcE": sum(v for k, v in pc.items() if k.endswith("lc_error")),
            "p.pyE": sum(v for k, v in pc.items() if k.endswith("py_error")),
        }  # fmt: skip
        tot.update(row)
        print(f"{p.name[:48]:48s} " + " ".join(f"{row[k]:>{max(5, len(k))}d}" for k in row)
              + f"  {r['seconds']}" + (f"  ERROR {r['error']}" if "error" in r else ""), flush=True)  # fmt: skip
        a.out.write_text(json.dumps(results, ensure_ascii=False, indent=1, default=str))
    print(f"{'TOTAL':48s} " + " ".join(f"{tot[k]:>{max(5, len(k))}d}" for k in tot))
    print(f"details: {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
