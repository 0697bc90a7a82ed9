"""POST /slots/{id}?action=save|restore|erase over a real socket with the fake model (whose KV state
can be saved too): round trip, file name checks, corrupt files, busy slots, the llama.cpp answers."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llamapy.server.app import ServerSettings
from llamapy.server.errors import APIError
from llamapy.server.slots import MAGIC, validate_filename
from tests.server.conftest import LiveServer, start_live, stop_live, wait_ready
from tests.server.fake_backend import FakeBackend

PROMPT = "the slot keeps this prompt"


@pytest.fixture(scope="module")
def save_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("slots")


@pytest.fixture(scope="module")
def srv(save_dir) -> Iterator[LiveServer]:
    settings = ServerSettings(model_path="/models/fake.gguf", slot_save_path=str(save_dir))
    live, thread = start_live(settings, FakeBackend(n_ctx=512, n_seq_max=2, n_batch=64, delay=0.002))
    wait_ready(live.base_url)
    yield live
    stop_live(live, thread)


def action(srv: LiveServer, slot: object, act: str, filename: str | None = None) -> httpx.Response:
    body = {} if filename is None else {"filename": filename}
    return httpx.post(f"{srv.base_url}/slots/{slot}", params={"action": act}, json=body, timeout=20)


def complete(srv: LiveServer, prompt: str, slot: int, n: int = 6) -> dict:
    body = {"prompt": prompt, "n_predict": n, "temperature": 0, "id_slot": slot, "return_tokens": True}
    r = httpx.post(srv.base_url + "/completion", json=body, timeout=20)
    assert r.status_code == 200, r.text
    return r.json()


def cached(srv: LiveServer, slot: int) -> int:
    return httpx.get(srv.base_url + "/slots").json()[slot]["n_cached_tokens"]


def test_save_erase_restore_round_trip(srv):
    first = complete(srv, PROMPT, 0)
    n_cache = cached(srv, 0)
    r = action(srv, 0, "save", "round.bin")
    assert r.status_code == 200, r.text
    saved = r.json()
    assert saved["id_slot"] == 0 and saved["filename"] == "round.bin" and saved["n_saved"] == n_cache
    assert saved["n_written"] > 4 * n_cache and "save_ms" in saved["timings"]

    r = action(srv, 0, "erase")
    assert r.status_code == 200 and r.json() == {"id_slot": 0, "n_erased": n_cache}
    assert cached(srv, 0) == 0 and srv.backend.kv[0] == []

    r = action(srv, 0, "restore", "round.bin")
    assert r.status_code == 200, r.text
    restored = r.json()
    assert restored["n_restored"] == n_cache and restored["n_read"] == saved["n_written"]
    assert cached(srv, 0) == n_cache and len(srv.backend.kv[0]) == n_cache

    # continuing the conversation: the restored slot reuses its cache, and the answer is the one a
    # fresh slot computes from scratch
    follow = PROMPT + first["content"] + " and more"
    a = complete(srv, follow, 0)
    assert a["tokens_cached"] >= n_cache - 1
    action(srv, 1, "erase")
    b = complete(srv, follow, 1)
    assert b["tokens_cached"] == 0 and a["tokens"] == b["tokens"] and a["content"] == b["content"]


def test_restore_into_the_other_slot(srv):
    complete(srv, "slot one text", 1)
    assert action(srv, 1, "save", "one.bin").status_code == 200
    assert action(srv, 0, "restore", "one.bin").status_code == 200
    assert srv.backend.kv[0] == srv.backend.kv[1]
    assert complete(srv, "slot one text!", 0)["tokens_cached"] > 0


@pytest.mark.parametrize("name", ["../x", "a/b", "a\\b", ".hidden", "x" * 300, "", "..", "a\x00b", " a", 5])
def test_bad_filenames(srv, save_dir, name):
    for act in ("save", "restore"):
        r = action(srv, 0, act, name)
        assert r.status_code == 400, (name, r.text)
        assert r.json()["error"]["param"] == "filename"
    assert not (save_dir.parent / "x").exists()


def test_validate_filename_accepts_plain_names():
    assert validate_filename("slot-0.bin") == "slot-0.bin"
    assert validate_filename("é" * 127) == "é" * 127  # 254 bytes
    with pytest.raises(APIError):
        validate_filename("é" * 128)  # 256 bytes


def _corrupt_files(good: bytes) -> dict[str, bytes]:
    n_header = int.from_bytes(good[len(MAGIC) : len(MAGIC) + 4], "little")
    h0 = len(MAGIC) + 4
    header = json.loads(good[h0 : h0 + n_header])
    rest = good[h0 + n_header :]

    def with_header(h: dict, body: bytes = rest) -> bytes:
        raw = json.dumps(h).encode()
        return MAGIC + len(raw).to_bytes(4, "little") + raw + body

    other = dict(header, model=dict(header["model"], file="other.gguf"))
    bad_token = bytearray(rest)
    bad_token[0:4] = (99999).to_bytes(4, "little")
    bad_state = bytearray(rest)
    bad_state[4 * header["n_tokens"]] ^= 0xFF  # the fake KV state's magic
    return {
        "garbage.bin": b"not a slot file at all",
        "empty.bin": b"",
        "truncated.bin": good[:-3],
        "longer.bin": good + b"\0",
        "header.bin": MAGIC + (50).to_bytes(4, "little") + b"{not json",
        "other-model.bin": with_header(other),
        "bad-token.bin": with_header(header, bytes(bad_token)),
        "bad-count.bin": with_header(dict(header, n_tokens=-1)),
        "too-many.bin": with_header(dict(header, n_tokens=10**6)),
        "bad-state.bin": with_header(header, bytes(bad_state)),
    }


def test_corrupt_files_are_400(srv, save_dir):
    complete(srv, "a prompt to save", 0)
    assert action(srv, 0, "save", "good.bin").status_code == 200
    good = (save_dir / "good.bin").read_bytes()
    for name, data in _corrupt_files(good).items():
        (save_dir / name).write_bytes(data)
        r = action(srv, 1, "restore", name)
        assert r.status_code == 400, (name, r.text)
        assert "cannot restore" in r.json()["error"]["message"]
    r = action(srv, 1, "restore", "missing.bin")
    assert r.status_code == 400 and "no such file" in r.json()["error"]["message"]
    # the slot still works, and a good file still restores
    complete(srv, "after the failures", 1)
    assert action(srv, 1, "restore", "good.bin").status_code == 200


def test_bad_slot_ids_and_actions(srv):
    for slot in (2, 99, -1, "abc"):
        r = action(srv, slot, "erase")
        assert r.status_code == 400 and "Invalid slot ID" in r.json()["error"]["message"], r.text
    assert action(srv, 0, "explode", "x.bin").status_code == 400
    assert action(srv, 0, None).status_code == 400
    r = httpx.post(f"{srv.base_url}/slots/0?action=save", content=b"[1]", timeout=10)
    assert r.status_code == 400


def test_busy_slot_is_409(srv):
    started = threading.Event()
    body = {"prompt": "busy " * 4, "n_predict": 200, "id_slot": 0, "stream": True, "ignore_eos": True}

    def run() -> None:
        with httpx.stream("POST", srv.base_url + "/completion", json=body, timeout=30) as resp:
            for _ in resp.iter_lines():
                started.set()

    t = threading.Thread(target=run)
    t.start()
    assert started.wait(10)
    for act, name in (("save", "busy.bin"), ("restore", "good.bin"), ("erase", None)):
        r = action(srv, 0, act, name)
        assert r.status_code == 409, r.text
    t.join(30)
    assert complete(srv, "still serving", 0)["stop"] is True


def test_without_slot_save_path(live):
    for act in ("save", "restore", "erase"):
        r = httpx.post(f"{live.base_url}/slots/0", params={"action": act}, json={"filename": "a.bin"})
        assert r.status_code == 501, r.text
        assert "--slot-save-path" in r.json()["error"]["message"]


# -- the real model: SmolLM2's KV state through ContextBackend and the engine thread -------------------


def test_real_model_save_erase_restore(smollm2_path, tmp_path):
    import asyncio

    from llamapy.server.backend import ContextBackend
    from llamapy.server.engine import Engine, GenParams, Task
    from llamapy.server.sampling import SamplingParams
    from llamapy.server.slots import slot_action

    backend = ContextBackend(smollm2_path, n_ctx=512, n_seq_max=2, n_batch=64, n_ubatch=64)
    engine = Engine(backend)
    engine.start()
    try:

        def run(prompt: list[int], slot: int, n: int = 8):
            done, events = threading.Event(), []

            def sink(ev):
                events.append(ev)
                if ev.done:
                    done.set()

            gp = GenParams(n_predict=n, sampling=SamplingParams(temp=0.0), id_slot=slot)
            engine.submit(Task(prompt, gp, sink))
            assert done.wait(120)
            assert events[-1].error is None, events[-1].error
            return [t for e in events for t in e.tokens], events[-1]

        def act(slot: int, a: str, name: str | None = None) -> dict:
            body = {"filename": name} if name else {}
            return asyncio.run(slot_action(engine, str(tmp_path), str(slot), a, body))

        prompt = backend.tokenize("The capital of France is", add_special=True)
        out, _ = run(prompt, 0)
        n = len(engine.slots[0].cache)
        assert act(0, "save", "real.bin")["n_saved"] == n
        assert act(0, "erase")["n_erased"] == n
        assert act(0, "restore", "real.bin")["n_restored"] == n
        follow = engine.slots[0].cache + backend.tokenize(" Paris is", add_special=False)
        restored, ev = run(follow, 0)
        assert ev.n_cached == n
        act(1, "erase")
        fresh, ev1 = run(follow, 1)
        assert ev1.n_cached == 0 and restored == fresh
        # a file of the fake model is refused by the real one
        (tmp_path / "fake.bin").write_bytes(MAGIC + b"\x02\x00\x00\x00{}")
        with pytest.raises(APIError, match="cannot restore"):
            act(0, "restore", "fake.bin")
        assert run(prompt, 0)[0] == out
    finally:
        engine.stop()


def test_cli_flag(smollm2_path, tmp_path):
    import subprocess
    import sys

    from llamapy.cli import build_parser

    args = build_parser().parse_args(["serve", "-m", "x.gguf", "--slot-save-path", str(tmp_path)])
    assert args.slot_save_path == str(tmp_path)
    cmd = [sys.executable, "-m", "llamapy", "serve", "-m", str(smollm2_path), "--port", "0"]
    r = subprocess.run(
        [*cmd, "--slot-save-path", str(tmp_path / "nope")], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2 and "--slot-save-path" in r.stderr and "not a folder" in r.stderr
