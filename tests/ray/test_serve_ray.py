"""Two llamapy replicas on a local Ray cluster behind one endpoint: the official openai client, streamed
and not; a conversation's next turn on the replica holding its prefix; /health and /metrics of both; a
replica killed during streams (error events, the others serve on, Ray restarts it)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import openai
import pytest

from tests.ray.conftest import RayServe

pytestmark = pytest.mark.slow


def _client(rs: RayServe) -> openai.OpenAI:
    return openai.OpenAI(base_url=rs.base_url + "/v1", api_key="none", max_retries=0, timeout=120)


def test_openai_client_streamed_and_not(ray_serve: RayServe) -> None:
    c = _client(ray_serve)
    msgs: Any = [{"role": "user", "content": "Name a color."}]
    r = c.chat.completions.create(model="m", messages=msgs, max_tokens=8, temperature=0)
    assert r.choices[0].message.content and r.usage and r.usage.completion_tokens > 0
    pieces = [
        ch.choices[0].delta.content or ""
        for ch in c.chat.completions.create(
            model="m", messages=msgs, max_tokens=8, temperature=0, stream=True
        )
        if ch.choices
    ]
    assert "".join(pieces) == r.choices[0].message.content  # same greedy answer, whichever replica
    assert len(c.models.list().data) == 1


def test_bad_request_keeps_the_api_shape(ray_serve: RayServe) -> None:
    r = httpx.post(ray_serve.base_url + "/v1/chat/completions", content=b"{not json", timeout=30)
    assert r.status_code == 400 and "error" in r.json()
    r = httpx.post(ray_serve.base_url + "/v1/messages", json={"messages": "x"}, timeout=30)
    assert r.status_code == 400 and r.json()["type"] == "error"
    big = b'{"prompt": "' + b"x" * (9 << 20) + b'"}'  # over the 8 MiB limit: refused by the ingress
    r = httpx.post(ray_serve.base_url + "/v1/completions", content=big, timeout=60)
    assert r.status_code == 413 and r.json()["error"]["code"] == 413
    nested = b"[" * 100_000 + b"]" * 100_000  # the key is given up; the replica answers as one server
    r = httpx.post(ray_serve.base_url + "/v1/chat/completions", content=nested, timeout=60)
    assert r.status_code == 400 and "error" in r.json()


def _chat(rs: RayServe, msgs: list[dict[str, str]]) -> tuple[str, str, dict[str, Any]]:
    r = httpx.post(
        rs.base_url + "/v1/chat/completions",
        json={"messages": msgs, "max_tokens": 12, "temperature": 0},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    body = r.json()
    return r.headers["x-llamapy-replica"], body["choices"][0]["message"]["content"], body["timings"]


def test_next_turn_lands_on_the_replica_with_its_prefix(ray_serve: RayServe) -> None:
    system = "You are a patient teacher who answers in one short sentence. " * 3
    convs = [  # four conversations that differ from their first tokens on
        [
            {"role": "system", "content": f"Lesson {i}. {system}"},
            {"role": "user", "content": f"Question {i}: what is {i} + {i}?"},
        ]
        for i in range(4)
    ]
    first = []
    for m in convs:  # turn 1 of every conversation, then turn 2 of every one (interleaved)
        replica, text, timings = _chat(ray_serve, m)
        m.append({"role": "assistant", "content": text})
        m.append({"role": "user", "content": "And why?"})
        first.append((replica, timings))
    assert len({r for r, _ in first}) == 2  # new conversations spread over both replicas
    for m, (replica1, t1) in zip(convs, first, strict=True):
        replica2, _, t2 = _chat(ray_serve, m)
        assert replica2 == replica1
        # as on a single server: the whole first prompt (and the answer) come from the cache
        assert t2["cache_n"] >= t1["prompt_n"], (t1, t2)
    health = httpx.get(ray_serve.base_url + "/health", timeout=30).json()
    assert health["routing"]["routed"].get("prefix", 0) >= 4


def test_health_and_metrics_aggregate_the_replicas(ray_serve: RayServe) -> None:
    r = httpx.get(ray_serve.base_url + "/health", timeout=30)
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "ok" and body["replicas_ok"] == 2
    ids = {rep["id"] for rep in body["replicas"]}
    assert len(ids) == 2 and all(rep["status"] == 200 for rep in body["replicas"])
    m = httpx.get(ray_serve.base_url + "/metrics", timeout=30).text
    for rid in ids:
        assert f'replica="{rid}"' in m
    assert "llamapy_ray:replicas_ok 2" in m


def test_anthropic_client_through_the_endpoint(ray_serve: RayServe) -> None:
    import anthropic

    c = anthropic.Anthropic(base_url=ray_serve.base_url, api_key="none", max_retries=0, timeout=120)
    msgs: Any = [{"role": "user", "content": "Name a fruit."}]
    greedy: Any = {"temperature": 0}
    m = c.messages.create(model="m", max_tokens=8, messages=msgs, extra_body=greedy)
    assert m.content[0].type == "text" and m.content[0].text
    with c.messages.stream(model="m", max_tokens=8, messages=msgs, extra_body=greedy) as st:
        text = "".join(st.text_stream)
    assert text == m.content[0].text


def test_responses_and_ollama_apis_through_the_endpoint(ray_serve: RayServe) -> None:
    import ollama

    r = _client(ray_serve).responses.create(model="m", input="Name an animal.", max_output_tokens=8)
    assert r.output_text
    c = ollama.Client(host=ray_serve.base_url)
    model = c.list().models[0].model
    parts = [p.message.content for p in c.chat(model=model, messages=[{"role": "user", "content": "Hi"}],
                                               stream=True, options={"num_predict": 6})]  # fmt: skip
    assert "".join(parts)


def test_session_hint_keeps_short_requests_together(ray_serve: RayServe) -> None:
    # prompts shorter than one block: no prefix to match, the `user` hint decides
    seen = set()
    for i in range(3):
        r = httpx.post(
            ray_serve.base_url + "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": f"Hi {i}"}], "max_tokens": 2, "user": "alice"},
            timeout=120,
        )
        assert r.status_code == 200
        seen.add(r.headers["x-llamapy-replica"])
    assert len(seen) == 1
    assert httpx.get(ray_serve.base_url + "/health", timeout=30).json()["routing"]["routed"]["session"] >= 2


def _processing(rs: RayServe) -> float:
    text = httpx.get(rs.base_url + "/metrics", timeout=30).text
    return sum(
        float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith("llamacpp:requests_processing{")
    )


def test_client_gone_mid_stream_stops_the_generation(ray_serve: RayServe) -> None:
    body = {
        "messages": [{"role": "user", "content": "Count from 1 to 500."}],
        "max_tokens": 400,
        "stream": True,
    }
    with httpx.stream("POST", ray_serve.base_url + "/v1/chat/completions", json=body, timeout=120) as r:
        lines = r.iter_lines()
        while not next(lines).startswith("data: {"):
            pass
        assert _processing(ray_serve) == 1
    deadline = time.monotonic() + 10  # the client closed the connection: the replica's slot is freed
    while _processing(ray_serve) != 0:
        assert time.monotonic() < deadline, "the generation went on after its client left"
        time.sleep(0.2)


def _stream(rs: RayServe, i: int, out: dict[int, dict[str, Any]]) -> None:
    rec: dict[str, Any] = {"chunks": 0, "error": None, "done": False}
    out[i] = rec
    body = {
        "messages": [{"role": "user", "content": f"Count from 1 to 300, one number a line. ({i})"}],
        "max_tokens": 400,
        "temperature": 0,
        "ignore_eos": True,  # every stream runs its 400 tokens: the tiny model may stop early
        "stream": True,
    }
    with httpx.stream("POST", rs.base_url + "/v1/chat/completions", json=body, timeout=120) as r:
        rec["replica"] = r.headers.get("x-llamapy-replica")
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                rec["done"] = True
                continue
            ev = json.loads(line[6:])
            if "error" in ev:
                rec["error"] = ev["error"]
            else:
                rec["chunks"] += 1
    rec["ended"] = time.monotonic()


def _replica_actor(rid: str) -> Any:
    import ray

    for a in ray.util.list_named_actors(all_namespaces=True):
        if a["name"].startswith("SERVE_REPLICA::") and a["name"].endswith("#" + rid):
            return ray.get_actor(a["name"], namespace=a["namespace"])
    raise AssertionError(f"no actor for replica {rid}")


def test_replica_killed_during_streams(ray_serve: RayServe) -> None:
    import ray

    out: dict[int, dict[str, Any]] = {}
    threads = [threading.Thread(target=_stream, args=(ray_serve, i, out)) for i in range(8)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while sum(1 for r in out.values() if r["chunks"] > 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    victim = next(r["replica"] for r in out.values() if r["chunks"] > 0)
    ray.kill(_replica_actor(victim), no_restart=True)
    killed = time.monotonic()
    for t in threads:
        t.join(90)
        assert not t.is_alive(), "a stream hung after its replica was killed"
    on_victim = [r for r in out.values() if r.get("replica") == victim]
    others = [r for r in out.values() if r.get("replica") not in (None, victim)]
    cut = [r for r in on_victim if not r["done"]]
    assert cut, "no stream was cut: the kill came too late to test anything"
    for r in cut:  # ended by an error event, within seconds
        assert r["error"] and "lost" in r["error"]["message"], r
        assert r["ended"] - killed < 15, r["ended"] - killed
    print(f"\n{len(cut)} streams cut, ended {max(r['ended'] for r in cut) - killed:.2f} s after the kill")
    for r in others:
        assert r["done"] and r["error"] is None, r
    c = _client(ray_serve)
    for i in range(4):  # later requests all succeed
        r = c.chat.completions.create(
            model="m", messages=[{"role": "user", "content": f"Hi {i}"}], max_tokens=4
        )
        assert r.choices[0].message.content is not None
    deadline = time.monotonic() + 120  # Ray Serve starts a new replica in its place
    while time.monotonic() < deadline:
        h = httpx.get(ray_serve.base_url + "/health", timeout=30).json()
        if h["replicas_ok"] == 2 and victim not in {rep["id"] for rep in h["replicas"]}:
            print(f"replaced and serving {time.monotonic() - killed:.1f} s after the kill")
            break
        time.sleep(1)
    else:
        raise AssertionError(f"the killed replica was not replaced: {h}")
    assert victim not in h["routing"]["replicas"]  # the router forgot it
