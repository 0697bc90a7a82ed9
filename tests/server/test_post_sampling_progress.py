"""llama-server's ``post_sampling_probs`` (probabilities after the sampler chain: ``prob``/``top_probs``)
and ``return_progress`` (``prompt_progress`` events while a streamed prompt is evaluated), as
llama-server 0.3.36 sends them (tools/server/server-context.cpp ``populate_token_probs``,
``send_partial_response``; server-task.cpp ``probs_vector_to_json``, ``result_prompt_progress``).

Fake model over a real socket (its logits: 10 for the next token, 0 for the others, so the
probabilities after a chain are known in closed form), the official clients where the route is theirs;
the last tests run the real model (SmolLM2, slow)."""

from __future__ import annotations

import json
import math

import anthropic
import httpx
import openai
import pytest

from llamapy.server.app import ServerSettings
from tests.server.conftest import start_live, stop_live, wait_ready
from tests.server.fake_backend import BOS, FakeBackend, reference

N_BATCH = 16  # tokens per engine step: a prompt longer than this is evaluated over several steps
MSGS = [{"role": "user", "content": "tell me things"}]
ENTRY_KEYS = {"id", "token", "bytes", "prob", "top_probs"}
TOP_KEYS = {"id", "token", "bytes", "prob"}
PROGRESS_KEYS = {"total", "cache", "processed", "time_ms"}
# a chain that keeps 5 candidates with temperature 5: logits 2 (the model's token) and 0 (four others)
WIDE = {"top_k": 5, "top_p": 1.0, "min_p": 0.0, "temperature": 5.0, "seed": 11}
P_TOP = 1.0 / (1.0 + 4.0 * math.exp(-2.0))
P_OTHER = math.exp(-2.0) / (math.exp(2.0 - 2.0) + 4.0 * math.exp(-2.0))


@pytest.fixture(scope="module")
def live():
    settings = ServerSettings(model_path="/models/fake.gguf", max_body_bytes=64 << 10)
    srv, thread = start_live(settings, FakeBackend(n_ctx=512, n_seq_max=2, n_batch=N_BATCH, delay=0.001))
    wait_ready(srv.base_url)
    yield srv
    stop_live(srv, thread)


@pytest.fixture
def client(live) -> openai.OpenAI:
    return openai.OpenAI(base_url=live.base_url + "/v1", api_key="none", max_retries=0, timeout=30)


def post(live, path: str, body: dict) -> httpx.Response:
    return httpx.post(live.base_url + path, json=body, timeout=30)


def events(r: httpx.Response) -> list[dict]:
    return [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]


def greedy_text(prompt: str, n: int) -> str:
    return bytes(t for t in reference([BOS, *prompt.encode()], n) if t < 256).decode()


def check_entry(e: dict, n_top: int, listed: bool = True) -> None:
    """One token's post-sampling entry: llama-server's keys, top_probs sorted and summing to at most 1,
    the chosen token's prob the one it has among them (``listed``: it must be there)."""
    assert set(e) == ENTRY_KEYS, e
    top = e["top_probs"]
    assert len(top) == n_top and all(set(t) == TOP_KEYS for t in top), top
    ps = [t["prob"] for t in top]
    assert ps == sorted(ps, reverse=True) and all(p > 0 for p in ps)
    assert sum(ps) <= 1.0 + 1e-5
    assert e["token"] == bytes(e["bytes"]).decode() and all(
        t["token"] == bytes(t["bytes"]).decode() for t in top
    )
    mine = [t for t in top if t["id"] == e["id"]]
    if listed:
        assert mine and mine[0]["prob"] == e["prob"], e
    else:  # (n_probs under the candidates the chain kept: the chosen one may be left out)
        assert mine[0]["prob"] == e["prob"] if mine else e["prob"] <= ps[-1], e


# -- post_sampling_probs ---------------------------------------------------------------------------------


@pytest.mark.parametrize("chain", [{"temperature": 0}, {"top_k": 1, "temperature": 1.0}])
def test_greedy_chain_gives_the_chosen_token_probability_one(live, chain):
    body = {"prompt": "abcdef", "n_predict": 4, "n_probs": 3, "post_sampling_probs": True, **chain}
    r = post(live, "/completion", body).json()
    assert r["content"] == greedy_text("abcdef", 4)
    assert r["generation_settings"]["post_sampling_probs"] is True
    probs = r["completion_probabilities"]
    assert len(probs) == 4
    for e in probs:
        check_entry(e, 1)  # the others have probability 0 after the chain: left out, as llama-server
        assert e["prob"] == 1.0 and e["top_probs"][0] == {k: e[k] for k in TOP_KEYS}


