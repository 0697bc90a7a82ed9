"""The busy-machine thread policy: threads = cores other processes leave free, with identical results."""

from __future__ import annotations

import numpy as np
import pytest

from llamapy import _cpuload
from llamapy._cpuload import ThreadPolicy


class Clock:
    """Fake /proc: ``others`` cores busy elsewhere, ``mine`` cores used by this process."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.t, self.busy, self.mine = 0.0, 0, 0
        monkeypatch.setattr(_cpuload, "_cpu_ticks", lambda: (self.busy, self.mine))
        monkeypatch.setattr(_cpuload.time, "monotonic", lambda: self.t)
        monkeypatch.setattr(_cpuload, "_n_cores", lambda: 4)

    def advance(self, seconds: float, others: float, mine: float) -> None:
        self.t += seconds
        tick = _cpuload._TICKS
        self.busy += int(round((others + mine) * seconds * tick))
        self.mine += int(round(mine * seconds * tick))


def test_policy_follows_other_load(monkeypatch):
    monkeypatch.delenv("LLAMAPY_ADAPTIVE_THREADS", raising=False)
    clk = Clock(monkeypatch)
    pol = ThreadPolicy(4, interval=0.25)
    assert pol.enabled and pol.threads() == 4
    clk.advance(1.0, others=0.0, mine=4.0)  # our own threads (spinning included) are not "others"
    assert pol.threads() == 4
    clk.advance(1.0, others=1.0, mine=3.0)  # one hog
    assert pol.threads() == 3 and pol.others == pytest.approx(1.0, abs=0.05)
    clk.advance(0.1, others=4.0, mine=0.0)  # within the interval: no new reading
    assert pol.threads() == 3
    clk.advance(1.0, others=3.9, mine=0.1)  # everything taken: still one thread
    assert pol.threads() == 1
    clk.advance(1.0, others=0.3, mine=1.0)  # the machine frees up again
    assert pol.threads() == 4
    monkeypatch.setenv("LLAMAPY_ADAPTIVE_THREADS", "0")
    assert not ThreadPolicy(4).enabled and ThreadPolicy(4).threads() == 4
    assert not ThreadPolicy(1).enabled


def test_real_proc_readings():
    pol = ThreadPolicy(2, interval=0.0)
    n = pol.threads()
    assert 1 <= n <= 2 and pol.others >= 0.0
    busy = _cpuload.other_busy_cores(0.05)
    assert busy is None or busy >= 0.0


def test_capped_decode_gives_the_same_logits(tmp_path, monkeypatch):
    from llamapy import _numba
    from llamapy.batch import Batch
    from llamapy.context import Context, ContextParams
    from llamapy.model import Model
    from tests.model.tiny import tiny_llama

    model = Model.load(str(tiny_llama(tmp_path / "t.gguf", ggml_type="Q8_0", n_embd=64)))
    toks = np.arange(1, 20) % model.n_vocab

    def logits(n_threads: int | None) -> np.ndarray:
        ctx = Context(model, ContextParams(n_ctx=256, n_threads=n_threads))
        ctx.decode(Batch.from_tokens(toks, pos0=0))
        ctx.decode(Batch.from_tokens(toks[:1], pos0=len(toks)))
        return ctx.get_logits().copy(), _numba.numba.get_num_threads()

    ref, _ = logits(2 if _numba.max_threads() >= 2 else 1)
    monkeypatch.setattr(ThreadPolicy, "threads", lambda self: 1)  # a fully busy machine
    got, used = logits(None)
    assert used == 1 and np.array_equal(got, ref)
    _numba.cap_threads(0)


def test_decode_cap_ends_with_the_decode(tmp_path, monkeypatch):
    """A busy machine's cap holds during a decode and is gone after it: the thread's own cap (none, or one
    set outside) is back, so what runs next in the thread gets the threads it asks for."""
    from llamapy import _numba
    from llamapy.batch import Batch
    from llamapy.context import Context, ContextParams
    from llamapy.model import Model
    from tests.model.tiny import tiny_llama

    if _numba.max_threads() < 2:
        pytest.skip("needs 2 threads")
    model = Model.load(str(tiny_llama(tmp_path / "t.gguf", ggml_type="Q8_0", n_embd=64)))
    monkeypatch.setattr(ThreadPolicy, "threads", lambda self: 1)  # a fully busy machine
    seen = []
    real = Context._decode_ubatch

    def spy(self, *a, **kw):
        seen.append((_numba._cap.n, _numba.numba.get_num_threads()))
        return real(self, *a, **kw)

    monkeypatch.setattr(Context, "_decode_ubatch", spy)
    _numba.cap_threads(0)
    ctx = Context(model, ContextParams(n_ctx=64))
    ctx.decode(Batch.from_tokens(np.arange(1, 5), pos0=0))
    assert seen == [(1, 1)]
    assert _numba.cap_threads(0) == 0  # no cap left in this thread
    assert _numba.set_num_threads(2) == 2 and _numba.numba.get_num_threads() == 2

    _numba.cap_threads(2)  # an outer cap of the caller's own comes back after the decode
    ctx.decode(Batch.from_tokens(np.arange(5, 7), pos0=4))
    assert seen[-1] == (1, 1) and _numba.cap_threads(0) == 2

    fixed = Context(model, ContextParams(n_ctx=64, n_threads=2))  # -t given: no cap during its decode
    _numba.cap_threads(1)
    fixed.decode(Batch.from_tokens(np.arange(1, 3), pos0=0))
    assert seen[-1][0] == 0 and _numba.cap_threads(0) == 1
