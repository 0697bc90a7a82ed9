"""The engine: one thread owns the model and serves every request through ``n_parallel`` slots.

Each step batches the next token of every generating slot plus chunks of pending prompts (up to
``n_batch`` tokens in all) into one ``decode`` over the multi-sequence KV cache (continuous batching):
a new request starts at the next step without waiting for the others, and a long prompt is evaluated
in chunks between the generating slots' tokens. Slot ``i`` is KV sequence ``i`` and owns
``n_ctx // n_parallel`` cells (as llama.cpp splits ``-c`` over ``-np``). Each slot keeps its tokens in
the KV cache after a request; a new request goes to the idle slot whose cached tokens share the longest
prefix with its prompt, and only the rest of the prompt is evaluated.

Request handlers talk to the engine with :meth:`Engine.submit` (a :class:`Task` with a thread-safe
``sink`` that receives :class:`Event` objects) and :meth:`Engine.cancel`.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np

from ..generation import IncrementalDetokenizer, StopStrings, common_prefix_length
from .backend import Backend
from .errors import APIError
from .metrics import Metrics
from .sampling import SamplingParams, log_softmax, make_chain, top_logprobs

log = logging.getLogger("llamapy.server")

SLOT_PROMPT_SIMILARITY = 0.1


@dataclass
class GenParams:
    n_predict: int = -1  # -1: until end of generation or a full slot
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    n_probs: int = 0  # alternatives reported per generated token
    logprobs: bool = False  # report the log-probability of each generated token
    cache_prompt: bool = True
    id_slot: int = -1


@dataclass
class TokenProb:
    id: int
    piece: bytes
    logprob: float
    top: list[tuple[int, bytes, float]]


@dataclass
class Event:
    """A piece of a task's answer. ``done`` marks the last one (then the statistics are set)."""

    text: str = ""
    tokens: list[int] = field(default_factory=list)
    probs: list[TokenProb] = field(default_factory=list)
    done: bool = False
    finish_reason: str | None = None  # "stop" | "length"
    stop_type: str = "none"  # "eos" | "word" | "limit"
    stopping_word: str = ""
    n_prompt: int = 0
    n_cached: int = 0
    n_predicted: int = 0
    prompt_ms: float = 0.0
    predicted_ms: float = 0.0
    slot_id: int = -1
    error: APIError | None = None
    embedding: np.ndarray | None = None


_ids = itertools.count()


@dataclass(eq=False)
class Task:
    prompt: list[int]
    params: GenParams
    sink: Callable[[Event], None]
    kind: str = "completion"  # or "embedding"
    id: int = field(default_factory=lambda: next(_ids))
    cancelled: bool = False
    t_submit: float = field(default_factory=time.perf_counter)


class SlotState(Enum):
    IDLE = "idle"
    PROMPT = "processing prompt"
    GENERATING = "generating"


class Slot:
    def __init__(self, id: int, n_ctx: int) -> None:
        self.id = id
        self.n_ctx = n_ctx
        self.cache: list[int] = []  # exactly the tokens the KV cache holds for sequence `id`
        self.state = SlotState.IDLE
        self.task: Task | None = None
        self.last_used = 0.0
        self._reset_request()

    def _reset_request(self) -> None:
        self.sampler: Any = None  # a llamapy.sampling.SamplerChain
        self.detok: IncrementalDetokenizer | None = None
        self.stops: StopStrings | None = None
        self.next_token = -1
        self.n_cached = 0
        self.n_decoded = 0
        self.t_start = self.t_first = 0.0


