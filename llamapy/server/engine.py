"""The engine: one thread owns the model and serves every request through ``n_parallel`` slots.

Each step batches the next token of every generating slot plus chunks of pending prompts (up to
``n_batch`` tokens in all) into one ``decode`` over the multi-sequence KV cache (continuous batching):
a new request starts at the next step without waiting for the others, and a long prompt is evaluated
in chunks between the generating slots' tokens. Slot ``i`` is KV sequence ``i`` and owns
``n_ctx // n_parallel`` cells (as llama.cpp splits ``-c`` over ``-np``). Each slot keeps its tokens in
the KV cache after a request; a new request goes to the idle slot that can keep the most of its prompt
(the common prefix, or on a recurrent memory the last state checkpoint at or before it: ``_reusable``),
and only the rest of the prompt is evaluated.

Request handlers talk to the engine with :meth:`Engine.submit` (a :class:`Task` with a thread-safe
``sink`` that receives :class:`Event` objects) and :meth:`Engine.cancel`; :meth:`Engine.call` runs a
function on the engine thread between two steps (slot save/restore/erase). The choices of an ``n > 1``
request are tasks whose ``leader`` is the first one: they wait for its prompt, then share its KV cells
(``seq_cp``) and sample their first token from its last prompt logits.

With ``context_shift`` (``llamapy serve --context-shift``), a slot whose context fills while generating
drops ``n_discard`` tokens after its first ``n_keep`` ones and moves the rest down (``seq_rm`` +
``seq_add``, the arithmetic of :func:`llamapy.generation.context_shift_plan`, shared with the ``Llama``
API), and a prompt that does not fit is truncated (:func:`llamapy.generation.truncate_prompt`), as
llama-server does. The request's ``n_keep``/``n_discard`` are range-checked when the request is parsed
(a 400) and clamped again here against what the slot holds, so no value reaches the KV cache out of
bounds. Prompts are then never shared between slots with ``seq_cp``: shifting a sequence moves the
positions of every cell it holds, and a shared cell would move under the other sequence too.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import field
from enum import Enum
from typing import Any

import numpy as np

from .._dataclass import dataclass
from ..generation import (
    ContextFullError,
    Generation,
    GenerationParams,
    Step,
    checkpoint_positions,
    common_prefix_length,
    context_shift_plan,
    truncate_prompt,
)
from .backend import Backend
from .errors import APIError, context_error
from .lora import resolve as resolve_lora
from .metrics import Metrics
from .sampling import SamplingParams, make_chain

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
    post_sampling_probs: bool = False  # report probabilities after the sampler chain instead (llama-server)
    return_progress: bool = False  # send prompt_progress events while the prompt is evaluated (streams)
    cache_prompt: bool = True
    id_slot: int = -1
    grammar: Any = None  # a llamapy.grammar.LlamaGrammar constraining the output
    chat_format: Any = None  # a llamapy.chat.ChatFormat parsing tool calls and reasoning
    chat_syntax: Any = None  # its llamapy.chat.ChatSyntax for this request
    preserved_tokens: list[int] = field(default_factory=list)  # special tokens kept as text
    # context shift (with Engine(context_shift=True)): prompt tokens kept at the start (-1: the whole
    # prompt; BOS is kept on top, as llama-server does), and tokens dropped per shift (0: half the rest)
    n_keep: int = 0
    n_discard: int = 0
    lora: dict[int, float] | None = None  # this request's LoRA scales by adapter id (lora.py)
    # image chunks (llamapy.mtmd) by the pseudo token of their first position: the prompt holds negative
    # pseudo tokens where an image goes (llamapy.mtmd.prompt), decoded as embeddings by backend.mtmd
    images: dict[int, Any] | None = None
    # llama-server's line stops (code completion clients): lines indented less than n_indent end the answer;
    # past t_max_predict_ms, so does the next newline (0: off; llamapy.generation.text.LineLimits)
    n_indent: int = 0
    t_max_predict_ms: float = 0


@dataclass
class TokenProb:
    id: int
    piece: bytes
    logprob: float  # (with post_sampling: the probability after the sampler chain)
    top: list[tuple[int, bytes, float]]
    post_sampling: bool = False  # llama-server's post_sampling_probs: plain probabilities, not logs


@dataclass
class Event:
    """A piece of a task's answer. ``done`` marks the last one (then the statistics are set)."""

    text: str = ""
    tokens: list[int] = field(default_factory=list)
    probs: list[TokenProb] = field(default_factory=list)
    done: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "tool_calls"
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
    truncated: bool = False  # the prompt was cut to fit the slot (context shift)
    n_shifted: int = 0  # tokens dropped by context shifts during this request
    draft_n: int = 0  # speculative decoding: tokens the draft model guessed / the ones kept
    draft_n_accepted: int = 0
    deltas: list[Any] = field(
        default_factory=list
    )  # chat deltas (llamapy.chat.ChatDelta), with a chat format
    message: Any = None  # on the last event, with a chat format: the parsed message
    # a prompt_progress event (GenParams.return_progress), no token: llama-server's {"total", "cache",
    # "processed", "time_ms"} of the prompt evaluation so far
    progress: dict[str, int] | None = None


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
    # n > 1: a follower starts from its leader's evaluated prompt (seq_cp of its KV and a copy of the
    # prompt's last logits) instead of evaluating the same prompt again
    leader: Task | None = None
    share_prompt: bool = False  # this task is a leader: keep its prompt's logits for the followers
    prompt_logits: np.ndarray | None = None
    prompt_slot: int = -1
    finished: bool = False