def test_chain_keeping_several_candidates(live):
    body = {"prompt": "abcdefgh", "n_predict": 12, "n_probs": 10, "post_sampling_probs": True, **WIDE}
    r = post(live, "/completion", body).json()
    probs = r["completion_probabilities"]
    assert len(probs) == 12 and r["tokens_predicted"] == 12
    for e in probs:
        check_entry(e, 5)  # n_probs 10, but top_k left 5 candidates
        top = [t["prob"] for t in e["top_probs"]]
        assert top[0] == pytest.approx(P_TOP, rel=1e-5) and top[1:] == pytest.approx([P_OTHER] * 4, rel=1e-5)
        assert sum(top) == pytest.approx(1.0, abs=1e-5)
    assert any(e["prob"] != e["top_probs"][0]["prob"] for e in probs), "a token other than the top one"
    # n_probs below the candidates: the most probable n_probs of them
    r = post(live, "/completion", body | {"n_probs": 2, "n_predict": 3}).json()
    for e in r["completion_probabilities"]:
        assert [t["prob"] for t in e["top_probs"]] == pytest.approx([P_TOP, P_OTHER], rel=1e-5)
        assert set(e) == ENTRY_KEYS


def test_streamed_completion_post_sampling(live):
    body = {"prompt": "abcdef", "n_predict": 4, "n_probs": 2, "post_sampling_probs": True, "stream": True}
    evs = events(post(live, "/completion", body | WIDE))
    tokens = [e for e in evs if not e["stop"]]
    assert len(tokens) == 4
    for e in tokens:
        (entry,) = e["completion_probabilities"]
        assert set(entry) == ENTRY_KEYS and entry["id"] == e["tokens"][0]
        assert len(entry["top_probs"]) == 2
    assert evs[-1]["stop"] is True and "completion_probabilities" not in evs[-1]


def test_chat_post_sampling_with_the_openai_client(client):
    extra = {
        "post_sampling_probs": True,
        **{k: v for k, v in WIDE.items() if k not in ("temperature", "seed")},
    }
    r = client.chat.completions.create(
        model="m",
        messages=MSGS,
        max_tokens=5,
        temperature=5.0,
        seed=3,
        logprobs=True,
        top_logprobs=5,
        extra_body=extra,
    )
    content = [c.to_dict() for c in r.choices[0].logprobs.content]
    assert len(content) == 5
    for e in content:
        check_entry(e, 5)
    r = client.chat.completions.create(
        model="m", messages=MSGS, max_tokens=5, temperature=5.0, seed=3, logprobs=True, top_logprobs=2,
        extra_body=extra,
    )  # fmt: skip
    for e in r.choices[0].logprobs.content:
        check_entry(e.to_dict(), 2, listed=False)
    chunks = list(
        client.chat.completions.create(
            model="m",
            messages=MSGS,
            max_tokens=3,
            temperature=0,
            logprobs=True,
            top_logprobs=2,
            stream=True,
            extra_body={"post_sampling_probs": True},
        )
    )
    streamed = [
        e.to_dict()
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content
    ]
    assert len(streamed) == 3
    for e in streamed:
        check_entry(e, 1)
        assert e["prob"] == 1.0


def test_v1_completions_post_sampling_is_llama_servers_content(client):
    r = client.completions.create(
        model="m",
        prompt="abcdef",
        max_tokens=3,
        temperature=0,
        logprobs=2,
        extra_body={"post_sampling_probs": True},
    )
    lp = r.choices[0].logprobs.to_dict()
    assert set(lp) == {"content"}  # llama-server's shape (no log-probabilities for OpenAI's fields)
    assert [e["token"] for e in lp["content"]] == list(greedy_text("abcdef", 3))
    for e in lp["content"]:
        check_entry(e, 1)
    text = ""
    for c in client.completions.create(
        model="m",
        prompt="abcdef",
        max_tokens=3,
        temperature=0,
        logprobs=2,
        stream=True,
        extra_body={"post_sampling_probs": True},
    ):
        text += c.choices[0].text
        if c.choices[0].finish_reason is not None:  # (no token: logprobs null, as llama-server)
            assert c.choices[0].logprobs is None
            continue
        lp = c.choices[0].logprobs.to_dict()
        assert set(lp) == {"content"} and all(set(e) == ENTRY_KEYS for e in lp["content"])
    assert text == greedy_text("abcdef", 3)


