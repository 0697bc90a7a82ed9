"""POST /slots/{id}?action=save|restore|erase over a real socket with the fake model (whose KV state
can be saved too): round trip, file name checks, corrupt files, busy slots, the llama.cpp answers."""

from __future__ import annotations

import json
import os
import resource
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
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


# -- hostile slot files (issue 33 §2.10): each a quick 400, and the server keeps serving the same output ----


def _header_of(raw: bytes) -> tuple[dict, int]:
    n_header = int.from_bytes(raw[len(MAGIC) : len(MAGIC) + 4], "little")
    h0 = len(MAGIC) + 4
    return json.loads(raw[h0 : h0 + n_header]), h0 + n_header


def _slot_file(header: dict, tokens: list[int], state: bytes) -> bytes:
    raw = json.dumps(dict(header, n_tokens=len(tokens), n_state=len(state))).encode()
    return MAGIC + len(raw).to_bytes(4, "little") + raw + np.asarray(tokens, "<i4").tobytes() + state


def quick_400(srv, slot: int, act: str, name: str, limit: float = 5.0) -> str:
    """The error message of a 400 that came in under ``limit`` seconds (the issue asks for < 1 s; this
    shared 2-core CI box gets a margin)."""
    t0 = time.perf_counter()
    r = action(srv, slot, act, name)
    dt = time.perf_counter() - t0
    assert r.status_code == 400, (name, r.status_code, r.text)
    assert dt < limit, f"{act} {name}: {dt:.2f} s"
    print(f"{act} {name}: 400 in {dt * 1e3:.0f} ms")
    return r.json()["error"]["message"]


@pytest.fixture(scope="module")
def greedy(srv) -> list[int]:
    """Slot 1's greedy answer to a fixed prompt before any hostile file was tried."""
    return complete(srv, "the greedy check prompt", 1, n=8)["tokens"]


def still_serving(srv, greedy: list[int]) -> None:
    assert httpx.get(srv.base_url + "/health", timeout=5).status_code == 200
    assert complete(srv, "the greedy check prompt", 1, n=8)["tokens"] == greedy


def test_save_never_writes_through_a_planted_link(srv, save_dir, tmp_path, greedy):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (save_dir / "planted.bin.tmp").symlink_to(victim)  # the old fixed temporary name
    (save_dir / "linked.bin").symlink_to(victim)
    complete(srv, PROMPT, 0)
    for name in ("planted.bin", "linked.bin"):
        assert action(srv, 0, "save", name).status_code == 200
    assert victim.read_text() == "keep me"
    assert (save_dir / "planted.bin.tmp").is_symlink()  # left alone
    assert (save_dir / "linked.bin").is_file() and not (save_dir / "linked.bin").is_symlink()
    assert action(srv, 1, "restore", "linked.bin").status_code == 200
    assert not list(save_dir.glob(".slot-*"))  # no temporary file left behind
    still_serving(srv, greedy)


def test_save_keeps_a_file_named_like_the_old_temporary(srv, save_dir, greedy):
    (save_dir / "keep.tmp").write_bytes(b"mine")
    complete(srv, PROMPT, 0)
    assert action(srv, 0, "save", "keep").status_code == 200
    assert (save_dir / "keep.tmp").read_bytes() == b"mine"
    assert (save_dir / "keep").read_bytes()[: len(MAGIC)] == MAGIC
    still_serving(srv, greedy)


def test_restore_of_a_fifo_or_folder_is_400(srv, save_dir, greedy):
    os.mkfifo(save_dir / "fifo.bin")
    (save_dir / "folder.bin").mkdir()
    for name in ("fifo.bin", "folder.bin"):
        assert "not a regular file" in quick_400(srv, 0, "restore", name)
    # a folder in the way of a save
    assert "folder" in quick_400(srv, 0, "save", "folder.bin")
    still_serving(srv, greedy)


def test_restore_of_a_huge_file_reads_only_its_header(srv, save_dir, greedy):
    complete(srv, PROMPT, 0)
    assert action(srv, 0, "save", "small.bin").status_code == 200
    header, _ = _header_of((save_dir / "small.bin").read_bytes())
    gib = 1 << 30
    with open(save_dir / "zeros.bin", "wb") as f:  # sparse: no disk used
        f.truncate(gib)
    raw = json.dumps(dict(header, n_tokens=3, n_state=gib)).encode()
    lying = MAGIC + len(raw).to_bytes(4, "little") + raw
    with open(save_dir / "lying.bin", "wb") as f:  # a header that promises a 1 GiB KV state, and the bytes
        f.write(lying)
        f.truncate(len(lying) + 12 + gib)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert "bad magic" in quick_400(srv, 0, "restore", "zeros.bin")
    assert "larger than 3 tokens can have" in quick_400(srv, 0, "restore", "lying.bin")
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    assert grown_mib < 200, f"the peak memory grew by {grown_mib:.0f} MiB"
    still_serving(srv, greedy)


