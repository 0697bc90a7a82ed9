"""Images through ``Llama(model_path, mmproj=...)``'s ``create_chat_completion`` (OpenAI content parts)."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import torch
from PIL import Image

from llamapy.api import Llama
from llamapy.api.chat_request import ChatRequestError
from llamapy.ggml.types import GGMLType
from llamapy.mtmd import ImageError, load_image, preprocess_fixed
from tests.mtmd import convert


def _png(seed: int, size: tuple[int, int] = (40, 70)) -> bytes:
    arr = np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


def _url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def _msg(*parts: dict) -> list[dict]:
    return [{"role": "user", "content": list(parts)}]


@pytest.fixture(scope="module")
def llm(gemma3_vlm: convert.TinyVLM) -> Llama:
    return Llama(str(gemma3_vlm.text_gguf()), mmproj=str(gemma3_vlm.mmproj_gguf()), n_ctx=256, n_batch=64,
                 n_ubatch=64, verbose=False)  # fmt: skip


def test_chat_with_an_image_follows_hf_greedy(gemma3_vlm: convert.TinyVLM, llm: Llama) -> None:
    png = _png(1)
    msgs = _msg(
        {"type": "text", "text": "what is this"}, {"type": "image_url", "image_url": {"url": _url(png)}}
    )
    out = llm.create_chat_completion(msgs, temperature=0.0, max_tokens=3)
    assert out["choices"][0]["message"]["role"] == "assistant"
    toks = llm.eval_tokens
    n_gen = out["usage"]["completion_tokens"]
    assert n_gen == 3
    ids = [convert.IMG if t < 0 else t for t in toks]
    assert ids.count(convert.IMG) == 16
    px = preprocess_fixed(load_image(png), 64, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
    gemma3_vlm.load(GGMLType.F32, GGMLType.F32)
    t = torch.tensor([ids])
    with torch.no_grad():
        ref = gemma3_vlm.hf(
            input_ids=t, pixel_values=torch.from_numpy(px[None]), token_type_ids=(t == convert.IMG).long()
        )
    n_prompt = out["usage"]["prompt_tokens"]
    greedy = ref.logits[0].argmax(-1).numpy()
    n_eval = len(toks) - n_prompt  # the generated tokens fed back (the last one is only sampled)
    assert n_eval == n_gen - 1
    assert list(toks[n_prompt:]) == list(greedy[n_prompt - 1 : -1])


def test_repeated_image_is_reused_and_new_image_encoded(llm: Llama) -> None:
    calls = []
    enc = llm.mtmd.clip.encode
    llm.mtmd.clip.encode = lambda px: calls.append(1) or enc(px)  # type: ignore[method-assign]
    try:
        a = _msg(
            {"type": "image_url", "image_url": {"url": _url(_png(2))}}, {"type": "text", "text": "describe"}
        )
        first = llm.create_chat_completion(a, temperature=0.0, max_tokens=2)
        again = llm.create_chat_completion(a, temperature=0.0, max_tokens=2)
        assert len(calls) == 1  # the cached image chunk is not encoded again
        assert again["choices"][0]["message"] == first["choices"][0]["message"]
        two = _msg({"type": "image_url", "image_url": {"url": _url(_png(2))}},
                   {"type": "image_url", "image_url": {"url": _url(_png(3, (30, 30)))}})  # fmt: skip
        llm.create_chat_completion(two, temperature=0.0, max_tokens=1)
        assert len(calls) == 2 and sum(t < 0 for t in llm.eval_tokens) == 32
    finally:
        llm.mtmd.clip.encode = enc  # type: ignore[method-assign]


def test_bad_image_requests(gemma3_vlm: convert.TinyVLM, llm: Llama) -> None:
    with pytest.raises(ImageError, match="remote image URLs are not fetched"):
        llm.create_chat_completion(
            _msg({"type": "image_url", "image_url": {"url": "http://127.0.0.1/x.png"}})
        )
    with pytest.raises(ImageError, match="not an image"):
        llm.create_chat_completion(_msg({"type": "image_url", "image_url": {"url": _url(b"garbage")}}))
    with pytest.raises(ImageError, match="corrupt|truncated"):
        llm.create_chat_completion(_msg({"type": "image_url", "image_url": {"url": _url(_png(4)[:60])}}))
    text_only = Llama(str(gemma3_vlm.text_gguf()), n_ctx=256, verbose=False)
    with pytest.raises(ChatRequestError, match="without an mmproj"):
        text_only.create_chat_completion(_msg({"type": "image_url", "image_url": {"url": _url(_png(1))}}))
    # text-only requests still work on the vision model, and after a failed one
    out = llm.create_chat_completion([{"role": "user", "content": "the cat"}], max_tokens=1)
    assert out["choices"][0]["finish_reason"] in ("length", "stop")


def test_llama_cpp_python_chat_handler(gemma3_vlm: convert.TinyVLM) -> None:
    from llamapy.mtmd.handlers import Gemma3ChatHandler

    h = Gemma3ChatHandler(clip_model_path=str(gemma3_vlm.mmproj_gguf()))
    llm = Llama(
        str(gemma3_vlm.text_gguf()), chat_handler=h, n_ctx=256, n_batch=64, n_ubatch=64, verbose=False
    )
    assert llm.mtmd is not None and llm.mtmd.clip.path == h.clip_model_path
    out = llm.create_chat_completion(
        _msg({"type": "image_url", "image_url": {"url": _url(_png(1))}}), max_tokens=1
    )
    assert out["usage"]["prompt_tokens"] > 16
