"""Chat templates: a model's ``tokenizer.chat_template`` (Jinja) rendered safely, plus built-in fallbacks.

Templates come from untrusted files, so they run in jinja2's ``ImmutableSandboxedEnvironment`` (no
Python internals, no mutating dicts; lists may ``append`` and ``pop``, as in llama.cpp's Jinja engine,
and a template that calls them renders on copies of its inputs) with the environment Hugging Face's
``apply_chat_template`` gives them: ``trim_blocks``/``lstrip_blocks``, loop controls, the
``{% generation %}`` tag, ``raise_exception``, ``strftime_now``, ``tojson`` without ASCII escaping, and
the variables ``messages``, ``bos_token``, ``eos_token``, ``add_generation_prompt``, ``tools`` and
``documents`` (left undefined when there are none, as llama.cpp does) plus any extra keyword
(``enable_thinking=...``). As in llama.cpp's Jinja, a member of an undefined value is undefined, and an
undefined value or none added to a string is an empty string. Rendering has a time, memory and size
limit, and every operation that can amplify a value's size (``**``, ``*``, ``%``, ``center``,
``join``...) is bounded before it runs (:mod:`llamapy.vocab.template_sandbox`).

Message ``content`` may be a string or a list of parts (``{"type": "text", "text": ...}``); as in
llama.cpp, a template that only understands one of the two forms gets the other converted to it
(parts joined with newlines).
"""

from __future__ import annotations

import copy
import datetime
import json
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.exceptions import SecurityError
from jinja2.ext import Extension

from ..errors import LlamapyError
from .template_sandbox import (
    MAX_OUTPUT_CHARS,
    MAX_RANGE,
    BoundedSandbox,
    RenderGuard,
    TemplateLimitError,
    bound_filters,
)

__all__ = ["MAX_OUTPUT_CHARS", "MAX_RANGE", "ChatTemplate", "TemplateError", "TemplateLimitExceeded"]

DEFAULT_TIME_LIMIT_S = 10.0


class TemplateError(LlamapyError, ValueError):
    """A chat template that cannot be parsed or rendered (syntax, raise_exception, unsafe access, limits)."""


class _GenerationTag(Extension):
    """``{% generation %}...{% endgeneration %}`` (marks assistant text for training masks): renders its body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


class TemplateLimitExceeded(TemplateError):
    """A template went past one of the sandbox's bounds (time, memory, the size of a value)."""


class _TemplateRaised(Exception):
    pass


def _raise_exception(message: Any) -> None:
    raise _TemplateRaised(str(message))


def _strftime_now(fmt: str) -> str:
    fmt = str(fmt)
    if len(fmt) > 1000:
        raise TemplateLimitError(f"strftime_now(): a format of {len(fmt)} characters (limit 1000)")
    return datetime.datetime.now().strftime(fmt)


def _json_default(o: Any) -> Any:
    if isinstance(o, jinja2.Undefined):
        return None
    if isinstance(o, (Iterator, map, filter)):  # e.g. the result of `tools | map(...)`
        return list(o)
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: Any = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    for x in (indent, *(separators if isinstance(separators, (list, tuple)) else ())):
        if (isinstance(x, str) and len(x) > 64) or (isinstance(x, int) and x > 64):
            raise TemplateLimitError("tojson: an indent or separator longer than 64 characters")
    return json.dumps(
        value,
        ensure_ascii=ensure_ascii,
        indent=indent,
        separators=separators,
        sort_keys=sort_keys,
        default=_json_default,
    )


def _environment() -> BoundedSandbox:
    env = BoundedSandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=False,
        extensions=["jinja2.ext.loopcontrols", _GenerationTag],
        undefined=jinja2.ChainableUndefined,  # (as llama.cpp: a member of an undefined value is undefined)
    )
    env.filters["tojson"] = _tojson
    bound_filters(env)
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
    return env


_ENV = _environment()
_MUTATES = re.compile(r"\.\s*(?:append|pop)\s*\(")  # a call of a list mutator the sandbox allows


def _concat_parts(parts: Sequence[Any]) -> str:
    text = ""
    for part in parts:
        if isinstance(part, Mapping) and part.get("type", "text") == "text":
            if text:
                text += "\n"
            text += str(part.get("text", ""))
        elif isinstance(part, str):
            text += ("\n" if text else "") + part
    return text


_PROBE = "\u2063llamapy-probe\u2063"
# a text part shown as data (``tojson``, a Python repr): the probe text right after a "text" key
_SERIALIZED_PART = re.compile(r"""["']text["']\s*:\s*["']""" + re.escape(_PROBE))


