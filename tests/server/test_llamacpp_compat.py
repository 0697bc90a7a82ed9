"""llama-server 0.3.36's behaviour where a differential run (benchmarks/server_vs_llamacpp.py) found
llamapy differing: token limits clamped, several prompts per request, /completion's stream events,
timings in streams, the context error, llama.cpp's request fields, /props and generation_settings names,
/metrics names, chat logprob ids, /v1/models, the input_tokens endpoints, integral floats, Anthropic's
cached usage. Fake model, real socket, the official clients where the endpoint is theirs."""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest

from tests.server.fake_backend import BOS, reference

SLOT = 256  # the live fixture's slot context (n_ctx 512, 2 slots)
MSGS = [{"role": "user", "content": "tell me things"}]


def expected(prompt_text: str, n: int) -> str:
    toks = reference([BOS, *prompt_text.encode()], n)
    return bytes(t for t in toks if t < 256).decode("utf-8", "replace")


def events(r: httpx.Response) -> list[dict]:
    return [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]


@pytest.fixture
def client(live) -> openai.OpenAI:
    return openai.OpenAI(base_url=live.base_url + "/v1", api_key="none", max_retries=0, timeout=30)


def post(live, path: str, body: dict) -> httpx.Response:
    return httpx.post(live.base_url + path, json=body, timeout=30)


# 1. token limits ----------------------------------------------------------------------------------------


def test_large_or_unlimited_max_tokens_are_clamped(live, client):
    for mt in (32000, -1):
        r = client.chat.completions.create(model="m", messages=MSGS, max_tokens=mt, temperature=0)
        assert r.choices[0].finish_reason in ("stop", "length")
        assert r.usage.total_tokens <= SLOT + 1  # (the last token is sampled, not decoded)
        r = client.completions.create(model="m", prompt="abc", max_tokens=mt, temperature=0)
        assert r.usage.total_tokens <= SLOT + 1  # (the last token is sampled, not decoded)
    r = client.chat.completions.create(model="m", messages=MSGS, max_completion_tokens=4096, temperature=0)
    assert r.usage.total_tokens <= SLOT + 1  # (the last token is sampled, not decoded)
    body = post(live, "/completion", {"prompt": "abc", "n_predict": 10**9, "temperature": 0}).json()
    assert body["generation_settings"]["n_predict"] == SLOT and body["tokens_predicted"] > 0
    for path, body in (
        ("/v1/chat/completions", {"messages": MSGS, "max_tokens": -2}),
        ("/v1/completions", {"prompt": "x", "max_tokens": -2}),
        ("/completion", {"prompt": "x", "n_predict": -2}),
    ):
        r = post(live, path, body)
        assert r.status_code == 400 and "-1 for no limit" in r.json()["error"]["message"], r.text


# 2. several prompts -------------------------------------------------------------------------------------


