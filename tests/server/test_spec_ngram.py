"""``llamapy serve --spec-type ngram-simple|ngram-map-k`` over a socket: each slot drafts from the
n-grams of its own prompt and generation, the engine verifies in the shared batch; greedy text
identical to a server without drafts, drafts accepted on repetitive text (``timings.draft_n_accepted``),
two slots at once, and bad flags refused at start-up."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from llamapy.errors import LlamapyError
from llamapy.generation.spec_server import server_spec
from llamapy.server.app import ServerSettings
from llamapy.server.backend import ContextBackend
from tests.server.conftest import LiveServer, start_live, stop_live, wait_ready

PROMPT = "Repeat after me.\n" + "The cat sat on the mat, and the dog sat on the log.\n" * 3


def _serve(path: str, draft: dict | None) -> tuple[LiveServer, object]:
    backend = ContextBackend(path, n_ctx=512, n_seq_max=2, n_batch=64, n_ubatch=64, draft=draft)
    srv, thread = start_live(ServerSettings(model_path=path, warmup=False), backend)
    wait_ready(srv.base_url, timeout=120)
    return srv, thread


@pytest.fixture(scope="module")
def servers(smollm2_path) -> Iterator[dict[str, LiveServer]]:
    out, threads = {}, []
    for name, draft in (("plain", None), ("ngram-simple", server_spec("ngram-simple", size_n=6, size_m=16)),
                        ("ngram-map-k", server_spec("ngram-map-k", size_n=4, size_m=8))):  # fmt: skip
        srv, th = _serve(str(smollm2_path), draft)
        out[name] = srv
        threads.append((srv, th))
    yield out
    for srv, th in threads:
        stop_live(srv, th)


def _complete(srv: LiveServer, prompt: str = PROMPT, n: int = 24) -> dict:
    r = httpx.post(srv.base_url + "/completion", json={"prompt": prompt, "n_predict": n, "temperature": 0},
                   timeout=300)  # fmt: skip
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["ngram-simple", "ngram-map-k"])
def test_same_text_and_accepted_drafts(servers: dict[str, LiveServer], spec: str) -> None:
    want = _complete(servers["plain"])
    got = _complete(servers[spec])
    assert got["content"] == want["content"]
    t = got["timings"]
    assert t["draft_n"] > 0 and t["draft_n_accepted"] > 0, t


@pytest.mark.slow
def test_two_slots_at_once(servers: dict[str, LiveServer]) -> None:
    prompts = [PROMPT, "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3,"]
    want = [_complete(servers["plain"], p)["content"] for p in prompts]
    with ThreadPoolExecutor(2) as ex:
        got = list(ex.map(lambda p: _complete(servers["ngram-simple"], p)["content"], prompts))
    assert got == want


def test_bad_spec_flags_refused(smollm2_path) -> None:
    with pytest.raises(LlamapyError, match="unknown speculative"):
        server_spec("ngram-lol")
    with pytest.raises(LlamapyError, match="size_n"):
        ContextBackend(str(smollm2_path), n_ctx=256, draft=server_spec("ngram-simple", size_n=0))
    with pytest.raises(LlamapyError, match="MTP"):
        ContextBackend(str(smollm2_path), n_ctx=256, draft=server_spec("mtp"))


def test_serve_spec_type_mtp_without_mtp_layers_exits(smollm2_path, capfd) -> None:
    """``llamapy serve --spec-type mtp`` on a model without MTP layers: ``error: ...``, exit 1, before
    listening (the header is read, not the model)."""
    from llamapy.cli import main

    rc = main(["serve", "-m", str(smollm2_path), "--spec-type", "mtp", "--port", "0", "-c", "256"])
    err = capfd.readouterr().err
    assert rc == 1 and "error:" in err and "MTP" in err
