"""An image attached on the page reaches a vision model: a tiny random Gemma3 VLM (tests/mtmd/convert.py)
served with its projector, the page mounted on it; the answer streams back with no error."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from PIL import Image

from llamapy.mtmd import MtmdContext
from llamapy.server.app import ServerSettings
from llamapy.server.backend import ContextBackend
from llamapy.server.webui import mount_webui
from tests.mtmd import convert
from tests.server.conftest import LiveServer, start_live, stop_live, wait_ready
from tests.webui.conftest import send, settle, shot, storage

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def vlm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    vlm = convert.make_gemma3(tmp_path_factory.mktemp("webui-vlm"))
    backend = ContextBackend(vlm.text_gguf(), n_ctx=512, n_seq_max=1, n_batch=64, n_ubatch=64)
    backend.mtmd = MtmdContext(vlm.mmproj_gguf(), backend.model)  # type: ignore[attr-defined]
    srv, thread = start_live(ServerSettings(model_path=str(vlm.text_gguf()), warmup=False), backend)
    mount_webui(srv.app)  # type: ignore[arg-type]
    wait_ready(srv.base_url, timeout=120)
    yield srv
    stop_live(srv, thread)


def test_image_to_a_vision_model(browser: Any, vlm_server: LiveServer, tmp_path) -> None:
    png = tmp_path / "noise.png"
    pixels = np.random.default_rng(0).integers(0, 256, (56, 40, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    png.write_bytes(buf.getvalue())
    base = vlm_server.base_url
    ctx = browser.new_context(
        base_url=base, storage_state=storage(base, None, {"max_tokens": "4", "temperature": "0"})
    )
    page = ctx.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto("/")
        page.wait_for_selector(".model-name")
        page.wait_for_selector("#attach[data-vision=yes]")  # /props answered: this model takes images
        page.set_input_files("#file", str(png))
        page.wait_for_selector(".composer .att img")
        send(page, "What is in this picture?")
        settle(page, 1)
        answer = page.locator(".msg.assistant").last
        assert answer.locator(".error-text").count() == 0
        assert "4 tokens" in answer.locator(".stats").inner_text()  # the image went in, 4 tokens came out
        assert page.locator(".msg.user .att img").count() == 1
        assert page.locator(".toast").count() == 0  # /props says vision: no warning when attaching
        shot(page, "vision")
        assert not errors
    finally:
        ctx.close()
