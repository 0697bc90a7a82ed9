"""Server counters and their Prometheus text exposition (``/metrics``), named as llama.cpp's."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass
class Metrics:
    """Totals since start; updated by the engine thread, read by request handlers."""

    prompt_tokens_total: int = 0  # prompt tokens evaluated (cached ones excluded)
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

    def add_request(self, n_prompt: int, prompt_s: float, n_predicted: int, predicted_s: float) -> None:
        with self.lock:
            self.requests_total += 1
            self.prompt_tokens_total += n_prompt
            self.prompt_seconds_total += prompt_s
            self.tokens_predicted_total += n_predicted
            self.tokens_predicted_seconds_total += predicted_s

    def prometheus(self, prefix: str = "llamapy") -> str:
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
            rows = [
                (
                    "counter",
                    "prompt_tokens_total",
                    "Number of prompt tokens processed.",
                    self.prompt_tokens_total,
                ),
                ("counter", "prompt_seconds_total", "Prompt process time.", self.prompt_seconds_total),
                (
                    "counter",
                    "tokens_predicted_total",
                    "Number of generation tokens processed.",
                    self.tokens_predicted_total,
                ),
                (
                    "counter",
                    "tokens_predicted_seconds_total",
                    "Predict process time.",
                    self.tokens_predicted_seconds_total,
                ),
                ("counter", "n_decode_total", "Total number of decode calls.", self.n_decode_total),
                ("counter", "requests_total", "Requests completed.", self.requests_total),
                ("counter", "n_draft_total", "Tokens guessed by the draft model.", self.n_draft_total),
                (
                    "counter",
                    "n_draft_accepted_total",
                    "Draft tokens the target model kept.",
                    self.n_draft_accepted_total,
                ),
                ("gauge", "n_busy_slots_per_decode", "Average number of busy slots per decode.", busy),
                ("gauge", "prompt_tokens_seconds", "Average prompt throughput in tokens/s.", pp_rate),
                ("gauge", "predicted_tokens_seconds", "Average generation throughput in tokens/s.", tg_rate),
                (
                    "gauge",
                    "kv_cache_usage_ratio",
                    "KV-cache usage. 1 means 100 percent usage.",
                    self.kv_cache_usage_ratio,
                ),
                ("gauge", "kv_cache_tokens", "KV-cache tokens.", self.kv_cache_tokens),
                ("gauge", "requests_processing", "Number of requests processing.", self.requests_processing),
                ("gauge", "requests_deferred", "Number of requests deferred.", self.requests_deferred),
            ]
        out = []
        for kind, name, help_, value in rows:
            full = f"{prefix}:{name}"
            out += [f"# HELP {full} {help_}", f"# TYPE {full} {kind}", f"{full} {_fmt(value)}"]
        return "\n".join(out) + "\n"


def _fmt(v: float) -> str:
    return str(v) if isinstance(v, int) else repr(float(v))
