"""Encode once (issue 30 §3): image embeddings cached by content in an LRU bounded in bytes, shared by
the server's slots and reused across turns and requests, with the same logits as encoding again."""

from __future__ import annotations

import base64
import io
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import openai
import pytest
from PIL import Image

from llamapy.api import Llama
from llamapy.mtmd import MtmdContext
from llamapy.mtmd.embd_cache import EmbeddingCache, chunk_key
from llamapy.mtmd.errors import MtmdError
from llamapy.server.app import ServerSettings
from llamapy.server.backend import ContextBackend
from tests.mtmd import convert
from tests.server.conftest import start_live, stop_live, wait_ready


def _url(seed: int, size: tuple[int, int] = (40, 70)) -> str:
    arr = np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _turns(n: int, url: str) -> list[list[dict]]:
    """The messages of an n-turn conversation that resends the image every turn, as OpenAI clients do."""
    msgs: list[dict] = [{"role": "system", "content": "be brief"}]
    out = []
    for k in range(n):
        msgs = msgs + [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                    {"type": "text", "text": f"question {k}"}]}]  # fmt: skip
        out.append(msgs)
        msgs = msgs + [{"role": "assistant", "content": f"answer {k}"}]
    return out


def test_cache_is_an_lru_bounded_in_bytes() -> None:
    c = EmbeddingCache(max_bytes=3 * 400)
    a = [np.full((10, 10), i, np.float32) for i in range(5)]  # 400 bytes each
    for i in range(3):
        c.put(f"k{i}", a[i])
    assert c.get("k0") is not None  # k0 now most recent: k1 goes first
    c.put("k3", a[3])
    assert c.get("k1") is None and c.get("k0") is not None and len(c) == 3 and c.n_bytes <= c.max_bytes
    big = c.put("big", np.zeros((100, 100), np.float32))  # larger than the bound: used, not kept
    assert big.shape == (100, 100) and c.get("big") is None and c.n_bytes <= c.max_bytes
    e = c.get("k3")
    assert e is not None and not e.flags.writeable
    c.resize(400)
    assert len(c) == 1 and c.n_bytes == 400
    c.resize(0)
    assert len(c) == 0
    c.put("x", a[0])
    assert c.get("x") is None  # 0: off
    with pytest.raises(ValueError):
        c.resize(-1)
    st = c.stats()
    assert st["hits"] >= 3 and st["misses"] >= 3


def test_key_follows_the_encoder_input() -> None:
    px = np.random.default_rng(0).random((3, 8, 8), dtype=np.float32)
    same = chunk_key("image", px.copy())
    assert chunk_key("image", px) == same
    other = px.copy()
    other[0, 0, 0] += 1e-6  # another preprocessing (or another picture) is another entry
    assert chunk_key("image", other) != same
    assert chunk_key("audio", px) != same and chunk_key("image", px.reshape(3, 4, 16)) != same


@pytest.fixture(scope="module")
def llm(gemma3_vlm: convert.TinyVLM) -> Llama:
    return Llama(str(gemma3_vlm.text_gguf()), mmproj=str(gemma3_vlm.mmproj_gguf()), n_ctx=512, n_batch=64,
                 n_ubatch=64, verbose=False)  # fmt: skip


