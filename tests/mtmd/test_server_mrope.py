"""Images through the server on an M-RoPE model (issue 18): a tiny random Qwen2.5-VL (qwen2vl text model,
qwen2.5vl_merger mmproj) served with ``--mmproj`` and 2 slots, with the openai client. An image's patches
take ``max(rows, cols)`` positions (M-RoPE) but ``rows * cols`` KV cells: the answers must equal
``Llama(..., mmproj=...).create_chat_completion``'s on the same files, the prompt cache must reuse a
repeated image (``cached_tokens`` covers it) with a cold run's answer, and two clients with different
images at once get their solo answers."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from PIL import Image

from llamapy.api import Llama
from llamapy.mtmd import MtmdContext
from llamapy.server.app import ServerSettings
from llamapy.server.backend import ContextBackend
from tests.mtmd import convert
from tests.server.conftest import LiveServer, start_live, stop_live, wait_ready

N_CTX_SLOT = 256
N_PREDICT = 6


def _url(seed: int, size: tuple[int, int] = (40, 56), fmt: str = "PNG") -> str:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)).save(
        buf, format=fmt
    )
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(buf.getvalue()).decode()


def _img(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def _text(t: str) -> dict[str, Any]:
    return {"type": "text", "text": t}


@pytest.fixture(scope="module")
def q25(tmp_path_factory: pytest.TempPathFactory) -> convert.TinyQwen2VL:
    return convert.make_qwen2vl(tmp_path_factory.mktemp("qwen25vl-server"), v25=True)


@pytest.fixture(scope="module")
def server(q25: convert.TinyQwen2VL, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    backend = ContextBackend(q25.text_gguf(), n_ctx=2 * N_CTX_SLOT, n_seq_max=2, n_batch=64, n_ubatch=64)
    backend.mtmd = MtmdContext(q25.mmproj_gguf(), backend.model)  # type: ignore[attr-defined]
    save = str(tmp_path_factory.mktemp("qwen25vl-slots"))
    settings = ServerSettings(model_path=str(q25.text_gguf()), warmup=False, slot_save_path=save)
    srv, thread = start_live(settings, backend)
    wait_ready(srv.base_url, timeout=120)
    yield srv
    stop_live(srv, thread)


@pytest.fixture(scope="module")
def llm(q25: convert.TinyQwen2VL) -> Llama:
    return Llama(str(q25.text_gguf()), mmproj=str(q25.mmproj_gguf()), n_ctx=N_CTX_SLOT, n_batch=64,
                 n_ubatch=64, verbose=False)  # fmt: skip


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0, timeout=120)


def _ask(c: openai.OpenAI, msgs: list[dict[str, Any]], **extra: Any) -> Any:
    return c.chat.completions.create(
        model="m", messages=msgs, max_tokens=N_PREDICT, temperature=0, extra_body=extra or None
    )


def _solo(llm: Llama, msgs: list[dict[str, Any]]) -> tuple[str, int]:
    out = llm.create_chat_completion(msgs, max_tokens=N_PREDICT, temperature=0.0)
    assert out["usage"]["completion_tokens"] == N_PREDICT  # (no early end of generation: a real answer)
    return out["choices"][0]["message"]["content"], out["usage"]["prompt_tokens"]


def test_props_and_one_image_answer_as_the_api(server: LiveServer, client: openai.OpenAI, llm: Llama) -> None:
    assert httpx.get(server.base_url + "/props").json()["modalities"]["vision"] is True
    msgs = [{"role": "user", "content": [_text("what is this"), _img(_url(1))]}]
    want, n_prompt = _solo(llm, msgs)
    r = _ask(client, msgs)
    assert r.choices[0].message.content == want and r.usage.completion_tokens >= 1
    assert r.usage.prompt_tokens == n_prompt


def test_two_images_in_one_message(client: openai.OpenAI, llm: Llama) -> None:
    msgs = [{"role": "user", "content": [_img(_url(2)), _text("and"), _img(_url(3, (64, 33), "JPEG"))]}]
    want, n_prompt = _solo(llm, msgs)
    r = _ask(client, msgs)
    assert r.choices[0].message.content == want and r.usage.prompt_tokens == n_prompt


def test_the_same_image_twice_in_one_message(client: openai.OpenAI, llm: Llama) -> None:
    u = _url(5, (48, 64))
    msgs = [{"role": "user", "content": [_img(u), _text("same?"), _img(u)]}]
    want, n_prompt = _solo(llm, msgs)
    r = _ask(client, msgs)
    assert r.choices[0].message.content == want and r.usage.prompt_tokens == n_prompt


def test_a_repeated_image_is_reused_from_the_prompt_cache(client: openai.OpenAI, llm: Llama) -> None:
    first = [{"role": "user", "content": [_img(_url(4, (48, 80))), _text("describe the cat")]}]
    want1 = _solo(llm, first)[0]
    view = [int(t) for t in llm.eval_tokens]
    img_at = [i for i, t in enumerate(view) if t < 0]  # the image's positions in the token view
    assert len(img_at) == 5  # 48 x 80 px: 3 x 5 merged patches, 15 tokens at 5 M-RoPE positions
    r1 = _ask(client, first)
    assert r1.choices[0].message.content == want1
    assert r1.usage.prompt_tokens_details.cached_tokens <= img_at[0]  # a new image is evaluated
    # the conversation goes on: its prompt repeats the image, which the slot holds
    follow = [*first, {"role": "assistant", "content": r1.choices[0].message.content},
              {"role": "user", "content": "and now?"}]  # fmt: skip
    r2 = _ask(client, follow)
    cold = _ask(client, follow, cache_prompt=False)
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    assert r2.choices[0].message.content == cold.choices[0].message.content == _solo(llm, follow)[0]
    assert r2.usage.prompt_tokens_details.cached_tokens > img_at[-1]  # the image is reused
    # the same message again: all but the last token
    r3 = _ask(client, first)
    assert r3.choices[0].message.content == want1
    assert r3.usage.prompt_tokens_details.cached_tokens == r3.usage.prompt_tokens - 1


def test_two_clients_with_different_images_at_once(client: openai.OpenAI, llm: Llama) -> None:
    def msgs(seed: int) -> list[dict[str, Any]]:
        return [{"role": "user", "content": [_text("look:"), _img(_url(seed, (40 + seed, 72))), _text("ok")]}]

    def ask(seed: int) -> str:
        return _ask(client, msgs(seed), cache_prompt=False).choices[0].message.content or ""

    alone = [_solo(llm, msgs(s))[0] for s in (10, 11)]
    assert alone[0] != alone[1]
    with ThreadPoolExecutor(2) as ex:
        together = list(ex.map(ask, [10, 11]))
    assert together == alone


def test_image_cells_count_against_the_slot(client: openai.OpenAI) -> None:
    """An image's KV cells (rows * cols), not its M-RoPE positions (max(rows, cols)), count against a
    slot's context: too many is a 400 up front, and two long generations after big images stop at their
    slots' size ("length") instead of running the shared KV cache out (a 500 mid-decode)."""
    big = [{"role": "user", "content": [_img(_url(20, (320, 320))), _text("hi")]}]  # 400 cells, 20 positions
    with pytest.raises(openai.BadRequestError, match="a slot's context holds 256"):
        _ask(client, big)

    def long(seed: int) -> Any:
        msgs = [{"role": "user", "content": [_img(_url(seed, (192, 192))), _text("go on")]}]  # 144 cells
        return client.chat.completions.create(
            model="m", messages=msgs, max_tokens=N_CTX_SLOT, temperature=0, extra_body={"ignore_eos": True}
        )

    with ThreadPoolExecutor(2) as ex:
        outs = list(ex.map(long, [21, 22]))
    for r in outs:
        assert r.choices[0].finish_reason == "length"
        # the cells decoded (the last token is only sampled): the slot is full
        assert r.usage.prompt_tokens + (144 - 12) + r.usage.completion_tokens - 1 == N_CTX_SLOT