class Engine:
    """Owns the backend; serves tasks from a worker thread (see the module docstring)."""

    def __init__(self, backend: Backend, n_batch: int | None = None, metrics: Metrics | None = None) -> None:
        self.backend = backend
        self.n_parallel = max(1, int(backend.n_seq_max))
        self.n_ctx_slot = int(backend.n_ctx) // self.n_parallel
        self.n_batch = min(int(n_batch or backend.n_batch), int(backend.n_batch))  # tokens per step
        self.slots = [Slot(i, self.n_ctx_slot) for i in range(self.n_parallel)]
        self.metrics = metrics or Metrics()
        self._cond = threading.Condition()
        self._incoming: deque[Task] = deque()
        self._deferred: deque[Task] = deque()
        self._stopping = False
        self._eog_ids: np.ndarray | None = None
        self._thread = threading.Thread(target=self._run, name="llamapy-engine", daemon=True)

    # -- called from request handlers (any thread) ----------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, task: Task) -> None:
        with self._cond:
            self._incoming.append(task)
            self._cond.notify_all()

    def cancel(self, task: Task) -> None:
        """Abandon a task (client gone): its slot is freed at the start of the next step."""
        task.cancelled = True
        with self._cond:
            self._cond.notify_all()

    def slots_info(self, verbose: bool = False) -> list[dict[str, Any]]:
        out = []
        for s in self.slots:
            task = s.task
            d: dict[str, Any] = {
                "id": s.id,
                "n_ctx": s.n_ctx,
                "state": s.state.value,
                "is_processing": s.state is not SlotState.IDLE,
                "id_task": task.id if task else -1,
                "n_cached_tokens": len(s.cache),
                "next_token": {
                    "has_next_token": s.state is SlotState.GENERATING,
                    "n_decoded": s.n_decoded,
                    "n_remain": (task.params.n_predict - s.n_decoded)
                    if task and task.params.n_predict >= 0
                    else -1,
                },
            }
            if verbose:
                d["cache_text"] = self.backend.detokenize(list(s.cache))
                d["prompt_tokens"] = list(task.prompt) if task else []
            out.append(d)
        return out

    # -- the engine thread ----------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and not self._incoming and not self._has_work():
                    self._cond.wait()
                if self._stopping:
                    break
                self._deferred.extend(self._incoming)
                self._incoming.clear()
            try:
                self._step()
            except Exception as e:  # never let one bad step kill the server
                log.exception("engine step failed")
                for s in self.slots:
                    if s.task is not None:
                        self._fail(
                            s, APIError(500, f"internal error in slot {s.id}: {type(e).__name__}: {e}")
                        )
        for s in self.slots:
            if s.task is not None:
                self._fail(s, APIError(503, "the server is shutting down"))
        for t in list(self._deferred) + list(self._incoming):
            self._send(t, Event(done=True, error=APIError(503, "the server is shutting down")))

    def _has_work(self) -> bool:
        if any(s.task is not None for s in self.slots):
            return True
        return bool(self._deferred)

    def _step(self) -> None:
        for s in self.slots:
            if s.task is not None and s.task.cancelled:
                self._release(s)
        self._deferred = deque(t for t in self._deferred if not t.cancelled)
        self._assign()
        self._update_gauges()
        if not any(s.task is not None for s in self.slots):
            return
        tokens: list[int] = []
        pos: list[int] = []
        seqs: list[int] = []
        outs: list[bool] = []
        sample_slots: list[Slot] = []
        embed_slots: list[Slot] = []
        for s in self.slots:
            if s.state is SlotState.GENERATING:
                tokens.append(s.next_token)
                pos.append(len(s.cache))
                seqs.append(s.id)
                outs.append(True)
                s.cache.append(s.next_token)
                sample_slots.append(s)
        budget = self.n_batch - len(tokens)
        prompting = sorted(
            (s for s in self.slots if s.state is SlotState.PROMPT), key=lambda s: s.task.t_submit
        )
        for s in prompting:
            if budget <= 0:
                break
            task = s.task
            assert task is not None
            rest = task.prompt[len(s.cache) :]
            if task.kind == "embedding" and len(rest) > budget:
                continue  # an embedding needs its whole input in one decode
            chunk = rest[:budget]
            done = len(chunk) == len(rest)
            p0 = len(s.cache)
            for j, t in enumerate(chunk):
                tokens.append(t)
                pos.append(p0 + j)
                seqs.append(s.id)
                outs.append(task.kind == "embedding" or (done and j == len(chunk) - 1))
            s.cache.extend(chunk)
            budget -= len(chunk)
            if done:
                (embed_slots if task.kind == "embedding" else sample_slots).append(s)
        if not tokens:
            return
        try:
            logits = self.backend.decode(tokens, pos, seqs, outs)
        except Exception as e:
            log.exception("decode failed")
            for sid in sorted(set(seqs)):
                s = self.slots[sid]
                self._fail(
                    s, APIError(500, f"decode failed in slot {sid}: {type(e).__name__}: {e}"), drop_cache=True
                )
            return
        with self.metrics.lock:
            self.metrics.n_decode_total += 1
            self.metrics.n_busy_slots_total += sum(1 for s in self.slots if s.task is not None)
        for row, s in enumerate(sample_slots):
            if s.task is None:
                continue
            try:
                self._sample(s, logits[row])
            except Exception as e:
                log.exception("sampling failed")
                self._fail(s, APIError(500, f"sampling failed in slot {s.id}: {type(e).__name__}: {e}"))
        for s in embed_slots:
            self._finish_embedding(s)

    def _assign(self) -> None:
        for task in list(self._deferred):
            slot = self._pick_slot(task)
            if slot is None:
                if task.params.id_slot < 0:
                    break  # no idle slot: later tasks wait too (FIFO)
                continue
            self._deferred.remove(task)
            self._start(slot, task)

    def _pick_slot(self, task: Task) -> Slot | None:
        idle = [s for s in self.slots if s.task is None]
        if task.params.id_slot >= 0:
            s = self.slots[task.params.id_slot]
            return s if s.task is None else None
        if not idle:
            return None

        if task.params.cache_prompt:
            # as llama.cpp (--slot-prompt-similarity 0.1): reuse the slot sharing the longest prefix when
            # it covers a tenth of the prompt; otherwise take the least recently used slot, so a slot's
            # cache is not thrown away for a prompt that only shares a BOS token with it
            best = max(idle, key=lambda s: (common_prefix_length(s.cache, task.prompt), -s.last_used))
            n = common_prefix_length(best.cache, task.prompt)
            if n > 0 and n >= SLOT_PROMPT_SIMILARITY * len(task.prompt):
                return best
        return min(idle, key=lambda s: s.last_used)

    def _start(self, s: Slot, task: Task) -> None:
        s._reset_request()
        s.task = task
        s.t_start = time.perf_counter()
        if len(task.prompt) >= s.n_ctx or not task.prompt:
            self._fail(s, _prompt_error(len(task.prompt), s.n_ctx))
            return
        if task.kind == "embedding":
            n_keep = 0
        else:
            n_keep = common_prefix_length(s.cache, task.prompt) if task.params.cache_prompt else 0
            n_keep = min(n_keep, len(task.prompt) - 1)  # evaluate at least one token for its logits
        if not self.backend.seq_rm(s.id, n_keep, -1):
            self.backend.seq_rm(s.id, -1, -1)
            n_keep = 0
        del s.cache[n_keep:]
        s.n_cached = n_keep
        s.state = SlotState.PROMPT
        if task.kind == "completion":
            p = task.params
            try:
                s.sampler = make_chain(
                    p.sampling, self.backend.n_vocab, s.n_ctx, getattr(self.backend, "vocab", None)
                )
                for t in task.prompt:  # as llama.cpp: penalties and DRY see the prompt too
                    s.sampler.accept(t)
            except Exception as e:
                self._fail(s, APIError(400, f"invalid sampling parameters: {e}"))
                return
            s.detok = IncrementalDetokenizer(self.backend)
            s.stops = StopStrings(p.stop)

    def _eog(self) -> np.ndarray:
        if self._eog_ids is None:
            b = self.backend
            self._eog_ids = np.array([t for t in range(b.n_vocab) if b.is_eog(t)], dtype=np.int64)
        return self._eog_ids

    def _sample(self, s: Slot, logits: np.ndarray) -> None:
        task = s.task
        assert task is not None and s.sampler is not None and s.detok is not None and s.stops is not None
        p = task.params
        if p.n_predict == 0:  # llama.cpp's n_predict=0: evaluate (and cache) the prompt, generate nothing
            s.t_first = time.perf_counter()
            self._finish(s, "", [], [], "limit")
            return
        z = logits
        if p.ignore_eos:
            z = np.array(logits, dtype=np.float32, copy=True)
            z[self._eog()] = -np.inf
        tok = s.sampler.sample(z)
        s.sampler.accept(tok)
        now = time.perf_counter()
        if s.n_decoded == 0:
            s.t_first = now
        s.n_decoded += 1
        probs: list[TokenProb] = []
        if p.logprobs or p.n_probs > 0:
            lp = log_softmax(logits)
            piece = self.backend.token_to_piece
            top = [(i, piece(i), v) for i, v in top_logprobs(lp, p.n_probs)]
            probs.append(TokenProb(tok, piece(tok), float(lp[tok]), top))
        if self.backend.is_eog(tok) and not p.ignore_eos:
            self._finish(s, "", [tok], probs, "eos")
            return
        text = s.stops.feed(s.detok.add(tok))
        if s.stops.stopped:
            self._finish(s, text, [tok], probs, "word")
        elif 0 <= p.n_predict <= s.n_decoded or len(s.cache) + 1 > s.n_ctx:
            self._finish(s, text, [tok], probs, "limit")
        else:
            s.state = SlotState.GENERATING
            s.next_token = tok
            self._send(task, Event(text=text, tokens=[tok], probs=probs, slot_id=s.id))

    def _finish(self, s: Slot, text: str, tokens: list[int], probs: list[TokenProb], stop_type: str) -> None:
        task = s.task
        assert task is not None and s.detok is not None and s.stops is not None
        if stop_type != "word":
            text += s.stops.feed(s.detok.flush())
            if s.stops.stopped:
                stop_type = "word"
            else:
                text += s.stops.flush()
        now = time.perf_counter()
        t_first = s.t_first or now
        ev = Event(
            text=text,
            tokens=tokens,
            probs=probs,
            done=True,
            finish_reason="length" if stop_type == "limit" else "stop",
            stop_type=stop_type,
            stopping_word=(s.stops.matched or "") if stop_type == "word" else "",
            n_prompt=len(task.prompt),
            n_cached=s.n_cached,
            n_predicted=s.n_decoded,
            prompt_ms=(t_first - s.t_start) * 1e3,
            predicted_ms=(now - t_first) * 1e3,
            slot_id=s.id,
        )
        self.metrics.add_request(
            len(task.prompt) - s.n_cached, t_first - s.t_start, s.n_decoded, now - t_first
        )
        self._send(task, ev)
        self._release(s)

    def _finish_embedding(self, s: Slot) -> None:
        task = s.task
        assert task is not None
        try:
            emb = np.asarray(self.backend.embeddings_seq(s.id), dtype=np.float32)
        except Exception as e:
            self._fail(s, APIError(500, f"embedding failed in slot {s.id}: {type(e).__name__}: {e}"), True)
            return
        now = time.perf_counter()
        self.metrics.add_request(len(task.prompt), now - s.t_start, 0, 0.0)
        ev = Event(
            done=True,
            embedding=emb,
            n_prompt=len(task.prompt),
            prompt_ms=(now - s.t_start) * 1e3,
            slot_id=s.id,
        )
        self._send(task, ev)
        # embeddings are not reused: free the cells for the next request
        self.backend.seq_rm(s.id, -1, -1)
        s.cache.clear()
        self._release(s)

    def _fail(self, s: Slot, err: APIError, drop_cache: bool = False) -> None:
        if s.task is not None:
            self._send(s.task, Event(done=True, error=err, slot_id=s.id))
        if drop_cache:
            try:
                self.backend.seq_rm(s.id, -1, -1)
            except Exception:  # pragma: no cover - the backend is already broken
                log.exception("seq_rm failed")
            s.cache.clear()
        self._release(s)

    def _release(self, s: Slot) -> None:
        # the KV cache keeps what was decoded (even half a prompt): s.cache lists exactly that
        s.task = None
        s.state = SlotState.IDLE
        s.last_used = time.perf_counter()
        s._reset_request()

    def _send(self, task: Task, ev: Event) -> None:
        if task.cancelled:
            return
        try:
            task.sink(ev)
        except Exception:  # the consumer is gone (event loop closed): treat as a disconnect
            task.cancelled = True

    def _update_gauges(self) -> None:
        m = self.metrics
        with m.lock:
            m.requests_processing = sum(1 for s in self.slots if s.task is not None)
            m.requests_deferred = len(self._deferred) + len(self._incoming)
            m.kv_cache_tokens = sum(len(s.cache) for s in self.slots)
            m.kv_cache_usage_ratio = m.kv_cache_tokens / max(1, self.n_ctx_slot * self.n_parallel)


def _prompt_error(n_prompt: int, n_ctx_slot: int) -> APIError:
    if n_prompt == 0:
        return APIError(400, "the prompt is empty (it tokenized to no tokens)", param="prompt")
    return APIError(
        400,
        f"the prompt has {n_prompt} tokens but a slot's context holds {n_ctx_slot} "
        f"(it must leave room for at least one generated token; shorten the prompt or start the server "
        f"with a larger -c or fewer -np)",
        param="prompt",
    )