def test_without_post_sampling_probs_the_log_probabilities_are_unchanged(live, client):
    body = {"prompt": "abcdef", "n_predict": 3, "n_probs": 2, **WIDE}
    r = post(live, "/completion", body).json()
    assert r["generation_settings"]["post_sampling_probs"] is False
    for e in r["completion_probabilities"]:
        assert set(e) == {"id", "token", "bytes", "logprob", "top_logprobs"}
        # the raw logits' log-softmax (10 for one token, 0 for the 257 others), not the chain's
        top = e["top_logprobs"]
        assert len(top) == 2 and top[0]["logprob"] == pytest.approx(
            -math.log1p(257 * math.exp(-10)), abs=1e-5
        )
        assert top[1]["logprob"] == pytest.approx(-10 - math.log1p(257 * math.exp(-10)), abs=1e-4)
    r = client.chat.completions.create(
        model="m", messages=MSGS, max_tokens=2, temperature=0, logprobs=True, top_logprobs=2
    )
    for e in r.choices[0].logprobs.content:
        assert e.logprob <= 0 and len(e.top_logprobs) == 2 and "prob" not in e.to_dict()
    r = client.completions.create(model="m", prompt="abc", max_tokens=2, temperature=0, logprobs=1)
    assert len(r.choices[0].logprobs.token_logprobs) == 2 and r.choices[0].logprobs.token_logprobs[0] <= 0


def test_post_sampling_probs_without_n_probs_reports_nothing(live):
    r = post(live, "/completion", {"prompt": "abc", "n_predict": 2, "post_sampling_probs": True}).json()
    assert "completion_probabilities" not in r and r["generation_settings"]["post_sampling_probs"] is True


# -- return_progress -------------------------------------------------------------------------------------


def progress_of(evs: list[dict]) -> list[dict]:
    return [e["prompt_progress"] for e in evs if "prompt_progress" in e]


def test_streamed_completion_reports_prompt_progress_per_batch(live):
    prompt = "the quick brown fox jumps over the lazy dog, twice over"  # 55 tokens with BOS
    total = len(prompt) + 1
    body = {"prompt": prompt, "n_predict": 3, "temperature": 0, "stream": True, "return_progress": True}
    evs = events(post(live, "/completion", body | {"cache_prompt": False}))
    prog = progress_of(evs)
    assert all(set(p) == PROGRESS_KEYS for p in prog)
    # the first one before any token is evaluated, then one per engine step (N_BATCH tokens)
    assert [p["processed"] for p in prog] == [*range(0, total, N_BATCH), total]
    assert {p["total"] for p in prog} == {total} and {p["cache"] for p in prog} == {0}
    times = [p["time_ms"] for p in prog]
    assert all(isinstance(t, int) for t in times) and times == sorted(times)
    # every progress event comes before the first token, and carries no text or token
    n = len(prog)
    assert all("prompt_progress" in e for e in evs[:n]) and not any("prompt_progress" in e for e in evs[n:])
    for e in evs[:n]:
        assert e["content"] == "" and e["tokens"] == [] and e["stop"] is False
        assert e["tokens_predicted"] == 0 and e["tokens_evaluated"] == total
        assert set(e) == {"index", "content", "tokens", "stop", "id_slot", "tokens_predicted",
                          "tokens_evaluated", "prompt_progress"}  # fmt: skip
    assert "".join(e["content"] for e in evs) == greedy_text(prompt, 3) and evs[-1]["stop"] is True
    # the same prompt again: all but its last token come from the slot's cache
    evs = events(post(live, "/completion", body))
    prog = progress_of(evs)
    assert [(p["cache"], p["processed"]) for p in prog] == [(total - 1, total - 1), (total - 1, total)]


