"""Server warm-up: ``/health`` is 503 "Loading model" until the kernels have run once, and after that
a request with any of the engine's batch shapes loads or compiles no Numba kernel."""

from __future__ import annotations

import gc
import threading

import httpx
import pytest

from llamapy.server.app import ServerSettings
from tests.server.conftest import start_live, stop_live, wait_ready
from tests.server.fake_backend import FakeBackend


class GatedBackend(FakeBackend):
    """A fake model whose warm-up waits for a gate."""

    def __init__(self, gate: threading.Event, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.gate = gate
        self.warmups = 0
        self.batches_at_warmed_up = -1  # decodes run when the engine said its warm-up was done

    def warmed_up(self) -> None:
        self.batches_at_warmed_up = len(self.batches)

    def warmup(self) -> None:
        self.warmups += 1
        assert self.gate.wait(30), "the test never opened the warm-up gate"


def test_health_is_503_until_warm() -> None:
    gate = threading.Event()
    backend = GatedBackend(gate, n_ctx=512, n_seq_max=3, n_batch=64)
    srv, thread = start_live(ServerSettings(model_path="/models/fake.gguf", metrics=True), backend)
    try:
        for _ in range(20):  # the backend is loaded; its warm-up is blocked
            if backend.warmups:
                break
            threading.Event().wait(0.02)
        assert backend.warmups == 1
        r = httpx.get(srv.base_url + "/health")
        assert r.status_code == 503 and r.json()["error"]["message"] == "Loading model"
        assert (
            httpx.post(srv.base_url + "/completion", json={"prompt": "ab", "n_predict": 2}).status_code == 503
        )
        gate.set()
        wait_ready(srv.base_url)
        # the engine's warm-up ran 1..n_parallel concurrent requests through the real step loop...
        sizes = {sum(n for _, n in b) for b in backend.batches}
        assert {1, 2, 3} <= sizes, sizes
        assert backend.batches_at_warmed_up == len(backend.batches)  # told once, after the last one
        assert any(len(b) == 3 for b in backend.batches)  # three slots in one decode
        # ...and left nothing behind: empty KV cache and slots, zero counters
        assert all(not v for v in backend.kv.values())
        slots = httpx.get(srv.base_url + "/slots").json()
        assert all(s["n_cached_tokens"] == 0 and not s["is_processing"] for s in slots)
        metrics = httpx.get(srv.base_url + "/metrics").text
        assert "llamacpp:tokens_predicted_total 0" in metrics and "llamacpp:n_decode_total 0" in metrics
        r = httpx.post(srv.base_url + "/completion", json={"prompt": "ab", "n_predict": 2, "temperature": 0})
        assert r.status_code == 200 and r.json()["tokens_predicted"] == 2
    finally:
        gate.set()
        stop_live(srv, thread)


def _n_signatures() -> int:
    """Compiled signatures over every Numba dispatcher in the process (a kernel compiled or loaded from
    the cache for a new type signature adds one)."""
    from numba.core.dispatcher import Dispatcher

    # (type(o), not isinstance: some objects, e.g. NumPy's npz BagObj, raise on __class__ lookups)
    return sum(len(o.overloads) for o in gc.get_objects() if issubclass(type(o), Dispatcher))


@pytest.fixture(scope="module")
def warm_server(smollm2_path):
    from llamapy.server.backend import ContextBackend

    backend = ContextBackend(smollm2_path, n_ctx=1024, n_seq_max=4, n_batch=256, n_ubatch=256)
    srv, thread = start_live(ServerSettings(model_path=str(smollm2_path)), backend)
    wait_ready(srv.base_url, timeout=600)
    yield srv
    stop_live(srv, thread)


def test_no_kernel_compilation_after_warmup(warm_server) -> None:
    base = warm_server.base_url
    before = _n_signatures()
    story = "Once upon a time, in a small village by the sea, there lived an old fisherman. " * 3
    bodies = [
        {"prompt": "Hi", "n_predict": 4, "temperature": 0},
        {"prompt": story, "n_predict": 6},
        {"prompt": "The capital of France is", "n_predict": 5, "temperature": 0.7, "top_k": 20},
        {"prompt": story[:90], "n_predict": 3, "temperature": 0},
    ]
    assert httpx.post(base + "/completion", json=bodies[0], timeout=120).status_code == 200
    out: list[int] = []

    def one(body: dict) -> None:
        out.append(httpx.post(base + "/completion", json=body, timeout=120).status_code)

    threads = [threading.Thread(target=one, args=(b,)) for b in bodies * 2]  # up to 4 slots at once, queued
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    chat = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 4, "stream": True}
    with httpx.stream("POST", base + "/v1/chat/completions", json=chat, timeout=120) as r:
        assert r.status_code == 200 and "[DONE]" in r.read().decode()
    assert out == [200] * len(threads)
    assert _n_signatures() == before, "a request after warm-up loaded or compiled new kernel signatures"