class SlotState(Enum):
    IDLE = "idle"
    PROMPT = "processing prompt"
    GENERATING = "generating"


class Slot:
    def __init__(self, id: int, n_ctx: int) -> None:
        self.id = id
        self.n_ctx = n_ctx
        self.cache: list[int] = []  # exactly the tokens the KV cache holds for sequence `id`
        self.cache_lora: tuple[float, ...] = ()  # the LoRA scales the cached tokens were computed with
        self.lora: tuple[float, ...] = ()  # the scales of the current request
        self.state = SlotState.IDLE
        self.task: Task | None = None
        self.last_used = 0.0
        self._reset_request()

    def _reset_request(self) -> None:
        self.gen: Generation | None = None  # the request's token loop state
        self.next_token = -1
        self.n_cached = 0
        self.n_decoded = 0
        self.n_keep = 0  # tokens a context shift keeps at the start (clamped for this slot)
        self.n_shifted = 0  # tokens dropped by context shifts in this request
        self.draft: list[int] = []  # the draft model's guesses in the batch being decoded
        self.checkpoints: list[int] = []  # prompt positions after which to checkpoint the state
        self.n_draft = self.n_draft_accepted = 0  # guesses made / kept in this request
        self.truncated = False
        self.n_image_cells = 0  # KV cells of the request's images beyond their positions (M-RoPE)
        self.t_start = self.t_first = 0.0


