"""The chat page's browser tests: one headless Chromium (Debian's, not Playwright's download) for the whole
session, driving the page of a real ``llamapy serve`` on SmolLM2 (with an API key, -c 1024 -np 2, so a
slot holds 512 tokens). Without Chromium the tests skip, except under CI (``CI`` set) where they fail:
.ci/run installs it (.ci/chromium)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.server.conftest import RealServer, run_real_server

SCREENSHOTS = Path(__file__).with_name("screenshots")
# short greedy answers keep the tests quick on a 2-core box; tests that need more set it on the page
TEST_SETTINGS = {"max_tokens": "24", "temperature": "0"}


def chromium_path() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    why = "no chromium on PATH (apt-get install chromium; .ci/chromium does it)"
    if os.environ.get("CI"):
        pytest.fail(why)
    pytest.skip(why)


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict[str, Any]) -> dict[str, Any]:
    # --no-sandbox: CI runs as root; the page is our own, served from 127.0.0.1
    return {**browser_type_launch_args, "executable_path": chromium_path(), "args": ["--no-sandbox"]}


@pytest.fixture(scope="session")
def webui_server(smollm2_path: Path) -> Iterator[RealServer]:
    with run_real_server(smollm2_path) as srv:
        yield srv


def storage(base_url: str, key: str | None, settings: dict[str, str] | None = None) -> dict[str, Any]:
    """A browser context's starting localStorage for the page's origin: the API key and the settings."""
    items = [{"name": "llamapy.settings", "value": json.dumps(settings or TEST_SETTINGS)}]
    if key:
        items.append({"name": "llamapy.apiKey", "value": key})
    return {"cookies": [], "origins": [{"origin": base_url, "localStorage": items}]}


@pytest.fixture(scope="session")
def browser_context_args(browser_context_args: dict[str, Any], webui_server: RealServer) -> dict[str, Any]:
    return {
        **browser_context_args,
        "base_url": webui_server.base_url,
        "viewport": {"width": 1280, "height": 800},
        "storage_state": storage(webui_server.base_url, webui_server.api_key),
    }


@pytest.fixture
def app(page: Any, webui_server: RealServer) -> Iterator[Any]:
    """The page, loaded and past its first look at the server (the model's name shown); fails the test
    on any JavaScript error the page throws."""
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.set_default_timeout(20_000)
    page.goto("/")
    page.locator(".model-name, #model").first.wait_for()
    yield page
    assert not errors, f"the page threw: {errors}"


def shot(page: Any, name: str) -> None:
    """A screenshot for a reviewer, under tests/webui/screenshots/ (ignored by git)."""
    SCREENSHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"))


def send(page: Any, text: str) -> None:
    page.fill("#input", text)
    page.press("#input", "Enter")


def settle(page: Any, answers: int) -> None:
    """Waits until the thread shows `answers` assistant messages and none is streaming."""
    page.wait_for_function(
        "n => document.querySelectorAll('.msg.assistant').length === n"
        " && !document.querySelector('.msg.streaming') && !document.querySelector('#stop')",
        arg=answers,
        timeout=60_000,
    )
