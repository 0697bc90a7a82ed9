"""Text completions of :class:`llamapy.api.Llama` (``create_completion``, ``__call__``): OpenAI
``text_completion`` dicts and stream chunks, logprobs, echo, fill-in-the-middle prompts."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ..generation import ContextFullError, GenerationParams, Step, generate, truncate_prompt
from ..sampling.logprobs import log_softmax, top_logprobs
from .common import LogitsProcessor, StoppingCriteria, UnsupportedError
from .infill import FimError, FimTokens, assemble


class CompletionMixin:
    """Completion methods; the state they use (``vocab``, ``_seq``, sampling) is set up by ``Llama``."""

    def _prompt_tokens(self, prompt: str | Sequence[int], suffix: str | None) -> list[int]:
        v = self.vocab
        if isinstance(prompt, str):
            pre = (
                self.tokenize(prompt.encode("utf-8"), add_bos=suffix is None, special=True) if prompt else []
            )
        else:
            pre = [int(t) for t in prompt]
        if suffix is None:
            return pre if pre else [v.bos] if v.bos >= 0 else pre
        try:
            fim = FimTokens.of(v, str(self.model_path))
        except FimError as e:
            raise UnsupportedError(f"{e}: suffix= needs them") from None
        suf = self.tokenize(suffix.encode("utf-8"), add_bos=False, special=False)
        return assemble(fim, pre, suf, spm_infill=self.spm_infill)

    def _top_logprobs(self, logprobs: np.ndarray, token: int, n: int) -> dict[str, float]:
        out = {self._piece_text(i): v for i, v in top_logprobs(logprobs, n)}
        out[self._piece_text(token)] = float(logprobs[token])
        return out

    def _completion_steps(
        self,
        prompt_tokens: list[int],
        max_tokens: int | None,
        stop: str | list[str] | None,
        sampling: dict[str, Any],
        logits_processor: LogitsProcessor | None,
        stopping_criteria: StoppingCriteria | None,
        grammar: Any = None,
        parser: Any = None,
        preserved_tokens: Sequence[int] = (),
    ) -> Iterator[Step]:
        """The steps of one completion through the token loop (``grammar``: a ``LlamaGrammar``;
        ``parser``: a chat format's parser)."""
        seq = self._need_ctx()
        n_ctx = self.n_ctx()
        if len(prompt_tokens) >= n_ctx and seq.context_shift and n_ctx >= 4:
            # as llama-server with --context-shift: keep n_keep tokens and the end of the prompt
            prompt_tokens = truncate_prompt(prompt_tokens, n_ctx, seq.n_keep)
        if len(prompt_tokens) >= n_ctx:
            raise ValueError(f"Requested tokens ({len(prompt_tokens)}) exceed context window of {n_ctx}")
        if max_tokens is None or max_tokens <= 0:
            max_tokens = n_ctx - len(prompt_tokens)
        if not seq.context_shift:
            max_tokens = min(max_tokens, n_ctx - len(prompt_tokens))
        gs = grammar.sampler(self.vocab) if grammar is not None else None
        chain = self._chain(**sampling)
        chain.accept_prompt(prompt_tokens)
        chain.set_grammar(gs)
        lp = crit = None
        if logits_processor is not None:
            lp = lambda toks, z: logits_processor(np.array(toks, dtype=np.intc), z)  # noqa: E731
        if stopping_criteria is not None:
            crit = lambda toks, z: stopping_criteria(np.array(toks, dtype=np.intc), z)  # noqa: E731
        params = GenerationParams(
            max_tokens=max_tokens,
            stop=[stop] if isinstance(stop, str) else list(stop or []),
            preserved_tokens=preserved_tokens,
        )
        gen = generate(
            seq, chain, self.vocab, prompt_tokens, params, stopping_criteria=crit, logits_processor=lp,
            grammar=gs, parser=parser, draft_model=getattr(self, "draft_model", None),
        )  # fmt: skip
        try:
            yield from gen
        except ContextFullError:  # generation filled the context (no shift): end as llama-cpp-python does
            yield Step(None, "", "length")

    def create_completion(
        self,
        prompt: str | list[int],
        suffix: str | None = None,
        max_tokens: int | None = 16,
        temperature: float = 0.8,
        top_p: float = 0.95,
        min_p: float = 0.05,
        typical_p: float = 1.0,
        logprobs: int | None = None,
        echo: bool = False,
        stop: str | list[str] | None = None,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        repeat_penalty: float = 1.0,
        top_k: int = 40,
        stream: bool = False,
        seed: int | None = None,
        tfs_z: float = 1.0,
        mirostat_mode: int = 0,
        mirostat_tau: float = 5.0,
        mirostat_eta: float = 0.1,
        model: str | None = None,
        stopping_criteria: StoppingCriteria | None = None,
        logits_processor: LogitsProcessor | None = None,
        grammar: Any = None,
        logit_bias: dict[Any, float] | None = None,
    ) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """A text completion (an OpenAI ``text_completion`` dict, or its chunks with ``stream=True``);
        ``grammar`` (a :class:`llamapy.grammar.LlamaGrammar`) constrains the text."""
        grammar = self._grammar(grammar)
        prompt_tokens = self._prompt_tokens(prompt, suffix)
        if echo and logprobs is not None and not self._logits_all:
            raise ValueError(
                "logprobs with echo=True needs the prompt's logits: create the Llama with logits_all=True"
            )
        sampling = dict(temp=temperature, top_k=top_k, top_p=top_p, min_p=min_p, typical_p=typical_p,
                        repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
                        presence_penalty=presence_penalty, mirostat_mode=mirostat_mode, mirostat_tau=mirostat_tau,
                        mirostat_eta=mirostat_eta, logit_bias=logit_bias, seed=seed)  # fmt: skip
        steps = self._completion_steps(
            prompt_tokens, max_tokens, stop, sampling, logits_processor, stopping_criteria, grammar
        )
        head = dict(id=f"cmpl-{uuid.uuid4()}", object="text_completion", created=int(time.time()),
                    model=model or self.model_path)  # fmt: skip
        prompt_text = ""
        if echo:
            prompt_text = self.detokenize(prompt_tokens, special=False).decode("utf-8", errors="replace")
        if stream:
            return self._stream_completion(head, steps, prompt_tokens, prompt_text, logprobs)
        text, tokens, lp, finish = prompt_text, [], None, "length"
        if logprobs is not None:
            lp = dict(tokens=[], text_offset=[], token_logprobs=[], top_logprobs=[])
            if echo:
                self._echo_logprobs(lp, prompt_tokens, logprobs)
        for s in steps:
            if s.token is not None:
                tokens.append(s.token)
                if lp is not None and s.logits is not None:
                    self._add_logprob(lp, s.token, s.logits, len(text), logprobs)
            text += s.text
            if s.finish_reason:
                finish = s.finish_reason
        n_prompt = len(prompt_tokens)
        return dict(head, choices=[dict(text=text, index=0, logprobs=lp, finish_reason=finish)],
                    usage=dict(prompt_tokens=n_prompt, completion_tokens=len(tokens),
                               total_tokens=n_prompt + len(tokens)))  # fmt: skip

    def _add_logprob(
        self, lp: dict[str, list[Any]], token: int, logits: np.ndarray, offset: int, n: int
    ) -> None:
        logp = log_softmax(logits)
        lp["tokens"].append(self._piece_text(token))
        lp["text_offset"].append(offset)
        lp["token_logprobs"].append(float(logp[token]))
        lp["top_logprobs"].append(self._top_logprobs(logp, token, n))

    def _echo_logprobs(self, lp: dict[str, list[Any]], prompt_tokens: list[int], n: int) -> None:
        seq = self._need_ctx()
        seq.truncate(0)
        seq.prefill(prompt_tokens)
        offset = 0
        for i, t in enumerate(prompt_tokens):
            piece = self._piece_text(t)
            lp["tokens"].append(piece)
            lp["text_offset"].append(offset)
            if i == 0:
                lp["token_logprobs"].append(None)
                lp["top_logprobs"].append(None)
            else:
                logp = log_softmax(self.scores[i - 1])
                lp["token_logprobs"].append(float(logp[t]))
                lp["top_logprobs"].append(self._top_logprobs(logp, t, n))
            offset += len(piece)

    def _stream_completion(
        self,
        head: dict[str, Any],
        steps: Iterator[Step],
        prompt_tokens: list[int],
        prompt_text: str,
        n_lp: int | None,
    ) -> Iterator[dict[str, Any]]:
        offset = 0
        if prompt_text:
            offset = len(prompt_text)
            yield dict(head, choices=[dict(text=prompt_text, index=0, logprobs=None, finish_reason=None)])
        for s in steps:
            lp = None
            if n_lp is not None and s.token is not None and s.logits is not None:
                lp = dict(tokens=[], text_offset=[], token_logprobs=[], top_logprobs=[])
                self._add_logprob(lp, s.token, s.logits, offset, n_lp)
            if s.text or lp is not None:
                yield dict(head, choices=[dict(text=s.text, index=0, logprobs=lp, finish_reason=None)])
                offset += len(s.text)
            if s.finish_reason:
                yield dict(
                    head, choices=[dict(text="", index=0, logprobs=None, finish_reason=s.finish_reason)]
                )

    def __call__(self, prompt: str | list[int], *args: Any, **kwargs: Any) -> Any:
        return self.create_completion(prompt, *args, **kwargs)