def test_progress_with_timings_per_token(live):
    body = {"prompt": "abcdefghij" * 2, "n_predict": 2, "stream": True, "return_progress": True}
    evs = events(post(live, "/completion", body | {"timings_per_token": True, "cache_prompt": False}))
    prog = [e for e in evs if "prompt_progress" in e]
    assert len(prog) == 3 and all("timings" in e for e in prog)
    # (the prompt tokens evaluated so far, as llama-server's)
    assert [e["timings"]["prompt_n"] for e in prog] == [e["prompt_progress"]["processed"] for e in prog]


def test_non_streamed_requests_accept_return_progress_and_ignore_it(live, client):
    body = {"prompt": "abcdef", "n_predict": 3, "temperature": 0, "return_progress": True}
    r = post(live, "/completion", body)
    assert r.status_code == 200 and r.json()["content"] == greedy_text("abcdef", 3)
    assert "prompt_progress" not in r.json()
    r = client.chat.completions.create(
        model="m", messages=MSGS, max_tokens=2, temperature=0, extra_body={"return_progress": True}
    )
    assert r.choices[0].message.content and "prompt_progress" not in r.to_dict()
    # a stream without it: no progress events
    evs = events(post(live, "/completion", body | {"stream": True, "return_progress": False}))
    assert not progress_of(evs) and evs[0]["content"]


def test_chat_stream_progress_chunks_with_the_openai_client(client):
    msgs = [{"role": "user", "content": "a longer question, to take several engine steps"}]
    chunks = list(
        client.chat.completions.create(
            model="m",
            messages=msgs,
            max_tokens=3,
            temperature=0,
            stream=True,
            extra_body={"return_progress": True, "cache_prompt": False},
        )
    )
    prog = [c for c in chunks if (c.model_extra or {}).get("prompt_progress")]
    assert len(prog) >= 3
    n = len(prog)
    assert chunks[:n] == prog  # before anything else
    for c in prog:  # llama-server's: the role delta, with the progress on the chunk
        assert c.choices[0].delta.role == "assistant" and c.choices[0].delta.content is None
        assert set(c.model_extra["prompt_progress"]) == PROGRESS_KEYS
    done = [c.model_extra["prompt_progress"]["processed"] for c in prog]
    assert done == sorted(done) and done[-1] == prog[0].model_extra["prompt_progress"]["total"]
    # then the stream as without progress: its role chunk, the text, the finish reason
    rest = chunks[n:]
    assert rest[0].choices[0].delta.role == "assistant" and not (rest[0].model_extra or {}).get(
        "prompt_progress"
    )
    assert "".join(c.choices[0].delta.content or "" for c in rest if c.choices)
    assert rest[-1].choices[0].finish_reason == "length"


def test_v1_completions_stream_progress(client):
    chunks = list(
        client.completions.create(
            model="m",
            prompt="x" * 40,
            max_tokens=2,
            temperature=0,
            stream=True,
            extra_body={"return_progress": True, "cache_prompt": False},
        )
    )
    prog = [c for c in chunks if (c.model_extra or {}).get("prompt_progress")]
    assert [c.model_extra["prompt_progress"]["processed"] for c in prog] == [0, 16, 32, 41]
    for c in prog:
        assert (
            c.choices[0].text == "" and c.choices[0].logprobs is None and c.choices[0].finish_reason is None
        )
    assert chunks[: len(prog)] == prog


def test_several_prompts_report_their_own_progress(live):
    body = {"prompt": ["p" * 20, "q" * 20], "n_predict": 2, "temperature": 0, "stream": True,
            "return_progress": True, "cache_prompt": False}  # fmt: skip
    evs = events(post(live, "/completion", body))
    for i in (0, 1):
        mine = [e for e in evs if e["index"] == i]
        prog = [e["prompt_progress"]["processed"] for e in mine if "prompt_progress" in e]
        assert prog[0] == 0 and prog[-1] == 21 and prog == sorted(prog)
        first_token = next(j for j, e in enumerate(mine) if e["tokens"])
        assert all("prompt_progress" in e for e in mine[:first_token])


