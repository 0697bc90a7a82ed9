"""``Llama``: the high-level object of llama-cpp-python, over llamapy's Model/Context/sampling.

Code written for ``llama_cpp.Llama`` runs with only the import changed::

    from llamapy import Llama
    llm = Llama(model_path="model.gguf", n_ctx=2048)
    out = llm("Q: Name the planets in the solar system? A: ", max_tokens=32, stop=["Q:", "\\n"])
    print(out["choices"][0]["text"])

Completions and chat completions return the same OpenAI-shaped dicts and stream chunks.
Lower level, llama.h style: ``llm.model`` (:class:`llamapy.model.Model`), ``llm.ctx``
(:class:`llamapy.context.Context`), :class:`llamapy.batch.Batch` and :mod:`llamapy.sampling`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import LlamapyError
from .generation import (
    ContextFullError,
    GenerationParams,
    IncrementalDetokenizer,
    Step,
    TokenSequence,
    common_prefix_length,
    generate,
)

LLAMA_DEFAULT_SEED = 0xFFFFFFFF
StoppingCriteria = Callable[[np.ndarray, np.ndarray], bool]
LogitsProcessor = Callable[[np.ndarray, np.ndarray], np.ndarray]


class UnsupportedError(LlamapyError):
    """A llama-cpp-python feature llamapy does not offer (LoRA adapters, draft models, grammars...)."""


@dataclass
class LlamaState:
    """A saved session (``Llama.save_state``): the tokens, their logits and the KV cache bytes."""

    input_ids: np.ndarray
    scores: np.ndarray
    n_tokens: int
    llama_state: bytes
    llama_state_size: int
    seed: int


# llama-cpp-python chat_format names -> llamapy's built-in templates
_CHAT_FORMAT_ALIASES = {
    "llama-3": "llama3",
    "mistral-instruct": "mistral",
    "phi-3": "phi3",
    "gemma2": "gemma",
}


def _cache_type(t: Any) -> str | None:
    if t is None or isinstance(t, str):
        return t
    from .ggml.types import GGMLType

    return GGMLType(int(t)).name.lower()


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    x = np.asarray(logits, dtype=np.float64)
    m = np.max(x, axis=-1, keepdims=True)
    return (x - m - np.log(np.sum(np.exp(x - m), axis=-1, keepdims=True))).astype(np.float32)


class Llama:
    """A model and a context, with llama-cpp-python's constructor arguments and methods."""

    def __init__(
        self,
        model_path: str,
        *,
        n_gpu_layers: int = 0,
        split_mode: int = 0,
        main_gpu: int = 0,
        tensor_split: list[float] | None = None,
        vocab_only: bool = False,
        use_mmap: bool = True,
        use_mlock: bool = False,
        kv_overrides: dict[str, Any] | None = None,
        seed: int = LLAMA_DEFAULT_SEED,
        n_ctx: int = 512,
        n_batch: int = 512,
        n_ubatch: int = 512,
        n_threads: int | None = None,
        n_threads_batch: int | None = None,
        pooling_type: int | str | None = None,
        logits_all: bool = False,
        embedding: bool = False,
        offload_kqv: bool = True,
        flash_attn: bool | None = None,
        no_perf: bool = False,
        last_n_tokens_size: int = 64,
        lora_base: str | None = None,
        lora_scale: float = 1.0,
        lora_path: str | None = None,
        numa: bool | int = False,
        chat_format: str | None = None,
        chat_handler: Any = None,
        draft_model: Any = None,
        tokenizer: Any = None,
        type_k: int | str | None = None,
        type_v: int | str | None = None,
        spm_infill: bool = False,
        verbose: bool = True,
        context_shift: bool = False,
        n_keep: int = 0,
        **kwargs: Any,
    ) -> None:
        for name, value in (("lora_path", lora_path), ("lora_base", lora_base), ("draft_model", draft_model),
                            ("chat_handler", chat_handler), ("tokenizer", tokenizer), ("kv_overrides", kv_overrides)):  # fmt: skip
            if value:
                raise UnsupportedError(f"Llama({name}=...) is not supported by llamapy")
        from .model import Model

        self.model_path = str(model_path)
        self.verbose = verbose
        model = Model.load(self.model_path, use_mmap=use_mmap, use_mlock=use_mlock, vocab_only=vocab_only)
        ctx = None
        if not vocab_only:
            from .context import Context, ContextParams

            n_ctx = int(n_ctx) if n_ctx else 0
            cp: dict[str, Any] = dict(n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch, n_threads=n_threads)
            cp.update(embeddings=embedding, pooling_type=pooling_type)
            if n_ctx:
                cp["n_batch"] = min(n_ctx, n_batch)
                cp["n_ubatch"] = min(cp["n_batch"], n_ubatch)
            for key, val in (("type_k", _cache_type(type_k)), ("type_v", _cache_type(type_v)),
                             ("flash_attn", flash_attn)):  # fmt: skip
                if val is not None:
                    cp[key] = val
            ctx = Context(model, ContextParams(**cp))
        self._setup(model, ctx, seed=seed, logits_all=logits_all, embedding=embedding, chat_format=chat_format,
                    spm_infill=spm_infill, context_shift=context_shift, n_keep=n_keep,
                    last_n_tokens_size=last_n_tokens_size)  # fmt: skip
        if verbose:
            import sys

            print(f"llamapy: {model.desc} from {self.model_path}, n_ctx = {self.n_ctx()}", file=sys.stderr)

    @classmethod
    def _from_parts(
        cls, model: Any, ctx: Any, batch_factory: Callable[..., Any] | None = None, **kw: Any
    ) -> Llama:
        """A Llama over an existing model and context (tests, embedding in other tools)."""
        self = cls.__new__(cls)
        self.model_path = str(getattr(model, "path", ""))
        self.verbose = False
        self._setup(model, ctx, batch_factory=batch_factory, **kw)
        return self

    def _setup(
        self,
        model: Any,
        ctx: Any,
        seed: int = LLAMA_DEFAULT_SEED,
        logits_all: bool = False,
        embedding: bool = False,
        chat_format: str | None = None,
        spm_infill: bool = False,
        context_shift: bool = False,
        n_keep: int = 0,
        last_n_tokens_size: int = 64,
        batch_factory: Callable[..., Any] | None = None,
    ) -> None:
        self.model = self._model = model
        self.ctx = self._ctx = ctx
        self.vocab = model.vocab
        self._seed = seed
        self._logits_all = logits_all
        self._embedding = embedding
        self.chat_format = chat_format
        self.chat_template: str | None = None  # Jinja source overriding the model's and chat_format
        self.spm_infill = spm_infill
        self.last_n_tokens_size = last_n_tokens_size
        self.metadata = {k: str(v) for k, v in getattr(model, "metadata", {}).items() if not isinstance(v, list | np.ndarray)}  # fmt: skip
        self._scores: np.ndarray | None = None
        self._seq: TokenSequence | None = None
        if ctx is not None:
            self._seq = TokenSequence(
                ctx, context_shift=context_shift, n_keep=n_keep, batch_factory=batch_factory
            )
            self._seq.logits_all = logits_all
            self._seq.on_logits = self._store_logits

    # ------------------------------------------------------------------------------------- basics
    def _need_ctx(self) -> TokenSequence:
        if self._seq is None:
            raise LlamapyError(
                f"{self.model_path}: loaded with vocab_only=True, there is no context to evaluate in"
            )
        return self._seq

    def n_ctx(self) -> int:
        return int(self.ctx.n_ctx) if self.ctx is not None else int(self.model.n_ctx_train)

    def n_embd(self) -> int:
        return int(self.model.n_embd)

    def n_vocab(self) -> int:
        return int(self.model.n_vocab)

    def token_bos(self) -> int:
        return int(self.vocab.bos)

    def token_eos(self) -> int:
        return int(self.vocab.eos)

    def token_nl(self) -> int:
        return int(self.vocab.nl)

    def tokenizer(self) -> Llama:
        return self

    @property
    def n_tokens(self) -> int:
        return len(self._seq) if self._seq is not None else 0

    @property
    def input_ids(self) -> np.ndarray:
        return np.array(self._seq.tokens if self._seq is not None else [], dtype=np.intc)

    @property
    def eval_tokens(self) -> list[int]:
        return list(self._seq.tokens) if self._seq is not None else []

    @property
    def scores(self) -> np.ndarray:
        """``[n_ctx, n_vocab]`` logits by position (rows of evaluated positions are filled: every one
        with ``logits_all=True``, else the last)."""
        if self._scores is None:
            self._scores = np.zeros((self.n_ctx(), self.n_vocab()), dtype=np.single)  # lazily paged in
        return self._scores

    @property
    def _scores_view(self) -> np.ndarray:
        return self.scores[: self.n_tokens]

    @property
    def eval_logits(self) -> list[list[float]]:
        return self._scores_view.tolist() if self._logits_all else self._scores_view[-1:].tolist()

    def _store_logits(self, pos: int, rows: np.ndarray) -> None:
        if pos + len(rows) <= self.n_ctx():
            self.scores[pos : pos + len(rows)] = rows

    def set_seed(self, seed: int) -> None:
        self._seed = seed

    def reset(self) -> None:
        """Forget the evaluated tokens (the next evaluation starts from an empty context)."""
        if self._seq is not None:
            self._seq.clear()

    def close(self) -> None:
        self._seq = None
        self.ctx = self._ctx = None

    def __enter__(self) -> Llama:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------------------------- tokens
    def tokenize(self, text: bytes | str, add_bos: bool = True, special: bool = False) -> list[int]:
        return list(self.vocab.tokenize(text, add_special=add_bos, parse_special=special))

    def detokenize(
        self, tokens: Sequence[int], prev_tokens: Sequence[int] | None = None, special: bool = False
    ) -> bytes:
        out = b"".join(self.vocab.token_to_piece(int(t), special) for t in tokens)
        first = prev_tokens[0] if prev_tokens else (tokens[0] if len(tokens) else None)
        if not prev_tokens and first is not None and first == self.vocab.bos and out[:1] == b" ":
            out = out[1:]  # llama-cpp-python drops the space SPM models put after BOS
        return out

    def _piece_text(self, token: int) -> str:
        return self.vocab.token_to_piece(int(token), False).decode("utf-8", errors="ignore")

    # ------------------------------------------------------------------------------------- evaluation
    def eval(self, tokens: Sequence[int]) -> None:
        """Evaluate ``tokens`` after the ones already evaluated (``n_tokens``)."""
        self._need_ctx().eval(list(tokens))

    def _sampling_params(self, seed: int | None = None, **kw: Any) -> Any:
        from .sampling import SamplingParams

        s = self._seed if seed is None else seed
        s = LLAMA_DEFAULT_SEED if s is None or s < 0 else s
        return SamplingParams(seed=s, **kw)

    def _chain(
        self,
        temp: float = 0.8,
        top_k: int = 40,
        top_p: float = 0.95,
        min_p: float = 0.05,
        typical_p: float = 1.0,
        repeat_penalty: float = 1.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        mirostat_mode: int = 0,
        mirostat_tau: float = 5.0,
        mirostat_eta: float = 0.1,
        logit_bias: dict[Any, float] | None = None,
        seed: int | None = None,
        **ignored: Any,
    ) -> Any:
        from .sampling import build_chain

        params = self._sampling_params(
            seed=seed, temp=temp, top_k=top_k, top_p=top_p, min_p=min_p, typ_p=typical_p,
            penalty_repeat=repeat_penalty, penalty_freq=frequency_penalty, penalty_present=presence_penalty,
            penalty_last_n=self.last_n_tokens_size, mirostat=mirostat_mode, mirostat_tau=mirostat_tau,
            mirostat_eta=mirostat_eta, logit_bias={int(k): float(v) for k, v in (logit_bias or {}).items()},
            samplers=["penalties", "top_k", "typ_p", "top_p", "min_p", "temperature"],
        )  # fmt: skip
        return build_chain(params, n_vocab=self.n_vocab(), vocab=self.vocab, n_ctx=self.n_ctx())

    def sample(
        self,
        top_k: int = 40,
        top_p: float = 0.95,
        min_p: float = 0.05,
        typical_p: float = 1.0,
        temp: float = 0.80,
        repeat_penalty: float = 1.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        tfs_z: float = 1.0,
        mirostat_mode: int = 0,
        mirostat_eta: float = 0.1,
        mirostat_tau: float = 5.0,
        penalize_nl: bool = True,
        logits_processor: LogitsProcessor | None = None,
        grammar: Any = None,
        idx: int | None = None,
    ) -> int:
        """Sample a token from the logits of the last evaluated token (or of position ``idx``)."""
        self._no_grammar(grammar)
        seq = self._need_ctx()
        chain = self._chain(temp, top_k, top_p, min_p, typical_p, repeat_penalty, frequency_penalty,
                            presence_penalty, mirostat_mode, mirostat_tau, mirostat_eta)  # fmt: skip
        for t in seq.tokens[-self.last_n_tokens_size :] if self.last_n_tokens_size > 0 else []:
            chain.accept(t)
        logits = seq.logits() if idx is None else self.scores[idx]
        if logits_processor is not None:
            logits = logits_processor(self.input_ids, logits.copy())
        return int(chain.sample(logits))

    @staticmethod
    def _no_grammar(grammar: Any) -> None:
        if grammar is not None:
            raise UnsupportedError("grammar-constrained sampling is not supported by llamapy's Llama yet")

    def generate(
        self,
        tokens: Sequence[int],
        top_k: int = 40,
        top_p: float = 0.95,
        min_p: float = 0.05,
        typical_p: float = 1.0,
        temp: float = 0.80,
        repeat_penalty: float = 1.0,
        reset: bool = True,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        tfs_z: float = 1.0,
        mirostat_mode: int = 0,
        mirostat_tau: float = 5.0,
        mirostat_eta: float = 0.1,
        penalize_nl: bool = True,
        logits_processor: LogitsProcessor | None = None,
        stopping_criteria: StoppingCriteria | None = None,
        grammar: Any = None,
        seed: int | None = None,
    ) -> Iterator[int]:
        """Yield sampled tokens forever (the caller stops); the prompt's cached prefix is reused."""
        self._no_grammar(grammar)
        seq = self._need_ctx()
        chain = self._chain(temp, top_k, top_p, min_p, typical_p, repeat_penalty, frequency_penalty,
                            presence_penalty, mirostat_mode, mirostat_tau, mirostat_eta, seed=seed)  # fmt: skip
        tokens = list(tokens)
        if not reset:
            tokens = seq.tokens + tokens
        for t in tokens:
            chain.accept(t)
        seq.prefill(tokens)
        while True:
            logits = seq.logits()
            if logits_processor is not None:
                logits = logits_processor(self.input_ids, logits.copy())
            token = int(chain.sample(logits))
            chain.accept(token)
            if stopping_criteria is not None and stopping_criteria(self.input_ids, logits):
                return
            extra = yield token
            seq.eval([token] + list(extra or []))

    # ------------------------------------------------------------------------------------- completion
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
        if min(v.fim_pre, v.fim_suf, v.fim_mid) < 0:
            raise UnsupportedError(
                f"{self.model_path}: the model has no fill-in-the-middle tokens for suffix="
            )
        suf = self.tokenize(suffix.encode("utf-8"), add_bos=False, special=False)
        bos = [v.bos] if v.add_bos and v.bos >= 0 else []
        if self.spm_infill:
            return bos + [v.fim_suf] + suf + [v.fim_pre] + pre + [v.fim_mid]
        return bos + [v.fim_pre] + pre + [v.fim_suf] + suf + [v.fim_mid]

    def _top_logprobs(self, logprobs: np.ndarray, token: int, n: int) -> dict[str, float]:
        top = np.argpartition(-logprobs, min(n, len(logprobs) - 1))[:n] if n > 0 else np.zeros(0, int)
        top = top[np.argsort(-logprobs[top])]
        out = {self._piece_text(int(i)): float(logprobs[i]) for i in top}
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
    ) -> Iterator[Step]:
        seq = self._need_ctx()
        n_ctx = self.n_ctx()
        if len(prompt_tokens) >= n_ctx:
            raise ValueError(f"Requested tokens ({len(prompt_tokens)}) exceed context window of {n_ctx}")
        if max_tokens is None or max_tokens <= 0:
            max_tokens = n_ctx - len(prompt_tokens)
        if not seq.context_shift:
            max_tokens = min(max_tokens, n_ctx - len(prompt_tokens))
        chain = self._chain(**sampling)
        for t in prompt_tokens:
            chain.accept(t)

        def sample(logits: np.ndarray) -> int:
            if logits_processor is not None:
                logits = logits_processor(np.array(seq.tokens, dtype=np.intc), logits.copy())
            return int(chain.sample(logits))

        crit = None
        if stopping_criteria is not None:
            crit = lambda toks, logits: stopping_criteria(np.array(toks, dtype=np.intc), logits)  # noqa: E731
        params = GenerationParams(
            max_tokens=max_tokens, stop=[stop] if isinstance(stop, str) else list(stop or [])
        )
        gen = generate(
            seq, sample, self.vocab, prompt_tokens, params, accept=chain.accept, stopping_criteria=crit
        )
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
        """A text completion (an OpenAI ``text_completion`` dict, or its chunks with ``stream=True``)."""
        self._no_grammar(grammar)
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
            prompt_tokens, max_tokens, stop, sampling, logits_processor, stopping_criteria
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
        logp = _log_softmax(logits)
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
                logp = _log_softmax(self.scores[i - 1])
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

    # ------------------------------------------------------------------------------------- chat
    def _chat_template(self) -> Any:
        """The template in effect: ``chat_template`` (Jinja source), else the built-in ``chat_format``,
        else the file's ``tokenizer.chat_template``, else a built-in chosen for the model."""
        from .vocab import chat_template as ct

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

    def apply_chat_template(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, **kwargs: Any
    ) -> list[int]:
        """The prompt tokens of a conversation rendered with the model's chat template."""
        text = self._chat_template().render(messages, add_generation_prompt=True, tools=tools, **kwargs)
        tokens = self.tokenize(text.encode("utf-8"), add_bos=True, special=True)
        bos = self.vocab.bos
        if len(tokens) >= 2 and tokens[0] == tokens[1] == bos:  # the template wrote BOS too
            tokens = tokens[1:]
        return tokens

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
    ) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """A chat completion through the model's chat template (``chat.completion`` dict or chunks)."""
        self._no_grammar(grammar)
        if isinstance(response_format, dict) and response_format.get("type") not in (None, "text"):
            raise UnsupportedError("response_format other than text needs grammars, not supported yet")
        if functions and not tools:
            tools = [{"type": "function", "function": f} for f in functions]
        prompt_tokens = self.apply_chat_template(messages, tools=tools)
        sampling = dict(temp=temperature, top_k=top_k, top_p=top_p, min_p=min_p, typical_p=typical_p,
                        repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
                        presence_penalty=presence_penalty, mirostat_mode=mirostat_mode, mirostat_tau=mirostat_tau,
                        mirostat_eta=mirostat_eta, logit_bias=logit_bias, seed=seed)  # fmt: skip
        steps = self._completion_steps(prompt_tokens, max_tokens, stop, sampling, logits_processor, None)
        head = dict(id=f"chatcmpl-{uuid.uuid4()}", created=int(time.time()), model=model or self.model_path)
        n_lp = (top_logprobs or 0) if logprobs else None
        if stream:
            return self._stream_chat(head, steps, n_lp)
        text, n_gen, finish, content = "", 0, "length", []
        for s in steps:
            if s.token is not None:
                n_gen += 1
                if n_lp is not None and s.logits is not None:
                    content.append(self._chat_logprob(s.token, s.logits, n_lp))
            text += s.text
            if s.finish_reason:
                finish = s.finish_reason
        lp = dict(content=content) if n_lp is not None else None
        n_prompt = len(prompt_tokens)
        return dict(head, object="chat.completion",
                    choices=[dict(index=0, message=dict(role="assistant", content=text), logprobs=lp,
                                  finish_reason=finish)],
                    usage=dict(prompt_tokens=n_prompt, completion_tokens=n_gen, total_tokens=n_prompt + n_gen))  # fmt: skip

    def _chat_logprob(self, token: int, logits: np.ndarray, n: int) -> dict[str, Any]:
        logp = _log_softmax(logits)
        top = np.argsort(-logp, kind="stable")[:n] if n > 0 else []
        piece = self._piece_text(token)
        tops = [(self._piece_text(int(i)), float(logp[i])) for i in top]
        return dict(token=piece, logprob=float(logp[token]), bytes=list(piece.encode()),
                    top_logprobs=[dict(token=k, logprob=v, bytes=list(k.encode())) for k, v in tops])  # fmt: skip

    def _stream_chat(
        self, head: dict[str, Any], steps: Iterator[Step], n_lp: int | None
    ) -> Iterator[dict[str, Any]]:
        head = dict(head, object="chat.completion.chunk")
        yield dict(
            head, choices=[dict(index=0, delta=dict(role="assistant"), logprobs=None, finish_reason=None)]
        )
        for s in steps:
            lp = None
            if n_lp is not None and s.token is not None and s.logits is not None:
                lp = dict(content=[self._chat_logprob(s.token, s.logits, n_lp)])
            if s.text or lp is not None:
                yield dict(
                    head, choices=[dict(index=0, delta=dict(content=s.text), logprobs=lp, finish_reason=None)]
                )
            if s.finish_reason:
                yield dict(
                    head, choices=[dict(index=0, delta={}, logprobs=None, finish_reason=s.finish_reason)]
                )

    # ------------------------------------------------------------------------------------- embeddings
    def embed(
        self,
        input: str | list[str],
        normalize: bool = False,
        truncate: bool = True,
        return_count: bool = False,
    ) -> Any:
        """Embeddings of one text or a list: a pooled vector per text, or with no pooling a vector per token."""
        if not self._embedding:
            raise LlamapyError("Llama model must be created with embedding=True to call this method")
        seq = self._need_ctx()
        texts = [input] if isinstance(input, str) else list(input)
        out, total = [], 0
        for text in texts:
            tokens = self.tokenize(text.encode("utf-8"), add_bos=True, special=True)
            if truncate:
                tokens = tokens[: min(self.ctx.n_batch, self.n_ctx())]
            total += len(tokens)
            seq.clear()
            self._embed_eval(seq, tokens)
            pooled = self._pooled()
            vecs = self.ctx.get_embeddings_seq(0) if pooled else self.ctx.get_embeddings()[: len(tokens)]
            vecs = np.array(vecs, dtype=np.float32)
            if normalize:
                norm = np.linalg.norm(vecs, axis=-1, keepdims=True)
                vecs = vecs / np.where(norm > 0, norm, 1.0)
            out.append(vecs.tolist())
            seq.clear()
        result: Any = out[0] if isinstance(input, str) else out
        return (result, total) if return_count else result

    def _pooled(self) -> bool:
        pt = getattr(self.ctx, "pooling_type", None)
        return pt not in (None, 0, "none") and str(pt).lower() not in ("none", "poolingtype.none")

    def _embed_eval(self, seq: TokenSequence, tokens: list[int]) -> None:
        from .batch import Batch

        if len(tokens) > self.ctx.n_batch:
            raise ValueError(f"input of {len(tokens)} tokens is longer than n_batch {self.ctx.n_batch} (truncate=True cuts it)")  # fmt: skip
        self.ctx.decode(Batch.from_tokens(tokens, pos0=0, seq_id=0, logits_all=True))
        seq.tokens = list(tokens)

    def create_embedding(self, input: str | list[str], model: str | None = None) -> dict[str, Any]:
        vecs, n = self.embed(input, return_count=True)
        if isinstance(input, str):
            vecs = [vecs]
        data = [dict(object="embedding", embedding=v, index=i) for i, v in enumerate(vecs)]
        return dict(object="list", data=data, model=model or self.model_path,
                    usage=dict(prompt_tokens=n, total_tokens=n))  # fmt: skip

    # ------------------------------------------------------------------------------------- state
    def save_state(self) -> LlamaState:
        seq = self._need_ctx()
        data = bytes(self.ctx.state_seq_get_data(seq.seq_id))
        n = len(seq)
        return LlamaState(self.input_ids.copy(), self.scores[:n].copy(), n, data, len(data), self._seed)

    def load_state(self, state: LlamaState) -> None:
        seq = self._need_ctx()
        seq.clear()
        self.ctx.state_seq_set_data(state.llama_state, seq.seq_id)
        seq.tokens = [int(t) for t in state.input_ids[: state.n_tokens]]
        if state.n_tokens:
            self.scores[: state.n_tokens] = state.scores[: state.n_tokens]
            seq._last_logits = np.array(self.scores[state.n_tokens - 1], dtype=np.float32)
        self._seed = state.seed

    # ------------------------------------------------------------------------------------- misc
    @staticmethod
    def logits_to_logprobs(logits: np.ndarray, axis: int = -1) -> np.ndarray:
        return _log_softmax(np.moveaxis(np.asarray(logits), axis, -1)).swapaxes(-1, axis)

    @staticmethod
    def longest_token_prefix(a: Sequence[int], b: Sequence[int]) -> int:
        return common_prefix_length(a, b)

    @classmethod
    def from_pretrained(cls, repo_id: str, filename: str | None = None, **kwargs: Any) -> Llama:
        """A known model by name (``smollm2-135m-instruct``, ``gemma3-270m``), fetched into the cache.
        Hugging Face repositories are not reachable from llamapy."""
        from . import hub

        if hub.canonical_name(repo_id) is None:
            raise UnsupportedError(
                f"Llama.from_pretrained({repo_id!r}): only llamapy's known models can be fetched "
                f"({', '.join(hub.KNOWN_MODELS)}); download the GGUF file and use Llama(model_path=...)"
            )
        return cls(str(hub.pull(repo_id)), **kwargs)

    def detokenizer(self, special: bool = False) -> IncrementalDetokenizer:
        """An incremental UTF-8-safe detokenizer over this model's vocabulary."""
        return IncrementalDetokenizer(self.vocab, special=special)
