"""Must-show: the official openai client over a real socket against `python -m llamapy serve` with
SmolLM2 (a subprocess started once per session, -np 2, an API key). Generation is kept short."""

from __future__ import annotations

import json
import threading
import time

import httpx
import numpy as np
import openai
import pytest

from tests.util import shared_path

pytestmark = pytest.mark.slow
N = 4  # tokens per answer (llama.cpp's greedy tokens agree over the first few positions)


@pytest.fixture(scope="module")
def client(real_server) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=real_server.base_url + "/v1", api_key=real_server.api_key, max_retries=0, timeout=300
    )


@pytest.fixture(scope="module")
def http(real_server) -> httpx.Client:
    return httpx.Client(
        base_url=real_server.base_url, headers={"Authorization": f"Bearer {real_server.api_key}"}, timeout=300
    )


@pytest.fixture(scope="module")
def reference() -> list[tuple[str, list[int]]]:
    """llama.cpp's greedy continuations of the reference prompts (SmolLM2)."""
    prompts = json.loads(shared_path("reference", "prompts.json").read_text())
    npz = np.load(shared_path("reference", "smollm2-135m-q4_1", "logits.npz"))
    return [(p, [int(t) for t in npz[f"p{i}_greedy"]]) for i, p in enumerate(prompts)]


def test_models(client):
    (m,) = client.models.list().data
    assert m.id == "SmolLM2-135M-Instruct.Q4_1.gguf" and m.object == "model"


def test_concurrent_requests_get_llama_cpp_greedy_answers(client, http, reference):
    """Three greedy requests at once on 2 slots (one waits for a slot), through both completion
    endpoints: each gets llama.cpp's greedy continuation of its own prompt, nothing mixed up."""
    jobs = reference[:3]
    out: dict[int, object] = {}
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            if i == 0:  # llama.cpp's native endpoint, with the token ids
                body = {"prompt": jobs[i][0], "n_predict": N, "temperature": 0, "return_tokens": True}
                out[i] = http.post("/completion", json=body).json()
            else:
                out[i] = client.completions.create(model="m", prompt=jobs[i][0], max_tokens=N, temperature=0)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert not errors, errors
    native = out[0]
    assert native["tokens"] == jobs[0][1][:N], native
    assert native["stop_type"] == "limit" and native["tokens_predicted"] == N
    for i in (1, 2):
        want = http.post("/detokenize", json={"tokens": jobs[i][1][:N]}).json()["content"]
        assert out[i].choices[0].text == want and out[i].choices[0].finish_reason == "length"


def test_chat_plain_and_streamed_agree(client):
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    r = client.chat.completions.create(model="m", messages=msgs, max_tokens=N, temperature=0, seed=1)
    text = r.choices[0].message.content
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-") and text
    assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens <= N
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    stream = client.chat.completions.create(
        model="m",
        messages=msgs,
        max_tokens=N,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    # the second request reused the first one's prompt from the slot's cache
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0


def test_completions_logprobs_and_seed(client):
    r = client.completions.create(
        model="m", prompt="The capital of France is", max_tokens=N, temperature=0, logprobs=2
    )
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == r.usage.completion_tokens and all(x <= 0 for x in lp.token_logprobs)
    assert all(len(t) == 2 for t in lp.top_logprobs)
    kw = dict(model="m", prompt="Once upon a time", max_tokens=3, temperature=1.0, seed=1234)
    assert client.completions.create(**kw).choices[0].text == client.completions.create(**kw).choices[0].text


def test_errors(client, http, real_server):
    with pytest.raises(openai.BadRequestError, match="role"):
        client.chat.completions.create(model="m", messages=[{"role": "wizard", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match="invalid response_format"):
        client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "x"}],
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}},
        )
    with pytest.raises(openai.BadRequestError, match="not in 'tools'"):
        client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "x"}],
            tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
            tool_choice={"type": "function", "function": {"name": "g"}},
        )
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model="m", prompt="x", max_tokens=-5)
    with pytest.raises(openai.BadRequestError, match="slot's context holds 512"):
        client.completions.create(model="m", prompt="hello " * 600, max_tokens=2)
    with pytest.raises(openai.NotFoundError):
        client.get("/no/such/path", cast_to=object)
    with pytest.raises(openai.InternalServerError, match="--embeddings"):  # 501: not an embedding server
        client.embeddings.create(model="m", input="hello")
    r = http.post("/v1/completions", content=b"{broken")
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = http.post("/v1/completions", content=b"x" * (300 << 10))
    assert r.status_code == 413 and "too large" in r.json()["error"]["message"]
    # the engine survived all of that
    assert client.completions.create(model="m", prompt="Hi", max_tokens=1).choices[0].finish_reason


def test_api_key(real_server):
    for key in ("wrong", ""):
        c = openai.OpenAI(base_url=real_server.base_url + "/v1", api_key=key or "x", max_retries=0)
        if not key:
            r = httpx.get(real_server.base_url + "/v1/models")
            assert r.status_code == 401 and "missing API key" in r.json()["error"]["message"]
            continue
        with pytest.raises(openai.AuthenticationError):
            c.models.list()
    assert httpx.get(real_server.base_url + "/health").status_code == 200  # health needs no key


def test_disconnect_frees_the_slot(http, real_server):
    body = {"prompt": "Tell me a long story.", "max_tokens": 400, "stream": True, "ignore_eos": True}
    with http.stream("POST", "/v1/completions", json=body) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("data: "):
                break
    deadline = time.monotonic() + 30
    while any(s["is_processing"] for s in http.get("/slots").json()):
        assert time.monotonic() < deadline, "the slot stayed busy after the client left"
        time.sleep(0.05)
    metrics = http.get("/metrics").text
    assert "llamacpp:tokens_predicted_total" in metrics


def test_embeddings_with_the_real_model(smollm2_path):
    """/v1/embeddings over a socket with SmolLM2 in embedding mode (mean pooling), in-process server."""
    from llamapy.server.app import ServerSettings
    from llamapy.server.backend import ContextBackend
    from tests.server.conftest import _engine_missing, start_live, stop_live, wait_ready

    why = _engine_missing(smollm2_path)
    if why:
        pytest.skip(f"needs the engine: {why}")
    backend = ContextBackend(
        smollm2_path, n_ctx=256, n_seq_max=2, n_batch=64, embeddings=True, pooling="mean"
    )
    srv, thread = start_live(ServerSettings(model_path=str(smollm2_path)), backend)
    try:
        wait_ready(srv.base_url, timeout=60)
        c = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0, timeout=300)
        r = c.embeddings.create(model="m", input=["Paris is in France.", "Paris is in France.", "bananas"])
        a, b, d = (np.array(x.embedding) for x in r.data)
        assert a.shape == (576,) and np.linalg.norm(a) == pytest.approx(1.0, abs=1e-5)
        # the same text in two slots of one batch: equal to float32 rounding, not bit for bit (OpenBLAS's
        # AVX-512 sgemm kernels, in attention, round a row by its position in the tile: max difference
        # 1.1e-5 on an Intel Xeon VM, 0 with OPENBLAS_CORETYPE=Haswell); another text: far apart (~0.26)
        assert np.allclose(a, b, rtol=0, atol=1e-4) and not np.allclose(a, d, atol=1e-3)
        with pytest.raises(openai.InternalServerError, match="without --embeddings"):
            c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    finally:
        stop_live(srv, thread)
