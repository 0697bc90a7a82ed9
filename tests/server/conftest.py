"""Servers for the tests: the app over the fake model in a background uvicorn thread (a real socket on
127.0.0.1), one per test module."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

from llamapy.server.app import ServerSettings, create_app
from tests.server.fake_backend import FakeBackend


@dataclass
class LiveServer:
    base_url: str
    backend: FakeBackend
    app: object
    server: object


def start_live(
    settings: ServerSettings, backend: object, load_gate: threading.Event | None = None
) -> tuple[LiveServer, threading.Thread]:
    def factory() -> object:
        if load_gate is not None:
            load_gate.wait(30)
        return backend

    app = create_app(settings, factory)
    base_url, server, thread = serve_app(app)
    return LiveServer(base_url, backend, app, server), thread


def serve_app(app: object) -> tuple[str, object, threading.Thread]:
    """``app`` served by uvicorn on a free port of 127.0.0.1 in a background thread: (base URL, server,
    thread); stop it with ``server.should_exit = True`` and a join."""
    import uvicorn

    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", access_log=False)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    return f"http://127.0.0.1:{port}", server, thread


def stop_live(live: LiveServer, thread: threading.Thread) -> None:
    live.server.should_exit = True  # type: ignore[attr-defined]
    thread.join(10)


def wait_ready(base_url: str, timeout: float = 10.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if httpx.get(base_url + "/health").status_code == 200:
            return
        time.sleep(0.02)
    raise RuntimeError("the server never became ready")


@pytest.fixture(scope="module")
def live() -> Iterator[LiveServer]:
    settings = ServerSettings(model_path="/models/fake.gguf", metrics=True, max_body_bytes=64 << 10)
    srv, thread = start_live(settings, FakeBackend(n_ctx=512, n_seq_max=2, n_batch=64, delay=0.001))
    wait_ready(srv.base_url)
    yield srv
    stop_live(srv, thread)


# -- the real server: `python -m llamapy serve` with SmolLM2 as a subprocess, once per test session ----

API_KEY = "test-key-123"


@dataclass
class RealServer:
    base_url: str
    api_key: str
    proc: object
    log: list[str]


def _engine_missing(model_path) -> str | None:
    """Why the real engine cannot serve yet (None when it can)."""
    for mod in ("llamapy.context", "llamapy.batch", "llamapy.model", "llamapy.vocab"):
        try:
            __import__(mod)
        except ImportError as e:
            return f"{mod} is not importable yet ({e})"
    from llamapy.model import Model

    try:
        m = Model.load(model_path, vocab_only=True)
    except TypeError:
        m = Model.load(model_path)
    if getattr(m, "vocab", None) is None:
        return "llamapy.model.Model.load gives no vocab yet (llamapy.vocab not wired in)"
    try:
        m.vocab.tokenize("hello", add_special=True, parse_special=True)
    except Exception as e:
        return f"the vocabulary cannot tokenize yet ({type(e).__name__}: {e})"
    return None


@contextmanager
def run_real_server(model_path, extra_args: Sequence[str] = ()) -> Iterator[RealServer]:
    """``python -m llamapy serve`` on ``model_path`` (-np 2, -c 1024, an API key) plus ``extra_args``, as
    a subprocess; yields once it is healthy, stops it afterwards. Skips when the engine cannot serve."""
    import os
    import re
    import subprocess
    import sys

    import httpx

    why = _engine_missing(model_path)
    if why:
        pytest.skip(f"real-model server tests need the engine: {why}")
    cmd = [
        sys.executable,
        "-m",
        "llamapy",
        "serve",
        "-m",
        str(model_path),
        "--host",
        "127.0.0.1",
        "--port",
        "0",
    ]
    cmd += [
        "-np",
        "2",
        "-c",
        "1024",
        "-b",
        "256",
        "--api-key",
        API_KEY,
        "--metrics",
        "--log-level",
        "warning",
    ]
    cmd += ["--max-body-size", str(256 << 10), *extra_args]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=os.environ.copy()
    )
    log: list[str] = []
    port: list[int] = []

    def reader() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            log.append(line)
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                port.append(int(m.group(1)))

    threading.Thread(target=reader, daemon=True).start()
    try:
        deadline = time.monotonic() + 300
        while not port:
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail("llamapy serve did not start:\n" + "".join(log[-40:]))
            time.sleep(0.05)
        base = f"http://127.0.0.1:{port[0]}"
        while True:
            r = httpx.get(base + "/health", timeout=5)
            if r.status_code == 200:
                break
            if "failed to load" in r.text or proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the model did not load: {r.text}\n" + "".join(log[-40:]))
            time.sleep(0.1)
        yield RealServer(base, API_KEY, proc, log)
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@pytest.fixture(scope="session")
def real_server(smollm2_path) -> Iterator[RealServer]:
    with run_real_server(smollm2_path) as srv:
        yield srv