class Engine:
    """Owns the backend; serves tasks from a worker thread (see the module docstring)."""

    def __init__(
        self,
        backend: Backend,
        n_batch: int | None = None,
        metrics: Metrics | None = None,
        context_shift: bool = False,
        cache_reuse: int = 0,
    ) -> None:
        self.backend = backend
        self.context_shift = bool(context_shift)
        self.cache_reuse = max(0, int(cache_reuse))  # --cache-reuse: least chunk re-used by shifting
        self._bos = list(backend.tokenize("", True, False))[:1]  # what the tokenizer starts a text with
        self.n_parallel = max(1, int(backend.n_seq_max))
        self.n_ctx_slot = int(backend.n_ctx) // self.n_parallel
        self.n_batch = min(int(n_batch or backend.n_batch), int(backend.n_batch))  # tokens per step
        self.slots = [Slot(i, self.n_ctx_slot) for i in range(self.n_parallel)]
        lora_info = getattr(backend, "lora_info", None)
        self.lora_scales: list[float] = [float(a["scale"]) for a in lora_info()] if lora_info else []
        self._lora_active: tuple[float, ...] | None = None  # what the backend applies now
        make_draft = getattr(backend, "make_draft", None)  # speculative decoding: one draft per slot
        self._drafts: list[Any] = [make_draft() if make_draft else None for _ in self.slots]
        self.metrics = metrics or Metrics()
        self._cond = threading.Condition()
        self._incoming: deque[Task] = deque()
        self._deferred: deque[Task] = deque()
        self._calls: deque[tuple[Callable[[Engine], Any], Future]] = deque()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="llamapy-engine", daemon=True)

    # -- called from request handlers (any thread) ----------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def warmup(self, n_prompt: int = 24, n_predict: int = 3) -> None:
        """Run once every kernel the steps will use, on the engine thread (OpenMP gives each launching
        thread its own worker pool: warmed from another thread, the first request still paid ~0.4 s),
        so that the first request pays no kernel compilation or cache loading (llama-server warms up
        before ``/health`` is ok too): the backend's own ``warmup()`` when it has one, then through the
        real step loop 1, 2, ..., ``n_parallel`` concurrent requests of an ``n_prompt``-token prompt and
        ``n_predict`` tokens each (greedy and sampled: decode batches of each size up to ``n_parallel``,
        mixed prompt batches), and last the backend's ``warmed_up()`` when it has one. Slots, KV cache
        and metrics are left as they were (empty). Call after
        :meth:`start` and before any task is submitted; blocks until done."""
        if threading.current_thread() is not self._thread:
            if not self._thread.is_alive():
                raise RuntimeError("Engine.warmup() runs on the engine thread: call Engine.start() first")
            self.call(lambda e: e.warmup(n_prompt, n_predict)).result()
            return
        fn = getattr(self.backend, "warmup", None)
        if callable(fn):
            fn()
        text = "The quick brown fox jumps over the lazy dog. " * (1 + n_prompt // 8)
        n = max(1, min(n_prompt, self.n_ctx_slot - n_predict - 1))
        prompt = list(self.backend.tokenize(text, True, False))[:n]
        metrics, self.metrics = self.metrics, Metrics()
        try:
            for k in range(1, self.n_parallel + 1):
                for i in range(k):
                    sp = SamplingParams(temp=0.0) if i % 2 == 0 else SamplingParams(seed=i)
                    gp = GenParams(n_predict=n_predict, sampling=sp, ignore_eos=True, cache_prompt=False)
                    kind = "embedding" if getattr(self.backend, "embeddings", False) else "completion"
                    task = Task(prompt=list(prompt), params=gp, sink=lambda ev: None, kind=kind)
                    self._deferred.append(task)
                for _ in range(4 * (n_predict + len(prompt) * k // max(1, self.n_batch) + 2)):
                    if not self._has_work():
                        break
                    self._step()
        finally:
            self.metrics = metrics
            self._deferred.clear()
            for s in self.slots:
                if s.task is not None:
                    self._release(s)
                self.backend.seq_rm(s.id, -1, -1)
            self.slots = [Slot(i, self.n_ctx_slot) for i in range(self.n_parallel)]  # nothing cached
        done = getattr(self.backend, "warmed_up", None)
        if callable(done):
            done()

    def stop(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def idle(self) -> bool:
        """No task in a slot, waiting or just submitted (router mode may unload an idle model)."""
        with self._cond:
            return not self._incoming and not self._calls and not self._has_work()

    def submit(self, task: Task) -> None:
        with self._cond:
            self._incoming.append(task)
            self._cond.notify_all()

    def cancel(self, task: Task) -> None:
        """Abandon a task (client gone): its slot is freed at the start of the next step."""
        task.cancelled = True
        with self._cond:
            self._cond.notify_all()

    def call(self, fn: Callable[[Engine], Any]) -> Future:
        """Run ``fn(engine)`` on the engine thread between two steps (never during a decode); the
        future holds its result or exception (slot save/restore/erase use this)."""
        fut: Future = Future()
        with self._cond:
            if self._stopping:
                fut.set_exception(APIError(503, "the server is shutting down"))
                return fut
            self._calls.append((fn, fut))
            self._cond.notify_all()
        return fut

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
                "n_keep": s.n_keep,
                "n_shifted": s.n_shifted,
                "next_token": {
                    "has_next_token": s.state is SlotState.GENERATING,
                    "n_decoded": s.n_decoded,
                    "n_remain": (task.params.n_predict - s.n_decoded)
                    if task and task.params.n_predict >= 0
                    else -1,
                },
            }
            if verbose:
                d["cache_text"] = self.backend.detokenize([t for t in s.cache if t >= 0])
                d["prompt_tokens"] = list(task.prompt) if task else []
            out.append(d)
        return out

    # -- the engine thread ----------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and not self._incoming and not self._calls and not self._has_work():
                    self._cond.wait()
                if self._stopping:
                    break
                self._deferred.extend(self._incoming)
                self._incoming.clear()
                calls = list(self._calls)
                self._calls.clear()
            for fn, fut in calls:
                try:
                    fut.set_result(fn(self))
                except BaseException as e:
                    fut.set_exception(e)
            try:
                self._step()
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as e:  # never let one bad step kill the server (a Rust panic included)
                log.exception("engine step failed")
                for s in self.slots:
                    if s.task is not None:
                        code = int(getattr(e, "http_status", 500))  # 503: a pipeline stage was lost
                        self._fail(
                            s, APIError(code, f"internal error in slot {s.id}: {type(e).__name__}: {e}")
                        )
        for s in self.slots:
            if s.task is not None:
                self._fail(s, APIError(503, "the server is shutting down"))
        for t in list(self._deferred) + list(self._incoming):
            self._send(t, Event(done=True, error=APIError(503, "the server is shutting down")))
        with self._cond:
            calls = list(self._calls)
            self._calls.clear()
        for _, fut in calls:
            fut.set_exception(APIError(503, "the server is shutting down"))

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
        checkpoint_slots: list[Slot] = []  # recurrent states to keep after this decode
        progress_slots: list[Slot] = []  # prompts evaluated in this decode, reporting their progress
        # one set of LoRA scales per batch: the oldest active request's (llama-server's can_batch_with)
        busy = [s for s in self.slots if s.task is not None and s.state is not SlotState.IDLE]
        lora = min(busy, key=lambda s: s.task.t_submit).lora if busy else ()
        for s in self.slots:
            if s.state is SlotState.GENERATING and s.lora == lora:
                s.draft = self._draft(s, self.n_batch - len(tokens) - 1)
                p0 = len(s.cache)
                for j, t in enumerate([s.next_token, *s.draft]):  # with a draft model: its guesses too
                    tokens.append(t)
                    pos.append(p0 + j)
                    seqs.append(s.id)
                    outs.append(True)
                    s.cache.append(t)
                sample_slots.append(s)
        budget = self.n_batch - len(tokens)
        prompting = sorted(
            (s for s in self.slots if s.state is SlotState.PROMPT), key=lambda s: s.task.t_submit
        )
        for s in prompting:
            if budget <= 0:
                break
            if s.lora != lora:
                continue
            task = s.task
            assert task is not None
            rest = task.prompt[len(s.cache) :]
            if task.kind == "embedding" and len(rest) > budget:
                continue  # an embedding needs its whole input in one decode
            if task.params.images and rest[0] < 0:  # an image: decoded on its own, as embeddings
                self._eval_image(s, task)
                continue
            chunk = rest[: min(budget, _text_len(task, rest))]
            p0 = len(s.cache)
            while s.checkpoints and s.checkpoints[0] <= p0:
                s.checkpoints.pop(0)
            if s.checkpoints and p0 + len(chunk) >= s.checkpoints[0]:  # stop there to checkpoint
                chunk = chunk[: s.checkpoints.pop(0) - p0]
                checkpoint_slots.append(s)
            done = len(chunk) == len(rest)
            for j, t in enumerate(chunk):
                tokens.append(t)
                pos.append(p0 + j)
                seqs.append(s.id)
                outs.append(task.kind == "embedding" or (done and j == len(chunk) - 1))
            s.cache.extend(chunk)
            budget -= len(chunk)
            if task.params.return_progress:
                progress_slots.append(s)
            if done:
                (embed_slots if task.kind == "embedding" else sample_slots).append(s)
        if not tokens:
            return
        try:
            if lora != self._lora_active and hasattr(self.backend, "set_lora"):
                self.backend.set_lora(lora)
                self._lora_active = lora
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
        for s in progress_slots:  # (before the prompt's first token, as llama-server's post_decode)
            self._progress(s)
        row = 0
        for s in sample_slots:
            draft, s.draft = s.draft, []
            first, row = row, row + 1 + len(draft)
            if s.task is None:
                continue
            t = s.task
            if t.share_prompt and t.prompt_logits is None and s.state is SlotState.PROMPT:
                t.prompt_logits, t.prompt_slot = np.array(logits[first], dtype=np.float32), s.id
            try:
                if draft:
                    self._verify(s, draft, logits[first:row])
                else:
                    self._sample(s, logits[first])
            except Exception as e:
                log.exception("sampling failed")
                self._fail(s, APIError(500, f"sampling failed in slot {s.id}: {type(e).__name__}: {e}"))
        for s in embed_slots:
            self._finish_embedding(s)
        for s in checkpoint_slots:
            self.backend.checkpoint(s.id)

    def _eval_image(self, s: Slot, task: Task) -> None:
        p0 = len(s.cache)
        mt = getattr(self.backend, "mtmd", None)
        img = (task.params.images or {}).get(task.prompt[p0])
        if mt is None or img is None:
            self._fail(s, APIError(500, f"slot {s.id}: no image for prompt position {p0}"), drop_cache=True)
            return
        n_pos = img.n_pos  # the positions it takes (M-RoPE: max(rows, cols), fewer than its tokens)
        last = p0 + n_pos == len(task.prompt)
        try:
            mt.eval_chunks(self.backend.ctx, [img], p0, seq_id=s.id, logits_last=last)  # type: ignore[attr-defined]
        except Exception as e:
            log.exception("image decode failed")
            self._fail(s, APIError(500, f"image decode failed in slot {s.id}: {e}"), drop_cache=True)
            return
        s.cache.extend(task.prompt[p0 : p0 + n_pos])
        self._progress(s)
        if last:  # the prompt ends with the image: sample from its last position
            self._sample(s, np.array(self.backend.ctx.get_logits_ith(-1), dtype=np.float32))  # type: ignore[attr-defined]

    def _assign(self) -> None:
        for task in list(self._deferred):
            lead = task.leader
            if lead is not None and not (lead.prompt_logits is not None or lead.finished or lead.cancelled):
                continue  # wait for the leader's prompt (a leader that failed: evaluate it here)
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
            n_reuse = {s.id: self._reusable(s, task.prompt) for s in idle}
            best = max(idle, key=lambda s: (n_reuse[s.id], -s.last_used))
            n = n_reuse[best.id]
            if n > 0 and n >= SLOT_PROMPT_SIMILARITY * len(task.prompt):
                return best
        return min(idle, key=lambda s: s.last_used)

    def _reusable(self, s: Slot, prompt: list[int]) -> int:
        """Prompt tokens slot ``s`` can keep: the common prefix, or with a recurrent state (which goes
        back only to a checkpoint) the last checkpoint at or before it."""
        n = common_prefix_length(s.cache, prompt)
        restorable = getattr(self.backend, "seq_pos_restorable", None)
        if restorable is not None and getattr(self.backend, "has_checkpoints", False):
            n = min(n, len(prompt) - 1)
            if n < len(s.cache):
                n = int(restorable(s.id, n))
        return n

    def _start(self, s: Slot, task: Task) -> None:
        s._reset_request()
        s.task = task
        s.t_start = time.perf_counter()
        if not task.prompt or (len(task.prompt) >= s.n_ctx and not self._may_truncate(task, s)):
            self._fail(s, _prompt_error(len(task.prompt), s.n_ctx))
            return
        if task.kind == "completion":
            s.n_keep = self._n_keep(task, s)
            # an M-RoPE image takes rows * cols KV cells at max(rows, cols) positions: count the cells
            ims = task.params.images or {}
            s.n_image_cells = sum(ims[t].n_tokens - ims[t].n_pos for t in task.prompt if t < 0 and t in ims)
            n_cells = len(task.prompt) + s.n_image_cells
            if n_cells >= s.n_ctx and task.params.images:  # never cut a prompt inside an image
                self._fail(s, _prompt_error(n_cells, s.n_ctx))
                return
            if len(task.prompt) >= s.n_ctx:
                task.prompt = truncate_prompt(task.prompt, s.n_ctx, s.n_keep)
                s.truncated = True
        s.lora = resolve_lora(task.params.lora, self.lora_scales)
        if task.kind == "embedding" or s.cache_lora != s.lora:  # other adapters: the cache is stale
            n_keep = 0
        else:
            n_keep = common_prefix_length(s.cache, task.prompt) if task.params.cache_prompt else 0
            n_keep = min(n_keep, len(task.prompt) - 1)  # evaluate at least one token for its logits
            if task.params.images:  # never keep part of an image: it is decoded whole
                from ..mtmd.prompt import snap_prefix

                n_keep = snap_prefix(task.prompt, n_keep)
        if self.cache_reuse and n_keep and task.kind == "completion":
            n_keep = self._reuse_chunks(s, task.prompt, n_keep)
        restorable = getattr(self.backend, "seq_pos_restorable", None)
        if restorable is not None and n_keep < len(s.cache):  # a recurrent state: back to a checkpoint
            n_keep = min(n_keep, int(restorable(s.id, n_keep)))
        if not self.backend.seq_rm(s.id, n_keep, -1):
            self.backend.seq_rm(s.id, -1, -1)
            n_keep = 0
        del s.cache[n_keep:]
        s.checkpoints = (
            checkpoint_positions(n_keep, len(task.prompt))
            if task.kind == "completion" and getattr(self.backend, "has_checkpoints", False)
            else []
        )
        s.cache_lora = s.lora
        s.n_cached = n_keep
        s.state = SlotState.PROMPT
        if task.kind == "completion":
            p = task.params
            try:
                s.gen = self._generation(p, s.n_ctx)
                s.gen.accept_prompt(task.prompt)  # as llama.cpp: penalties and DRY see the prompt too
            except Exception as e:
                self._fail(s, APIError(400, f"invalid sampling parameters: {e}"))
                return
            shared = task.leader is not None and not self.context_shift and self._share_prompt(s, task)
            self._progress(s)  # (as llama-server: the first event tells what the cache already holds)
            if shared:
                lead = task.leader
                assert lead is not None and lead.prompt_logits is not None
                self._sample(s, lead.prompt_logits.copy())

    def _reuse_chunks(self, s: Slot, prompt: list[int], n_past: int) -> int:
        """llama-server's ``--cache-reuse``: after the common prefix, find runs of at least
        ``cache_reuse`` tokens of the prompt further on in the slot's cache and move their KV cells to the
        prompt's positions (``seq_rm`` of the gap, ``seq_add`` of the run) instead of evaluating them
        again. ``s.cache`` is rewritten to match; returns the prompt tokens now cached (the caller cuts
        the rest, and keeps at least one prompt token to evaluate)."""
        cache, b = s.cache, self.backend
        head_c = head_p = n_past
        while head_c < len(cache) and head_p < len(prompt) - 1:
            n = 0
            while (
                head_c + n < len(cache)
                and head_p + n < len(prompt) - 1
                and cache[head_c + n] == prompt[head_p + n]
            ):
                n += 1
            if n < self.cache_reuse:
                head_c += 1
                continue
            try:
                if not b.seq_rm(s.id, head_p, head_c):
                    break
                b.seq_add(s.id, head_c, head_c + n, head_p - head_c)
            except Exception:
                log.exception("cache reuse failed in slot %d: evaluating the rest of the prompt", s.id)
                b.seq_rm(s.id, head_p, -1)
                del cache[head_p:]
                return head_p
            cache[head_p : head_c + n] = cache[head_c : head_c + n]
            head_c = head_p = head_p + n
            n_past = head_p
        return n_past

    def _share_prompt(self, s: Slot, task: Task) -> bool:
        """Start ``task`` in slot ``s`` from its leader's evaluated prompt: the prompt's KV cells are
        shared with ``seq_cp`` (no copy of the data) and the first token is sampled from the leader's
        last prompt logits. False (evaluate the prompt as usual) when the leader's slot no longer holds
        the prompt, its recurrent state has gone past it, or ``s`` is that slot."""
        lead = task.leader
        assert lead is not None
        if lead.prompt_logits is None or lead.prompt_slot in (-1, s.id):
            return False
        src, n = self.slots[lead.prompt_slot], len(task.prompt)
        if src.cache[:n] != task.prompt:
            return False
        if len(src.cache) != n and getattr(self.backend, "has_checkpoints", False):
            return False  # a recurrent state past the prompt (the leader went on): it cannot be cut back
        try:
            self.backend.seq_rm(s.id, -1, -1)
            s.cache.clear()
            self.backend.seq_cp(src.id, s.id, 0, n)
        except Exception:
            log.exception("seq_cp failed: evaluating the prompt in slot %d instead", s.id)
            self.backend.seq_rm(s.id, -1, -1)
            s.cache.clear()
            s.n_cached = 0
            return False
        s.cache[:] = task.prompt
        s.n_cached = n
        return True

    def _generation(self, p: GenParams, n_ctx: int) -> Generation:
        b = self.backend
        vocab = getattr(b, "vocab", None)
        grammar = p.grammar.sampler(vocab) if p.grammar is not None else None
        chain = make_chain(p.sampling, b.n_vocab, n_ctx, vocab, grammar=grammar)
        parser = p.chat_format.parser(p.chat_syntax) if p.chat_format is not None else None
        gp = GenerationParams(
            max_tokens=p.n_predict,
            stop=p.stop,
            ignore_eos=p.ignore_eos,
            n_probs=p.n_probs,
            logprobs=p.logprobs,
            post_sampling_probs=p.post_sampling_probs,
            preserved_tokens=p.preserved_tokens,
            n_indent=p.n_indent,
            t_max_predict_ms=p.t_max_predict_ms,
        )
        return Generation(b, chain, gp, grammar=grammar, parser=parser)

    def _sample(self, s: Slot, logits: np.ndarray) -> None:
        task, gen = s.task, s.gen
        assert task is not None and gen is not None
        step = gen.step(logits)
        now = time.perf_counter()
        if s.n_decoded == 0:
            s.t_first = now
        s.n_decoded = gen.n_generated
        n_cells = len(s.cache) + s.n_image_cells
        full = step.finish_reason is None and not gen.limit_reached and n_cells + 1 > s.n_ctx
        if full and self.context_shift:
            full = not self._shift(s)
        if step.finish_reason is None and (gen.limit_reached or full):
            self._finish(s, [step, gen.finish("length", "limit")])
        elif step.finish_reason is not None:
            self._finish(s, [step])
        else:
            assert step.token is not None
            s.state = SlotState.GENERATING
            s.next_token = step.token
            self._send(task, self._event(step, s))

    def _draft(self, s: Slot, room: int) -> list[int]:
        """The draft model's guesses after ``s.next_token`` (none without one): as many as fit the batch
        ``room``, the slot (no context shift in between) and the request's ``n_predict``."""
        draft_model = self._drafts[s.id]
        if draft_model is None or s.gen is None or s.task is None:
            return []
        n_max = min(room, s.n_ctx - len(s.cache) - 2)
        if s.task.params.n_predict >= 0:
            n_max = min(n_max, s.task.params.n_predict - s.n_decoded - 1)
        from ..generation.speculative import draft_tokens

        try:
            guess = draft_tokens(draft_model, [*s.cache, s.next_token], self.backend.n_vocab, n_max)
        except Exception:
            log.exception("the draft model failed in slot %d: generating without it", s.id)
            return []
        s.n_draft += len(guess)
        return guess

    def _verify(self, s: Slot, draft: list[int], rows: np.ndarray) -> None:
        """Sample row after row of a drafted batch (``rows[j]``: the logits after the j-th token of
        ``[next_token, *draft]``): a guess is kept while the sampler picks it; the cache is cut back
        after the last kept one. Each token is sampled from the logits of exactly the tokens before
        it, so the output is what generation without a draft gives."""
        p0 = len(s.cache) - len(draft) - 1  # the position of next_token
        j = 0
        for j in range(len(draft) + 1):
            self._sample(s, rows[j])
            if j == len(draft) or s.state is not SlotState.GENERATING or s.next_token != draft[j]:
                break
            s.n_draft_accepted += 1
        keep = p0 + 1 + j  # next_token and the guesses kept
        if keep < len(s.cache):
            del s.cache[keep:]
            if not self.backend.seq_rm(s.id, keep, -1):  # a memory that cannot roll back (no drafts there)
                self.backend.seq_rm(s.id, -1, -1)
                s.cache.clear()
                if s.task is not None:
                    self._fail(
                        s, APIError(500, f"slot {s.id}: the rejected draft tokens could not be removed")
                    )

    def _may_truncate(self, task: Task, s: Slot) -> bool:
        return self.context_shift and task.kind == "completion" and s.n_ctx >= 4

    def _n_keep(self, task: Task, s: Slot) -> int:
        """The request's ``n_keep`` for this slot: -1 is the whole prompt; BOS counts on top (as in
        llama-server); at most ``n_ctx - 4``, so a shift always has tokens to drop."""
        n = task.params.n_keep
        if n < 0:
            n = len(task.prompt)
        elif n > 0 and self._bos and task.prompt[:1] == self._bos:
            n += 1
        return max(0, min(n, s.n_ctx - 4))

    def _shift(self, s: Slot) -> bool:
        """Make room in a full slot: drop ``n_discard`` tokens after the first ``n_keep`` and move the
        rest down. False (the request then ends with "length") when nothing can be dropped or the
        memory cannot remove the range (a sliding-window cache that no longer holds what it needs)."""
        task = s.task
        assert task is not None
        n_past = len(s.cache)
        try:
            n_keep, n_discard = context_shift_plan(n_past, s.n_keep, task.params.n_discard)
        except ContextFullError:
            return False
        if any(t < 0 for t in s.cache[n_keep:]):  # an image would be cut or moved (its cells' M-RoPE
            return False  # rows and columns too): as llama-server, which shifts no multimodal context
        b = self.backend
        try:
            if not b.seq_rm(s.id, n_keep, n_keep + n_discard):
                return False
            b.seq_add(s.id, n_keep + n_discard, n_past, -n_discard)
        except Exception:
            b.seq_rm(s.id, -1, -1)  # the cells are in an unknown state: start the slot afresh
            s.cache.clear()
            raise
        del s.cache[n_keep : n_keep + n_discard]
        s.n_shifted += n_discard
        log.info("slot %d: context shift, kept %d, dropped %d of %d tokens", s.id, n_keep, n_discard, n_past)
        return True

    def _event(self, step: Step, s: Slot) -> Event:
        """An event for one step (token, text, log-probabilities, chat deltas)."""
        tokens = [t for t in (step.token, step.eog_token) if t is not None]
        probs = []
        if step.logprob is not None:
            piece = self.backend.token_to_piece
            lp = step.logprob
            top = [(i, piece(i), v) for i, v in lp.top]
            probs.append(TokenProb(lp.token, piece(lp.token), lp.logprob, top, lp.post_sampling))
        ev = Event(text=step.text, tokens=tokens, probs=probs, slot_id=s.id, deltas=list(step.deltas))
        self._stats(ev, s, time.perf_counter())
        return ev

    def _progress(self, s: Slot) -> None:
        """A prompt_progress event (with ``return_progress``): llama-server's ``total`` prompt tokens,
        ``cache`` (those kept from the slot's cache), ``processed`` (in the cache now) and ``time_ms``
        since the request started."""
        task = s.task
        if task is None or not task.params.return_progress:
            return
        now = time.perf_counter()
        progress = {
            "total": len(task.prompt),
            "cache": s.n_cached,
            "processed": len(s.cache),
            "time_ms": int((now - s.t_start) * 1e3),
        }
        ev = Event(slot_id=s.id, progress=progress)
        self._stats(ev, s, now)
        self._send(task, ev)

    @staticmethod
    def _stats(ev: Event, s: Slot, now: float) -> None:
        """The statistics so far (every event has them: llama-server's ``timings_per_token``)."""
        assert s.task is not None
        t_first = s.t_first or now
        ev.n_prompt = len(s.task.prompt)
        ev.n_cached = s.n_cached
        ev.n_predicted = s.n_decoded
        ev.prompt_ms = (t_first - s.t_start) * 1e3
        ev.predicted_ms = (now - t_first) * 1e3

    def _finish(self, s: Slot, steps: list[Step]) -> None:
        task = s.task
        assert task is not None
        ev = self._event(steps[0], s)
        for extra in steps[1:]:
            more = self._event(extra, s)
            ev.text += more.text
            ev.tokens += more.tokens
            ev.probs += more.probs
            ev.deltas += more.deltas
        last = steps[-1]
        now = time.perf_counter()
        t_first = s.t_first or now
        ev.done = True
        ev.finish_reason = last.finish_reason
        ev.stop_type = last.stop_type
        ev.stopping_word = last.stopping_word
        ev.message = last.message
        self._stats(ev, s, now)
        ev.truncated, ev.n_shifted = s.truncated, s.n_shifted
        ev.draft_n, ev.draft_n_accepted = s.n_draft, s.n_draft_accepted
        if s.n_draft:
            with self.metrics.lock:
                self.metrics.n_draft_total += s.n_draft
                self.metrics.n_draft_accepted_total += s.n_draft_accepted
        n_pp = len(task.prompt) - s.n_cached
        self.metrics.add_request(
            n_pp, t_first - s.t_start, s.n_decoded, now - t_first, s.n_cached, len(s.cache)
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
        if s.task is not None:
            s.task.finished = True
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


def _text_len(task: Task, rest: list[int]) -> int:
    """Tokens of ``rest`` before the next image position (all of them without images)."""
    if not task.params.images:
        return len(rest)
    return next((i for i, t in enumerate(rest) if t < 0), len(rest))


def _prompt_error(n_prompt: int, n_ctx_slot: int) -> APIError:
    if n_prompt == 0:
        return APIError(400, "the prompt is empty (it tokenized to no tokens)", param="prompt")
    return context_error(n_prompt, n_ctx_slot)