def _object_arguments(call: Any) -> Any:
    """A tool call whose JSON-string ``arguments`` (OpenAI style) are parsed into an object."""
    if not isinstance(call, Mapping):
        return call
    fn = call.get("function") if isinstance(call.get("function"), Mapping) else None
    target = fn if fn is not None else call
    args = target.get("arguments")
    if not isinstance(args, str):
        return call
    try:
        parsed = json.loads(args)
    except ValueError:
        return call
    if not isinstance(parsed, dict):
        return call
    if fn is not None:
        return {**call, "function": {**fn, "arguments": parsed}}
    return {**call, "arguments": parsed}


class ChatTemplate:
    """A chat template from Jinja source. ``render(messages, add_generation_prompt=True, tools=None,
    **kwargs) -> str``. Errors (syntax, ``raise_exception``, unsafe access) raise ``TemplateError``."""

    def __init__(
        self,
        source: str,
        bos_token: str = "",
        eos_token: str = "",
        *,
        name: str = "chat template",
        time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    ) -> None:
        if not isinstance(source, str):
            raise TemplateError(f"{name}: source must be a string, got {type(source).__name__}")
        self.source = source
        self.bos_token = bos_token or ""
        self.eos_token = eos_token or ""
        self.name = name
        self.time_limit_s = time_limit_s
        try:
            self._template = _ENV.from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise TemplateError(f"{name}: syntax error at line {e.lineno}: {e.message}") from None
        except Exception as e:  # e.g. recursion in a pathological source
            raise TemplateError(f"{name}: cannot parse: {type(e).__name__}: {e}") from None
        # it may append to or pop from a list (template_sandbox.LIST_MUTATORS): render on copies of the inputs
        self._mutates = _MUTATES.search(source) is not None
        self._caps: tuple[bool, bool] | None = None
        self._system_role: bool | None = None
        self._object_args: bool | None = None
        self._thinking: bool | None = None

    def __repr__(self) -> str:
        return f"ChatTemplate({self.name!r}, {len(self.source)} chars)"

    # --- capabilities (llama.cpp's supports_string_content / supports_typed_content) ---

    def _try_render(self, messages: list[dict[str, Any]], **variables: Any) -> str | None:
        """A probe render (no tools, as llama.cpp probes); None when the template fails on it."""
        try:
            return self._render_raw({"messages": messages, "add_generation_prompt": False, **variables})
        except TemplateLimitExceeded:
            raise
        except TemplateError:
            return None

    def _probe(self, content: Any, role: str = "user") -> bool:
        """Whether the template shows ``content`` (the probe text, as a string or in a text part) in a
        ``role`` message; a part shown as a serialized structure (``tojson``, a Python repr) is not shown."""
        msgs = [{"role": role, "content": content}]
        if role != "user":
            msgs.append({"role": "user", "content": "x"})
        out = self._try_render(msgs)
        return out is not None and _PROBE in out and _SERIALIZED_PART.search(out) is None

    @property
    def supports_string_content(self) -> bool:
        return self._capabilities()[0]

    @property
    def supports_typed_content(self) -> bool:
        return self._capabilities()[1]

    @property
    def supports_system_role(self) -> bool:
        """Whether the template shows a leading system message (llama.cpp merges it into the next
        message when it does not)."""
        if self._system_role is None:
            out = self._try_render([{"role": "system", "content": _PROBE}, {"role": "user", "content": "x"}])
            self._system_role = out is not None and _PROBE in out
        return self._system_role

    @property
    def supports_thinking(self) -> bool:
        """Whether the template reacts to ``enable_thinking`` where the answer starts: the generation
        prompt after a user message differs between true and false (llama.cpp's autoparser compares
        the same renders; a template that only mentions it elsewhere, such as Apertus's "Deliberation"
        line, does not count)."""
        if self._thinking is None:
            msgs = [{"role": "user", "content": "test"}]

            def generation_prompt(enabled: bool) -> str | None:
                full = self._try_render(msgs, add_generation_prompt=True, enable_thinking=enabled)
                bare = self._try_render(msgs, enable_thinking=enabled)
                if full is None or bare is None:
                    return None
                return full[len(os.path.commonprefix([full, bare])) :]

            on, off = generation_prompt(True), generation_prompt(False)
            self._thinking = on is not None and off is not None and on != off
        return self._thinking

    @property
    def wants_object_arguments(self) -> bool:
        """Whether tool-call ``arguments`` should be given as an object rather than a JSON string:
        the template mangles a string (e.g. ``arguments | tojson``) but shows an object's keys."""
        if self._object_args is None:
            self._object_args = False
            as_str = '{"probe_arg": "probe"}'

            def probe(arguments: Any) -> str | None:
                call = {
                    "id": "probe0001",
                    "type": "function",
                    "function": {"name": "probe_fn", "arguments": arguments},
                }
                msgs = [
                    {"role": "user", "content": "x"},
                    {"role": "assistant", "content": "", "tool_calls": [call]},
                ]
                return self._try_render(msgs)

            out_str = probe(as_str)
            if out_str is None or as_str not in out_str:
                out_obj = probe({"probe_arg": "probe"})
                if out_obj is not None:
                    # a string fails but an object works, or the object's key shows (not as a Python repr)
                    self._object_args = out_str is None or (
                        "probe_arg" in out_obj and "{'probe_arg'" not in out_obj
                    )
        return self._object_args

    def _capabilities(self) -> tuple[bool, bool]:
        if self._caps is None:
            part = [{"type": "text", "text": _PROBE}]
            # typed parts are kept only where every role shows them (a system message the template
            # does not show is merged into the next message as text anyway)
            typed = self._probe(part) and (not self.supports_system_role or self._probe(part, "system"))
            self._caps = (self._probe(_PROBE), typed)
        return self._caps

    def _workarounds(self, messages: list[Any]) -> list[Any]:
        """llama.cpp's message workarounds: developer -> system (except for GPT-OSS templates), a
        system message merged into the next one when the template ignores it, and an empty content
        for tool-call messages without one."""
        out = []
        for m in messages:
            if isinstance(m, Mapping):
                if m.get("role") == "developer" and "<|channel|>" not in self.source:
                    m = {**m, "role": "system"}
                if "tool_calls" in m and m.get("content") is None:
                    m = {**m, "content": ""}
                if m.get("tool_calls") and self.wants_object_arguments:
                    m = {**m, "tool_calls": [_object_arguments(c) for c in m["tool_calls"]]}
            out.append(m)
        if (
            out
            and isinstance(out[0], Mapping)
            and out[0].get("role") == "system"
            and not self.supports_system_role
        ):
            sys_text = out[0].get("content")
            sys_text = _concat_parts(sys_text) if isinstance(sys_text, list) else str(sys_text or "")
            if len(out) > 1 and isinstance(out[1], Mapping):
                nxt = out[1].get("content")
                nxt = _concat_parts(nxt) if isinstance(nxt, list) else str(nxt or "")
                out = [{**out[1], "content": sys_text + "\n" + nxt}] + out[2:]
            else:
                out = out[1:]
        return out

    def _normalize(self, messages: Sequence[Any]) -> list[Any]:
        messages = self._workarounds(list(messages))
        has_str = any(isinstance(m, Mapping) and isinstance(m.get("content"), str) for m in messages)
        has_list = any(isinstance(m, Mapping) and isinstance(m.get("content"), list) for m in messages)
        if not (has_str or has_list):
            return list(messages)
        s, t = self._capabilities()
        out = []
        for i, m in enumerate(messages):
            if not isinstance(m, Mapping):
                raise TemplateError(f"{self.name}: message {i} is a {type(m).__name__}, not a mapping")
            c = m.get("content")
            if s and not t and isinstance(c, list):
                m = {**m, "content": _concat_parts(c)}
            elif t and not s and isinstance(c, str):
                m = {**m, "content": [{"type": "text", "text": c}]}
            out.append(m)
        return out

    # --- rendering ---

    def _render_raw(self, variables: dict[str, Any]) -> str:
        if self._mutates:
            variables = {
                k: copy.deepcopy(v) if isinstance(v, (list, dict)) else v for k, v in variables.items()
            }
        # (``tools`` and ``documents`` stay undefined unless given, as in llama.cpp: templates loop over them)
        ctx = {"bos_token": self.bos_token, "eos_token": self.eos_token}
        ctx.update(variables)
        chunks: list[str] = []
        size = 0
        try:
            with RenderGuard(self.time_limit_s):
                for chunk in self._template.generate(**ctx):
                    size += len(chunk)
                    if size > MAX_OUTPUT_CHARS:
                        raise TemplateLimitError(f"output is over {MAX_OUTPUT_CHARS} characters")
                    chunks.append(chunk)
        except _TemplateRaised as e:
            raise TemplateError(f"{self.name}: {e}") from None
        except TemplateLimitError as e:
            raise TemplateLimitExceeded(f"{self.name}: {e}") from None
        except SecurityError as e:
            raise TemplateError(f"{self.name}: refused unsafe operation: {e}") from None
        except jinja2.TemplateError as e:
            raise TemplateError(f"{self.name}: {type(e).__name__}: {e}") from None
        except RecursionError:
            raise TemplateError(f"{self.name}: recursion too deep") from None
        except Exception as e:  # errors inside template expressions (TypeError, KeyError, ...)
            hint = ""
            if "NoneType" in str(e):
                hint = " (the template may need a variable that was not given, such as tools)"
            raise TemplateError(f"{self.name}: rendering failed: {type(e).__name__}: {e}{hint}") from None
        return "".join(chunks)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        **kwargs: Any,
    ) -> str:
        """The prompt text for ``messages`` (OpenAI-style dicts: role, content, tool_calls, ...)."""
        if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
            raise TemplateError(
                f"{self.name}: messages must be a list of dicts, got {type(messages).__name__}"
            )
        for i, m in enumerate(messages):
            if not isinstance(m, Mapping):
                raise TemplateError(f"{self.name}: message {i} is a {type(m).__name__}, not a mapping")
        variables = dict(kwargs)
        variables.update(
            messages=self._normalize(messages), add_generation_prompt=bool(add_generation_prompt)
        )
        if tools:
            variables["tools"] = list(tools)
        if documents:
            variables["documents"] = list(documents)
        return self._render_raw(variables)

    __call__ = render


