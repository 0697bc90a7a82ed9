"""The model picker on a router-mode server (`llamapy serve --models-dir`, two tiny models): both listed
with their load state, the chosen one named in the request, loaded on its first answer, and the picker
showing it loaded afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from llamapy.cli import build_parser
from llamapy.cli.serve import make_app
from llamapy.server.webui import mount_webui
from tests.hub.conftest import tiny_with_vocab
from tests.server.conftest import serve_app
from tests.webui.conftest import send, settle, shot, storage

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def router_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    d = tmp_path_factory.mktemp("webui-models")
    tiny_with_vocab(d / "alpha.gguf", seed=1)
    tiny_with_vocab(d / "beta.gguf", seed=2)
    argv = ["serve", "--models-dir", str(d), "-c", "256", "-np", "1", "--no-warmup"]
    app: Any = make_app(build_parser().parse_args(argv), [], None)
    mount_webui(app)
    url, server, thread = serve_app(app)
    yield url
    server.should_exit = True  # type: ignore[attr-defined]
    thread.join(10)


def states(url: str) -> dict[str, str]:
    return {m["id"]: m["status"]["value"] for m in httpx.get(url + "/v1/models").json()["data"]}


def test_model_picker_in_router_mode(browser: Any, router_url: str, tmp_path: Path) -> None:
    assert states(router_url) == {"alpha": "unloaded", "beta": "unloaded"}
    settings = {"max_tokens": "4", "temperature": "0"}
    ctx = browser.new_context(base_url=router_url, storage_state=storage(router_url, None, settings))
    page = ctx.new_page()
    bodies: list[dict[str, Any]] = []
    page.route("**/v1/chat/completions", lambda r: (bodies.append(r.request.post_data_json), r.continue_()))
    try:
        page.goto("/")
        picker = page.locator("#model")
        picker.wait_for()
        assert sorted(picker.locator("option").all_inner_texts()) == ["alpha (unloaded)", "beta (unloaded)"]
        picker.select_option("beta")
        send(page, "Hello there")
        settle(page, 1)
        answer = page.locator(".msg.assistant").last
        assert answer.locator(".error-text").count() == 0
        assert answer.locator(".who").inner_text() == "beta"
        assert bodies[0]["model"] == "beta"
        assert states(router_url) == {"alpha": "unloaded", "beta": "loaded"}  # loaded by its first answer
        page.wait_for_selector(
            "#model option[value=beta]:text-is('beta')", state="attached"
        )  # the picker shows it loaded
        assert "context " in answer.locator(".stats").inner_text()  # n_ctx from /props?model=beta
        shot(page, "router-picker")
        page.reload()
        picker.wait_for()
        assert picker.input_value() == "beta"  # the choice is kept
    finally:
        ctx.close()
