"""``--api-prefix`` (llama-server's: every route under the prefix, the chat page too, nothing outside it)
and ``LLAMA_ARG_API_PREFIX``. Fake model, real socket, the openai client on ``base_url=.../PREFIX/v1``."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from llamapy.cli import build_parser
from llamapy.cli.env import with_env
from llamapy.server.app import ServerSettings
from llamapy.server.webui import mount_webui
from tests.server.conftest import LiveServer, start_live, stop_live, wait_ready
from tests.server.fake_backend import FakeBackend


@pytest.fixture(scope="module")
def prefixed() -> Iterator[LiveServer]:
    settings = ServerSettings(model_path="/models/fake.gguf", api_keys=["k"], api_prefix="/llm", warmup=False)
    srv, thread = start_live(settings, FakeBackend(n_ctx=512, n_seq_max=2, n_batch=64))
    mount_webui(srv.app)
    wait_ready(srv.base_url + "/llm")
    yield srv
    stop_live(srv, thread)


def test_openai_client_under_the_prefix(prefixed):
    client = openai.OpenAI(base_url=prefixed.base_url + "/llm/v1", api_key="k", max_retries=0, timeout=30)
    assert [m.id for m in client.models.list().data] == ["fake.gguf"]
    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert r.usage.completion_tokens == 3
    chunks = list(client.completions.create(model="m", prompt="abc", max_tokens=2, stream=True))
    assert chunks


def test_every_route_under_the_prefix_and_none_outside(prefixed):
    base = prefixed.base_url
    assert httpx.get(base + "/llm/health").status_code == 200  # public: no key needed under the prefix
    page = httpx.get(base + "/llm/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    asset = page.text.split('src="')[1].split('"')[0]  # relative ("webui/app-....js")
    assert httpx.get(f"{base}/llm/{asset}").status_code == 200
    r = httpx.post(base + "/llm/v1/messages", json={}, timeout=30)  # Anthropic's error shape, key missing
    assert r.status_code == 401 and r.json()["type"] == "error", r.text
    for path in ("/health", "/v1/models", "/", "/llmx/health", "/llm"):
        r = httpx.get(base + path)
        assert r.status_code == 404 and "error" in r.json(), (path, r.text)


def test_flag_and_environment_variable():
    def prefix(argv: list[str], env: dict[str, str]) -> str:
        return build_parser("serve").parse_args(with_env(argv, env)).api_prefix

    assert prefix(["serve", "-m", "x.gguf", "--api-prefix", "/llm/"], {}) == "/llm"
    assert prefix(["serve", "-m", "x.gguf"], {"LLAMA_ARG_API_PREFIX": "llm"}) == "/llm"
    assert prefix(["serve", "-m", "x.gguf"], {}) == ""