def test_several_prompts_on_completion(live):
    r = post(live, "/completion", {"prompt": ["abcd", "xyz"], "n_predict": 4, "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [b["index"] for b in body] == [0, 1]
    assert [b["content"] for b in body] == [expected("abcd", 4), expected("xyz", 4)]
    assert [b["prompt"] for b in body] == ["abcd", "xyz"]
    one = post(live, "/completion", {"prompt": [[BOS, 97, 98], [BOS, 120]], "n_predict": 3}).json()
    assert [b["content"] for b in one] == [expected("ab", 3), expected("x", 3)]
    # a list with a number in it is ONE prompt (token ids and strings)
    mixed = post(live, "/completion", {"prompt": [BOS, "ab"], "n_predict": 3, "temperature": 0}).json()
    assert isinstance(mixed, dict) and mixed["content"] == expected("ab", 3)


def test_several_prompts_on_completion_stream(live):
    r = post(live, "/completion", {"prompt": ["abcd", "xyz"], "n_predict": 4, "stream": True})
    assert r.status_code == 200 and "[DONE]" not in r.text
    evs = events(r)
    for i, p in enumerate(["abcd", "xyz"]):
        mine = [e for e in evs if e["index"] == i]
        assert "".join(e["content"] for e in mine) == expected(p, 4)
        assert [e["stop"] for e in mine][-1] is True and sum(e["stop"] for e in mine) == 1


def test_several_prompts_on_v1_completions(live, client):
    r = client.completions.create(model="m", prompt=["abcd", "xyz"], max_tokens=4, temperature=0)
    assert [c.index for c in r.choices] == [0, 1]
    assert [c.text for c in r.choices] == [expected("abcd", 4), expected("xyz", 4)]
    assert r.usage.prompt_tokens == 5 + 4 and r.usage.completion_tokens == 8
    texts: dict[int, str] = {}
    for ch in client.completions.create(model="m", prompt=["abcd", "xyz"], max_tokens=4, stream=True):
        for c in ch.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
    assert texts == {0: expected("abcd", 4), 1: expected("xyz", 4)}
    r = post(live, "/v1/completions", {"prompt": ["a", "b"], "n": 2})
    assert r.status_code == 400 and "several prompts" in r.json()["error"]["message"]


# 3. /completion's stream events -------------------------------------------------------------------------


def test_completion_stream_events_as_llama_server(live):
    body = {"prompt": "abcdef", "n_predict": 5, "temperature": 0}
    whole = post(live, "/completion", body).json()
    evs = events(post(live, "/completion", {**body, "stream": True}))
    partial, final = evs[:-1], evs[-1]
    assert all(len(e["tokens"]) == 1 and e["tokens_evaluated"] == 7 for e in partial)
    assert [e["tokens_predicted"] for e in partial] == list(range(1, len(partial) + 1))
    assert "timings" in partial[-1] and all("timings" not in e for e in partial[:-1])
    assert "".join(e["content"] for e in partial) == whole["content"]
    assert final["stop"] is True and final["content"] == "" and final["tokens"] == []
    assert final["tokens_predicted"] == whole["tokens_predicted"] == 5
    assert "completion_probabilities" not in final
    assert whole["tokens"] == [] and whole["content"] == expected("abcdef", 5)  # unchanged, not streamed


# 4. timings in streams ----------------------------------------------------------------------------------


def test_chat_stream_timings(live):
    body = {"messages": MSGS, "max_tokens": 4, "temperature": 0, "stream": True}
    evs = events(post(live, "/v1/chat/completions", body))
    done = [e for e in evs if e["choices"] and e["choices"][0]["finish_reason"]]
    assert len(done) == 1 and done[0]["timings"]["predicted_n"] == 4
    assert all("timings" not in e for e in evs if e not in done)
    evs = events(post(live, "/v1/chat/completions", {**body, "timings_per_token": True}))
    content = [e for e in evs if e["choices"] and e["choices"][0]["delta"].get("content")]
    assert content and all("timings" in e for e in content)
    evs = events(
        post(
            live, "/completion", {"prompt": "abc", "n_predict": 3, "stream": True, "timings_per_token": True}
        )
    )
    assert all("timings" in e for e in evs)


def test_chat_stream_first_chunk_content_null(live, client):
    body = {"messages": MSGS, "max_tokens": 4, "temperature": 0, "stream": True}
    evs = events(post(live, "/v1/chat/completions", body))
    assert evs[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    chunks = list(client.chat.completions.create(model="m", messages=MSGS, max_tokens=4, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content is None
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


# 5. the context error -----------------------------------------------------------------------------------


def test_prompt_past_the_context(live):
    for path, body in (
        ("/completion", {"prompt": "x" * 400}),
        ("/v1/completions", {"prompt": "x" * 400}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 400}]}),
    ):
        r = post(live, path, body)
        assert r.status_code == 400
        err = r.json()["error"]
        assert err["type"] == "exceed_context_size_error" and err["n_ctx"] == SLOT, err
        assert err["n_prompt_tokens"] > SLOT
    r = post(live, "/v1/messages", {"max_tokens": 4, "messages": [{"role": "user", "content": "x" * 400}]})
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert r.json()["error"]["type"] == "invalid_request_error" and "context" in r.json()["error"]["message"]


# 6. llama.cpp request fields ----------------------------------------------------------------------------


def test_llama_cpp_fields(live):
    r = post(live, "/v1/chat/completions", {"messages": MSGS, "n_predict": 3, "temperature": 0}).json()
    assert r["usage"]["completion_tokens"] == 3 and r["choices"][0]["finish_reason"] == "length"
    fields = ["content", "generation_settings/n_predict", "nope/x"]
    r = post(live, "/completion", {"prompt": "abc", "n_predict": 3, "response_fields": fields}).json()
    assert r == {"content": expected("abc", 3), "generation_settings/n_predict": 3}
    r = post(live, "/completion", {"prompt": "abc", "n_predict": 2, "n_cmpl": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n_cmpl", r.text
    assert post(live, "/completion", {"prompt": "abc", "n_predict": 2, "n_cmpl": 1}).status_code == 200


# fields llama-server acts on and llamapy does not: a 400 naming each, unless its value changes nothing
REFUSED = [
    ("/completion", "chat_format", 1),
    ("/completion", "chat_parser", "x"), ("/completion", "generation_prompt", "<think>"),
    ("/completion", "parse_tool_calls", True), ("/v1/chat/completions", "reasoning_budget_message", "stop"),
    ("/v1/chat/completions", "reasoning_budget_end_tags", ["</think>"]),
]  # fmt: skip


@pytest.mark.parametrize(("path", "field", "value"), REFUSED)
def test_fields_changing_the_answer_are_refused(live, path, field, value):
    body = {"prompt": "abc", "input_prefix": "a", "input_suffix": "b", "messages": MSGS, "max_tokens": 2}
    r = post(live, path, body | {field: value})
    assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text


def test_fields_left_off_are_accepted(live):
    body = {"prompt": "abc", "n_predict": 2, "n_indent": 0, "t_max_predict_ms": -1, "chat_parser": ""}
    assert post(live, "/completion", body).status_code == 200
    chat = {
        "messages": MSGS,
        "max_tokens": 2,
        "continue_final_message": False,
        "reasoning_budget_message": "",
    }
    assert post(live, "/v1/chat/completions", chat).status_code == 200


def test_adaptive_p_fields_reach_the_sampler(live):
    body = {"prompt": "abc", "n_predict": 2, "adaptive_target": 0.5, "adaptive_decay": 0.5}
    gs = post(live, "/completion", body).json()["generation_settings"]
    assert (gs["adaptive_target"], gs["adaptive_decay"]) == (0.5, 0.5)
    r = post(live, "/completion", body | {"adaptive_decay": 0.995})
    assert r.status_code == 400 and r.json()["error"]["param"] == "adaptive_decay", r.text


# 7. /props and generation_settings ----------------------------------------------------------------------


LLAMA_SERVER_PARAMS = {
    "seed", "temperature", "dynatemp_range", "dynatemp_exponent", "top_k", "top_p", "min_p", "top_n_sigma",
    "xtc_probability", "xtc_threshold", "typical_p", "repeat_last_n", "repeat_penalty", "presence_penalty",
    "frequency_penalty", "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n",
    "mirostat", "mirostat_tau", "mirostat_eta", "adaptive_target", "adaptive_decay", "max_tokens",
    "n_predict", "n_keep", "n_discard", "ignore_eos", "stream", "n_probs", "min_keep", "chat_format",
    "reasoning_format", "reasoning_in_content", "generation_prompt", "samplers", "speculative.types",
    "timings_per_token", "post_sampling_probs", "backend_sampling", "lora",
}  # fmt: skip
FULL_ONLY = {"dry_sequence_breakers", "stop", "logit_bias", "grammar", "grammar_lazy", "grammar_triggers",
             "preserved_tokens"}  # fmt: skip


def test_props_and_generation_settings_names(live):
    props = httpx.get(live.base_url + "/props").json()
    assert set(props["default_generation_settings"]["params"]) == LLAMA_SERVER_PARAMS
    for k in ("chat_template_caps", "endpoint_slots", "endpoint_props", "endpoint_metrics", "model_ftype"):
        assert k in props, k
    assert set(props["modalities"]) == {"vision", "video", "audio"}
    assert props["endpoint_metrics"] is True and props["chat_template_caps"]["supports_tools"] is False
    body = {
        "prompt": "abc",
        "n_predict": 2,
        "temperature": 0.5,
        "repeat_penalty": 1.1,
        "logit_bias": [[65, -1]],
    }
    gs = post(live, "/completion", body).json()["generation_settings"]
    assert set(gs) == LLAMA_SERVER_PARAMS | FULL_ONLY
    assert gs["temperature"] == 0.5 and gs["repeat_penalty"] == 1.1 and gs["max_tokens"] == 2
    assert gs["logit_bias"] == [{"bias": -1.0, "token": 65}]


def test_post_props_not_supported_as_llama_server(live):
    r = post(live, "/props", {"n_ctx": 8})
    assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error", r.text
    assert r.json()["error"]["code"] == 501


def test_generation_settings_report_what_the_request_used(live):
    gs = post(live, "/completion", {"prompt": "abc", "n_predict": 1}).json()["generation_settings"]
    assert gs["reasoning_format"] == "deepseek"  # llama-server's /completion shows the default auto so
    assert (gs["grammar_lazy"], gs["grammar_triggers"], gs["speculative.types"]) == (False, [], "none")
    body = {"prompt": "abc", "n_predict": 1, "reasoning_format": "none"}
    assert post(live, "/completion", body).json()["generation_settings"]["reasoning_format"] == "none"
    r = post(live, "/completion", body | {"reasoning_format": "loud"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "reasoning_format"


def test_speculative_types_names():
    from llamapy.server.backend import ContextBackend

    b = object.__new__(ContextBackend)
    b._spec_drafts, b._eagle3, b._draft_model = None, None, None
    assert b.speculative_types == "none"
    b._draft_model = object()
    assert b.speculative_types == "draft-simple"
    b._spec_drafts = type("D", (), {"spec_type": "mtp"})()
    assert b.speculative_types == "draft-mtp"


def test_lazy_grammar_triggers_as_llama_server():
    from llamapy.grammar import LlamaGrammar, Trigger
    from llamapy.server.engine import GenParams
    from llamapy.server.inputs import settings_dict

    g = LlamaGrammar.from_string('root ::= "x"').lazy([Trigger("word", "<tool_call>"), Trigger("token", 7)])
    gs = settings_dict(GenParams(grammar=g))
    assert gs["grammar_lazy"] is True
    assert gs["grammar_triggers"] == [
        {"type": 1, "value": "<tool_call>"},
        {"type": 0, "value": "", "token": 7},
    ]


# 8. /metrics --------------------------------------------------------------------------------------------


def test_metrics_names(live):
    post(live, "/completion", {"prompt": "abcdefgh", "n_predict": 2})
    post(live, "/completion", {"prompt": "abcdefgh", "n_predict": 2})
    text = httpx.get(live.base_url + "/metrics").text
    names = {line.split()[0] for line in text.splitlines() if not line.startswith("#")}
    assert all(n.startswith("llamacpp:") for n in names)
    for n in ("prompt_tokens_total", "prompt_tokens_cached_total", "n_tokens_max", "n_decode_total",
              "spec_decode_num_draft_tokens_total", "n_busy_slots_per_decode"):  # fmt: skip
        assert f"llamacpp:{n}" in names, n
    value = {
        line.split()[0]: float(line.split()[1]) for line in text.splitlines() if not line.startswith("#")
    }
    assert value["llamacpp:prompt_tokens_cached_total"] > 0 and value["llamacpp:n_tokens_max"] >= 10


# 9-11. logprob ids, /v1/models, input_tokens ------------------------------------------------------------


def test_chat_logprobs_have_ids(client):
    r = client.chat.completions.create(
        model="m", messages=MSGS, max_tokens=3, temperature=0, logprobs=True, top_logprobs=2
    )
    content = r.model_dump()["choices"][0]["logprobs"]["content"]
    assert all(isinstance(c["id"], int) and c["token"] == chr(c["id"]) for c in content)
    assert all(isinstance(t["id"], int) for c in content for t in c["top_logprobs"])


def test_models_shape(live, client):
    (m,) = client.models.list().data
    assert m.id == "fake.gguf" and m.owned_by == "llamacpp"
    body = httpx.get(live.base_url + "/v1/models").json()
    assert body["models"][0]["name"] == "fake.gguf" and body["data"][0]["aliases"] == ["fake.gguf"]
    meta = body["data"][0]["meta"]
    assert meta == {"vocab_type": 2, "n_vocab": 258, "n_ctx": SLOT, "n_ctx_train": 1024, "n_embd": 8,
                    "n_params": 1234, "size": 0, "ftype": "F32"}  # fmt: skip


def test_input_tokens_endpoints(live, client):
    r = client.chat.completions.create(model="m", messages=MSGS, max_tokens=1)
    for path in ("/v1/chat/completions/input_tokens", "/chat/completions/input_tokens"):
        got = post(live, path, {"messages": MSGS}).json()
        assert got == {"input_tokens": r.usage.prompt_tokens, "object": "response.input_tokens"}
    resp = client.responses.create(model="m", input="tell me things", max_output_tokens=2)
    got = post(live, "/v1/responses/input_tokens", {"input": "tell me things"}).json()
    assert got == {"input_tokens": resp.usage.input_tokens, "object": "response.input_tokens"}


# 12. lenient inputs, as llama-server -------------------------------------------------------------------


def test_integral_floats_and_null_assistant_content(live):
    r = post(live, "/v1/chat/completions", {"messages": MSGS, "max_tokens": 3.0, "temperature": 0})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    r = post(live, "/v1/chat/completions", {"messages": MSGS, "max_tokens": 3.5})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    turns = [*MSGS, {"role": "assistant", "content": None}, {"role": "user", "content": "more"}]
    assert post(live, "/v1/chat/completions", {"messages": turns, "max_tokens": 2}).status_code == 200


# 13. Anthropic's cached usage --------------------------------------------------------------------------


def test_anthropic_usage_splits_cached_tokens(live):
    c = anthropic.Anthropic(base_url=live.base_url, api_key="none", max_retries=0, timeout=30)
    msgs = [{"role": "user", "content": "a long enough question to cache"}]
    n = c.messages.count_tokens(model="m", messages=msgs).input_tokens
    c.messages.create(model="m", max_tokens=2, messages=msgs)
    again = c.messages.create(model="m", max_tokens=2, messages=msgs)
    assert again.usage.cache_read_input_tokens > 0
    assert again.usage.input_tokens + again.usage.cache_read_input_tokens == n
    with c.messages.stream(model="m", max_tokens=2, messages=msgs) as s:
        final = s.get_final_message()
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == n


def test_line_stops_of_code_completion_clients(live):
    """n_indent and t_max_predict_ms (llama.vim, llama.vscode): the answer cut where llama-server cuts it
    (tests/generation/test_line_limits.py has the rule), in the stream too, the stop type a limit."""
    from tests.generation.test_line_limits import llama_cpp_indent

    body = {"prompt": "x\ny\nzz\n\nq r\n s\nt", "n_predict": 30, "temperature": 0}
    full = post(live, "/completion", body).json()["content"]
    want = llama_cpp_indent(full, 1)
    assert want is not None and want != full, full  # (the fake model's answer has an unindented line)
    cut = post(live, "/completion", body | {"n_indent": 1}).json()
    assert (cut["content"], cut["stop_type"]) == (want, "limit")
    streamed = events(post(live, "/completion", body | {"n_indent": 1, "stream": True}))
    assert "".join(e["content"] for e in streamed) == want
    timed = post(live, "/completion", body | {"t_max_predict_ms": 1e-6}).json()
    assert timed["content"] == full[: full.index("\n") + 1] and timed["stop_type"] == "limit"
    for bad in ({"n_indent": -1}, {"t_max_predict_ms": "soon"}):
        assert post(live, "/completion", body | bad).status_code == 400


def test_last_assistant_message_is_prefilled(live):
    """llama-server continues a last assistant message (prefill_assistant, also Anthropic's prefill);
    continue_final_message false closes it instead."""
    msgs = [*MSGS, {"role": "assistant", "content": "Sure:"}]
    r = post(live, "/apply-template", {"messages": msgs})
    assert r.json()["prompt"] == "<user>tell me things\n<assistant>Sure:"
    r = post(live, "/apply-template", {"messages": msgs, "continue_final_message": False})
    assert r.json()["prompt"] == "<user>tell me things\n<assistant>Sure:\n<assistant>"
    r = post(live, "/v1/chat/completions", {"messages": msgs, "max_tokens": 3, "temperature": 0})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["role"] == "assistant"
    two = [*msgs, {"role": "assistant", "content": "more"}]
    r = post(live, "/v1/chat/completions", {"messages": two, "max_tokens": 3})
    assert r.status_code == 400 and "2 or more assistant messages" in r.json()["error"]["message"]
    r = post(
        live, "/v1/chat/completions", {"messages": MSGS, "max_tokens": 3, "continue_final_message": True}
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "continue_final_message"
    r = post(live, "/v1/messages", {"model": "m", "max_tokens": 3, "messages": msgs})
    assert r.status_code == 200, r.text