def test_n_choices_share_an_image_prompt(client: openai.OpenAI, llm: Llama) -> None:
    """``n = 2``: the second choice shares the first's prompt cells (image cells included, seq_cp by
    position) and answers the same greedy text."""
    msgs = [{"role": "user", "content": [_img(_url(30, (64, 48))), _text("twice")]}]
    want = _solo(llm, msgs)[0]
    r = client.chat.completions.create(model="m", messages=msgs, max_tokens=N_PREDICT, temperature=0, n=2)
    assert [ch.message.content for ch in r.choices] == [want, want]


def test_saving_a_slot_that_holds_an_image_is_refused(server: LiveServer, client: openai.OpenAI) -> None:
    """The slot file stores int32 token ids; an image's pseudo tokens are not: a 501, not a crash."""
    _ask(client, [{"role": "user", "content": [_img(_url(40)), _text("keep")]}], id_slot=0)
    url = server.base_url + "/slots/0"
    r = httpx.post(url, params={"action": "save"}, json={"filename": "img.bin"}, timeout=30)
    assert r.status_code == 501 and "holds an image" in r.json()["error"]["message"]
    assert httpx.post(url, params={"action": "erase"}, timeout=30).status_code == 200
    _ask(client, [{"role": "user", "content": "text only"}], id_slot=0)
    r = httpx.post(url, params={"action": "save"}, json={"filename": "txt.bin"}, timeout=30)
    assert r.status_code == 200 and r.json()["n_saved"] > 0


def test_context_shift_never_cuts_an_image(q25: convert.TinyQwen2VL) -> None:
    """``--context-shift``: a shift that would drop or move an image's cells is refused (the answer ends
    with "length" when the slot is full, as llama-server, which shifts no multimodal context); one that
    keeps the image (``n_keep: -1``, the whole prompt) goes on past the slot's size."""
    backend = ContextBackend(q25.text_gguf(), n_ctx=256, n_seq_max=2, n_batch=64, n_ubatch=64)
    backend.mtmd = MtmdContext(q25.mmproj_gguf(), backend.model)  # type: ignore[attr-defined]
    settings = ServerSettings(model_path=str(q25.text_gguf()), warmup=False, context_shift=True)
    srv, thread = start_live(settings, backend)
    try:
        wait_ready(srv.base_url, timeout=120)
        c = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0, timeout=120)
        msgs = [{"role": "user", "content": [_img(_url(50, (96, 96))), _text("go")]}]  # 36 cells, 6 positions

        def ask(**extra: Any) -> Any:
            return c.chat.completions.create(
                model="m",
                messages=msgs,
                max_tokens=200,
                temperature=0,
                extra_body={"ignore_eos": True, **extra},
            )

        r = ask()
        assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens < 200
        assert r.usage.prompt_tokens + (36 - 6) + r.usage.completion_tokens - 1 == 128  # the slot is full
        kept = ask(n_keep=-1)
        assert kept.usage.completion_tokens == 200
    finally:
        stop_live(srv, thread)