def test_restore_errors_say_nothing_about_outside_the_folder(srv, save_dir, tmp_path, greedy):
    secret = tmp_path / "secret.txt"
    secret.write_text("x")
    secret_dir = tmp_path / "secret-dir"
    secret_dir.mkdir()
    unreadable = tmp_path / "unreadable.txt"
    unreadable.write_text("x")
    unreadable.chmod(0)
    targets = {"to-file.bin": secret, "to-dir.bin": secret_dir, "to-none.bin": tmp_path / "missing",
               "to-unreadable.bin": unreadable, "to-good.bin": save_dir / "good.bin"}  # fmt: skip
    messages = set()
    for name, target in targets.items():
        (save_dir / name).symlink_to(target)
        messages.add(quick_400(srv, 0, "restore", name).replace(repr(name), "NAME"))
    assert len(messages) == 1, messages
    assert "symbolic link" in messages.pop()
    still_serving(srv, greedy)


# -- crafted KV states on the real model (SmolLM2 through ContextBackend, over a socket) ---------------


@pytest.fixture(scope="module")
def real_srv(smollm2_path, tmp_path_factory) -> Iterator[LiveServer]:
    from llamapy.server.backend import ContextBackend

    folder = tmp_path_factory.mktemp("real-slots")
    backend = ContextBackend(smollm2_path, n_ctx=1024, n_seq_max=2, n_batch=64, n_ubatch=64)
    settings = ServerSettings(model_path=str(smollm2_path), slot_save_path=str(folder))
    live, thread = start_live(settings, backend)
    wait_ready(live.base_url, timeout=600)
    live.folder = folder  # type: ignore[attr-defined]
    yield live
    stop_live(live, thread)


def _craft_state(state: bytes, positions: list[int]) -> bytes:
    """SmolLM2's saved KV state (f16, no window, one sequence) rebuilt with cells at ``positions`` (the
    rows of the saved cells repeated)."""
    ctx_header = 20
    n = int.from_bytes(state[ctx_header + 4 : ctx_header + 8], "little")
    n_layers = int.from_bytes(state[ctx_header + 8 : ctx_header + 12], "little")
    m = len(positions)
    out = [state[:ctx_header], state[ctx_header : ctx_header + 4], struct.pack("<I", m)]
    out.append(state[ctx_header + 8 : ctx_header + 20])
    out.append(np.asarray(positions, "<i8").tobytes())
    off = ctx_header + 20 + 8 * n
    pick = np.arange(m) % n
    for _ in range(n_layers):
        _, nk, nv = struct.unpack_from("<III", state, off)
        out.append(state[off : off + 12])
        off += 12
        for width in (2 * nk, 2 * nv):
            rows = np.frombuffer(state, np.uint8, n * width, off).reshape(n, width)
            out.append(rows[pick].tobytes())
            off += n * width
    assert off == len(state)
    return b"".join(out)


def test_real_model_crafted_kv_cells_are_400(real_srv):
    srv, folder = real_srv, real_srv.folder
    question = "The capital of France is"
    greedy = complete(srv, question, 1, n=8)["tokens"]
    long_prompt = "One two three four five six seven eight nine ten. " * 6
    complete(srv, long_prompt, 0, n=4)
    assert action(srv, 0, "save", "long.bin").status_code == 200
    raw = (folder / "long.bin").read_bytes()
    header, off = _header_of(raw)
    n = header["n_tokens"]
    assert n > 40
    tokens = np.frombuffer(raw, "<i4", n, off).tolist()
    state = raw[off + 4 * n :]
    assert _craft_state(state, list(range(n))) == state
    crafted = {
        # the KV cells of a 60-token sequence under 13 tokens (the 4000 cells for 13 tokens)
        "more-cells.bin": _slot_file(header, tokens[:13], state),
        "many-cells.bin": _slot_file(header, tokens[:13], _craft_state(state, list(range(500)))),
        "zero-pos.bin": _slot_file(header, tokens, _craft_state(state, [0] * n)),
        "huge-pos.bin": _slot_file(header, tokens, _craft_state(state, [*range(n - 1), 1 << 62])),
        "gap.bin": _slot_file(header, tokens, _craft_state(state, [*range(n - 1), n])),
        "fewer-cells.bin": _slot_file(header, tokens, _craft_state(state, list(range(n - 1)))),
        "negative.bin": _slot_file(header, tokens, _craft_state(state, [-1, *range(1, n)])),
    }
    for name, data in crafted.items():
        (folder / name).write_bytes(data)
        message = quick_400(srv, 0, "restore", name)
        assert "cannot restore" in message, message
        # the slot is usable, with its whole context: a prompt longer than 83 tokens
        r = complete(srv, long_prompt * 2, 0, n=2)
        assert r["tokens_evaluated"] > 100
        assert complete(srv, question, 1, n=8)["tokens"] == greedy, name
    # the real file still restores, and continues as a fresh slot would
    assert action(srv, 0, "restore", "long.bin").status_code == 200
    assert complete(srv, question, 1, n=8)["tokens"] == greedy