# --- built-in templates (llama.cpp's llm_chat_apply_template formats, as Jinja) ---

_CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_LLAMA3 = (
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim"
    " + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)

# Gemma 3's own template (Gemma 2's plus a system message folded into the first user turn)
_GEMMA = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\\n'}}
{%- endif -%}
"""

_PHI3 = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)

# Mistral "v7": [SYSTEM_PROMPT] / [INST] with a space, assistant turns end with </s>
_MISTRAL = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ '[SYSTEM_PROMPT] ' + message['content'] + '[/SYSTEM_PROMPT]' }}"
    "{% elif message['role'] == 'user' %}{{ '[INST] ' + message['content'] + '[/INST]' }}"
    "{% else %}{{ ' ' + message['content'] + '</s>' }}{% endif %}"
    "{% endfor %}"
)

BUILTIN_TEMPLATES: dict[str, str] = {
    "chatml": _CHATML,
    "llama3": _LLAMA3,
    "gemma": _GEMMA,
    "phi3": _PHI3,
    "mistral": _MISTRAL,
    "mistral-v7": _MISTRAL,
}


def builtin_template(name: str) -> str:
    """The Jinja source of a built-in template: chatml, llama3, gemma, phi3, mistral (= mistral-v7)."""
    key = str(name).strip().lower()
    if key not in BUILTIN_TEMPLATES:
        raise TemplateError(f"unknown built-in chat template {name!r}; known: {', '.join(BUILTIN_TEMPLATES)}")
    return BUILTIN_TEMPLATES[key]


def default_template_name(metadata: Mapping[str, Any]) -> str:
    """The built-in to use for a model whose file has no ``tokenizer.chat_template``: by architecture
    (gemma*, phi3) or by the special tokens its vocabulary has (llama3, mistral), else chatml."""
    arch = str(metadata.get("general.architecture", "")).lower()
    if arch.startswith("gemma"):
        return "gemma"
    if arch == "phi3":
        return "phi3"
    tokens = metadata.get("tokenizer.ggml.tokens")
    if tokens is not None and len(tokens) > 0:
        have = set()
        for t in ("<|start_header_id|>", "<|eot_id|>", "[INST]", "<|im_start|>"):
            if t in tokens:
                have.add(t)
        if "<|im_start|>" in have:
            return "chatml"
        if "<|start_header_id|>" in have and "<|eot_id|>" in have:
            return "llama3"
        if "[INST]" in have:
            return "mistral"
    return "chatml"


def template_for_model(
    metadata: Mapping[str, Any], bos_token: str = "", eos_token: str = "", override: str | None = None
) -> ChatTemplate:
    """The model's chat template (``override`` source first, e.g. ``--chat-template-file``; then
    ``tokenizer.chat_template``; then the built-in for its architecture)."""
    if override is not None:
        if override.strip().lower() in BUILTIN_TEMPLATES:
            return ChatTemplate(builtin_template(override), bos_token, eos_token, name=f"built-in {override}")
        return ChatTemplate(override, bos_token, eos_token, name="chat template override")
    src = metadata.get("tokenizer.chat_template")
    if isinstance(src, str) and src.strip():
        return ChatTemplate(src, bos_token, eos_token, name="tokenizer.chat_template")
    name = default_template_name(metadata)
    return ChatTemplate(builtin_template(name), bos_token, eos_token, name=f"built-in {name}")
