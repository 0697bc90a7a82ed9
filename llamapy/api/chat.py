"""Chat completions of :class:`llamapy.api.Llama`: the chat template in effect (``chat_template``,
``chat_format`` or the model's), ``apply_chat_template``, ``create_chat_completion`` and its chunks, with
tools, ``response_format``, grammars and reasoning (:mod:`llamapy.api.chat_request` plans the request)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..generation import Step
from ..sampling.logprobs import log_softmax, top_logprobs
from .chat_request import ChatPlan, delta_dicts, message_dict, plan_chat
from .common import LogitsProcessor


def _has_images(messages: Any) -> bool:
    from ..mtmd.prompt import has_images

    return isinstance(messages, list) and has_images(messages)


# llama-cpp-python chat_format names -> llamapy's built-in templates
_CHAT_FORMAT_ALIASES = {
    "llama-3": "llama3",
    "mistral-instruct": "mistral",
    "phi-3": "phi3",
    "gemma2": "gemma",
}


class ChatMixin:
    """Chat methods, over ``CompletionMixin``'s steps; set up by ``Llama``."""

    def _chat_template(self) -> Any:
        """The template in effect: ``chat_template`` (Jinja source), else the built-in ``chat_format``,
        else the file's ``tokenizer.chat_template``, else a built-in chosen for the model."""
        from ..vocab import chat_template as ct

        key = (self.chat_template, self.chat_format)
        cached = getattr(self, "_template_cache", None)
        if cached is not None and cached[0] == key:
            return cached[1]
        v = self.vocab
        bos = v.token_text(v.bos) if v.bos >= 0 else ""
        eos = v.token_text(v.eos) if v.eos >= 0 else ""
        if self.chat_template:
            tmpl = ct.template_for_model(self.model.metadata, bos, eos, override=self.chat_template)
        elif self.chat_format:
            name = _CHAT_FORMAT_ALIASES.get(self.chat_format.lower(), self.chat_format)
            tmpl = ct.ChatTemplate(
                ct.builtin_template(name), bos, eos, name=f"chat_format {self.chat_format}"
            )
        else:
            tmpl = ct.template_for_model(self.model.metadata, bos, eos)
        self._template_cache = (key, tmpl)
        return tmpl

    def _plan(self, messages: list[dict[str, Any]], **kw: Any) -> ChatPlan:
        kw.setdefault("continue_final_message", False)  # (llama-cpp-python closes a last assistant turn)
        return plan_chat(self._chat_template(), self.vocab, messages, **kw)

    def _chat_tokens(self, text: str) -> list[int]:
        tokens = self.tokenize(text.encode("utf-8"), add_bos=True, special=True)
        bos = self.vocab.bos
        if len(tokens) >= 2 and tokens[0] == tokens[1] == bos:  # the template wrote BOS too
            tokens = tokens[1:]
        return tokens

    def apply_chat_template(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, **kwargs: Any
    ) -> list[int]:
        """The prompt tokens of a conversation rendered with the model's chat template."""
        return self._chat_tokens(
            self._chat_template().render(messages, add_generation_prompt=True, tools=tools, **kwargs)
        )

    def create_chat_completion(
        self,
        messages: list[dict[str, Any]],
        functions: list[dict[str, Any]] | None = None,
        function_call: Any = None,
        tools: list[dict[str, Any]] | None = None,
        tool_choice: Any = None,
        temperature: float = 0.2,
        top_p: float = 0.95,
        top_k: int = 40,
        min_p: float = 0.05,
        typical_p: float = 1.0,
        stream: bool = False,
        stop: str | list[str] | None = None,
        seed: int | None = None,
        response_format: Any = None,
        max_tokens: int | None = None,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        repeat_penalty: float = 1.0,
        tfs_z: float = 1.0,
        mirostat_mode: int = 0,
        mirostat_tau: float = 5.0,
        mirostat_eta: float = 0.1,
        model: str | None = None,
        logits_processor: LogitsProcessor | None = None,
        grammar: Any = None,
        logit_bias: dict[Any, float] | None = None,
        logprobs: bool | None = None,
        top_logprobs: int | None = None,
        parallel_tool_calls: bool | None = None,
        reasoning_format: str | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """A chat completion through the model's chat template (``chat.completion`` dict or chunks).

        ``tools``/``tool_choice``/``parallel_tool_calls`` give ``message.tool_calls`` (finish reason
        ``tool_calls``) in the template family's call syntax, constrained by a grammar;
        ``response_format`` (json_object, json_schema) or ``grammar`` constrain the text;
        ``reasoning_format`` (none, deepseek, auto) splits ``<think>`` into ``reasoning_content``."""
        grammar = self._grammar(grammar)
        images = None
        if _has_images(messages):  # OpenAI image_url content parts: need the mmproj
            messages, images = self._split_images(messages)
        if functions and not tools:
            tools = [{"type": "function", "function": f} for f in functions]
            if isinstance(function_call, dict) and function_call.get("name"):
                tool_choice = {"type": "function", "function": {"name": function_call["name"]}}
            elif function_call in ("none", "auto"):
                tool_choice = function_call
        plan = self._plan(messages, tools=tools, tool_choice=tool_choice, parallel_tool_calls=parallel_tool_calls,
                          response_format=response_format, grammar=grammar, reasoning_format=reasoning_format,
                          chat_template_kwargs=chat_template_kwargs)  # fmt: skip
        if images is not None:
            prompt_tokens = self._prefill_images(plan.prompt, images)
        else:
            prompt_tokens = self._chat_tokens(plan.prompt)
        sampling = dict(temp=temperature, top_k=top_k, top_p=top_p, min_p=min_p, typical_p=typical_p,
                        repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
                        presence_penalty=presence_penalty, mirostat_mode=mirostat_mode, mirostat_tau=mirostat_tau,
                        mirostat_eta=mirostat_eta, logit_bias=logit_bias, seed=seed)  # fmt: skip
        parser = plan.format.parser(plan.syntax)
        steps = self._completion_steps(prompt_tokens, max_tokens, stop, sampling, logits_processor, None,
                                       plan.grammar, parser, plan.preserved_tokens)  # fmt: skip
        head = dict(id=f"chatcmpl-{uuid.uuid4()}", created=int(time.time()), model=model or self.model_path)
        n_lp = (top_logprobs or 0) if logprobs else None
        if stream:
            return self._stream_chat(head, steps, n_lp)
        text, n_gen, finish, content, message = "", 0, "length", [], None
        for s in steps:
            if s.token is not None:
                n_gen += 1
                if n_lp is not None and s.logits is not None:
                    content.append(self._chat_logprob(s.token, s.logits, n_lp))
            text += s.text
            if s.finish_reason:
                finish = s.finish_reason
                message = s.message
        lp = dict(content=content) if n_lp is not None else None
        n_prompt = len(prompt_tokens)
        return dict(head, object="chat.completion",
                    choices=[dict(index=0, message=message_dict(message, text), logprobs=lp,
                                  finish_reason=finish)],
                    usage=dict(prompt_tokens=n_prompt, completion_tokens=n_gen, total_tokens=n_prompt + n_gen))  # fmt: skip

    def _split_images(self, messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[Any]]:
        from ..mtmd.prompt import split_content
        from .chat_request import ChatRequestError

        if getattr(self, "mtmd", None) is None:
            raise ChatRequestError(
                "the messages have images but this model was loaded without an mmproj (Llama(mmproj=...), "
                "--mmproj FILE)",
                "messages",
            )
        return split_content(messages)

    def _prefill_images(self, prompt: str, images: list[Any]) -> list[int]:
        """Evaluate the prompt's text and image chunks (the token view has pseudo tokens for images)."""
        from ..mtmd.prompt import prefill

        mt = self.mtmd
        chunks = mt.tokenize(prompt, [mt.bitmap_from_bytes(data, where) for where, data in images])
        return prefill(mt, self._need_ctx(), chunks)

    def _chat_logprob(self, token: int, logits: np.ndarray, n: int) -> dict[str, Any]:
        logp = log_softmax(logits)
        piece = self._piece_text(token)
        tops = [(self._piece_text(i), v) for i, v in top_logprobs(logp, n)]
        return dict(token=piece, logprob=float(logp[token]), bytes=list(piece.encode()),
                    top_logprobs=[dict(token=k, logprob=v, bytes=list(k.encode())) for k, v in tops])  # fmt: skip

    def _stream_chat(
        self, head: dict[str, Any], steps: Iterator[Step], n_lp: int | None
    ) -> Iterator[dict[str, Any]]:
        head = dict(head, object="chat.completion.chunk")

        def chunk(delta: dict[str, Any], lp: Any = None, finish: str | None = None) -> dict[str, Any]:
            return dict(head, choices=[dict(index=0, delta=delta, logprobs=lp, finish_reason=finish)])

        yield chunk(dict(role="assistant"))
        for s in steps:
            lp = None
            if n_lp is not None and s.token is not None and s.logits is not None:
                lp = dict(content=[self._chat_logprob(s.token, s.logits, n_lp)])
            deltas = delta_dicts(s.deltas)
            for i, d in enumerate(deltas):
                yield chunk(d, lp if i == 0 else None)
            if not deltas and lp is not None:
                yield chunk({}, lp)
            if s.finish_reason:
                yield chunk({}, None, s.finish_reason)
