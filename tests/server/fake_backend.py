"""A tiny deterministic stand-in for the model, implementing llamapy.server.backend.Backend.

Tokens 0..255 are bytes, 256 is BOS and 257 EOS; 258..263 are the fill-in-the-middle tokens
(prefix, suffix, middle, pad, repo, file separator), declared only with ``fim=True`` (``fim="basic"``:
prefix/suffix/middle only). The "model" keeps a real per-sequence KV list and
checks positions like a KV cache would, so the engine's cache bookkeeping is tested for real: after a
sequence s the next token is s[len(s) // 2] (BOS counts as "a"), and after "!" it is EOS. Each cached
token has a position (``pos``): ``seq_rm`` can leave a hole and ``seq_add`` moves positions, and a decode
must continue right after the highest position with the positions 0..n-1 all filled (as a context
shift leaves them).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

BOS, EOS, N_VOCAB = 256, 257, 258  # without FIM tokens
N_VOCAB_FIM = 264
FIM_PRE, FIM_SUF, FIM_MID, FIM_PAD, FIM_REP, FIM_SEP = range(258, 264)
FIM_TEXT = {
    FIM_PRE: b"<PRE>",
    FIM_SUF: b"<SUF>",
    FIM_MID: b"<MID>",
    FIM_PAD: b"<PAD>",
    FIM_REP: b"<REPO>",
    FIM_SEP: b"<SEP>",
}
STATE_MAGIC = b"FAKEKV1\0"
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


def _in(p: int, p0: int, p1: int) -> bool:
    """Position ``p`` in [p0, p1), negative bounds open (as llama.cpp's seq_rm/seq_add)."""
    return (p0 < 0 or p >= p0) and (p1 < 0 or p < p1)


class FakeBackend:
    #: a batch holding this token makes ``decode`` raise (None: never; the route fuzzer's servers)
    fail_byte: int | None = FAIL_BYTE

    def __init__(
        self,
        n_ctx: int = 256,
        n_seq_max: int = 2,
        n_batch: int = 64,
        delay: float = 0.0,
        fim: bool | str = False,
        model_path: str = "/models/fake.gguf",
    ) -> None:
        self.model_path = model_path
        self.fim = fim
        self.n_ctx, self.n_seq_max, self.n_batch, self.n_vocab = n_ctx, n_seq_max, n_batch, N_VOCAB
        if fim:
            self.n_vocab = N_VOCAB_FIM
        self.embeddings = False
        self.delay = delay
        self.kv: dict[int, list[int]] = {i: [] for i in range(n_seq_max)}  # tokens, in position order
        self.pos: dict[int, list[int]] = {i: [] for i in range(n_seq_max)}  # their positions
        self.n_seq_add = 0  # context shifts seen
        self.batches: list[list[tuple[int, int]]] = []  # per decode: (seq, n_tokens) pairs
        self.thread_ids: set[int] = set()
        self.n_seq_cp = 0  # prompts shared between slots (n > 1)
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
        if token in FIM_TEXT:
            return FIM_TEXT[token] if special else b""
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
        if self.fail_byte is not None and self.fail_byte in tokens:
            raise RuntimeError("fake decode failure")
        if self.delay:
            time.sleep(self.delay)
        rows = []
        with self.lock:
            for t, p, s, o in zip(tokens, pos, seq_ids, outputs, strict=True):
                kv, kp = self.kv[s], self.pos[s]
                assert p == len(kv), f"seq {s}: position {p} but the cache holds {len(kv)} tokens"
                assert kp == list(range(len(kp))), f"seq {s}: decoding over a hole in positions {kp}"
                kv.append(int(t))
                kp.append(int(p))
                assert sum(len(v) for v in self.kv.values()) <= self.n_ctx, "KV cache overflow"
                if o:
                    z = np.zeros(self.n_vocab, np.float32)
                    z[next_token(kv)] = 10.0
                    rows.append(z)
            counts: dict[int, int] = {}
            for s in seq_ids:
                counts[s] = counts.get(s, 0) + 1
            self.batches.append(sorted(counts.items()))
        return np.stack(rows) if rows else np.zeros((0, self.n_vocab), np.float32)

    def embeddings_seq(self, seq: int) -> np.ndarray:
        v = np.bincount(np.array(self.kv[seq]) % 8, minlength=8).astype(np.float32)
        return v / np.linalg.norm(v)

    def seq_rm(self, seq: int, p0: int, p1: int) -> bool:
        with self.lock:
            seqs = list(self.kv) if seq < 0 else [seq]
            for q in seqs:
                keep = [i for i, p in enumerate(self.pos[q]) if not _in(p, p0, p1)]
                self.kv[q] = [self.kv[q][i] for i in keep]
                self.pos[q] = [self.pos[q][i] for i in keep]
        return True

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        with self.lock:
            self.n_seq_add += 1
            moved = [p + delta if _in(p, p0, p1) else p for p in self.pos[seq]]
            pairs = sorted((p, t) for p, t in zip(moved, self.kv[seq], strict=True) if p >= 0)
            assert len({p for p, _ in pairs}) == len(pairs), f"seq {seq}: seq_add made positions collide"
            self.pos[seq] = [p for p, _ in pairs]
            self.kv[seq] = [t for _, t in pairs]

    def fim_tokens(self):
        from llamapy.api.infill import FimError, FimTokens

        if not self.fim:
            raise FimError("fake.gguf has no fill-in-the-middle tokens")
        full = self.fim is True
        return FimTokens(
            FIM_PRE, FIM_SUF, FIM_MID, FIM_REP if full else -1, FIM_SEP if full else -1, BOS, True
        )

    def state_seq_get(self, seq: int) -> bytes:
        with self.lock:
            assert self.pos[seq] == list(range(len(self.pos[seq]))), "saving a sequence with holes"
            kv = np.asarray(self.kv[seq], dtype="<i4")
        return STATE_MAGIC + len(kv).to_bytes(4, "little") + kv.tobytes()

    def state_seq_set(self, data: bytes, seq: int, n_tokens: int | None = None) -> int:
        if data[:8] != STATE_MAGIC or len(data) < 12:
            raise ValueError("not a fake KV state")
        n = int.from_bytes(data[8:12], "little")
        if len(data) != 12 + 4 * n:
            raise ValueError(f"fake KV state of {n} tokens has {len(data)} bytes")
        if n_tokens is not None and n != n_tokens:
            raise ValueError(f"fake KV state of {n} cells for {n_tokens} tokens")
        toks = np.frombuffer(data, dtype="<i4", count=n, offset=12).tolist()
        with self.lock:
            if sum(len(v) for s, v in self.kv.items() if s != seq) + n > self.n_ctx:
                raise ValueError("KV cache overflow")
            self.kv[seq] = toks
            self.pos[seq] = list(range(n))
        return len(data)

    def state_seq_size_max(self, n_tokens: int) -> int:
        return 12 + 4 * n_tokens

    def identity(self) -> dict[str, Any]:
        return {"file": self.model_path.rsplit("/", 1)[-1], "size": 1234, "n_vocab": self.n_vocab}

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        with self.lock:
            self.n_seq_cp += 1
            p0 = max(p0, 0)
            assert len(self.kv[dst]) == p0, "seq_cp into a sequence that does not end at p0"
            sel = [i for i, p in enumerate(self.pos[src]) if _in(p, p0, p1)]
            self.kv[dst] += [self.kv[src][i] for i in sel]
            self.pos[dst] += [self.pos[src][i] for i in sel]

    @property
    def chat_template(self):
        from llamapy.vocab.chat_template import ChatTemplate

        return ChatTemplate(FAKE_TEMPLATE, "<s>", "</s>", name="fake template")

    def health(self) -> str | None:
        return None

    def info(self) -> dict[str, Any]:
        return {
            "n_vocab": self.n_vocab,
            "n_ctx_train": 1024,
            "n_embd": 8,
            "size": 0,
            "n_params": 1234,
            "ftype": "F32",
            "vocab_type": 2,
            "desc": "fake",
            "arch": "fake",
            "file": "fake.gguf",
            "bos_token": "<s>",
            "eos_token": "</s>",
            "chat_template": "(fake)",
        }
