"""Collect an importance matrix as ``llama-imatrix`` does: for every weight matrix, the sum over all
tokens of the squared activations going into it (per column; per expert for MoE weights), read through
the context's eval callback (``ContextParams.cb_eval`` with ``ask_unnamed``).

The text is tokenized once, cut into chunks of ``n_ctx`` tokens (the first replaced by BOS when the
model adds one), ``n_batch // n_ctx`` chunks per batch as separate sequences, every token an output
(so that the last layer sees every row, as in llama-imatrix).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .._dataclass import dataclass
from .ftypes import QuantizeError
from .imatrix_file import Imatrix, ImatrixEntry

__all__ = ["Collector", "TensorStats", "compute_imatrix", "statistics"]

_MATMUL = ("mul_mat", "mul_mat_id")


class Collector:
    """The eval callback of llama-imatrix (``IMatrixCollector::collect_imatrix``)."""

    ask_unnamed = True  # asked about the (unnamed) mat-mul nodes too; their inputs stay readable

    def __init__(self, chunk_size: int, process_output: bool = False) -> None:
        self.chunk_size = chunk_size
        self.process_output = process_output
        self.sums: dict[str, np.ndarray] = {}  # float64[n_mat, ne0]
        self.counts: dict[str, np.ndarray] = {}  # int64[n_mat]
        self.ctx: Any = None  # the Context (its scheduler holds the values)

    def _wanted(self, name: str) -> bool:
        return name.startswith("blk.") or (self.process_output and name == "output.weight")

    def __call__(self, t: Any, ask: bool, value: np.ndarray | None) -> bool:
        if t.op not in _MATMUL:
            return False
        w, x = t.src[0], t.src[1]
        if ask:
            if not w.name or not self._wanted(w.name):
                return False
            if t.op == "mul_mat_id":
                return True
            rows = x.shape[-2] if x.ndim >= 2 else 1
            return rows >= 16 and x.type.name == "F32"  # llama-imatrix skips batches under 16 tokens
        if self.ctx is None:
            raise QuantizeError("imatrix collector: no context attached")
        xv = np.asarray(self.ctx.sched.get(x), dtype=np.float32)
        if t.op == "mul_mat_id":
            self._collect_id(w, xv, np.asarray(self.ctx.sched.get(t.src[2])))
        else:
            self._collect(w, xv)
        return True

    def _entry(self, name: str, n_mat: int, ne0: int, n_counts: int) -> tuple[np.ndarray, np.ndarray]:
        s = self.sums.get(name)
        if s is None:
            s = self.sums[name] = np.zeros((n_mat, ne0), dtype=np.float64)
            self.counts[name] = np.zeros(n_counts, dtype=np.int64)
        elif s.shape != (n_mat, ne0):
            raise QuantizeError(f"imatrix: inconsistent size for {name} ({s.size} vs {n_mat * ne0})")
        return s, self.counts[name]

    def _collect(self, w: Any, x: np.ndarray) -> None:
        """A dense weight: one count (even for a batched 3-D weight, as llama-imatrix keeps it)."""
        ne0 = x.shape[-1]
        x3, x2 = ((1, 1) + x.shape[:-2])[-2:]  # NumPy order: (ne3, ne2)
        w3, w2 = ((1, 1) + w.shape[:-2])[-2:]
        n_mat = w3 * w2
        s, c = self._entry(w.name, n_mat, ne0, 1)
        if len(c) > 1 and (c == c[0]).all():
            c = self.counts[w.name] = c[:1].copy()
        sq = (x.astype(np.float64) ** 2).reshape(x3, x2, -1, ne0).sum(axis=2)
        for i3 in range(x3):
            for i2 in range(x2):
                s[(i3 % w3) * w2 + (i2 % w2)] += sq[i3, i2]
        c += (x.size // ne0) // n_mat
        if not np.isfinite(s).all():
            raise QuantizeError(f"imatrix: non-finite values detected in {w.name}")

    def _collect_id(self, w: Any, x: np.ndarray, ids: np.ndarray) -> None:
        n_as, ne0 = w.shape[0], x.shape[-1]
        s, c = self._entry(w.name, n_as, ne0, n_as)
        if len(c) == 1 and n_as > 1:  # broadcast, when loaded from an old imatrix
            c = self.counts[w.name] = np.full(n_as, c[0], dtype=np.int64)
        n_tok, n_used = ids.shape
        xs = x.reshape(n_tok, -1, ne0).astype(np.float64) ** 2
        for j in range(n_used):
            ex = ids[:, j].astype(np.int64)
            if (ex < 0).any() or (ex >= n_as).any():
                raise QuantizeError(f"imatrix: expert id out of range for {w.name}")
            np.add.at(s, ex, xs[:, j % xs.shape[1]])
            np.add.at(c, ex, 1)
        if not np.isfinite(s[np.unique(ids)]).all():
            raise QuantizeError(f"imatrix: non-finite values detected in {w.name}")

    def imatrix(self, datasets: list[str]) -> Imatrix:
        im = Imatrix(datasets=list(datasets), chunk_size=self.chunk_size)
        for name in sorted(self.sums):
            im.entries[name] = ImatrixEntry(
                self.sums[name].astype(np.float32).reshape(-1), self.counts[name].copy()
            )
        mx = max((int(c.max()) for c in self.counts.values() if c.size), default=0)
        im.chunk_count = mx // self.chunk_size if self.chunk_size else 0
        return im


def compute_imatrix(
    model: Any,
    tokens: list[int] | np.ndarray,
    n_ctx: int = 512,
    n_batch: int = 2048,
    n_chunks: int = -1,
    process_output: bool = False,
    n_threads: int | None = None,
    datasets: list[str] | None = None,
    previous: Imatrix | None = None,
    progress: Callable[[int, int, float], None] | None = None,
    **ctx_kw: Any,
) -> Imatrix:
    """The importance matrix of ``model`` over ``tokens`` (llama-imatrix's ``compute_imatrix``);
    ``previous`` (already combined ``--in-file`` matrices) is added in first."""
    from ..batch import Batch
    from ..context import Context, ContextParams

    tokens = np.asarray(tokens, dtype=np.int64)
    if n_ctx <= 0:
        raise QuantizeError("imatrix needs a context size (-c) > 0")
    if len(tokens) < 2 * n_ctx:
        raise QuantizeError(f"you need at least {2 * n_ctx} tokens for a context of {n_ctx} tokens; "
                            f"the text tokenizes to only {len(tokens)}")  # fmt: skip
    n_seq = max(1, n_batch // n_ctx)
    n_batch = min(n_batch, n_seq * n_ctx)
    if not (n_batch < n_ctx or n_batch % n_ctx == 0):
        raise QuantizeError(f"-b {n_batch} must be below -c {n_ctx} or a multiple of it")
    n_chunk_max = len(tokens) // n_ctx
    n_chunk = n_chunk_max if n_chunks < 0 else min(n_chunks, n_chunk_max)
    col = Collector(n_ctx, process_output)
    if previous is not None:
        for name, e in previous.entries.items():
            n_mat = len(e.counts)
            col.sums[name] = e.sums.astype(np.float64).reshape(n_mat, -1).copy()
            col.counts[name] = e.counts.astype(np.int64).copy()
    params = ContextParams(n_ctx=n_seq * n_ctx, n_batch=n_batch, n_ubatch=min(512, n_batch), n_seq_max=n_seq,
                           n_threads=n_threads, cb_eval=col, **ctx_kw)  # fmt: skip
    ctx = Context(model, params)
    col.ctx = ctx
    vocab = model.vocab
    add_bos = bool(vocab is not None and vocab.add_bos)
    bos = vocab.bos if vocab is not None else -1
    num_batches = (n_ctx + n_batch - 1) // n_batch
    t0 = time.perf_counter()
    for i in range(0, n_chunk, n_seq):
        n_seq_batch = min(n_seq, n_chunk - i)
        ctx.memory.clear()
        for j in range(num_batches):
            b0 = j * n_batch
            size = min(n_ctx - b0, n_batch)
            toks, pos, seqs = [], [], []
            for s in range(n_seq_batch):
                start = (i + s) * n_ctx + b0
                chunk = tokens[start : start + size].copy()
                if add_bos and j == 0:
                    chunk[0] = bos
                toks.append(chunk)
                pos.append(np.arange(b0, b0 + size, dtype=np.int32))
                seqs += [[s]] * size
            n = sum(len(x) for x in toks)
            ctx.decode(Batch(np.concatenate(toks), None, np.concatenate(pos), seqs, np.ones(n, dtype=bool)))
        if progress is not None:
            progress(i + n_seq_batch, n_chunk, time.perf_counter() - t0)
    return col.imatrix((previous.datasets if previous else []) + list(datasets or []))


@dataclass
class TensorStats:
    name: str
    total: float
    min: float
    max: float
    mean: float
    stddev: float
    active: float
    elements: int
    entropy: float
    zd: float
    cossim: float = 0.0


def statistics(im: Imatrix) -> list[TensorStats]:
    """llama-imatrix's ``--show-statistics``: per tensor, over the mean squared activations."""
    out: list[TensorStats] = []
    raw: dict[str, np.ndarray] = {}
    for name, e in im.entries.items():
        n_mat = len(e.counts)
        if not n_mat or e.sums.size % n_mat:
            continue
        per = e.sums.astype(np.float32).reshape(n_mat, -1)
        acts = [per[i] / np.float32(c) for i, c in enumerate(e.counts) if c > 0]
        if not acts:
            continue
        a = np.concatenate(acts).astype(np.float32)
        total = float(a.sum(dtype=np.float32))
        mean = total / a.size
        var = float((a.astype(np.float64) ** 2).sum()) / a.size - mean * mean
        dev = math.sqrt(max(0.0, var))
        active = 1 - float((np.abs(a) <= 1e-5).sum()) / a.size
        entropy = 0.0
        if total > 0:
            p = a.astype(np.float64) / total
            p = p[p > 0]
            entropy = float(-(p * np.log2(p)).sum())
        zd = float(((a - mean) / dev > 1).sum()) / a.size if dev > 0 else 0.0
        out.append(
            TensorStats(name, total, float(a.min()), float(a.max()), mean, dev, active, a.size, entropy, zd)
        )
        raw[name] = e.sums.astype(np.float64)
    for ts in out:  # cosine similarity with the same tensor one layer up
        m = re.search(r"blk\.(\d+)\.", ts.name)
        if m is None:
            continue
        prev = ts.name[: m.start(1)] + str(int(m.group(1)) - 1) + ts.name[m.end(1) :]
        if prev in raw and raw[prev].shape == raw[ts.name].shape:
            a, b = raw[ts.name], raw[prev]
            den = math.sqrt(float(a @ a)) * math.sqrt(float(b @ b))
            ts.cossim = float(a @ b) / den if den else 0.0
    return out