def test_choices_sharing_the_prompt(client):
    """n > 1: the first choice evaluates the prompt (its progress per step), the others start from its
    cells (one progress event: everything cached)."""
    chunks = list(
        client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "hello there, a long question"}],
            max_tokens=2,
            n=2,
            temperature=0,
            stream=True,
            extra_body={"return_progress": True, "cache_prompt": False},
        )
    )
    by = {i: [c for c in chunks if c.choices and c.choices[0].index == i] for i in (0, 1)}
    for i, mine in by.items():
        prog = [
            c.model_extra["prompt_progress"] for c in mine if (c.model_extra or {}).get("prompt_progress")
        ]
        total = prog[-1]["total"]
        if i == 0:
            assert [p["processed"] for p in prog] == [*range(0, total, N_BATCH), total] and prog[0][
                "cache"
            ] == 0
        else:
            assert [(p["cache"], p["processed"]) for p in prog] == [(total, total)]
        rest = mine[len(prog) :]
        assert rest[0].choices[0].delta.role == "assistant" and rest[-1].choices[0].finish_reason == "length"
        assert len([c for c in rest if c.choices[0].delta.content]) == 2


def test_responses_stream_progress(live):
    body = {"model": "m", "input": "a question, long enough", "max_output_tokens": 2, "stream": True,
            "return_progress": True, "cache_prompt": False}  # fmt: skip
    r = post(live, "/v1/responses", body)
    evs = events(r)
    types = [e["type"] for e in evs]
    assert types[:2] == ["response.created", "response.in_progress"] and types.count("response.created") == 1
    prog = [e for e in evs if "prompt_progress" in e]
    assert len(prog) >= 3 and all(e["type"] == "response.in_progress" for e in prog)
    assert prog[0] is evs[1] and prog[0]["prompt_progress"]["processed"] == 0
    assert [e["sequence_number"] for e in evs] == list(range(len(evs)))
    assert types[-1] == "response.incomplete"  # (max_output_tokens)


def test_messages_stream_accepts_return_progress(live):
    c = anthropic.Anthropic(base_url=live.base_url, api_key="none", max_retries=0, timeout=30)
    stream = c.messages.create(
        model="m", max_tokens=3, messages=MSGS, stream=True, extra_body={"return_progress": True}
    )
    types = [e.type for e in stream]
    assert (
        types[0] == "message_start" and types[-1] == "message_stop"
    )  # (llama-server sends no progress here)


# -- malformed values: the API's own 400 -------------------------------------------------------------------


@pytest.mark.parametrize(("field", "value"), [("post_sampling_probs", "yes"), ("return_progress", 3)])
def test_malformed_values_are_400s(live, field, value):
    for path, body in (
        ("/completion", {"prompt": "abc", "n_predict": 2}),
        ("/v1/completions", {"prompt": "abc", "max_tokens": 2}),
        ("/v1/chat/completions", {"messages": MSGS, "max_tokens": 2}),
    ):
        r = post(live, path, body | {field: value})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["code"] == 400 and field in err["message"], err
    r = post(live, "/v1/messages", {"model": "m", "max_tokens": 2, "messages": MSGS, field: value})
    assert r.status_code == 400 and r.json()["type"] == "error", r.text
    assert r.json()["error"]["type"] == "invalid_request_error"


# -- the real model (SmolLM2) ------------------------------------------------------------------------------


@pytest.mark.slow
def test_real_model_post_sampling_and_progress(real_server):
    http = httpx.Client(
        base_url=real_server.base_url, headers={"Authorization": f"Bearer {real_server.api_key}"}, timeout=300
    )
    body = {"prompt": "The capital of France is", "n_predict": 3, "n_probs": 5, "post_sampling_probs": True}
    r = http.post("/completion", json=body | {"top_k": 1}).json()
    assert [e["prob"] for e in r["completion_probabilities"]] == [1.0, 1.0, 1.0]
    r = http.post("/completion", json=body | {"top_k": 5, "temperature": 1.0, "seed": 5}).json()
    for e in r["completion_probabilities"]:
        assert 1 <= len(e["top_probs"]) <= 5
        check_entry(e, len(e["top_probs"]))
    # a prompt over one batch of the server (-b 256): progress per batch, before the first token
    prompt = " ".join(f"word{i}" for i in range(100))
    body = {"prompt": prompt, "n_predict": 1, "stream": True, "return_progress": True, "cache_prompt": False}
    with http.stream("POST", "/completion", json=body) as resp:
        evs = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: {")]
    prog = progress_of(evs)
    total = prog[0]["total"]
    assert total > 256 and [p["processed"] for p in prog] == [*range(0, total, 256), total]
    assert "prompt_progress" not in evs[len(prog)] and evs[len(prog)]["tokens"]
