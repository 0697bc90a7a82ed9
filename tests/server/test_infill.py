"""Fill-in-the-middle: the prompt assembly (llama.cpp's format_infill) against hand-computed token
sequences, /infill and /v1/completions ``suffix`` over a real socket (fake model with FIM tokens, and
the FIM-less fake and SmolLM2, which answer 400)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from llamapy.api.infill import FimError, FimTokens, assemble, format_infill
from llamapy.server.app import ServerSettings
from tests.server.conftest import LiveServer, start_live, stop_live, wait_ready
from tests.server.fake_backend import (
    BOS,
    EOS,
    FIM_MID,
    FIM_PRE,
    FIM_REP,
    FIM_SEP,
    FIM_SUF,
    FakeBackend,
    reference,
)

PRE, SUF, MID, REP, SEP, B = 1001, 1002, 1003, 1004, 1005, 1000
FULL = FimTokens(PRE, SUF, MID, REP, SEP, B, True)
BASIC = FimTokens(PRE, SUF, MID)


def tok(text: str) -> list[int]:
    return list(text.encode())


def test_basic_layout_prompt_follows_prefix():
    got = format_infill(BASIC, tok, [1, 2, 3], [4, 5], [], [9], n_batch=64, n_predict=8, n_ctx=256)
    assert got == [PRE, 1, 2, 3, 9, SUF, 4, 5, MID]
    assert assemble(BASIC, [1], [2], spm_infill=True) == [SUF, 2, PRE, 1, MID]


def test_repo_level_pattern_with_extra_chunks():
    chunks = [("a.py", "xy"), ("b.py", "z")]
    got = format_infill(FULL, tok, [1], [2], chunks, [], n_batch=64, n_predict=8, n_ctx=512)
    extra = [REP, *tok("myproject\n"), SEP, *tok("a.py\n"), *tok("xy"), SEP, *tok("b.py\n"), *tok("z")]
    extra += [SEP, *tok("filename\n")]
    assert got == [*extra, B, PRE, 1, SUF, 2, MID]


def test_extra_chunks_without_file_separator():
    fim = FimTokens(PRE, SUF, MID, bos=B, add_bos=False)
    got = format_infill(fim, tok, [1], [2], [("a.py", "xy")], [], n_batch=64, n_predict=8, n_ctx=512)
    assert got == [*tok("\n\n--- snippet ---\n\n"), *tok("xy"), PRE, 1, SUF, 2, MID]


def test_truncation_keeps_three_quarters_prefix_one_quarter_suffix():
    prefix, suffix = list(range(100, 130)), list(range(200, 230))
    # n_batch 16: the prefix keeps its last 12 tokens, the suffix its first 16/4 - 2 - len(prompt) = 1
    got = format_infill(BASIC, tok, prefix, suffix, [], [7], n_batch=16, n_predict=8, n_ctx=256)
    assert got == [PRE, *range(118, 130), 7, SUF, 200, MID]
    # the extra context keeps its last n_ctx - n_batch - 2 * n_predict = 40 - 16 - 16 = 8 tokens
    chunks = [("f", "abcdefghijklmnop")]
    got = format_infill(FULL, tok, prefix, suffix, chunks, [], n_batch=16, n_predict=8, n_ctx=40)
    extra = [REP, *tok("myproject\n"), SEP, *tok("f\n"), *tok("abcdefghijklmnop"), SEP, *tok("filename\n")]
    assert got == [*extra[-8:], B, PRE, *range(118, 130), SUF, 200, 201, MID]
    # no room for extra context at all
    got = format_infill(FULL, tok, [1], [2], chunks, [], n_batch=16, n_predict=12, n_ctx=40)
    assert got == [B, PRE, 1, SUF, 2, MID]


def test_vocab_without_fim_tokens():
    class V:
        fim_pre, fim_suf, fim_mid, bos, add_bos = 5, -1, 7, 1, True

    with pytest.raises(FimError, match="fim_suf"):
        FimTokens.of(V(), "m.gguf")


# -- over HTTP -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fim_live() -> Iterator[LiveServer]:
    settings = ServerSettings(model_path="/models/fake.gguf")
    srv, thread = start_live(settings, FakeBackend(n_ctx=512, n_seq_max=2, n_batch=64, fim=True))
    wait_ready(srv.base_url)
    yield srv
    stop_live(srv, thread)


def _generated(prompt: list[int], n: int) -> list[int]:
    return [t for t in reference(prompt, n) if t != EOS]


def test_infill_endpoint(fim_live):
    body = {
        "input_prefix": "def f(",
        "input_suffix": "):\n",
        "input_extra": [{"filename": "u.py", "text": "x=1"}],
        "prompt": "a",
        "n_predict": 6,
        "temperature": 0,
        "return_tokens": True,
    }
    r = httpx.post(fim_live.base_url + "/infill", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    extra = [FIM_REP, *tok("myproject\n"), FIM_SEP, *tok("u.py\n"), *tok("x=1"), FIM_SEP, *tok("filename\n")]
    want = [*extra, BOS, FIM_PRE, *tok("def f("), *tok("a"), FIM_SUF, *tok("):\n"), FIM_MID]
    assert out["tokens_evaluated"] == len(want)
    assert out["tokens"] == _generated(want, 6)
    assert out["stop"] is True and "content" in out and "timings" in out
    with httpx.stream("POST", fim_live.base_url + "/infill", json=body | {"stream": True}) as resp:
        assert resp.status_code == 200
        lines = [line for line in resp.iter_lines() if line.startswith("data: ")]
    assert '"stop":true' in lines[-1]


def test_infill_bad_bodies(fim_live):
    url = fim_live.base_url + "/infill"
    assert httpx.post(url, json={"input_suffix": "x"}).status_code == 400  # input_prefix is required
    bad_extra = {"input_prefix": "", "input_suffix": "", "input_extra": [{"text": 3}]}
    assert httpx.post(url, json=bad_extra).status_code == 400
    assert httpx.post(url, json={"input_prefix": "", "input_suffix": "", "prompt": [1]}).status_code == 400
    assert httpx.post(url, json={"input_prefix": "", "input_suffix": "", "n": 2}).status_code == 400


def test_completions_suffix(fim_live):
    client = openai.OpenAI(base_url=fim_live.base_url + "/v1", api_key="x", max_retries=0, timeout=20)
    c = client.completions.create(model="m", prompt="ab", suffix="cd", max_tokens=5, temperature=0)
    want = [FIM_REP, *tok("myproject\n"), FIM_SEP, *tok("filename\n")]
    want += [BOS, FIM_PRE, *tok("ab"), FIM_SUF, *tok("cd"), FIM_MID]
    assert c.usage.prompt_tokens == len(want)
    gen = _generated(want, 5)
    assert c.choices[0].text == bytes(t for t in gen if t < 256).decode()
    assert c.usage.completion_tokens == len(gen)


def test_no_fim_tokens_is_400(live):
    r = httpx.post(live.base_url + "/infill", json={"input_prefix": "a", "input_suffix": "b"})
    assert r.status_code == 400 and "Infill is not supported by this model" in r.json()["error"]["message"]
    r = httpx.post(live.base_url + "/v1/completions", json={"prompt": "a", "suffix": "b"})
    assert r.status_code == 400 and "fill-in-the-middle" in r.json()["error"]["message"]
    assert httpx.post(live.base_url + "/v1/completions", json={"prompt": "a"}).status_code == 200


def test_real_smollm2_has_no_fim_tokens(real_server):
    # SmolLM2's vocabulary declares <reponame> (fim_rep) but no prefix/suffix/middle tokens
    h = {"Authorization": f"Bearer {real_server.api_key}"}
    r = httpx.post(
        real_server.base_url + "/infill", json={"input_prefix": "a", "input_suffix": "b"}, headers=h
    )
    assert r.status_code == 400 and "fim_pre" in r.json()["error"]["message"]


def test_llama_suffix_uses_the_same_assembly():
    from llamapy.api.common import UnsupportedError
    from llamapy.api.completion import CompletionMixin

    class V:
        fim_pre, fim_suf, fim_mid, fim_rep, fim_sep, bos, add_bos = PRE, SUF, MID, -1, -1, B, True

    class L(CompletionMixin):
        vocab, spm_infill, model_path = V(), False, "m.gguf"

        def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
            return ([B] if add_bos else []) + list(text)

    assert L()._prompt_tokens("ab", "cd") == [B, PRE, *b"ab", SUF, *b"cd", MID]
    L.spm_infill = True
    assert L()._prompt_tokens("ab", "cd") == [B, SUF, *b"cd", PRE, *b"ab", MID]
    V.fim_mid = -1
    with pytest.raises(UnsupportedError, match="fim_mid"):
        L()._prompt_tokens("ab", "cd")
