"""The server on hybrid models (issue 13) with the openai client over a real socket: a tiny random Qwen3.5
(Gated DeltaNet + gated attention) and LFM2 (short convolutions + attention) with Qwen's real vocabulary
(and its ChatML template), served with 3 slots.

- continuous batching: concurrent streamed greedy requests give the text each gives alone;
- the prompt-cache checkpoint: a request that shares a long prefix with a slot's cached prompt but leaves
  it before its end resumes from the recurrent-state checkpoint at or before the common prefix
  (``timings.cache_n`` is that checkpoint's position), with a cold run's text; the slot choice takes the
  slot with the nearest checkpoint; one that leaves it before every checkpoint starts over (``cache_n`` 0)
  and is still right; ``/slots`` stays sane;
- ``n = 3`` choices never copy a leader's recurrent state that has gone past the prompt;
- slot save / erase / restore keeps the recurrent states.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from llamapy.generation import checkpoint_positions
from llamapy.ggml.types import GGMLType
from llamapy.gguf import GGUFValueType
from llamapy.gguf.reader import GGUFReader
from llamapy.gguf.writer import GGUFWriter
from llamapy.server.app import ServerSettings
from llamapy.server.backend import ContextBackend
from tests.server.conftest import LiveServer, start_live, stop_live, wait_ready
from tests.util import shared_path

pytest.importorskip("torch")

N_PARALLEL = 3
N_PREDICT = 6
VOCAB = "ggml-vocab-qwen35.gguf"  # 151936 tokens, BPE (pre qwen35), ChatML template


def write_hybrid(family_name: str, path: Path, seed: int = 0) -> Path:
    """The tiny random ``family_name`` test model (tests/model/hf_tiny.py) with Qwen's vocabulary: the
    token embedding resized to it (random rows of the same scale, the output tied to it)."""
    from tests.model import hf_tiny

    fam = hf_tiny.FAMILIES[family_name]
    tm = hf_tiny.make_tiny(fam, path.parent, seed)
    cfg = tm.hf.config
    tensors = hf_tiny.convert(fam, cfg, tm.state)
    md = hf_tiny.metadata(fam, cfg, GGMLType.F32)
    src = GGUFReader(shared_path("vocab", VOCAB))
    n_vocab = len(src.get("tokenizer.ggml.tokens"))
    emb = tensors["token_embd.weight"]
    rng = np.random.default_rng(seed)
    tensors["token_embd.weight"] = (rng.standard_normal((n_vocab, emb.shape[1])) * emb.std()).astype(
        np.float32
    )
    tensors.pop("output.weight", None)
    md[f"{fam.arch}.vocab_size"] = n_vocab
    w = GGUFWriter(path, arch=fam.arch)
    w.add_metadata(md, int_type=GGUFValueType.UINT32)
    for k, f in src.fields.items():
        if k.startswith("tokenizer."):
            w.add_key_value_raw(k, f.type, src.raw_value(k))
    for name, arr in tensors.items():
        w.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32), ggml_type=GGMLType.F32)
    w.write()
    w.close()
    src.close()
    return path


@pytest.fixture(scope="module", params=["qwen35", "lfm2"])
def hybrid(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    path = write_hybrid(request.param, tmp_path_factory.mktemp(request.param) / f"{request.param}.gguf")
    backend = ContextBackend(path, n_ctx=256 * N_PARALLEL, n_seq_max=N_PARALLEL, n_batch=64, n_ubatch=64)
    assert backend.has_checkpoints
    save = tmp_path_factory.mktemp(request.param + "-slots")
    srv, thread = start_live(
        ServerSettings(model_path=str(path), warmup=False, slot_save_path=str(save)), backend
    )
    wait_ready(srv.base_url, timeout=120)
    yield srv
    stop_live(srv, thread)


def _client(srv: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0, timeout=120)


def _chat(c: openai.OpenAI, text: str, **extra: Any) -> str:
    stream = c.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": text}],
        max_tokens=N_PREDICT,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True, **extra},
    )
    return "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)


def _complete(c: openai.OpenAI, prompt: list[int], **extra: Any) -> tuple[str, dict[str, Any]]:
    r = c.completions.create(
        model="m",
        prompt=prompt,
        max_tokens=N_PREDICT,
        temperature=0,
        extra_body={"ignore_eos": True, **extra},
    )
    return r.choices[0].text, (r.model_extra or {}).get("timings") or {}


def _slots(srv: LiveServer) -> list[dict[str, Any]]:
    r = httpx.get(srv.base_url + "/slots", timeout=30)
    assert r.status_code == 200
    return r.json()


def test_concurrent_streams_give_their_solo_texts(hybrid: LiveServer) -> None:
    c = _client(hybrid)
    questions = [f"Question {i}: tell me about the number {i * 7}." for i in range(N_PARALLEL + 1)]
    alone = [_chat(c, q, cache_prompt=False) for q in questions]
    assert all(alone) and len(set(alone)) > 1
    together: dict[int, str] = {}
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            together[i] = _chat(c, questions[i])
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    m = hybrid.app.state.server.engine.metrics  # type: ignore[attr-defined]
    n_decode, n_busy = m.n_decode_total, m.n_busy_slots_total
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(questions))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert m.n_busy_slots_total - n_busy > m.n_decode_total - n_decode  # slots shared decodes
    assert [together[i] for i in range(len(questions))] == alone  # one more request than slots waits
    for s in _slots(hybrid):
        assert s["state"] == "idle" and not s["is_processing"] and s["id_task"] == -1


def test_prompt_cache_resumes_from_a_checkpoint(hybrid: LiveServer) -> None:
    c = _client(hybrid)
    rng = np.random.default_rng(1)
    p1 = [int(t) for t in rng.integers(100, 50000, 100)]
    ckpts = checkpoint_positions(0, len(p1))  # [36, 96]: the states kept while p1 is evaluated
    assert ckpts == [36, 96]
    text1, t1 = _complete(c, p1)
    assert t1["cache_n"] == 0 and t1["prompt_n"] == len(p1)
    # the same prompt again: its last token must be evaluated for the logits, and the state goes back
    # to the checkpoint 4 tokens before the end
    again, t1b = _complete(c, p1)
    assert t1b["cache_n"] == ckpts[1] and again == text1

    # leaves p1 two tokens before its end: resumes from the checkpoint after 96 tokens
    p2 = p1[:98] + [int(t) for t in rng.integers(100, 50000, 10)]
    text2, t2 = _complete(c, p2)
    assert t2["cache_n"] == ckpts[1] and t2["prompt_n"] == len(p2) - ckpts[1]
    assert text2 == _complete(c, p2, cache_prompt=False)[0]

    # leaves it at 50: the slot of p1 and p2 could go back to 36 tokens, but the slot of p2's cold run
    # (the same first 108 tokens) kept a state at 108 - 64 = 44: the slot choice takes that one
    assert checkpoint_positions(0, len(p2))[0] == 44
    p3 = p1[:50] + [int(t) for t in rng.integers(100, 50000, 20)]
    text3, t3 = _complete(c, p3)
    assert t3["cache_n"] == 44
    assert text3 == _complete(c, p3, cache_prompt=False)[0]

    # leaves it at 20, inside p1's span without a checkpoint: back to the nearest one any slot has
    # (p3's cold run kept one after 70 - 64 = 6 tokens), and still right
    p4 = p1[:20] + [int(t) for t in rng.integers(100, 50000, 30)]
    text4, t4 = _complete(c, p4)
    assert t4["cache_n"] == 6 and t4["prompt_n"] == len(p4) - 6
    assert text4 == _complete(c, p4, cache_prompt=False)[0]

    # leaves it at 5, before every checkpoint: starts over
    p5 = p1[:5] + [int(t) for t in rng.integers(100, 50000, 30)]
    text5, t5 = _complete(c, p5)
    assert t5["cache_n"] == 0 and t5["prompt_n"] == len(p5)
    assert text5 == _complete(c, p5, cache_prompt=False)[0]

    slots = _slots(hybrid)
    assert all(s["state"] == "idle" and not s["is_processing"] for s in slots)
    assert all(0 <= s["n_cached_tokens"] <= s["n_ctx"] for s in slots)
    n_cached = [s["n_cached_tokens"] for s in slots]
    # the last cold run's slot holds p5 and its generated tokens (the last one is not decoded)
    assert len(p5) + N_PREDICT - 1 in n_cached


def test_n_choices_share_the_prompt_state(hybrid: LiveServer) -> None:
    """``n = 3`` while another request holds a slot: the third choice gets a slot only when that request
    ends, after its leader has gone on generating, so it must not copy the leader's (advanced)
    recurrent state as the prompt's. The engine is held between two steps while both requests arrive,
    so that they start in the same step."""
    c = _client(hybrid)
    engine = hybrid.app.state.server.engine  # type: ignore[attr-defined]
    msgs = [{"role": "user", "content": "Share this prompt, three times over."}]
    kw: dict[str, Any] = dict(model="m", temperature=0, extra_body={"ignore_eos": True})
    one = c.chat.completions.create(messages=msgs, max_tokens=24, **kw).choices[0].message.content
    out: dict[str, Any] = {}

    def ask(name: str, **more: Any) -> None:
        out[name] = c.chat.completions.create(**kw, **more)

    gate = threading.Event()
    held = engine.call(lambda e: gate.wait(60))
    busy = threading.Thread(
        target=ask, args=("busy",), kwargs=dict(messages=[{"role": "user", "content": "x"}], max_tokens=4)
    )
    shared = threading.Thread(target=ask, args=("n3",), kwargs=dict(messages=msgs, max_tokens=24, n=3))
    try:
        busy.start()
        deadline = time.monotonic() + 30
        while len(engine._incoming) < 1 and time.monotonic() < deadline:
            time.sleep(0.002)
        shared.start()
        while len(engine._incoming) < 1 + N_PARALLEL and time.monotonic() < deadline:
            time.sleep(0.002)
        assert len(engine._incoming) == 1 + N_PARALLEL
    finally:
        gate.set()
        held.result(60)
        busy.join(120)
        shared.join(120)
    assert out["busy"].usage.completion_tokens == 4
    assert [ch.message.content for ch in out["n3"].choices] == [one] * N_PARALLEL


def _native(srv: LiveServer, prompt: list[int], **extra: Any) -> dict[str, Any]:
    body = {
        "prompt": prompt,
        "n_predict": N_PREDICT,
        "temperature": 0,
        "ignore_eos": True,
        "return_tokens": True,
    }
    r = httpx.post(srv.base_url + "/completion", json={**body, **extra}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_slot_save_and_restore_keep_the_recurrent_state(hybrid: LiveServer) -> None:
    """A slot saved, erased and restored (its KV cells and recurrent states in the file) continues the
    conversation from all its tokens, with a cold run's text."""
    rng = np.random.default_rng(2)
    p1 = [int(t) for t in rng.integers(100, 50000, 40)]
    gen = _native(hybrid, p1, id_slot=0)["tokens"]
    url = hybrid.base_url + "/slots/0"
    saved = httpx.post(url, params={"action": "save"}, json={"filename": "h.bin"}).json()
    assert saved["n_saved"] == len(p1) + N_PREDICT - 1
    assert httpx.post(url, params={"action": "erase"}).json()["n_erased"] == saved["n_saved"]
    assert _slots(hybrid)[0]["n_cached_tokens"] == 0
    r = httpx.post(url, params={"action": "restore"}, json={"filename": "h.bin"})
    assert r.status_code == 200 and r.json()["n_restored"] == saved["n_saved"]
    p2 = p1 + gen + [int(t) for t in rng.integers(100, 50000, 3)]
    warm = _native(hybrid, p2, id_slot=0)
    assert warm["timings"]["cache_n"] == saved["n_saved"]  # all of it: the state is at its end
    cold = _native(hybrid, p2, id_slot=1, cache_prompt=False)
    assert cold["timings"]["cache_n"] == 0 and warm["tokens"] == cold["tokens"]
