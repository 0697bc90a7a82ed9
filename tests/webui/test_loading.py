"""A page opened while the server still loads its model waits and says so, then works once it is ready
(the fake model; no real weights needed)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from llamapy.server.app import ServerSettings
from llamapy.server.webui import mount_webui
from tests.server.conftest import LiveServer, start_live, stop_live
from tests.server.fake_backend import FakeBackend
from tests.webui.conftest import send, settle, storage

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gated() -> Iterator[tuple[LiveServer, threading.Event]]:
    gate = threading.Event()
    backend = FakeBackend(n_ctx=512, n_seq_max=1, n_batch=64, delay=0.01)
    srv, thread = start_live(ServerSettings(model_path="/models/fake.gguf"), backend, load_gate=gate)
    mount_webui(srv.app)  # type: ignore[arg-type]
    yield srv, gate
    gate.set()
    stop_live(srv, thread)


def test_the_page_waits_for_the_model(browser: Any, gated) -> None:
    srv, gate = gated
    ctx = browser.new_context(
        base_url=srv.base_url, storage_state=storage(srv.base_url, None, {"max_tokens": "8"})
    )
    page = ctx.new_page()
    try:
        page.goto("/")
        page.wait_for_selector(".waiting:text('Loading model')")
        gate.set()
        page.wait_for_selector(".model-name:text('fake.gguf')")
        assert page.locator(".waiting").count() == 0
        send(page, "abc")
        settle(page, 1)
        assert page.locator(".msg.assistant .content").inner_text().strip()
        assert page.locator(".msg.assistant .error-text").count() == 0
    finally:
        ctx.close()
