"""Router mode (issue 26 §3): many tiny models in one server (``llamapy serve --models-dir``), over a real
socket with the official ``openai`` and ``ollama`` clients: each answer equals the model served alone, a
failing model next to working ones, unknown models, 8 concurrent first requests load once, LRU with
``--models-max 1``, idle unload (``--keep-alive``, ollama's ``keep_alive``), the memory check,
``/models/load`` and ``/models/unload``, per-model ``/props``, ``/health``, ``/slots``, ``/metrics``, and
ollama's ``/api/pull`` (from the fake Hub of tests/hub), ``/api/copy``, ``/api/delete``."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import openai
import pytest

from llamapy.cli import build_parser, main
from llamapy.cli.serve import make_app
from tests.hub.conftest import fake_hub, hf_env, tiny_with_vocab  # noqa: F401  (fixtures)
from tests.server.conftest import serve_app

pytestmark = pytest.mark.slow
ARGS = ["-c", "256", "-np", "1", "--no-warmup", "--metrics", "--no-webui"]


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("models")
    tiny_with_vocab(d / "alpha.gguf", seed=1)
    tiny_with_vocab(d / "beta.gguf", seed=2)
    sub = d / "gamma-Q8_0"  # a model alone in a folder is named by the folder
    sub.mkdir()
    (sub / "gamma-Q8_0.gguf").write_bytes((d / "alpha.gguf").read_bytes())
    data = (d / "alpha.gguf").read_bytes()
    (d / "broken.gguf").write_bytes(data[: len(data) // 3])  # truncated: fails to load
    return d


class Served:
    def __init__(self, argv: list[str]) -> None:
        args = build_parser().parse_args(["serve", *argv, *ARGS])
        self.app: Any = make_app(args, [], args.model)
        self.url, self.server, self.thread = serve_app(self.app)
        self.oai = openai.OpenAI(base_url=self.url + "/v1", api_key="x", max_retries=0, timeout=120)
        self.ollama = ollama.Client(host=self.url, timeout=120)

    @property
    def router(self) -> Any:
        return self.app.state.server.router

    def states(self) -> dict[str, str]:
        return {m["id"]: m["status"]["value"] for m in httpx.get(self.url + "/v1/models").json()["data"]}

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def ask(srv: Served, model: str, prompt: str = "Hello there") -> str:
    r = srv.oai.completions.create(model=model, prompt=prompt, max_tokens=6, temperature=0)
    return r.choices[0].text


def chat(srv: Served, model: str) -> str:
    msgs = [{"role": "user", "content": "Say hi"}]
    r = srv.oai.chat.completions.create(model=model, messages=msgs, max_tokens=6, temperature=0)
    return r.choices[0].message.content or ""


def wait_for(cond: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def router(models_dir: Path) -> Iterator[Served]:
    srv = Served(["--models-dir", str(models_dir), "--models-max", "3"])
    yield srv
    srv.stop()


def test_each_model_answers_as_served_alone(router: Served, models_dir: Path) -> None:
    assert router.states() == {"alpha": "unloaded", "beta": "unloaded", "gamma-Q8_0": "unloaded",
                               "broken": "unloaded"}  # fmt: skip
    got = {m: (ask(router, m), chat(router, m)) for m in ("alpha", "beta")}
    assert got["alpha"] != got["beta"]  # two different models
    assert router.states()["alpha"] == router.states()["beta"] == "loaded"
    for m in ("alpha", "beta"):
        alone = Served(["-m", str(models_dir / f"{m}.gguf"), "-a", m])
        try:
            wait_for(lambda a=alone: httpx.get(a.url + "/health").status_code == 200)
            assert (ask(alone, m), chat(alone, m)) == got[m]
        finally:
            alone.stop()


def test_a_failing_model_answers_its_error_only(router: Served) -> None:
    with pytest.raises(openai.APIStatusError) as e:
        ask(router, "broken")
    assert (
        e.value.status_code == 424
        and "failed to load" in e.value.message
        and "broken.gguf" in e.value.message
    )
    with pytest.raises(openai.APIStatusError):  # again: the error, not a second load
        ask(router, "broken")
    assert router.states()["broken"] == "failed"
    assert ask(router, "alpha")  # the others still serve
    failed = [m for m in httpx.get(router.url + "/v1/models").json()["data"] if m["id"] == "broken"][0]
    assert failed["status"]["failed"] is True and "broken.gguf" in failed["status"]["error"]


def test_unknown_or_missing_model_names_the_known_ones(router: Served) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        ask(router, "nope")
    assert "nope" in e.value.message and "alpha, beta, broken, gamma-Q8_0" in e.value.message
    r = httpx.post(router.url + "/v1/completions", json={"prompt": "x"})
    assert r.status_code == 400 and "known models: alpha" in r.json()["error"]["message"]
    r = httpx.post(router.url + "/v1/completions", content=b"{not json")
    assert r.status_code == 400
    assert ask(router, "ALPHA.gguf") == ask(router, "alpha")  # names as ollama's: case, .gguf, :latest


def test_hostile_model_fields(router: Served) -> None:
    url = router.url + "/v1/chat/completions"
    msgs = [{"role": "user", "content": "hi"}]
    for value, status in [(5, 400), (["alpha"], 400), ({"a": 1}, 400), ("", 400), (None, 400),
                          ("x" * 1_000_000, 404), ("../alpha", 404), ("alpha\u0000", 404)]:  # fmt: skip
        t0 = time.monotonic()
        r = httpx.post(url, json={"model": value, "messages": msgs}, timeout=30)
        assert r.status_code == status, (value if len(str(value)) < 20 else "long", r.text[:200])
        assert len(r.text) < 2000 and time.monotonic() - t0 < 5  # (the name is cut in the message)
    r = httpx.post(router.url + "/v1/messages", json={"model": "nope", "max_tokens": 5, "messages": msgs})
    assert r.status_code == 404 and r.json()["type"] == "error"  # Anthropic's shape under /v1/messages
    r = httpx.post(router.url + "/api/chat", json={"model": "nope", "messages": msgs})
    assert r.status_code == 404 and "known models" in r.json()["error"]  # ollama's shape under /api/
    assert ask(router, "alpha")


def test_per_model_endpoints(router: Served) -> None:
    ask(router, "alpha")
    assert httpx.get(router.url + "/health").json() == {"status": "ok"}
    assert httpx.get(router.url + "/health", params={"model": "alpha"}).status_code == 200
    props = httpx.get(router.url + "/props", params={"model": "alpha"}).json()
    assert props["model_alias"] == "alpha" and props["model_path"].endswith("alpha.gguf")
    slots = httpx.get(router.url + "/slots", params={"model": "alpha"}).json()
    assert len(slots) == 1
    metrics = httpx.get(router.url + "/metrics", params={"model": "alpha"})
    assert metrics.status_code == 200 and "requests_processing" in metrics.text
    r = httpx.get(router.url + "/props", params={"model": "gamma-Q8_0"})  # a GET does not load a model
    assert r.status_code == 503 and "not loaded" in r.json()["error"]["message"]
    toks = httpx.post(router.url + "/tokenize", params={"model": "alpha"}, json={"content": "Hello"}).json()
    assert toks["tokens"]


def test_concurrent_first_requests_load_once(router: Served) -> None:
    before = router.router.loads_started
    out: list[str] = []

    async def one(client: openai.AsyncOpenAI) -> str:
        r = await client.completions.create(
            model="gamma-Q8_0", prompt="Hello there", max_tokens=6, temperature=0
        )
        return r.choices[0].text

    async def run() -> None:
        client = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="x", max_retries=0, timeout=120)
        out.extend(await asyncio.gather(*(one(client) for _ in range(8))))

    asyncio.run(run())
    assert router.router.loads_started == before + 1
    assert len(set(out)) == 1 and out[0] == ask(router, "alpha")  # gamma is alpha's file


def test_memory_check_refuses_a_model_that_does_not_fit(
    router: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    httpx.post(router.url + "/api/copy", json={"source": "beta", "destination": "big"}).raise_for_status()
    monkeypatch.setenv("LLAMAPY_FREE_MEMORY", str(1 << 20))  # 1 MiB free
    with pytest.raises(openai.APIStatusError) as e:
        ask(router, "big")
    assert e.value.status_code == 424 and "does not fit in memory" in e.value.message
    assert "1.0 MiB is free" in e.value.message and router.states()["big"] == "failed"
    monkeypatch.setenv("LLAMAPY_FREE_MEMORY", "lots")  # a bad setting: the load fails and says why
    assert httpx.post(router.url + "/models/load", json={"model": "big"}).json() == {"success": True}

    def error() -> str:
        models = httpx.get(router.url + "/v1/models").json()["data"]
        return {m["id"]: m["status"].get("error") or "" for m in models}["big"]

    wait_for(lambda: "LLAMAPY_FREE_MEMORY='lots': expected a byte count" in error())
    with pytest.raises(openai.APIStatusError) as e:
        ask(router, "big")
    assert e.value.status_code == 424 and "LLAMAPY_FREE_MEMORY='lots'" in e.value.message
    monkeypatch.delenv("LLAMAPY_FREE_MEMORY")
    assert httpx.post(router.url + "/models/load", json={"model": "big"}).json() == {"success": True}
    wait_for(lambda: router.states()["big"] == "loaded")
    assert ask(router, "alpha")


def test_load_and_unload_endpoints(router: Served) -> None:
    ask(router, "beta")
    r = httpx.post(router.url + "/models/load", json={"model": "beta"})
    assert r.status_code == 400 and "already loaded" in r.json()["error"]["message"]
    assert httpx.post(router.url + "/models/unload", json={"model": "beta"}).json() == {"success": True}
    wait_for(lambda: router.states()["beta"] == "unloaded")
    r = httpx.post(router.url + "/models/unload", json={"model": "beta"})
    assert r.status_code == 400 and "not loaded" in r.json()["error"]["message"]
    assert httpx.post(router.url + "/models/unload", json={"model": "zzz"}).status_code == 404
    assert httpx.post(router.url + "/models/load", json={"model": "beta"}).json() == {"success": True}
    wait_for(lambda: router.states()["beta"] == "loaded")


def test_ollama_routes_pick_the_model(router: Served, capsys: pytest.CaptureFixture) -> None:
    names = {m.model for m in router.ollama.list().models}
    assert {"alpha:latest", "beta:latest", "broken:latest"} <= names
    msgs = [{"role": "user", "content": "Say hi"}]
    r = router.ollama.chat(model="alpha", messages=msgs, options={"temperature": 0, "num_predict": 6})
    assert r.message.content == chat(router, "alpha")
    router.ollama.copy("alpha", "alpha-copy")
    r2 = router.ollama.chat(
        model="alpha-copy:latest", messages=msgs, options={"temperature": 0, "num_predict": 6}
    )
    assert r2.message.content == r.message.content
    assert "alpha:latest" in {m.model for m in router.ollama.ps().models}
    assert main(["ps", "--url", router.url, "--json"]) == 0  # llamapy ps lists the router's loaded models
    assert "alpha:latest" in {m["name"] for m in json.loads(capsys.readouterr().out)}
    router.ollama.delete("alpha-copy")
    assert "alpha-copy:latest" not in {m.model for m in router.ollama.list().models}
    with pytest.raises(ollama.ResponseError) as e:
        router.ollama.chat(model="nope", messages=msgs)
    assert e.value.status_code == 404 and "known models" in str(e.value)
    with pytest.raises(ollama.ResponseError) as e:
        router.ollama.generate(model="alpha", prompt="x", keep_alive="soon")
    assert e.value.status_code == 400 and "keep_alive" in str(e.value)


def test_ollama_keep_alive_zero_unloads_after_the_answer(router: Served) -> None:
    router.ollama.generate(model="beta", prompt="Hello", options={"num_predict": 3}, keep_alive=0)
    wait_for(lambda: router.states()["beta"] == "unloaded", timeout=10)
    r = router.ollama.generate(model="beta", prompt="Hello", options={"num_predict": 3}, keep_alive=0)
    assert 0 < r.load_duration < r.total_duration  # it waited for beta to load
    wait_for(lambda: router.states()["beta"] == "unloaded", timeout=10)
    r = router.ollama.generate(model="beta", prompt="", keep_alive="5m")  # ollama's "load this model"
    assert r.done_reason == "load" and router.states()["beta"] == "loaded"


def test_lru_and_idle_unload(models_dir: Path) -> None:
    srv = Served(["--models-dir", str(models_dir), "--models-max", "1", "--keep-alive", "1s"])
    try:
        ask(srv, "alpha")
        assert srv.states()["alpha"] == "loaded"
        ask(srv, "beta")  # one at a time: alpha, least recently used, makes room
        s = srv.states()
        assert (s["alpha"], s["beta"]) == ("unloaded", "loaded")
        t0 = time.monotonic()
        wait_for(lambda: srv.states()["beta"] == "unloaded", timeout=15)  # idle for 1 s
        assert time.monotonic() - t0 < 10
    finally:
        srv.stop()


def test_no_autoload_and_preset(models_dir: Path, tmp_path: Path) -> None:
    preset = tmp_path / "models.toml"
    preset.write_text(
        '["*"]\nn-predict = 7\n\n[alpha]\nparallel = 2\n\n[second]\nmodel = "%s"\nc = 128\ntemp = 0.25\n'
        % (models_dir / "beta.gguf")
    )
    srv = Served(["--models-dir", str(models_dir), "--models-preset", str(preset), "--no-models-autoload"])
    try:
        with pytest.raises(openai.APIStatusError) as e:
            ask(srv, "second")
        assert e.value.status_code == 503 and "POST /models/load" in e.value.message
        for m in ("alpha", "second"):
            httpx.post(srv.url + "/models/load", json={"model": m}).raise_for_status()
        wait_for(lambda: srv.states()["alpha"] == srv.states()["second"] == "loaded")
        assert httpx.get(srv.url + "/props", params={"model": "alpha"}).json()["total_slots"] == 2
        gen = httpx.get(srv.url + "/props", params={"model": "second"}).json()["default_generation_settings"]
        assert (
            gen["n_ctx"] == 256
        )  # -c 256 on the command line wins over the preset's c = 128, as llama-server's
        assert gen["params"]["temperature"] == 0.25 and gen["params"]["n_predict"] == 7  # its table and ["*"]
        assert httpx.get(srv.url + "/props", params={"model": "beta"}).status_code == 503
    finally:
        srv.stop()


def test_bad_preset_is_a_startup_error(
    models_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    preset = tmp_path / "bad.toml"
    preset.write_text('[alpha]\nctx-size = "lots"\n')
    assert main(["serve", "--models-preset", str(preset), "--no-webui"]) == 1
    assert "ctx-size" in capsys.readouterr().err
    preset.write_text("[alpha]\nport = 1\n")
    assert main(["serve", "--models-preset", str(preset), "--no-webui"]) == 1
    assert "whole server" in capsys.readouterr().err
    assert main(["serve", "--models-dir", str(models_dir), "--keep-alive", "soon", "--no-webui"]) == 1
    assert "--keep-alive must be a duration" in capsys.readouterr().err
    assert main(["serve", "--models-dir", str(tmp_path / "none"), "--no-webui"]) == 1
    assert "not a folder" in capsys.readouterr().err


def test_pull_from_the_hub(models_dir: Path, hf_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    srv = Served(["--models-dir", str(models_dir)])
    try:
        events = list(srv.ollama.pull("test/chat-GGUF", stream=True))
        assert events[0].status == "pulling manifest" and events[-1].status == "success"
        assert any(e.total and e.completed == e.total for e in events)
        assert "test/chat-GGUF:latest" in {m.model for m in srv.ollama.list().models}
        assert ask(srv, "test/chat-GGUF")
        assert srv.ollama.pull("test/tiny-GGUF:Q8_0").status == "success"  # not streamed
        with pytest.raises(ollama.ResponseError) as e:
            srv.ollama.pull("test/no-such-GGUF", stream=False)
        assert e.value.status_code == 400 and "not found" in str(e.value)
        srv.ollama.delete("test/chat-GGUF")
        assert "test/chat-GGUF:latest" not in {m.model for m in srv.ollama.list().models}
        assert not list(hf_env.glob("models--test--chat-GGUF/snapshots/*/*.gguf"))  # its files are gone
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]  # closed again: nothing listens there
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
        t0 = time.monotonic()
        with pytest.raises(ollama.ResponseError) as e:
            srv.ollama.pull("test/other-GGUF", stream=False)
        assert e.value.status_code == 502 and "cannot list test/other-GGUF" in str(e.value)
        assert time.monotonic() - t0 < 10  # (measured ~0.01 s; huggingface_hub's retries took ~24 s)
    finally:
        srv.stop()


def test_a_slow_load_does_not_block_the_other_models(tmp_path: Path) -> None:
    """The fake backend behind two router entries: while one loads (held by a gate), the other answers."""
    from llamapy.server.app import ServerSettings, create_app
    from llamapy.server.router import ModelSpec, Router
    from llamapy.server.state import ModelEntry
    from tests.server.fake_backend import FakeBackend

    gate = threading.Event()

    def make_entry(spec: ModelSpec) -> ModelEntry:
        def factory() -> Any:
            if spec.name == "slow":
                gate.wait(30)
            return FakeBackend(n_ctx=256, n_seq_max=1)

        return ModelEntry(ServerSettings(model_path=spec.model, alias=spec.name), factory)

    for name in ("slow", "fast"):
        (tmp_path / f"{name}.gguf").write_bytes(b"GGUF")
    specs = [ModelSpec(n, str(tmp_path / f"{n}.gguf")) for n in ("slow", "fast")]
    app = create_app(ServerSettings(), router=Router(specs, make_entry))
    url, server, thread = serve_app(app)
    try:
        body = {"prompt": "hi", "max_tokens": 3}
        pending = threading.Thread(
            target=lambda: httpx.post(url + "/v1/completions", json={"model": "slow", **body}, timeout=60)
        )
        pending.start()
        wait_for(lambda: httpx.get(url + "/v1/models").json()["data"][0]["status"]["value"] == "loading")
        t0 = time.monotonic()
        r = httpx.post(url + "/v1/completions", json={"model": "fast", **body}, timeout=30)
        assert r.status_code == 200 and time.monotonic() - t0 < 5  # (measured: ~0.05 s)
        assert httpx.get(url + "/health", params={"model": "slow"}).status_code == 503
        gate.set()
        pending.join(30)
        states = {m["id"]: m["status"]["value"] for m in httpx.get(url + "/v1/models").json()["data"]}
        assert states == {"slow": "loaded", "fast": "loaded"}
    finally:
        gate.set()
        server.should_exit = True  # type: ignore[attr-defined]
        thread.join(10)


def test_models_dir_pairs_split_parts_and_mmproj(tmp_path: Path) -> None:
    from llamapy.server.router import scan_models_dir

    for rel in ["a-Q4_K_M.gguf", "mmproj-a-F16.gguf", "big/Big-Q8_0-00001-of-00003.gguf",
                "big/Big-Q8_0-00002-of-00003.gguf", "big/Big-Q8_0-00003-of-00003.gguf",
                "vis/vis-Q8_0.gguf", "vis/mmproj-F16.gguf", "notes.txt"]:  # fmt: skip
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"GGUF")
    specs = {s.name: s for s in scan_models_dir(tmp_path)}
    assert set(specs) == {"a-Q4_K_M", "big", "vis"}
    assert specs["a-Q4_K_M"].mmproj.endswith("mmproj-a-F16.gguf")
    assert specs["big"].model.endswith("Big-Q8_0-00001-of-00003.gguf") and specs["big"].mmproj is None
    assert specs["vis"].mmproj.endswith("vis/mmproj-F16.gguf")
    with pytest.raises(FileNotFoundError):
        scan_models_dir(tmp_path / "nope")


def test_preset_with_a_hub_ref(hf_env: Path, tmp_path: Path) -> None:  # noqa: F811
    preset = tmp_path / "hub.toml"
    preset.write_text('[hubbed]\nmodel = "test/chat-GGUF"\n')
    srv = Served(["--models-preset", str(preset)])
    try:
        assert srv.states() == {"hubbed": "unloaded"}
        assert ask(srv, "hubbed")  # downloaded by the first request, then loaded
        props = httpx.get(srv.url + "/props", params={"model": "hubbed"}).json()
        assert str(hf_env) in props["model_path"] and srv.states() == {"hubbed": "loaded"}
    finally:
        srv.stop()


def test_memory_check_sizes_the_kv_cache_by_its_types(smollm2_path, tmp_path):
    """-ctk/-ctv reach the router's memory check: a q8_0 cache is 34 bytes a block of 32 (f16: 64)."""
    from llamapy.server.router import model_bytes

    _, f16 = model_bytes(str(smollm2_path), 1024)
    _, q8 = model_bytes(str(smollm2_path), 1024, type_k="q8_0", type_v="q8_0")
    _, mixed = model_bytes(str(smollm2_path), 1024, type_k="q8_0", type_v="f16")
    assert q8 * 64 == f16 * 34 and mixed * 128 == f16 * (64 + 34)
    args = build_parser("serve").parse_args(["serve", "--models-dir", str(tmp_path), "-ctk", "q4_0"])
    from llamapy.cli.serve import server_settings

    st = server_settings(args, "", [])
    assert (st.cache_type_k, st.cache_type_v) == ("q4_0", "f16")
