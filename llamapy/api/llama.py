"""The :class:`Llama` class: construction (llama-cpp-python's arguments), tokens, evaluation,
sampling, ``generate``, saved state. Completions, chat and embeddings are its mixins (``completion``,
``chat``, ``embedding``)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from ..errors import LlamapyError
from ..generation import IncrementalDetokenizer, TokenSequence, common_prefix_length
from ..generation.speculative import SPEC_TYPES, make_spec_draft
from ..gguf.strings import StringArray
from ..sampling.logprobs import log_softmax
from .chat import ChatMixin
from .common import LLAMA_DEFAULT_SEED, LlamaState, LogitsProcessor, StoppingCriteria, UnsupportedError
from .completion import CompletionMixin
from .embedding import EmbeddingMixin


def _cache_type(t: Any) -> str | None:
    if t is None or isinstance(t, str):
        return t
    from ..ggml.types import GGMLType

    return GGMLType(int(t)).name.lower()


class Llama(CompletionMixin, ChatMixin, EmbeddingMixin):
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
        n_seq_max: int | None = None,
        rope_scaling_type: int | str | None = None,
        pooling_type: int | str | None = None,
        rope_freq_base: float = 0.0,
        rope_freq_scale: float = 0.0,
        yarn_ext_factor: float = -1.0,
        yarn_attn_factor: float = -1.0,
        yarn_beta_fast: float = -1.0,
        yarn_beta_slow: float = -1.0,
        yarn_orig_ctx: int = 0,
        logits_all: bool = False,
        embedding: bool = False,
        offload_kqv: bool = True,
        repack: bool = True,
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
        mmproj: str | None = None,
        pipeline_stages: int = 0,
        pipeline_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if chat_handler is not None and getattr(chat_handler, "clip_model_path", None):
            mmproj = mmproj or chat_handler.clip_model_path  # llama-cpp-python's multimodal handlers
            chat_handler = None
        for name, value in (("chat_handler", chat_handler), ("tokenizer", tokenizer)):
            if value:
                raise UnsupportedError(f"Llama({name}=...) is not supported by llamapy")
        # llama_context_params' RoPE scaling (0 / -1 / None: the model's), checked before loading anything
        rope: dict[str, Any] = dict(
            rope_scaling_type=rope_scaling_type, rope_freq_base=rope_freq_base, rope_freq_scale=rope_freq_scale,
            yarn_ext_factor=yarn_ext_factor, yarn_attn_factor=yarn_attn_factor, yarn_beta_fast=yarn_beta_fast,
            yarn_beta_slow=yarn_beta_slow, yarn_orig_ctx=yarn_orig_ctx,
        )  # fmt: skip
        if not vocab_only:  # (a vocabulary needs no context: its module is not imported)
            from ..context import ContextParams
            from ..rope_params import check_rope_params

            check_rope_params(ContextParams(**rope))
        overrides = None
        if kv_overrides:  # metadata replaced before the model reads it (llama.cpp's --override-kv)
            from ..gguf.overrides import kv_overrides as parse_overrides

            overrides = parse_overrides(kv_overrides)
            if pipeline_stages:
                raise UnsupportedError("Llama(kv_overrides=...) does not reach the stages of pipeline_stages")
        spec_type = None  # llama.cpp's --spec-type name: made once the model is loaded
        if isinstance(draft_model, str) and draft_model.strip().lower() in SPEC_TYPES:
            spec_type, draft_model = draft_model, None
        eagle3_head = None  # an EAGLE-3 head GGUF: made once the target is loaded (it reads its states)
        if isinstance(draft_model, (str, os.PathLike)):
            from ..generation.eagle3 import is_eagle3_file

            if is_eagle3_file(draft_model):
                eagle3_head, draft_model = draft_model, None
        if isinstance(draft_model, (str, os.PathLike)):  # a second GGUF (llama.cpp's --model-draft)
            from ..generation.draft_model import LlamaModelDraft

            draft_model = LlamaModelDraft(draft_model, n_ctx=max(int(n_ctx or 0), 512), n_threads=n_threads,
                                          rope=rope)  # fmt: skip
        if draft_model is not None and not callable(draft_model):
            raise TypeError(
                "Llama(draft_model=...) must be called as draft(input_ids) -> token ids, such as "
                f"llamapy.LlamaPromptLookupDecoding(); got {type(draft_model).__name__}"
            )
        from ..model import Model

        self.model_path = str(model_path)
        self.verbose = verbose
        model = Model.load(
            self.model_path,
            use_mmap=use_mmap,
            use_mlock=use_mlock,
            vocab_only=vocab_only,
            kv_overrides=overrides,
        )
        if hasattr(draft_model, "model") and hasattr(draft_model, "ctx"):  # a LlamaModelDraft
            from ..generation.draft_model import check_compatible

            check_compatible(model.vocab, draft_model.vocab)
        if eagle3_head is not None and not vocab_only:
            from ..generation.eagle3 import Eagle3Draft

            draft_model = Eagle3Draft(
                eagle3_head, model, n_ctx=max(int(n_ctx or 0), 512), n_threads=n_threads
            )
        if spec_type is not None and not vocab_only:  # "mtp", "ngram-simple", "ngram-map-k"
            draft_model = make_spec_draft(
                spec_type, model, n_ctx=max(int(n_ctx or 0), 512), n_threads=n_threads
            )
        ctx = None
        if not vocab_only:
            from ..context import Context

            n_ctx = int(n_ctx) if n_ctx else 0
            cp: dict[str, Any] = dict(n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch, n_threads=n_threads)
            cp.update(rope)
            cp.update(embeddings=embedding, pooling_type=pooling_type)
            cp.update(n_gpu_layers=int(n_gpu_layers), main_gpu=int(main_gpu), offload_kqv=bool(offload_kqv))
            cp["repack"] = bool(repack)  # False: llama.cpp's --no-repack (Context.repack)
            # embeddings: several inputs per decode (llama-embedding runs as many sequences as it can)
            cp["n_seq_max"] = int(n_seq_max) if n_seq_max else (64 if embedding else 1)
            if n_ctx:
                cp["n_batch"] = min(n_ctx, n_batch)
                cp["n_ubatch"] = min(cp["n_batch"], n_ubatch)
            for key, val in (("type_k", _cache_type(type_k)), ("type_v", _cache_type(type_v)),
                             ("flash_attn", flash_attn)):  # fmt: skip
                if val is not None:
                    cp[key] = val
            if pipeline_stages:  # layers split over Ray actors (llamapy.ray.pipeline)
                from ..ray.pipeline import pipeline_context

                ctx = pipeline_context(model, int(pipeline_stages), cp, **(pipeline_options or {}))
            else:
                ctx = Context(model, ContextParams(**cp))
            if lora_path:  # applied in the graph, never merged (lora_base is not needed for that)
                from ..model.lora import LoraAdapter

                ctx.set_adapter_lora(LoraAdapter.load(lora_path, model), lora_scale)
        self._setup(model, ctx, seed=seed, logits_all=logits_all, embedding=embedding, chat_format=chat_format,
                    spm_infill=spm_infill, context_shift=context_shift, n_keep=n_keep,
                    last_n_tokens_size=last_n_tokens_size, draft_model=draft_model)  # fmt: skip
        if mmproj and ctx is not None:  # images in, text out (llama-mtmd): the vision encoder + projector
            from ..mtmd import MtmdContext

            self.mtmd = MtmdContext(mmproj, model, n_threads=n_threads)
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
        draft_model: Any = None,
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
        # speculative decoding: draft(input_ids) -> guessed tokens (llamapy.LlamaPromptLookupDecoding)
        self.draft_model = draft_model
        self.metadata = {k: str(v) for k, v in getattr(model, "metadata", {}).items() if not isinstance(v, list | np.ndarray | StringArray)}  # fmt: skip
        self._scores: np.ndarray | None = None
        self._seq: TokenSequence | None = None
        self.mtmd: Any = None  # llamapy.mtmd.MtmdContext when made with mmproj=...
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
        seq = self._seq
        if not self._logits_all and seq is not None and len(seq) and seq._last_logits is not None:
            # the last row, written when read (see _store_logits)
            self._scores[len(seq) - 1] = seq._last_logits
        return self._scores

    @property
    def _scores_view(self) -> np.ndarray:
        return self.scores[: self.n_tokens]

    @property
    def eval_logits(self) -> list[list[float]]:
        return self._scores_view.tolist() if self._logits_all else self._scores_view[-1:].tolist()

    def _store_logits(self, pos: int, rows: np.ndarray) -> None:
        # without logits_all only the last row exists, and the sequence keeps it: writing it here would
        # page in a row of n_vocab floats per generated token (1 MiB each on a 262k vocabulary)
        if self._logits_all and pos + len(rows) <= self.n_ctx():
            self.scores[pos : pos + len(rows)] = rows

    def set_seed(self, seed: int) -> None:
        self._seed = seed

    def reset(self) -> None:
        """Forget the evaluated tokens (the next evaluation starts from an empty context)."""
        if self._seq is not None:
            self._seq.clear()

    def close(self) -> None:
        stop = getattr(self._ctx, "close", None)  # a pipeline's stage actors (Llama(pipeline_stages=N))
        if stop is not None:
            stop()
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
        from ..sampling import SamplingParams

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
        from ..sampling import build_chain

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
        grammar = self._grammar(grammar)
        seq = self._need_ctx()
        chain = self._chain(temp, top_k, top_p, min_p, typical_p, repeat_penalty, frequency_penalty,
                            presence_penalty, mirostat_mode, mirostat_tau, mirostat_eta)  # fmt: skip
        chain.accept_prompt(seq.tokens[-self.last_n_tokens_size :] if self.last_n_tokens_size > 0 else [])
        if grammar is not None:  # a fresh grammar state: the token is the first of the grammar's text
            chain.set_grammar(grammar.sampler(self.vocab))
        logits = seq.logits() if idx is None else self.scores[idx]
        if logits_processor is not None:
            logits = logits_processor(self.input_ids, logits.copy())
        return int(chain.sample(logits))

    @staticmethod
    def _grammar(grammar: Any) -> Any:
        """A :class:`llamapy.grammar.LlamaGrammar` (or None) given as ``grammar=``."""
        if grammar is None:
            return None
        from ..grammar import LlamaGrammar

        if not isinstance(grammar, LlamaGrammar):
            raise UnsupportedError(
                f"grammar= takes a LlamaGrammar (LlamaGrammar.from_string(gbnf), .from_json_schema(...)), "
                f"got {type(grammar).__name__}"
            )
        return grammar

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
        grammar = self._grammar(grammar)
        seq = self._need_ctx()
        chain = self._chain(temp, top_k, top_p, min_p, typical_p, repeat_penalty, frequency_penalty,
                            presence_penalty, mirostat_mode, mirostat_tau, mirostat_eta, seed=seed)  # fmt: skip
        tokens = list(tokens)
        if not reset:
            tokens = seq.tokens + tokens
        chain.accept_prompt(tokens)
        if grammar is not None:
            chain.set_grammar(grammar.sampler(self.vocab))
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
            scores = self.scores
            scores[: state.n_tokens] = state.scores[: state.n_tokens]
            seq._last_logits = np.array(scores[state.n_tokens - 1], dtype=np.float32)
        self._seed = state.seed

    # ------------------------------------------------------------------------------------- misc
    @staticmethod
    def logits_to_logprobs(logits: np.ndarray, axis: int = -1) -> np.ndarray:
        return log_softmax(np.moveaxis(np.asarray(logits), axis, -1)).swapaxes(-1, axis)

    @staticmethod
    def longest_token_prefix(a: Sequence[int], b: Sequence[int]) -> int:
        return common_prefix_length(a, b)

    @classmethod
    def from_pretrained(
        cls,
        repo_id: str,
        filename: str | None = None,
        additional_files: list[str] | None = None,
        local_dir: str | os.PathLike | None = None,
        local_dir_use_symlinks: bool | str = "auto",
        cache_dir: str | os.PathLike | None = None,
        **kwargs: Any,
    ) -> Llama:
        """A model from the Hugging Face Hub, as llama-cpp-python: ``filename`` is a glob (fnmatch) that must
        match exactly one file of ``repo_id`` (a split model's parts all come along); ``additional_files``
        are globs of other files to fetch (e.g. ``mmproj*.gguf``). Files go into huggingface_hub's cache (or
        ``cache_dir``, or ``local_dir`` as plain files); ``HF_TOKEN``, ``HF_ENDPOINT`` and ``HF_HUB_OFFLINE``
        apply (and the keyword arguments ``token``/``offline``). ``local_dir_use_symlinks`` is accepted and
        ignored (huggingface_hub >= 1.0 has none). None or several matching files raise
        :class:`llamapy.hub.NoMatchingFileError` (a ``ValueError``) listing the repo's GGUF files.

        llamapy's known models (``smollm2-135m-instruct``, ``gemma3-270m``) are fetched by their name alone.
        The other keyword arguments go to :class:`Llama`."""
        from .. import hub

        del local_dir_use_symlinks
        token = kwargs.pop("token", None)
        offline = bool(kwargs.pop("offline", False))
        if filename is None:
            if hub.canonical_name(repo_id) is not None:
                return cls(str(hub.pull(repo_id)), **kwargs)
            if not hub.looks_like_ref(repo_id):
                raise UnsupportedError(
                    f"Llama.from_pretrained({repo_id!r}): give a Hugging Face repo id and a filename glob, "
                    f"or one of llamapy's known models ({', '.join(hub.KNOWN_MODELS)})"
                )
            m = hub.hf.download(repo_id, token=token, offline=offline, mmproj=False)
            return cls(str(m.path), **kwargs)
        path, _extra = hub.hf.pretrained(
            repo_id, filename, additional_files, local_dir=local_dir, cache_dir=cache_dir, token=token,
            offline=offline,
        )  # fmt: skip
        return cls(str(path), **kwargs)

    def detokenizer(self, special: bool = False) -> IncrementalDetokenizer:
        """An incremental UTF-8-safe detokenizer over this model's vocabulary."""
        return IncrementalDetokenizer(self.vocab, special=special)
