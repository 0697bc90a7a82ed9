"""The one token loop: :class:`Generation` holds everything one sequence needs between logits in and text
out (sampler chain with its grammar, detokenizer, stop strings, end-of-generation set, limits,
log-probabilities, the chat format's tool-call/reasoning parser, the finish reason).

Whoever owns the model drives it: :func:`generate` over a :class:`TokenSequence` (the ``Llama`` API and
the CLI), and the server engine, which batches many slots into one decode and hands each slot's row of
logits to its own ``Generation``::

    gen = Generation(vocab, chain, GenerationParams(max_tokens=64, stop=["\\n\\n"]))
    while not gen.done:
        step = gen.step(logits)          # samples, accepts, detokenizes; the last step has finish_reason
        ...evaluate step.token unless step.finish_reason...
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import field
from typing import Any, Protocol

import numpy as np

from .._dataclass import dataclass
from ..sampling.logprobs import log_softmax, post_sampling_probs, top_logprobs
from ..vocab.vocab import eog_ids
from .sequence import TokenSequence
from .text import IncrementalDetokenizer, LineLimits, StopStrings


class TokenSampler(Protocol):
    def sample(self, logits: np.ndarray) -> int: ...
    def accept(self, token: int) -> None: ...


class ChatParserLike(Protocol):
    """``llamapy.chat.ChatParser``: streamed text in, deltas out; the whole message at the end."""

    def feed(self, text: str) -> list[Any]: ...
    def finish(self) -> tuple[list[Any], Any]: ...


@dataclass
class GenerationParams:
    """What the token loop generates and reports: length, stop strings, EOS, special tokens, probabilities."""

    max_tokens: int = -1  # n_predict: -1 = until end of generation (or a full context)
    stop: Sequence[str] = ()
    ignore_eos: bool = False
    special: bool = False  # render special tokens in the output text
    n_probs: int = 0  # most likely alternatives reported per generated token
    logprobs: bool = False  # report the log-probability of each generated token
    # with logprobs/n_probs: report probabilities after the sampler chain instead (llama-server's
    # post_sampling_probs; the sampler must keep its final candidates, as SamplerChain.cur)
    post_sampling_probs: bool = False
    preserved_tokens: Sequence[int] = ()  # special tokens rendered as text (a chat format's tags)
    n_indent: int = 0  # lines after the first must be indented this much (text.LineLimits)
    t_max_predict_ms: float = 0  # after a newline, stop at the next one past this time (text.LineLimits)


@dataclass
class TokenLogprob:
    """The log-probability of a generated token and of the ``n_probs`` most likely ones (raw logits).

    With ``post_sampling`` (``GenerationParams.post_sampling_probs``) ``logprob`` and ``top`` hold plain
    probabilities after the sampler chain instead: the token's, and up to ``n_probs`` of the chain's final
    candidates (:func:`llamapy.sampling.logprobs.post_sampling_probs`)."""

    token: int
    logprob: float
    top: list[tuple[int, float]]
    post_sampling: bool = False


@dataclass
class Step:
    """One step of the loop: the sampled token (None for the final flush), the text it released, and on
    the last step the finish reason (``"stop"``, ``"length"`` or ``"tool_calls"``) and why
    (``stop_type``: ``"eos"``, ``"word"``, ``"limit"``)."""

    token: int | None
    text: str
    finish_reason: str | None = None
    logits: np.ndarray | None = None  # the (raw) logits the token was sampled from
    stop_type: str = "none"
    stopping_word: str = ""
    logprob: TokenLogprob | None = None
    eog_token: int | None = None  # the end-of-generation token that ended it (not part of the output)
    deltas: list[Any] = field(default_factory=list)  # chat deltas (llamapy.chat.ChatDelta), with a parser
    message: Any = None  # on the last step, with a parser: the parsed message (llamapy.chat.ParsedMessage)


class Generation:
    """The generation state of one sequence (see the module docstring).

    ``sampler`` has ``sample(logits) -> token`` and ``accept(token)`` (a
    :class:`llamapy.sampling.SamplerChain`, with a grammar sampler in it when constrained); ``grammar``
    is that grammar sampler, whose completion ends the generation (``finish_reason "stop"``).
    ``logits_processor(tokens, logits) -> logits`` and ``stopping_criteria(tokens, logits) -> bool`` are
    llama-cpp-python's hooks over the sequence's ``tokens`` (a callable giving them). ``parser`` turns
    the text into chat deltas and a message.
    """

    def __init__(
        self,
        vocab: Any,
        sampler: TokenSampler,
        params: GenerationParams | None = None,
        *,
        grammar: Any = None,
        parser: ChatParserLike | None = None,
        tokens: Callable[[], Sequence[int]] | None = None,
        logits_processor: Callable[[Sequence[int], np.ndarray], np.ndarray] | None = None,
        stopping_criteria: Callable[[Sequence[int], np.ndarray], bool] | None = None,
    ) -> None:
        self.vocab = vocab
        self.sampler = sampler
        self.params = p = params or GenerationParams()
        self.grammar = grammar
        self.parser = parser
        self._tokens = tokens or (lambda: ())
        self.logits_processor = logits_processor
        self.stopping_criteria = stopping_criteria
        self.stops = StopStrings(p.stop)
        # (None: both limits off, nothing to do per token)
        self.lines = (
            LineLimits(p.n_indent, p.t_max_predict_ms) if p.n_indent > 0 or p.t_max_predict_ms > 0 else None
        )
        self.detok = IncrementalDetokenizer(vocab, special=p.special, preserved=p.preserved_tokens)
        self._eog = eog_ids(vocab) if p.ignore_eos else None
        if p.post_sampling_probs and not hasattr(sampler, "cur"):
            raise ValueError(
                "post_sampling_probs needs a sampler that keeps its final candidates (a SamplerChain)"
            )
        self.n_generated = 0
        self.done = False

    def accept_prompt(self, tokens: Iterable[int]) -> None:
        """Let the sampler see the prompt (penalties and DRY count it, as in llama.cpp; a grammar does not)."""
        accept_prompt = getattr(self.sampler, "accept_prompt", None)
        if accept_prompt is not None:
            accept_prompt(tokens)
            return
        for t in tokens:
            self.sampler.accept(int(t))

    @property
    def limit_reached(self) -> bool:
        return 0 <= self.params.max_tokens <= self.n_generated

    def step(self, logits: np.ndarray) -> Step:
        """Sample the next token from ``logits`` and return what it gives: the final step when the token
        ends the generation (end of generation, a stop string, a finished grammar). After a token that
        reaches ``max_tokens`` (:attr:`limit_reached`) the driver calls ``finish("length", "limit")``
        (a ``step`` at the limit does the same without sampling)."""
        if self.done:
            raise RuntimeError("the generation has already finished")
        if self.limit_reached:
            return self.finish("length", "limit")
        p = self.params
        raw = logits
        z = logits
        if self._eog is not None and self._eog.size:
            z = np.array(logits, dtype=np.float32, copy=True)
            z[self._eog] = -np.inf
        if self.logits_processor is not None:
            z = self.logits_processor(self._tokens(), np.array(z, dtype=np.float32, copy=True))
        if self.lines is not None:
            self.lines.start()
        token = int(self.sampler.sample(z))
        if self.stopping_criteria is not None and self.stopping_criteria(self._tokens(), z):
            return self.finish("stop", "word")
        self.sampler.accept(token)
        self.n_generated += 1
        lp = None
        if p.logprobs or p.n_probs > 0:
            if p.post_sampling_probs:
                prob, top = post_sampling_probs(self.sampler.cur, token, p.n_probs)  # type: ignore[attr-defined]
                lp = TokenLogprob(token, prob, top, post_sampling=True)
            else:
                logp = log_softmax(raw)
                lp = TokenLogprob(token, float(logp[token]), top_logprobs(logp, p.n_probs))
        if self._eog is None and self.vocab.is_eog(token):
            return self.finish("stop", "eos", logits=raw, logprob=lp, eog_token=token)
        text = self.stops.feed(self.detok.add(token))
        if self.stops.stopped:
            return self.finish("stop", "word", text, token, raw, lp)
        if self.lines is not None:
            text, cut = self.lines.feed(text)
            if cut:
                return self.finish("length", "limit", text, token, raw, lp, held=False)
        if self.grammar is not None and self.grammar.is_finished():
            return self.finish("stop", "eos", text, token, raw, lp)
        return Step(token, text, None, raw, logprob=lp, deltas=self._parse(text))

    def finish(
        self,
        reason: str,
        stop_type: str,
        text: str = "",
        token: int | None = None,
        logits: np.ndarray | None = None,
        logprob: TokenLogprob | None = None,
        eog_token: int | None = None,
        held: bool = True,
    ) -> Step:
        """End the generation (also from outside: a full context, a cancelled request); releases the
        text held back by the detokenizer and the stop strings (unless ``held`` is False: a line limit cut
        the text before it), and closes the chat parser."""
        if self.done:
            raise RuntimeError("the generation has already finished")
        self.done = True
        if held and not self.stops.stopped:
            rest = self.stops.feed(self.detok.flush())
            if self.stops.stopped:
                reason, stop_type = "stop", "word"
            else:
                rest += self.stops.flush()
            if self.lines is not None:
                rest, cut = self.lines.feed(rest)
                if cut:
                    reason, stop_type = "length", "limit"
            text += rest
        deltas = self._parse(text)
        message = None
        if self.parser is not None:
            last, message = self.parser.finish()
            deltas += last
            if getattr(message, "tool_calls", None) and reason == "stop":
                reason = "tool_calls"
        word = (self.stops.matched or "") if stop_type == "word" else ""
        return Step(token, text, reason, logits, stop_type, word, logprob, eog_token, deltas, message)

    def _parse(self, text: str) -> list[Any]:
        if self.parser is None or not text:
            return []
        return self.parser.feed(text)


class _Callables:
    def __init__(self, sample: Callable[[np.ndarray], int], accept: Callable[[int], None] | None) -> None:
        self.sample = sample
        self.accept = accept or (lambda t: None)


def generate(
    seq: TokenSequence,
    sample: Callable[[np.ndarray], int] | TokenSampler,
    vocab: Any,
    prompt: Sequence[int],
    params: GenerationParams | None = None,
    accept: Callable[[int], None] | None = None,
    stopping_criteria: Callable[[list[int], np.ndarray], bool] | None = None,
    draft_model: Any = None,
    **generation: Any,
) -> Iterator[Step]:
    """Evaluate ``prompt`` and generate until end of generation, a stop string, a finished grammar or
    ``max_tokens``.

    ``sample`` is a sampler (``sample``/``accept``, e.g. a sampler chain) or a callable
    ``sample(logits) -> token`` with ``accept(token)`` told every generated token.
    ``stopping_criteria(tokens, logits)`` (tokens in the cache, the logits just sampled from) may end
    generation before a sampled token is used; other keywords go to :class:`Generation`. Yields a
    :class:`Step` per token; the last step carries the finish reason. A full context raises
    :class:`ContextFullError` unless the sequence shifts its context.

    ``draft_model`` (``draft(input_ids) -> tokens``, e.g. :class:`~.speculative.LlamaPromptLookupDecoding`)
    turns on speculative decoding: the sampled token and the draft's guesses are evaluated in one batch,
    each row's logits go through :meth:`Generation.step` in turn (detokenizer, stop strings, grammar,
    limits, hooks see only the accepted tokens), guesses are kept while the sampler picks them and the
    cache is cut back after the first one it does not (:mod:`.speculative`).
    """
    sampler = sample if hasattr(sample, "accept") and accept is None else _Callables(sample, accept)  # type: ignore[arg-type]
    n_seen: list[int | None] = [None]  # tokens the hooks see: all of seq.tokens, or the accepted ones

    def tokens() -> list[int]:
        n = n_seen[0]
        return seq.tokens if n is None else seq.tokens[:n]

    gen = Generation(vocab, sampler, params, tokens=tokens, stopping_criteria=stopping_criteria, **generation)
    bind = getattr(draft_model, "bind", None)  # a draft reading the target's hidden states (MTP)
    if bind is not None:
        bind(seq)
        try:
            yield from _generate(seq, gen, prompt, vocab, draft_model, n_seen)
        finally:
            seq.set_hidden_tap(None)
        return
    yield from _generate(seq, gen, prompt, vocab, draft_model, n_seen)


def _generate(
    seq: TokenSequence, gen: Generation, prompt: Sequence[int], vocab: Any, draft_model: Any, n_seen: list
) -> Iterator[Step]:
    seq.prefill(prompt)
    n_vocab = _n_vocab(vocab)
    step = gen.step(seq.logits())
    yield step
    while True:
        if step.finish_reason is not None:
            return
        if gen.limit_reached:
            yield gen.finish("length", "limit")
            return
        assert step.token is not None
        draft: list[int] = []
        if draft_model is not None:
            from .speculative import draft_tokens

            n_max = seq.n_ctx - len(seq) - 1  # the batch must fit without a context shift in between
            if gen.params.max_tokens >= 0:
                n_max = min(n_max, gen.params.max_tokens - gen.n_generated)
            draft = draft_tokens(draft_model, [*seq.tokens, step.token], n_vocab, n_max)
        if not draft:
            seq.eval([step.token])
            step = gen.step(seq.logits())  # (eval gives every row with the sequence's logits_all)
            yield step
            continue
        n0 = len(seq)
        if getattr(seq.ctx.memory, "has_checkpoints", False):  # a recurrent state: keep it to come back to
            seq.ctx.memory.checkpoint(seq.seq_id)
        rows = seq.eval([step.token, *draft], logits_all=True)
        try:
            for i, guess in enumerate(draft):
                n_seen[0] = n0 + 1 + i  # the tokens rows[i] was computed after
                step = gen.step(rows[i])
                yield step
                if step.finish_reason is not None or gen.limit_reached or step.token != guess:
                    seq.truncate(n0 + 1 + i)  # drop the guesses from this one on
                    break
                _count_accepted(draft_model)
            else:
                n_seen[0] = None
                step = gen.step(rows[len(draft)])  # every guess kept: the row after the last one
                yield step
        finally:
            n_seen[0] = None


def _count_accepted(draft_model: Any) -> None:
    """Acceptance statistics on the draft object (``n_accepted``), where it takes attributes."""
    try:
        draft_model.n_accepted = getattr(draft_model, "n_accepted", 0) + 1
    except AttributeError:
        pass


def _n_vocab(vocab: Any) -> int:
    n = getattr(vocab, "n_tokens", None)
    n = n() if callable(n) else n
    if n is None:
        try:
            n = len(vocab)
        except TypeError:
            n = 1 << 31
    return int(n)
