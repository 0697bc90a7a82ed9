"""One chat request -> what the token loop needs: the prompt text, the grammar (tools, ``response_format``
or a user grammar), the chat format that parses the answer, its syntax, the tokens kept as text.

Shared by :class:`llamapy.api.Llama` and the server, so both refuse the same requests the same way.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import field
from typing import Any

from .._dataclass import dataclass
from ..errors import LlamapyError

REASONING_FORMATS = ("none", "deepseek", "auto")


class ChatRequestError(LlamapyError, ValueError):
    """A chat request that cannot be served as given (``param`` names the offending field)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass
class ChatPlan:
    """A chat request made ready: the rendered prompt, its format and syntax, and the grammar that constrains it."""

    prompt: str
    format: Any  # llamapy.chat.ChatFormat
    syntax: Any  # llamapy.chat.ChatSyntax
    grammar: Any = None  # llamapy.grammar.LlamaGrammar
    preserved_tokens: list[int] = field(default_factory=list)


def response_format_grammar(response_format: Any) -> Any:
    """The grammar of an OpenAI ``response_format`` (None for text): ``{"type": "json_object"}`` with an
    optional ``schema``, or ``{"type": "json_schema", "json_schema": {"schema": ...}}``."""
    from ..grammar import LlamaGrammar

    if response_format is None:
        return None
    if not isinstance(response_format, Mapping):
        raise ChatRequestError("'response_format' must be an object", "response_format")
    kind = response_format.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        schema = response_format.get("schema")
        return LlamaGrammar.json_object() if schema is None else LlamaGrammar.from_json_schema(schema)
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, Mapping):
            raise ChatRequestError(
                "'response_format' of type json_schema needs 'json_schema': {\"schema\": {...}}",
                "response_format",
            )
        schema = spec.get("schema")
        if schema is None:
            schema = {"type": "object"} if "schema" not in spec else None
        if not isinstance(schema, Mapping | bool):
            raise ChatRequestError(
                "'response_format.json_schema.schema' must be a JSON schema object", "response_format"
            )
        return LlamaGrammar.from_json_schema(dict(schema) if isinstance(schema, Mapping) else schema)
    raise ChatRequestError(
        f"'response_format' type {kind!r} is not one of text, json_object, json_schema", "response_format"
    )


def tool_names(tools: Sequence[Any]) -> list[str]:
    names = []
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, Mapping) else None
        if (
            not isinstance(t, Mapping)
            or t.get("type", "function") != "function"
            or not isinstance(fn, Mapping)
        ):
            raise ChatRequestError(f'tools[{i}] must be {{"type": "function", "function": {{...}}}}', "tools")
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise ChatRequestError(f"tools[{i}].function has no 'name'", "tools")
        names.append(name)
    return names


def normalize_tool_choice(tool_choice: Any, tools: Sequence[Any] | None) -> str | dict[str, Any]:
    """``auto`` / ``none`` / ``required`` or ``{"type": "function", "function": {"name": ...}}``, checked
    against ``tools``."""
    names = tool_names(tools or [])
    if tool_choice is None:
        return "auto" if names else "none"
    if isinstance(tool_choice, str):
        if tool_choice not in ("auto", "none", "required"):
            raise ChatRequestError(
                f"'tool_choice' {tool_choice!r} is not auto, none, required or a named function",
                "tool_choice",
            )
        if tool_choice == "required" and not names:
            raise ChatRequestError("'tool_choice' is 'required' but no 'tools' were given", "tool_choice")
        return tool_choice
    fn = tool_choice.get("function") if isinstance(tool_choice, Mapping) else None
    name = fn.get("name") if isinstance(fn, Mapping) else None
    if not isinstance(name, str):
        raise ChatRequestError(
            '\'tool_choice\' must be a string or {"type": "function", "function": {"name": ...}}',
            "tool_choice",
        )
    if name not in names:
        known = ", ".join(names) or "none"
        raise ChatRequestError(
            f"'tool_choice' names the function {name!r}, which is not in 'tools' ({known})", "tool_choice"
        )
    return {"type": "function", "function": {"name": name}}


def _special_id(vocab: Any, text: str) -> int | None:
    """The id of ``text`` when it is one special token of the vocabulary (a grammar names it by id)."""
    from ..grammar import special_token_id

    return special_token_id(vocab, text) if vocab is not None else None


def _token_id(vocab: Any, text: str) -> int:
    lookup = getattr(vocab, "text_to_token", None)
    return int(lookup(text)) if lookup is not None else -1


def template_context(now: datetime.datetime | None = None) -> dict[str, str]:
    """The variables llama.cpp gives every chat template (``common_chat_extra_context``): ``datetime``
    ("Mar 14 2025") and ``date_string`` ("14 Mar 2025"), today's date (Llama 3.x and firefunction show it)."""
    now = now or datetime.datetime.now()
    return {"datetime": now.strftime("%b %d %Y"), "date_string": now.strftime("%d %b %Y")}


