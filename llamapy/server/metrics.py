"""Server counters and their Prometheus text exposition (``/metrics``), named as llama-server's
(``llamacpp:prompt_tokens_total`` ...)."""

from __future__ import annotations

import threading
from dataclasses import field

from .._dataclass import dataclass


@dataclass
class Metrics:
    """Totals since start; updated by the engine thread, read by request handlers."""

    prompt_tokens_total: int = 0  # prompt tokens evaluated (cached ones excluded)
    prompt_tokens_cached_total: int = 0  # prompt tokens reused from the cache
    n_tokens_max: int = 0  # the longest sequence a request left in its slot
    prompt_seconds_total: float = 0.0
    tokens_predicted_total: int = 0
    tokens_predicted_seconds_total: float = 0.0
    n_decode_total: int = 0
    n_busy_slots_total: int = 0  # summed over decodes
    requests_total: int = 0
    n_draft_total: int = 0  # speculative decoding: tokens guessed by the draft model / kept
    n_draft_accepted_total: int = 0
    requests_processing: int = 0
    requests_deferred: int = 0
    kv_cache_tokens: int = 0
    kv_cache_usage_ratio: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add_request(
        self,
        n_prompt: int,
        prompt_s: float,
        n_predicted: int,
        predicted_s: float,
        n_cached: int = 0,
        n_tokens: int = 0,
    ) -> None:
        """A finished request: ``n_prompt`` tokens evaluated (``n_cached`` more reused from the cache),
        ``n_predicted`` generated; ``n_tokens``: the sequence it left in its slot."""
        with self.lock:
            self.requests_total += 1
            self.prompt_tokens_total += n_prompt
            self.prompt_tokens_cached_total += n_cached
            self.prompt_seconds_total += prompt_s
            self.tokens_predicted_total += n_predicted
            self.tokens_predicted_seconds_total += predicted_s
            self.n_tokens_max = max(self.n_tokens_max, n_tokens)

    def prometheus(self, prefix: str = "llamacpp") -> str:
        """The Prometheus text: llama-server 0.3.36's metrics (its names, help texts and order; not its
        ``spec_decode_num_drafts_total``, which llamapy does not count), then llamapy's own
        (``requests_total``, ``kv_cache_tokens``, ``kv_cache_usage_ratio``)."""
        with self.lock:
            pp_rate = (
                self.prompt_tokens_total / self.prompt_seconds_total if self.prompt_seconds_total else 0.0
            )
            tg_rate = (
                self.tokens_predicted_total / self.tokens_predicted_seconds_total
                if self.tokens_predicted_seconds_total
                else 0.0
            )
            busy = self.n_busy_slots_total / self.n_decode_total if self.n_decode_total else 0.0
            counters = [
                ("prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens",
                 self.prompt_tokens_total),
                ("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache",
                 self.prompt_tokens_cached_total),
                ("prompt_seconds_total", "Total time spent processing prompts", self.prompt_seconds_total),
                ("tokens_predicted_total", "Number of generation tokens processed", self.tokens_predicted_total),
                ("tokens_predicted_seconds_total", "Total time spent generating tokens",
                 self.tokens_predicted_seconds_total),
                ("n_decode_total", "Total number of llama_decode() calls", self.n_decode_total),
                ("n_tokens_max", "Largest observed sequence length (prompt + generation)", self.n_tokens_max),
                ("spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated",
                 self.n_draft_total),
                ("spec_decode_num_accepted_tokens_total",
                 "Speculative: Total draft tokens accepted by the target model", self.n_draft_accepted_total),
                ("requests_total", "Requests completed.", self.requests_total),
            ]  # fmt: skip
            gauges = [
                ("prompt_tokens_seconds", "Average prompt throughput in tokens/s", pp_rate),
                ("predicted_tokens_seconds", "Average generation throughput in tokens/s", tg_rate),
                ("requests_processing", "Number of requests processing", self.requests_processing),
                ("requests_deferred", "Number of requests deferred", self.requests_deferred),
                ("n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call", busy),
                ("kv_cache_usage_ratio", "KV-cache usage. 1 means 100 percent usage.", self.kv_cache_usage_ratio),
                ("kv_cache_tokens", "KV-cache tokens.", self.kv_cache_tokens),
            ]  # fmt: skip
        out = []
        for kind, rows in (("counter", counters), ("gauge", gauges)):
            for name, help_, value in rows:
                full = f"{prefix}:{name}"
                out += [f"# HELP {full} {help_}", f"# TYPE {full} {kind}", f"{full} {_fmt(value)}"]
        return "\n".join(out) + "\n"


def _fmt(v: float) -> str:
    return str(v) if isinstance(v, int) else repr(float(v))
