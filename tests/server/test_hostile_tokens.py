"""Hostile chat templates and huge prompts against the real server and CLI (issue 33 §2.4, §2.6): a
template that computes ``10 ** 10 ** 8`` or builds a 2 GB string is a 400 in well under the render
deadline while ``/health`` keeps answering; ``llamapy chat`` with it prints ``error:`` and exits 1;
``count_tokens`` of 3,000,000 ``x`` is exact and fast, and a 2 MB chat prompt is a fast 400."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import RealServer, run_real_server

HOSTILE = {
    "pow": "{% set e = 10 ** 8 %}{{ ((10 ** e) % 7) * 0 }}",
    "repeat": "{% set n = 2 * 10 ** 9 %}{% if ('a' * n)|length > 0 %}x{% endif %}",
}
GREEDY = {"prompt": "The capital of France is", "n_predict": 8, "temperature": 0, "cache_prompt": False}


def _headers(srv: RealServer) -> dict[str, str]:
    return {"Authorization": f"Bearer {srv.api_key}"}


@pytest.fixture(scope="module")
def hostile_server(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealServer]:
    path = tmp_path_factory.mktemp("tpl") / "pow.jinja"
    path.write_text(HOSTILE["pow"], encoding="utf-8")
    with run_real_server(smollm2_path, ["--chat-template-file", str(path)]) as srv:
        yield srv


@pytest.fixture(scope="module")
def big_body_server(smollm2_path: Path) -> Iterator[RealServer]:
    with run_real_server(smollm2_path, ["--max-body-size", str(16 << 20)]) as srv:
        yield srv


def _health_while(srv: RealServer, request: callable) -> tuple[httpx.Response, float, float]:
    """Runs ``request`` in a thread and polls /health meanwhile: (its response, its seconds, the slowest
    /health answer)."""
    result: list[httpx.Response] = []
    t0 = time.monotonic()
    th = threading.Thread(target=lambda: result.append(request()))
    th.start()
    slowest = 0.0
    with httpx.Client(base_url=srv.base_url, timeout=30) as c:
        while th.is_alive():
            h0 = time.monotonic()
            assert c.get("/health").status_code == 200
            slowest = max(slowest, time.monotonic() - h0)
            time.sleep(0.05)
    th.join()
    return result[0], time.monotonic() - t0, slowest


def test_hostile_template_is_a_fast_400_and_health_stays_up(hostile_server: RealServer) -> None:
    srv = hostile_server
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    with httpx.Client(base_url=srv.base_url, timeout=60, headers=_headers(srv)) as c:
        before = c.post("/completion", json=GREEDY).json()["content"]
        for _ in range(2):  # the first request also runs the template's capability probes
            r, elapsed, slowest = _health_while(srv, lambda: c.post("/v1/chat/completions", json=body))
            assert r.status_code == 400, r.text
            assert "'**' would make an integer" in r.json()["error"]["message"]
            assert elapsed < 5, elapsed  # measured: well under a second
            assert slowest < 2, slowest
        r = c.post("/v1/messages", json={**body, "model": "x"})
        assert r.status_code == 400 and r.json()["type"] == "error", r.text
        assert c.post("/completion", json=GREEDY).json()["content"] == before


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_cli_chat_with_a_hostile_template_fails_fast(name: str, smollm2_path: Path, tmp_path: Path) -> None:
    path = tmp_path / "t.jinja"
    path.write_text(HOSTILE[name], encoding="utf-8")
    cmd = [sys.executable, "-m", "llamapy", "chat", "-m", str(smollm2_path), "--chat-template-file", str(path),
           "-n", "4", "-c", "256"]  # fmt: skip
    t0 = time.monotonic()
    p = subprocess.run(cmd, input="hi\n", capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - t0
    assert p.returncode == 1, (p.returncode, p.stderr[-2000:])
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
    assert lines and "would make" in lines[-1], p.stderr[-2000:]
    assert "Traceback" not in p.stderr
    assert elapsed < 60, elapsed  # model load included; the template fails in milliseconds


def test_count_tokens_of_3m_x_is_exact(big_body_server: RealServer) -> None:
    srv = big_body_server
    body = {"model": "x", "messages": [{"role": "user", "content": "x" * 3_000_000}]}
    with httpx.Client(base_url=srv.base_url, timeout=120, headers=_headers(srv)) as c:
        small = c.post(
            "/v1/messages/count_tokens", json={**body, "messages": [{"role": "user", "content": "x"}]}
        )
        assert small.status_code == 200, small.text
        # 'x' alone is one token; 3,000,000 of them are 750,000 'xxxx' tokens
        r, elapsed, slowest = _health_while(srv, lambda: c.post("/v1/messages/count_tokens", json=body))
        assert r.status_code == 200, r.text
        assert r.json()["input_tokens"] == small.json()["input_tokens"] - 1 + 750_000
        assert elapsed < 30, elapsed  # was 28.7 s and +1 GB; measured: a few seconds on this busy box
        assert slowest < 2, slowest


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/messages"])
def test_a_2mb_chat_prompt_is_a_fast_400(big_body_server: RealServer, route: str) -> None:
    srv = big_body_server
    body = {"model": "x", "max_tokens": 4, "messages": [{"role": "user", "content": "x" * (2 << 20)}]}
    with httpx.Client(base_url=srv.base_url, timeout=60, headers=_headers(srv)) as c:
        t0 = time.monotonic()
        r = c.post(route, json=body)
        elapsed = time.monotonic() - t0
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert "tokens but a slot's context holds" in err["message"]
        assert elapsed < 5, elapsed  # was 27 s
        r = c.post("/completion", json={**GREEDY, "prompt": "y" * (2 << 20)})
        assert r.status_code == 400 and "context holds" in r.text, r.text
        ok = c.post("/v1/chat/completions", json={**body, "messages": [{"role": "user", "content": "hi"}]})
        assert ok.status_code == 200, ok.text
