"""Prompt-cache checkpoints of a recurrent state (llama-server's context checkpoints): a prompt is
evaluated with checkpoints shortly before its end, and a later prompt that leaves the cached tokens
before their end resumes from the last checkpoint at or before the common prefix instead of from the
start, with the logits of a cold run. In TokenSequence (the Llama API) on a tiny Qwen3.5, and in the
server engine over a fake model whose state can only go back to a checkpoint."""

from __future__ import annotations

import numpy as np
import pytest

from llamapy.generation import TokenSequence, checkpoint_positions
from llamapy.server.engine import Engine, Task
from tests.server.fake_backend import BOS, FakeBackend, reference
from tests.server.test_engine import Collector, params


def test_checkpoint_positions():
    assert checkpoint_positions(0, 100) == [36, 96]
    assert checkpoint_positions(50, 100) == [96]
    assert checkpoint_positions(0, 5) == [1]
    assert checkpoint_positions(0, 4) == []


@pytest.fixture(scope="module")
def qwen35_file(tmp_path_factory):
    pytest.importorskip("torch")
    from llamapy.ggml.types import GGMLType
    from tests.model import hf_tiny

    tm = hf_tiny.make_tiny(hf_tiny.FAMILIES["qwen35"], tmp_path_factory.mktemp("ckpt"), seed=11)
    return tm.write(GGMLType.F32)


def test_sequence_resumes_from_a_checkpoint(qwen35_file):
    from llamapy.context import Context, ContextParams
    from llamapy.model import Model

    m = Model.load(qwen35_file)
    rng = np.random.default_rng(0)
    p1 = [int(t) for t in rng.integers(0, 200, 100)]
    p2 = p1[:98] + [int(t) for t in rng.integers(0, 200, 10)]  # leaves p1 two tokens before its end

    def seq() -> TokenSequence:
        return TokenSequence(Context(m, ContextParams(n_ctx=256, n_batch=64, type_k="f32", type_v="f32")))

    warm = seq()
    assert warm.ctx.memory.has_checkpoints
    warm.prefill(p1)
    warm.prefill(p2)
    assert warm.n_reused == 96  # the checkpoint 4 tokens before p1's end
    cold = seq()
    cold.prefill(p2)
    assert cold.n_reused == 0
    np.testing.assert_allclose(warm.logits(), cold.logits(), rtol=0, atol=1e-4 * np.abs(cold.logits()).max())


class FakeRecurrent(FakeBackend):
    """A fake whose sequences can only be cut back to a checkpoint (or emptied), as a recurrent state."""

    has_checkpoints = True

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.ckpt: dict[int, set[int]] = {i: set() for i in range(self.n_seq_max)}

    def checkpoint(self, seq: int) -> int:
        self.ckpt[seq].add(len(self.kv[seq]))
        return len(self.kv[seq]) - 1

    def seq_pos_restorable(self, seq: int, p0: int) -> int:
        return max([0, *(c for c in self.ckpt[seq] if c <= p0)])

    def seq_rm(self, seq: int, p0: int, p1: int) -> bool:
        n = len(self.kv[seq]) if seq >= 0 else 0
        if seq >= 0 and 0 < p0 < n and p1 < 0 and p0 not in self.ckpt[seq]:
            return False
        if seq >= 0 and p0 <= 0 and p1 < 0:
            self.ckpt[seq].clear()
        return super().seq_rm(seq, p0, p1)


def test_engine_resumes_from_a_checkpoint():
    b = FakeRecurrent(n_seq_max=1, n_ctx=512)
    e = Engine(b)
    e.start()
    try:
        p1 = [BOS, *(b"The quick brown fox jumps over the lazy dog. " * 3)]
        c = Collector()
        e.submit(Task(p1, params(6), c))
        c.wait()
        assert b.ckpt[0] == {len(p1) - 64, len(p1) - 4}
        p2 = p1[:-2] + list(b" and then?")
        c = Collector()
        e.submit(Task(p2, params(6), c))
        _, ev, toks = c.wait()
        assert ev.n_cached == len(p1) - 4 and toks == reference(p2, 6)
        assert b.kv[0] == e.slots[0].cache
    finally:
        e.stop()
