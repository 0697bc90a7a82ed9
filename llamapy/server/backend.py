"""What the server engine needs from a model: a narrow interface, and its implementation over
:class:`llamapy.model.Model` + :class:`llamapy.context.Context` (one multi-sequence context whose
``n_seq_max`` is the number of slots).

Tests drive the engine with a small fake that implements the same :class:`Backend` protocol.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np


class Backend(Protocol):
    model_path: str
    n_ctx: int  # total KV cells, shared by all sequences
    n_seq_max: int
    n_batch: int
    n_vocab: int
    embeddings: bool

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]: ...
    def token_to_piece(self, token: int, special: bool = False) -> bytes: ...
    def detokenize(self, tokens: Sequence[int]) -> str: ...
    def is_eog(self, token: int) -> bool: ...

    def decode(
        self, tokens: Sequence[int], pos: Sequence[int], seq_ids: Sequence[int], outputs: Sequence[bool]
    ) -> np.ndarray:
        """Evaluate one mixed batch; return the logits of the ``outputs`` tokens, in batch order."""
        ...

    def embeddings_seq(self, seq: int) -> np.ndarray: ...
    def seq_rm(self, seq: int, p0: int, p1: int) -> bool: ...
    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        """Move ``seq``'s positions in [p0, p1) by ``delta`` (a context shift; the keys are re-roped)."""
        ...

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        """Make ``dst`` share ``src``'s cells at positions [p0, p1) (``dst`` is empty there)."""
        ...

    @property
    def chat_template(self) -> Any:
        """The :class:`llamapy.vocab.chat_template.ChatTemplate` chat requests are rendered with."""
        ...

    def info(self) -> dict[str, Any]: ...

    def health(self) -> str | None:
        """Why the loaded model cannot answer now (e.g. a Ray pipeline that lost a stage), or None."""
        ...

    def fim_tokens(self) -> Any:
        """The :class:`llamapy.api.infill.FimTokens` of the vocabulary (``FimError`` without them)."""
        ...

    def state_seq_get(self, seq: int) -> bytes:
        """Sequence ``seq``'s KV state, as :meth:`state_seq_set` reads it back."""
        ...

    def state_seq_set(self, data: bytes, seq: int, n_tokens: int | None = None) -> int:
        """Replace sequence ``seq``'s KV state by ``data``; return the bytes read (raises if invalid, or,
        with ``n_tokens``, if its cells are not at the positions ``0..n_tokens-1`` of that many tokens)."""
        ...

    def state_seq_size_max(self, n_tokens: int) -> int:
        """The most bytes :meth:`state_seq_get` gives for a sequence of ``n_tokens`` tokens."""
        ...

    def identity(self) -> dict[str, Any]:
        """What a saved slot file must match to be restored here (model file name and size)."""
        ...


# llama.cpp's enum llama_vocab_type, by llamapy.vocab.VocabType name (/v1/models' meta.vocab_type)
_VOCAB_TYPES = {"NONE": 0, "SPM": 1, "BPE": 2, "WPM": 3, "UGM": 4, "RWKV": 5, "PLAMO2": 6}