def thinking_kwargs(
    template: Any,
    chat_template_kwargs: Mapping[str, Any] | None,
    *,
    reasoning: bool = True,
    reasoning_effort: str | None = None,
) -> dict[str, Any]:
    """The template's ``enable_thinking`` (and ``reasoning_effort``), as llama-server decides them: on where
    reasoning is on (``reasoning``, llama-server's ``--reasoning``) and the template reacts to it
    (``ChatTemplate.supports_thinking``), else off; a boolean ``chat_template_kwargs["enable_thinking"]``
    decides instead, and ``reasoning_effort`` "none" turns it off (another effort is passed on)."""
    kwargs = dict(chat_template_kwargs or {})
    enabled = reasoning and bool(getattr(template, "supports_thinking", False))
    explicit = kwargs.get("enable_thinking")
    if isinstance(explicit, str):
        raise ChatRequestError(
            'invalid type for "enable_thinking" (expected boolean, got string)', "chat_template_kwargs"
        )
    if isinstance(explicit, bool):
        enabled = explicit
    if reasoning_effort == "none":
        enabled = False
        kwargs.pop("reasoning_effort", None)
    elif reasoning_effort:
        kwargs["reasoning_effort"] = reasoning_effort
    return {"enable_thinking": enabled, **kwargs}


def plan_chat(
    template: Any,
    vocab: Any,
    messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None = None,
    tool_choice: Any = None,
    parallel_tool_calls: bool | None = None,
    response_format: Any = None,
    grammar: Any = None,
    reasoning_format: str | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    add_generation_prompt: bool = True,
    reasoning: bool = True,
    reasoning_effort: str | None = None,
    continue_final_message: bool | None = None,
) -> ChatPlan:
    """Render the prompt and choose the grammar and parser of one chat request (see module docstring).

    The template gets :func:`template_context`, ``enable_thinking`` (:func:`thinking_kwargs`: ``reasoning``
    False is llama-server's ``--reasoning off``, ``reasoning_effort`` OpenAI's field), the family's
    variables, then ``chat_template_kwargs`` over them.

    A last assistant message without tool calls is continued, as llama-server's default
    (``prefill_assistant``) and Anthropic's prefill: the prompt is the earlier messages with the generation
    prompt, then that message's text (after its reasoning, closed, where the template has reasoning tags;
    a message with only reasoning continues the reasoning); the answer is what follows.
    ``continue_final_message`` False renders it as a finished turn instead; True requires such a message.

    ``template`` is a :class:`llamapy.vocab.chat_template.ChatTemplate`; ``grammar`` a
    :class:`llamapy.grammar.LlamaGrammar` (or GBNF text). Errors: :class:`ChatRequestError`,
    :class:`llamapy.grammar.GrammarError`, the template's ``TemplateError``.
    """
    from ..chat import ChatSyntax, detect_format
    from ..grammar import LlamaGrammar, Trigger

    reasoning_format = reasoning_format or "auto"
    if reasoning_format not in REASONING_FORMATS:
        raise ChatRequestError(
            f"'reasoning_format' {reasoning_format!r} is not one of {', '.join(REASONING_FORMATS)}",
            "reasoning_format",
        )
    if isinstance(grammar, str):
        grammar = LlamaGrammar.from_string(grammar) if grammar else None
    rf_grammar = response_format_grammar(response_format)
    if grammar is not None and rf_grammar is not None:
        raise ChatRequestError("give either 'grammar' or 'response_format', not both", "grammar")
    user_grammar = grammar or rf_grammar
    tools = list(tools) if tools else None
    choice = normalize_tool_choice(tool_choice, tools)
    use_tools = bool(tools) and choice != "none"
    if use_tools and user_grammar is not None:
        raise ChatRequestError(
            "a grammar or a JSON 'response_format' cannot be combined with tool calls "
            "(use tool_choice 'none', or drop 'tools')",
            "tools",
        )
    parallel = True if parallel_tool_calls is None else bool(parallel_tool_calls)
    fmt = detect_format(getattr(template, "source", None), tools_requested=use_tools)
    messages = list(messages)
    last = _continued(messages, continue_final_message)
    if last is not None:
        messages = messages[:-1]
    msgs = fmt.prepare_messages(messages, tools=tools if use_tools else None)
    kwargs: dict[str, Any] = template_context()
    kwargs.update(fmt.template_kwargs(tools, choice, parallel) if use_tools else {})
    kwargs.update(
        thinking_kwargs(
            template, chat_template_kwargs, reasoning=reasoning, reasoning_effort=reasoning_effort
        )
    )

    def render(gp: bool) -> str:  # (finish_prompt: Gemma 4's turn its template omits)
        return fmt.finish_prompt(template.render(msgs, add_generation_prompt=gp, tools=tools, **kwargs), gp)

    if last is None:
        prompt = render(add_generation_prompt)
    else:  # the earlier turns, then the generation prompt and the continued message
        full, bare = render(True), render(False)
        gp = full[len(bare) :] if full.startswith(bare) else ""
        prompt = (bare if full.startswith(bare) else full) + _continuation(fmt, template, gp, last)
    # (a continued message with only reasoning leaves the reasoning block open, whatever its text)
    forced_open = fmt.thinking_forced_open(prompt) or (
        last is not None and _continues_reasoning(fmt, template, last)
    )
    preserved: list[int] = []
    if use_tools:
        tg = fmt.grammar(
            tools, choice, parallel, lambda text: _special_id(vocab, text), thinking_forced_open=forced_open
        )
        if tg is not None:
            g = LlamaGrammar.from_lark(tg.lark)
            if tg.triggers and choice == "auto":
                triggers = []
                for kind, value in tg.triggers:
                    if kind == "token":
                        tid = _token_id(vocab, value)
                        triggers.append(Trigger("token", tid) if tid >= 0 else Trigger("word", value))
                    else:
                        triggers.append(Trigger(kind, value))
                g = g.lazy(triggers)
            user_grammar = g
            preserved = [t for t in (_token_id(vocab, s) for s in tg.preserved_tokens) if t >= 0]
    if user_grammar is not None:
        user_grammar.check(vocab)
    syntax = ChatSyntax(
        format=fmt.name,
        reasoning_format=reasoning_format,
        thinking_forced_open=forced_open,
        parse_tool_calls=use_tools,
        tools=tools if use_tools else None,
    )
    return ChatPlan(prompt, fmt, syntax, user_grammar, preserved)


