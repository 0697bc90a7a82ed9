"""Images through the server (``--mmproj``) with the openai client: answers, two images in one message,
the prompt cache reusing a repeated image, ``/props``, and bad input as HTTP 400."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest
from PIL import Image

from llamapy.mtmd import MtmdContext
from llamapy.server.app import ServerSettings
from llamapy.server.backend import ContextBackend
from tests.mtmd import convert
from tests.server.conftest import LiveServer, start_live, stop_live, wait_ready


def _url(seed: int, fmt: str = "PNG", size: tuple[int, int] = (40, 56)) -> str:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)).save(
        buf, format=fmt
    )
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(buf.getvalue()).decode()


def _img(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def _serve(vlm: convert.TinyVLM, mmproj: bool) -> tuple[LiveServer, object]:
    backend = ContextBackend(vlm.text_gguf(), n_ctx=512, n_seq_max=2, n_batch=64, n_ubatch=64)
    if mmproj:
        backend.mtmd = MtmdContext(vlm.mmproj_gguf(), backend.model)  # type: ignore[attr-defined]
    srv, thread = start_live(ServerSettings(model_path=str(vlm.text_gguf()), warmup=False), backend)
    wait_ready(srv.base_url, timeout=120)
    return srv, thread


@pytest.fixture(scope="module")
def vision(gemma3_vlm: convert.TinyVLM) -> Iterator[LiveServer]:
    srv, thread = _serve(gemma3_vlm, True)
    yield srv
    stop_live(srv, thread)


def _client(srv: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0, timeout=120)


def test_props_say_vision(vision: LiveServer) -> None:
    assert httpx.get(vision.base_url + "/props").json()["modalities"]["vision"] is True


def test_chat_with_images_and_the_prompt_cache(vision: LiveServer) -> None:
    c = _client(vision)
    msg = [{"role": "user", "content": [{"type": "text", "text": "what is this"}, _img(_url(1))]}]
    r1 = c.chat.completions.create(model="m", messages=msg, max_tokens=4, temperature=0)
    assert r1.choices[0].message.content is not None and r1.usage.completion_tokens >= 1
    r2 = c.chat.completions.create(model="m", messages=msg, max_tokens=4, temperature=0)
    assert r2.choices[0].message.content == r1.choices[0].message.content
    assert r2.usage.prompt_tokens == r1.usage.prompt_tokens
    assert r2.usage.prompt_tokens_details.cached_tokens == r2.usage.prompt_tokens - 1  # image included
    other = [{"role": "user", "content": [{"type": "text", "text": "what is this"}, _img(_url(2, "JPEG"))]}]
    r3 = c.chat.completions.create(model="m", messages=other, max_tokens=2, temperature=0)
    assert (
        r3.usage.prompt_tokens_details.cached_tokens < r3.usage.prompt_tokens - 16
    )  # a new image: not reused
    two = [
        {"role": "user", "content": [_img(_url(1)), {"type": "text", "text": "and"}, _img(_url(3, "WEBP"))]}
    ]
    r4 = c.chat.completions.create(model="m", messages=two, max_tokens=2, temperature=0)
    assert r4.usage.prompt_tokens >= 32 + 4
    stream = c.chat.completions.create(model="m", messages=msg, max_tokens=3, temperature=0, stream=True)
    text = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
    assert text == r1.choices[0].message.content[: len(text)]


def test_bad_images_are_400(vision: LiveServer) -> None:
    def post(content: list) -> httpx.Response:
        body = {"messages": [{"role": "user", "content": content}], "max_tokens": 1}
        return httpx.post(vision.base_url + "/v1/chat/completions", json=body, timeout=60)

    r = post([_img("data:image/png;base64," + base64.b64encode(b"not a png").decode())])
    assert r.status_code == 400 and "not an image" in r.json()["error"]["message"]
    r = post([_img("http://10.0.0.1/cat.png")])
    assert r.status_code == 400 and "remote image URLs are not fetched" in r.json()["error"]["message"]
    huge = _url(4, size=(8, 8)).replace(
        _url(4, size=(8, 8)).split(",")[1], base64.b64encode(_bomb()).decode()
    )
    r = post([_img(huge)])
    assert r.status_code == 400 and "exceeds the limit" in r.json()["error"]["message"]
    r = post([{"type": "text", "text": "a <__media__> b"}, _img(_url(1))])
    assert r.status_code == 400
    assert httpx.get(vision.base_url + "/health").status_code == 200  # still serving


def _bomb() -> bytes:
    from tests.mtmd.test_image import _png_header_only

    return _png_header_only(60000, 60000)


def test_image_to_a_server_without_mmproj(gemma3_vlm: convert.TinyVLM) -> None:
    srv, thread = _serve(gemma3_vlm, False)
    try:
        assert httpx.get(srv.base_url + "/props").json()["modalities"]["vision"] is False
        with pytest.raises(openai.BadRequestError, match="mmproj"):
            _client(srv).chat.completions.create(
                model="m", messages=[{"role": "user", "content": [_img(_url(1))]}], max_tokens=1
            )
    finally:
        stop_live(srv, thread)


def test_two_slots_at_once(vision: LiveServer) -> None:
    """Two requests with different images in parallel slots answer as each does alone."""
    from concurrent.futures import ThreadPoolExecutor

    c = _client(vision)

    def ask(seed: int) -> str:
        msg = [{"role": "user", "content": [_img(_url(seed)), {"type": "text", "text": "describe the cat"}]}]
        r = c.chat.completions.create(model="m", messages=msg, max_tokens=6, temperature=0)
        return r.choices[0].message.content or ""

    alone = [ask(10), ask(11)]
    with ThreadPoolExecutor(2) as ex:
        together = list(ex.map(ask, [10, 11]))
    assert together == alone