class ContextBackend:
    """The real model: one :class:`llamapy.context.Context` with ``n_seq_max`` sequences.

    ``chat_template`` overrides the model's template: Jinja source or a built-in name (chatml, llama3,
    gemma, phi3, mistral).
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        n_ctx: int = 4096,
        n_seq_max: int = 1,
        n_batch: int = 512,
        n_ubatch: int = 512,
        n_threads: int | None = None,
        type_k: str = "f16",
        type_v: str = "f16",
        embeddings: bool = False,
        chat_template: str | None = None,
        pooling: str | None = None,
        loras: Sequence[tuple[str, float]] = (),
        draft: dict[str, Any] | None = None,
        pipeline: dict[str, Any] | None = None,
        rope: dict[str, Any] | None = None,
        kv_overrides: Any = None,
    ) -> None:
        """``rope``: :class:`llamapy.context.ContextParams`' RoPE fields (``rope_scaling_type``,
        ``rope_freq_scale``, ``yarn_orig_ctx``...); ``kv_overrides``: metadata overrides (``Model.load``)."""
        from ..context import Context, ContextParams
        from ..model import Model
        from ..vocab.chat_template import template_for_model

        self.model_path = str(model_path)
        self._rope = dict(rope or {})  # (a -md draft's context takes them too, as llama.cpp's)
        self.model = Model.load(self.model_path, kv_overrides=kv_overrides)
        params = ContextParams(
            **self._rope,
            n_ctx=n_ctx,
            n_batch=n_batch,
            n_ubatch=min(n_ubatch, n_batch),
            n_seq_max=n_seq_max,
            n_threads=n_threads,
            type_k=type_k,  # -ctk/-ctv
            type_v=type_v,
            embeddings=embeddings,
            pooling_type=pooling,
        )
        if pipeline:  # the layers split over Ray actors (llamapy serve --pipeline N: llamapy.ray.pipeline)
            from ..ray.pipeline import pipeline_context

            kw = dict(pipeline)
            self.ctx = pipeline_context(self.model, int(kw.pop("stages")), vars(params).copy(), **kw)
        else:
            self.ctx = Context(self.model, params)
        from ..model.lora import LoraAdapter

        # LoRA adapters (--lora / --lora-scaled): loaded once; the engine sets the scales per batch
        self.loras = [(LoraAdapter.load(path, self.model), float(scale)) for path, scale in loras]
        self.set_lora(tuple(s for _, s in self.loras))
        # speculative decoding (-md): the draft model, loaded once; make_draft() gives each slot its own
        # context over it (LlamaModelDraft keyword arguments besides "model")
        self._draft_kw = dict(draft or {})
        self._draft_model = None
        # --spec-type (ngram-simple, ngram-map-k, mtp): per-slot drafts by llamapy.generation.spec_server
        spec, self._spec_drafts = (self._draft_kw, None) if self._draft_kw.get("spec_type") else (None, None)
        if spec is not None:
            self._draft_kw = {}
        hp = self.model.hparams
        if (self._draft_kw or spec) and any(hp.is_recurrent(il) for il in range(hp.n_layer)):
            raise ValueError(
                "speculative decoding (-md, --spec-type) needs a memory that can drop rejected tokens; "
                f"{self.model.arch} keeps a recurrent state"
            )
        self._n_eagle3_slots = 0
        self._eagle3: Any = None  # -md of an EAGLE-3 head: one head, each slot its own draft cache
        if self._draft_kw:
            from ..generation.draft_model import check_compatible
            from ..generation.eagle3 import Eagle3Head, is_eagle3_file

            path = self._draft_kw.pop("model")
            if is_eagle3_file(path):
                self._eagle3 = Eagle3Head(path, self.model)
            else:
                self._draft_model = Model.load(path)
                check_compatible(self.model.vocab, self._draft_model.vocab)
        self.pooling_type = int(getattr(self.ctx, "pooling_type", 0))  # 0: none (per-token, not OpenAI's)
        self.vocab = self.model.vocab
        self.n_ctx = int(self.ctx.n_ctx)
        self.n_seq_max = int(self.ctx.n_seq_max)
        self.n_batch = int(self.ctx.n_batch)
        self.n_vocab = int(self.model.n_vocab)
        self.embeddings = embeddings
        v = self.vocab
        self.bos_text = v.token_text(v.bos) if v.bos >= 0 else ""
        self.eos_text = v.token_text(v.eos) if v.eos >= 0 else ""
        self._template = template_for_model(self.model.metadata, self.bos_text, self.eos_text, chat_template)
        self.chat_template_source = self._template.source
        if spec is not None:
            from ..generation.spec_server import SlotDrafts

            self._spec_drafts = SlotDrafts(self, spec)

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return list(self.vocab.tokenize(text, add_special=add_special, parse_special=parse_special))

    def token_to_piece(self, token: int, special: bool = False) -> bytes:
        return self.vocab.token_to_piece(token, special=special)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.vocab.detokenize(list(tokens))

    def is_eog(self, token: int) -> bool:
        return bool(self.vocab.is_eog(token))

    def decode(
        self, tokens: Sequence[int], pos: Sequence[int], seq_ids: Sequence[int], outputs: Sequence[bool]
    ) -> np.ndarray:
        from ..batch import Batch

        batch = Batch(token=list(tokens), pos=list(pos), seq_id=[[s] for s in seq_ids], logits=list(outputs))
        self.ctx.decode(batch)
        if not self.embeddings:
            return np.asarray(self.ctx.get_logits())
        return np.zeros((0, self.n_vocab), np.float32)

    def warmup(self) -> None:
        """Decode once with a batch size of each kernel class, so their kernels are loaded: one row,
        the 4-row mat-vec with small attention (2), the 8-row mat-vec with BLAS attention (5), the
        tile + sgemm path (mat-vec limit + 1); the KV cache is left empty. Each other size costs only
        its graph build. :meth:`llamapy.server.engine.Engine.warmup` then runs the engine's own shapes."""
        from ..ggml.cpu.backend import ATTN_SMALL_MAX_TOKENS, MATVEC_MAX_TOKENS
        from ..ggml.cpu.matmul_kernels import BATCH8_MIN_ROWS

        bos = self.vocab.bos if self.vocab.bos >= 0 else 0
        limit = min(self.n_ctx // self.n_seq_max - 1, self.n_batch)
        sizes = {1, 2, BATCH8_MIN_ROWS, ATTN_SMALL_MAX_TOKENS + 1, MATVEC_MAX_TOKENS + 1}
        for n in sorted(min(n, limit) for n in sizes):
            self.decode([bos] * n, list(range(n)), [0] * n, [False] * (n - 1) + [True])
            self.ctx.memory.seq_rm(-1, -1, -1)

    def warmed_up(self) -> None:
        """Called by the engine after its warm-up: every kernel is loaded, so LLVM's code need not
        stay resident (``llamapy._numba.release_compiler_pages``)."""
        from .._numba import release_compiler_pages

        release_compiler_pages()

    def embeddings_seq(self, seq: int) -> np.ndarray:
        return np.asarray(self.ctx.get_embeddings_seq(seq), dtype=np.float32)

    def make_draft(self) -> Any:
        """A draft model for one slot (None without ``-md`` or ``--spec-type``)."""
        if self._spec_drafts is not None:
            return self._spec_drafts.make()
        if self._eagle3 is not None:
            from ..generation.eagle3 import Eagle3Draft

            keys = ("n_draft", "n_min", "p_min", "n_threads")
            n_ctx = self.n_ctx // max(1, self.n_seq_max)
            d = Eagle3Draft(self._eagle3, n_ctx=n_ctx, n_batch=min(512, n_ctx),
                            **{k: v for k, v in self._draft_kw.items() if k in keys and v is not None})  # fmt: skip
            d.attach(self.ctx, seq_id=self._n_eagle3_slots, n_ctx=n_ctx)  # slots are made in order: 0, 1...
            self._n_eagle3_slots += 1
            return d
        if self._draft_model is None:
            return None
        from ..generation.draft_model import LlamaModelDraft

        kw = dict(self._draft_kw)
        kw.setdefault("n_ctx", self.n_ctx // max(1, self.n_seq_max))
        return LlamaModelDraft(self._draft_model, rope=self._rope, **kw)

    def lora_info(self) -> list[dict[str, Any]]:
        """The adapters loaded at start: id, path and the scale given on the command line."""
        return [{"id": i, "path": ad.path, "scale": s} for i, (ad, s) in enumerate(self.loras)]

    def set_lora(self, scales: Sequence[float]) -> None:
        """Apply the adapters with these scales (one per adapter, 0: off) to the next decodes."""
        self.ctx.set_adapters_lora([(ad, s) for (ad, _), s in zip(self.loras, scales, strict=True)])

    def seq_rm(self, seq: int, p0: int, p1: int) -> bool:
        return bool(self.ctx.memory.seq_rm(seq, p0, p1))

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        self.ctx.memory.seq_cp(src, dst, p0, p1)

    @property
    def has_checkpoints(self) -> bool:
        """Whether going back in a sequence needs state checkpoints (a recurrent model)."""
        return bool(getattr(self.ctx.memory, "has_checkpoints", False))

    def checkpoint(self, seq: int) -> int:
        return int(self.ctx.memory.checkpoint(seq))

    def seq_pos_restorable(self, seq: int, p0: int) -> int:
        return int(self.ctx.memory.seq_pos_restorable(seq, p0))

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        self.ctx.memory.seq_add(seq, p0, p1, delta)

    @property
    def chat_template(self) -> Any:
        return self._template

    @property
    def speculative_types(self) -> str:
        """llama-server's name of the speculative decoding every slot uses (``speculative.types``)."""
        if self._spec_drafts is not None:
            t = self._spec_drafts.spec_type
            return "draft-mtp" if t == "mtp" else t
        if self._eagle3 is not None:
            return "draft-eagle3"
        return "draft-simple" if self._draft_model is not None else "none"

    def fim_tokens(self) -> Any:
        from ..api.infill import FimTokens

        return FimTokens.of(self.vocab, Path(self.model_path).name)

    def state_seq_get(self, seq: int) -> bytes:
        return bytes(self.ctx.state_seq_get_data(seq))

    def state_seq_set(self, data: bytes, seq: int, n_tokens: int | None = None) -> int:
        return int(self.ctx.state_seq_set_data(data, seq, n_tokens))

    def state_seq_size_max(self, n_tokens: int) -> int:
        return int(self.ctx.state_seq_size_max(n_tokens))

    def identity(self) -> dict[str, Any]:
        return {
            "file": Path(self.model_path).name,
            "size": os.path.getsize(self.model_path),
            "n_vocab": self.n_vocab,
        }

    def health(self) -> str | None:
        h = self.ctx.health()
        return None if h.get("ok", True) else str(h.get("error") or "unavailable")

    def info(self) -> dict[str, Any]:
        m = self.model
        return {
            "n_vocab": self.n_vocab,
            "n_ctx_train": int(getattr(m, "n_ctx_train", 0) or 0),
            "n_embd": int(getattr(m, "n_embd", 0) or 0),
            "size": int(getattr(m, "size", 0) or 0),
            "n_params": int(getattr(m, "n_params", 0) or 0),
            "ftype": str(getattr(m, "ftype", "")),
            "vocab_type": _VOCAB_TYPES.get(getattr(getattr(self.vocab, "type", None), "name", ""), 0),
            "desc": str(getattr(m, "desc", "")),
            "arch": str(getattr(m, "arch", "")),
            "file": Path(self.model_path).name,
            "bos_token": self.bos_text,
            "eos_token": self.eos_text,
            "chat_template": self.chat_template_source,
        }