def _continued(messages: list[dict[str, Any]], continue_final_message: bool | None) -> dict[str, Any] | None:
    """The last message when it is to be continued (see :func:`plan_chat`), as llama-server decides."""
    last = messages[-1] if messages and isinstance(messages[-1], Mapping) else None
    if continue_final_message is False or last is None or last.get("role") != "assistant":
        if continue_final_message:
            raise ChatRequestError(
                "'continue_final_message' needs the last message to be the assistant's",
                "continue_final_message",
            )
        return None
    if last.get("tool_calls"):
        if continue_final_message:
            raise ChatRequestError(
                "cannot continue an assistant message that contains tool calls", "continue_final_message"
            )
        return None
    if len(messages) >= 2 and isinstance(messages[-2], Mapping) and messages[-2].get("role") == "assistant":
        raise ChatRequestError("cannot have 2 or more assistant messages at the end of the list", "messages")
    return dict(last)


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p.get("text", "") for p in content if isinstance(p, Mapping) and p.get("type") == "text"
        )
    return ""


def _continues_reasoning(fmt: Any, template: Any, last: dict[str, Any]) -> bool:
    think = getattr(fmt, "think", None)
    return (
        think is not None
        and think.start in getattr(template, "source", "")
        and bool(_text_of(last.get("reasoning_content")))
        and not _text_of(last.get("content"))
    )


def _continuation(fmt: Any, template: Any, generation_prompt: str, last: dict[str, Any]) -> str:
    """The generation prompt followed by the continued message (llama.cpp's ``continue_msg``): where the
    template has the family's reasoning tags, the generation prompt up to its opening tag, the tag, the
    message's reasoning and (continuing the text) the closing tag; then the text."""
    text = _text_of(last.get("content"))
    reasoning = _text_of(last.get("reasoning_content"))
    think = getattr(fmt, "think", None)
    if think is not None and think.start in getattr(template, "source", ""):
        at = generation_prompt.find(think.start)
        generation_prompt = (
            generation_prompt[: at if at >= 0 else len(generation_prompt)] + think.start + reasoning
        )
        if text or not reasoning:
            generation_prompt += think.end
        else:
            return generation_prompt  # only reasoning: the answer goes on thinking
    return generation_prompt + text


def message_dict(message: Any, text: str) -> dict[str, Any]:
    """An OpenAI ``chat.completion`` message from a parsed message (``text`` when there is none)."""
    if message is None:
        return {"role": "assistant", "content": text}
    out: dict[str, Any] = {"role": "assistant", "content": message.content}
    if message.reasoning_content:
        out["reasoning_content"] = message.reasoning_content
    if message.tool_calls:
        if not message.content:
            out["content"] = None
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in message.tool_calls
        ]
    return out


def delta_dicts(deltas: Sequence[Any]) -> list[dict[str, Any]]:
    """OpenAI ``chat.completion.chunk`` deltas from chat deltas (neighbouring text pieces merged)."""
    out: list[dict[str, Any]] = []
    for d in deltas:
        if d.tool_call_index is not None:
            fn: dict[str, Any] = {"arguments": d.tool_call_arguments}
            call: dict[str, Any] = {"index": d.tool_call_index}
            if d.tool_call_id is not None:
                call["id"] = d.tool_call_id
                call["type"] = "function"
            if d.tool_call_name is not None:
                fn = {"name": d.tool_call_name, **fn}
            call["function"] = fn
            out.append({"tool_calls": [call]})
            continue
        for key in ("reasoning_content", "content"):
            piece = getattr(d, key)
            if not piece:
                continue
            if out and set(out[-1]) == {key}:
                out[-1][key] += piece
            else:
                out.append({key: piece})
    return out
