"""A tiny deterministic stand-in for the model, implementing llamapy.server.backend.Backend.

Tokens 0..255 are bytes, 256 is BOS and 257 EOS. The "model" keeps a real per-sequence KV list and
checks positions like a KV cache would, so the engine's cache bookkeeping is tested for real: after a
sequence s the next token is s[len(s) // 2] (BOS counts as "a"), and after "!" it is EOS.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

BOS, EOS, N_VOCAB = 256, 257, 258
FAIL_BYTE = 7  # a batch containing this byte makes decode raise
FAKE_TEMPLATE = (
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def next_token(seq: Sequence[int]) -> int:
    if seq[-1] == ord("!"):
        return EOS
    t = seq[len(seq) // 2]
    return ord("a") if t == BOS else t


def reference(prompt: Sequence[int], n: int) -> list[int]:
    """What greedy generation must give for ``prompt`` (at most ``n`` tokens, stopping after EOS)."""
    seq, out = list(prompt), []
    for _ in range(n):
        t = next_token(seq)
        out.append(t)
        if t == EOS:
            break
        seq.append(t)
    return out


class FakeBackend:
    def __init__(self, n_ctx: int = 256, n_seq_max: int = 2, n_batch: int = 64, delay: float = 0.0) -> None:
        self.model_path = "/models/fake.gguf"
        self.n_ctx, self.n_seq_max, self.n_batch, self.n_vocab = n_ctx, n_seq_max, n_batch, N_VOCAB
        self.embeddings = False
        self.delay = delay
        self.kv: dict[int, list[int]] = {i: [] for i in range(n_seq_max)}
        self.batches: list[list[tuple[int, int]]] = []  # per decode: (seq, n_tokens) pairs
        self.thread_ids: set[int] = set()
        self.lock = threading.Lock()

    # vocabulary
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        out = [BOS] if add_special else []
        if parse_special:
            parts = text.split("</s>")
            for i, p in enumerate(parts):
                out += list(p.encode())
                if i < len(parts) - 1:
                    out.append(EOS)
            return out
        return out + list(text.encode())

    def token_to_piece(self, token: int, special: bool = False) -> bytes:
        if token >= 256:
            return (b"<s>" if token == BOS else b"</s>") if special else b""
        return bytes([token])

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.token_to_piece(t) for t in tokens).decode("utf-8", "replace")

    def is_eog(self, token: int) -> bool:
        return token == EOS

    # compute
    def decode(
        self, tokens: Sequence[int], pos: Sequence[int], seq_ids: Sequence[int], outputs: Sequence[bool]
    ):
        self.thread_ids.add(threading.get_ident())
        assert len(tokens) == len(pos) == len(seq_ids) == len(outputs) and 0 < len(tokens) <= self.n_batch
        if FAIL_BYTE in tokens:
            raise RuntimeError("fake decode failure")
        if self.delay:
            time.sleep(self.delay)
        rows = []
        with self.lock:
            for t, p, s, o in zip(tokens, pos, seq_ids, outputs, strict=True):
                kv = self.kv[s]
                assert p == len(kv), f"seq {s}: position {p} but the cache holds {len(kv)} tokens"
                kv.append(int(t))
                assert sum(len(v) for v in self.kv.values()) <= self.n_ctx, "KV cache overflow"
                if o:
                    z = np.zeros(N_VOCAB, np.float32)
                    z[next_token(kv)] = 10.0
                    rows.append(z)
            counts: dict[int, int] = {}
            for s in seq_ids:
                counts[s] = counts.get(s, 0) + 1
            self.batches.append(sorted(counts.items()))
        return np.stack(rows) if rows else np.zeros((0, N_VOCAB), np.float32)

    def embeddings_seq(self, seq: int) -> np.ndarray:
        v = np.bincount(np.array(self.kv[seq]) % 8, minlength=8).astype(np.float32)
        return v / np.linalg.norm(v)

    def seq_rm(self, seq: int, p0: int, p1: int) -> bool:
        kv = self.kv[seq]
        p0 = max(p0, 0)
        if p1 < 0 or p1 >= len(kv):
            del kv[p0:]
            return True
        return False  # holes are not supported by this fake

    @property
    def chat_template(self):
        from llamapy.vocab.chat_template import ChatTemplate

        return ChatTemplate(FAKE_TEMPLATE, "<s>", "</s>", name="fake template")

    def info(self) -> dict[str, Any]:
        return {
            "n_vocab": N_VOCAB,
            "n_ctx_train": 1024,
            "n_embd": 8,
            "size": 0,
            "desc": "fake",
            "arch": "fake",
            "file": "fake.gguf",
            "bos_token": "<s>",
            "eos_token": "</s>",
            "chat_template": "(fake)",
        }