def test_three_turns_encode_the_image_once_with_identical_logits(
    gemma3_vlm: convert.TinyVLM, llm: Llama
) -> None:
    """Each turn starts from an empty KV cache (another slot, an evicted prompt): the embeddings come
    from the cache, and the answer's log-probabilities are those of a run that encodes every time."""
    mt = llm.mtmd
    mt.embd_cache.clear()
    n0 = mt.n_encoded
    url = _url(7)
    cached = []
    t_turn = []
    for msgs in _turns(3, url):
        llm.reset()
        t0 = time.perf_counter()
        cached.append(
            llm.create_chat_completion(msgs, temperature=0, max_tokens=3, logprobs=True, top_logprobs=3)
        )
        t_turn.append(time.perf_counter() - t0)
    assert mt.n_encoded - n0 == 1 and mt.embd_cache.hits >= 2
    fresh = Llama(str(gemma3_vlm.text_gguf()), mmproj=str(gemma3_vlm.mmproj_gguf()), n_ctx=512, n_batch=64,
                  n_ubatch=64, verbose=False)  # fmt: skip
    fresh.mtmd.embd_cache.resize(0)  # off: every turn encodes
    for msgs, got in zip(_turns(3, url), cached, strict=True):
        fresh.reset()
        want = fresh.create_chat_completion(msgs, temperature=0, max_tokens=3, logprobs=True, top_logprobs=3)
        assert got["choices"][0]["logprobs"] == want["choices"][0]["logprobs"]
        assert got["choices"][0]["message"] == want["choices"][0]["message"]
    assert fresh.mtmd.n_encoded == 1 + 2 + 3  # turn k resends the picture in each of its k user messages
    print(f"turn times (s), cache on: {[round(t, 3) for t in t_turn]}")


def test_kv_prefix_reused_across_turns_with_the_image(llm: Llama) -> None:
    """Without a reset the next turn reuses the KV cells through the first image (compared by its
    hash) and evaluates only what follows; the resent copy of the picture comes from the cache."""
    llm.reset()
    turns = _turns(2, _url(8))
    llm.create_chat_completion(turns[0], temperature=0, max_tokens=2)
    mt = llm.mtmd
    n_enc, hits = mt.n_encoded, mt.embd_cache.hits
    reused: list[int] = []
    inner = mt.eval_chunks
    mt.eval_chunks = lambda ctx, chunks, n_past, **kw: (
        reused.append(n_past) or inner(ctx, chunks, n_past, **kw)
    )
    try:
        llm.create_chat_completion(turns[1], temperature=0, max_tokens=2)
    finally:
        del mt.eval_chunks
    assert reused and reused[0] > 16  # past the first image's 16 positions
    assert mt.n_encoded == n_enc and mt.embd_cache.hits == hits + 1


def test_bad_cache_size(gemma3_vlm: convert.TinyVLM) -> None:
    with pytest.raises(MtmdError, match="cache"):
        MtmdContext(gemma3_vlm.mmproj_gguf(), Llama(str(gemma3_vlm.text_gguf()), vocab_only=True,
                                                    verbose=False).model, cache_mb=-1)  # fmt: skip


@pytest.fixture(scope="module")
def served(gemma3_vlm: convert.TinyVLM) -> Iterator[tuple[object, ContextBackend]]:
    backend = ContextBackend(gemma3_vlm.text_gguf(), n_ctx=512, n_seq_max=2, n_batch=64, n_ubatch=64)
    backend.mtmd = MtmdContext(gemma3_vlm.mmproj_gguf(), backend.model)  # type: ignore[attr-defined]
    srv, thread = start_live(ServerSettings(model_path=str(gemma3_vlm.text_gguf()), warmup=False), backend)
    wait_ready(srv.base_url, timeout=120)
    yield srv, backend
    stop_live(srv, thread)


def test_slots_and_requests_share_one_encoding(served: tuple) -> None:
    srv, backend = served
    mt = backend.mtmd  # type: ignore[attr-defined]
    n0 = mt.n_encoded
    c = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0, timeout=120)
    url = _url(9)

    def ask(system: str) -> str:
        msgs = [{"role": "system", "content": system}, *_turns(1, url)[0][1:]]
        r = c.chat.completions.create(model="m", messages=msgs, temperature=0, max_tokens=3)
        return r.choices[0].message.content or ""

    with ThreadPoolExecutor(2) as ex:  # two slots at once, the same picture
        answers = list(ex.map(ask, ["one", "two"]))
    ask("a third system prompt: no KV prefix through the image")
    assert mt.n_encoded - n0 == 1 and mt.embd_cache.hits >= 2
    assert mt.embd_cache.n_bytes <= mt.embd_cache.max_bytes
    assert all(isinstance(a, str) for a in answers)
