"""Bad input through every door (``load_image``, ``MtmdContext``, the ``Llama`` API, the server): each is a
typed error or an HTTP 400 whose message names what was wrong; nothing crashes and the server keeps serving.
Runs on the tiny LLaVA (CLIP 32 px, mlp projector) and the tiny MobileVLM (ldp)."""

from __future__ import annotations

import base64
import io
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image, ImageFile

from llamapy.api import Llama
from llamapy.api.chat_request import ChatRequestError
from llamapy.ggml.types import GGMLType
from llamapy.model.model import Model
from llamapy.mtmd import ClipModel, ImageError, MtmdContext, MtmdError, load_image
from llamapy.server.app import ServerSettings
from llamapy.server.backend import ContextBackend
from tests.mtmd import convert
from tests.mtmd.test_image import _png_header_only
from tests.server.conftest import LiveServer, start_live, stop_live, wait_ready

RNG = np.random.default_rng(5)
PIXELS = RNG.integers(0, 256, (40, 56, 3), dtype=np.uint8)


def _encode(fmt: str, arr: np.ndarray = PIXELS, **kw: object) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format=fmt, **kw)
    return buf.getvalue()


SVG = b'<svg xmlns="http://www.w3.org/2000/svg" width="9" height="9"><rect width="9" height="9"/></svg>'
# (id, the bytes, what the message says)
BAD_IMAGES: list[tuple[str, Callable[[], bytes], str]] = [
    ("garbage", lambda: b"this is not an image at all", "not an image in a supported format"),
    ("empty", lambda: b"", "the image is empty"),
    ("truncated-png", lambda: _encode("PNG")[:2000], "PNG image is corrupt or truncated"),
    ("png-signature-only", lambda: b"\x89PNG\r\n\x1a\n", "PNG image is corrupt or truncated"),
    ("truncated-jpeg", lambda: _encode("JPEG")[:300], "JPEG image is corrupt or truncated"),
    ("truncated-gif", lambda: _encode("GIF")[:200], "GIF image is corrupt or truncated"),
    ("truncated-webp", lambda: _encode("WEBP")[:100], "WEBP image is corrupt or truncated"),
    ("svg", lambda: SVG, "not an image in a supported format (PNG, JPEG, WEBP, GIF, BMP)"),
    ("tiff", lambda: _encode("TIFF"), "image format TIFF is not supported"),
    ("ico", lambda: _encode("ICO", PIXELS[:16, :16]), "image format ICO is not supported"),
    ("bomb", lambda: _png_header_only(60000, 60000), "image exceeds the limit of 67108864 pixels"),
]


def _url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def _msg(data: bytes) -> list[dict]:
    part = {"type": "image_url", "image_url": {"url": _url(data)}}
    return [{"role": "user", "content": [{"type": "text", "text": "what is"}, part]}]


@pytest.fixture(scope="module")
def vlm(llava_vlm: convert.TinyVLM) -> convert.TinyVLM:
    return llava_vlm


@pytest.fixture(scope="module")
def llm(vlm: convert.TinyVLM) -> Llama:
    return Llama(str(vlm.text_gguf()), mmproj=str(vlm.mmproj_gguf()), n_ctx=256, n_batch=64, verbose=False)


# -- images ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("make,says", [c[1:] for c in BAD_IMAGES], ids=[c[0] for c in BAD_IMAGES])
def test_bad_image_bytes(make: Callable[[], bytes], says: str) -> None:
    with pytest.raises(ImageError) as e:
        load_image(make(), where="upload.png")
    assert str(e.value).startswith("upload.png: ") and says in str(e.value)


@pytest.mark.parametrize("make,says", [c[1:] for c in BAD_IMAGES], ids=[c[0] for c in BAD_IMAGES])
def test_bad_images_through_the_api(llm: Llama, make: Callable[[], bytes], says: str) -> None:
    with pytest.raises(ImageError) as e:
        llm.create_chat_completion(_msg(make()), max_tokens=1)
    assert "messages[0].content[1]" in str(e.value) and says in str(e.value)


def test_pixel_limit_refuses_before_decoding(vlm: convert.TinyVLM, monkeypatch: pytest.MonkeyPatch) -> None:
    text = Model.load(vlm.text_gguf())
    mt = MtmdContext(vlm.mmproj_gguf(), text, max_pixels=40 * 56 - 1)
    decoded: list[bool] = []
    real = ImageFile.ImageFile.load
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda self: decoded.append(True) or real(self))
    with pytest.raises(ImageError, match=f"40 = 2240 pixels exceeds the limit of {40 * 56 - 1} pixels"):
        mt.bitmap_from_bytes(_encode("PNG"), "img")
    assert not decoded  # refused from the header alone
    assert mt.bitmap_from_bytes(_encode("PNG", PIXELS[:, :55])).width == 55 and decoded


def test_16_bit_grey_png_keeps_its_high_byte() -> None:
    """Pillow's RGB conversion of a 16-bit grey PNG clips at 255 (an image gone white); stb_image, which
    llama.cpp uses, keeps the high byte."""
    grey = (np.arange(40 * 56, dtype=np.uint16).reshape(40, 56) * 29).astype(np.uint16)
    got = load_image(_encode("PNG", grey)).data
    np.testing.assert_array_equal(got, np.repeat((grey >> 8).astype(np.uint8)[..., None], 3, axis=2))


def test_an_image_for_a_model_without_mmproj(vlm: convert.TinyVLM) -> None:
    text_only = Llama(str(vlm.text_gguf()), n_ctx=128, verbose=False)
    with pytest.raises(
        ChatRequestError, match=r"loaded without an mmproj \(Llama\(mmproj=...\), --mmproj FILE\)"
    ):
        text_only.create_chat_completion(_msg(_encode("PNG")), max_tokens=1)


# -- mmproj files ---------------------------------------------------------------------------------------
def _mmproj(vlm: convert.TinyVLM, tmp: Path, drop: str = "", **replace: np.ndarray) -> str:
    ts = vlm.mm_tensors(GGMLType.F32)
    assert not drop or drop in ts
    ts.pop(drop, None)
    ts.update({k.replace("__", "."): v for k, v in replace.items()})
    md = convert.mmproj_metadata(vlm.cfg, GGMLType.F32)
    if isinstance(vlm, convert.TinyLDP):
        md["clip.projector_type"] = vlm.projector_type
    return str(convert.write_mmproj(tmp / "bad-mmproj.gguf", md, ts, GGMLType.F32))


def test_mmproj_with_a_missing_tensor(vlm: convert.TinyVLM, tmp_path: Path) -> None:
    bad = _mmproj(vlm, tmp_path, drop="v.blk.1.attn_q.weight")
    with pytest.raises(MtmdError, match=r"bad-mmproj.gguf.*'v.blk.1.attn_q.weight' is missing"):
        Llama(str(vlm.text_gguf()), mmproj=bad, n_ctx=128, verbose=False)
    with pytest.raises(MtmdError, match="'mm.2.bias' is missing"):
        ClipModel(_mmproj(vlm, tmp_path, drop="mm.2.bias"))


@pytest.mark.parametrize("version", [1, 2])
def test_ldp_mmproj_bad_tensors(version: int, tmp_path: Path) -> None:
    ldp = convert.make_ldp(tmp_path, version=version)
    dw = "mm.model.mb_block.2.block.0.0.weight" if version == 1 else "mm.model.peg.0.weight"
    with pytest.raises(MtmdError, match=f"'{dw}' is missing"):
        ClipModel(_mmproj(ldp, tmp_path, drop=dw))
    with pytest.raises(MtmdError, match=rf"'{dw}' has shape \(64, 5, 5\); expected \(64, 3, 3\)"):
        ClipModel(_mmproj(ldp, tmp_path, **{dw.replace(".", "__"): np.zeros((64, 5, 5), np.float32)}))
    mlp = "mm.model.mlp.3.weight" if version == 1 else "mm.model.mlp.2.weight"
    with pytest.raises(MtmdError, match=rf"'{mlp}' has shape \(64, 48\); expected \(64, 64\)"):
        ClipModel(_mmproj(ldp, tmp_path, **{mlp.replace(".", "__"): np.zeros((64, 48), np.float32)}))
    if version == 1:
        with pytest.raises(MtmdError, match="'mm.model.mb_block.1.block.1.fc2.weight' is missing"):
            ClipModel(_mmproj(ldp, tmp_path, drop="mm.model.mb_block.1.block.1.fc2.weight"))


def test_mmproj_for_another_text_model(vlm: convert.TinyVLM, tmp_path: Path) -> None:
    wide = _mmproj(
        vlm, tmp_path, mm__2__weight=np.zeros((48, 64), np.float32), mm__2__bias=np.zeros(48, np.float32)
    )
    assert ClipModel(wide).n_mmproj_embd == 48
    with pytest.raises(
        MtmdError, match=r"embeddings of 48 values but the text model .*takes 64; this mmproj is for another"
    ):
        Llama(str(vlm.text_gguf()), mmproj=wide, n_ctx=128, verbose=False)
    with pytest.raises(MtmdError, match="not an mmproj file .*general.architecture is 'llama'"):
        Llama(str(vlm.text_gguf()), mmproj=str(vlm.text_gguf()), n_ctx=128, verbose=False)
    with pytest.raises(MtmdError, match="nothing.gguf: mmproj file not found"):
        Llama(str(vlm.text_gguf()), mmproj=str(tmp_path / "nothing.gguf"), n_ctx=128, verbose=False)


def test_mmproj_given_as_the_text_model(vlm: convert.TinyVLM) -> None:
    from llamapy.errors import LlamapyError

    with pytest.raises(LlamapyError, match="clip"):
        Llama(str(vlm.mmproj_gguf()), n_ctx=128, verbose=False)


# -- the server -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def servers(vlm: convert.TinyVLM) -> Iterator[tuple[LiveServer, LiveServer]]:
    """With and without --mmproj."""
    live = []
    for mmproj in (True, False):
        backend = ContextBackend(vlm.text_gguf(), n_ctx=256, n_seq_max=1, n_batch=64, n_ubatch=64)
        if mmproj:
            backend.mtmd = MtmdContext(vlm.mmproj_gguf(), backend.model)  # type: ignore[attr-defined]
        live.append(start_live(ServerSettings(model_path=str(vlm.text_gguf()), warmup=False), backend))
        wait_ready(live[-1][0].base_url, timeout=120)
    yield live[0][0], live[1][0]
    for srv, thread in live:
        stop_live(srv, thread)


def _post(srv: LiveServer, messages: list[dict]) -> httpx.Response:
    body = {"messages": messages, "max_tokens": 1}
    return httpx.post(srv.base_url + "/v1/chat/completions", json=body, timeout=60)


@pytest.mark.parametrize("make,says", [c[1:] for c in BAD_IMAGES], ids=[c[0] for c in BAD_IMAGES])
def test_bad_images_through_the_server(
    servers: tuple[LiveServer, LiveServer], make: Callable[[], bytes], says: str
) -> None:
    r = _post(servers[0], _msg(make()))
    assert r.status_code == 400, r.text
    assert says in r.json()["error"]["message"]


def test_server_bad_parts_and_no_mmproj(servers: tuple[LiveServer, LiveServer]) -> None:
    vision, text_only = servers
    cases = [
        ({"type": "image_url"}, "the image URL must be a non-empty string"),
        ({"type": "image_url", "image_url": {"url": 7}}, "the image URL must be a non-empty string"),
        (
            {"type": "image_url", "image_url": {"url": "data:image/png;base64"}},
            "needs a ',' before its payload",
        ),
        (
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,abc"}},
            "base64 payload is invalid",
        ),
        ({"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}, "must be data: URLs"),
        ({"type": "input_audio", "input_audio": {"data": "AAAA"}}, "not a WAV, FLAC, OGG or MP3 file"),
    ]
    for part, says in cases:
        r = _post(vision, [{"role": "user", "content": [part]}])
        assert r.status_code == 400 and says in r.json()["error"]["message"], (part, r.text)
    r = _post(text_only, _msg(_encode("PNG")))
    assert r.status_code == 400 and "start it with --mmproj FILE" in r.json()["error"]["message"], r.text
    ok = _post(vision, _msg(_encode("PNG")))  # still serving, images included
    assert ok.status_code == 200, ok.text
    assert ok.json()["usage"]["prompt_tokens"] >= 16


def test_server_with_a_bad_mmproj_says_why(vlm: convert.TinyVLM, tmp_path: Path) -> None:
    """``llamapy serve --mmproj BAD``: the load fails in the background; every endpoint answers 503 naming
    the tensor (the server does not crash or hang)."""
    import time

    from fastapi.testclient import TestClient

    from llamapy.server.app import create_app

    bad = _mmproj(vlm, tmp_path, drop="v.blk.0.ln1.weight")

    def factory() -> ContextBackend:
        backend = ContextBackend(vlm.text_gguf(), n_ctx=128, n_seq_max=1)
        backend.mtmd = MtmdContext(bad, backend.model)  # type: ignore[attr-defined]
        return backend

    with TestClient(create_app(ServerSettings(model_path=str(vlm.text_gguf()), warmup=False), factory)) as c:
        deadline = time.monotonic() + 60
        while "failed to load" not in (r := c.get("/health")).text and time.monotonic() < deadline:
            time.sleep(0.05)
        assert r.status_code == 503 and "MtmdError" in r.text and "'v.blk.0.ln1.weight' is missing" in r.text
        r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 503 and "'v.blk.0.ln1.weight' is missing" in r.text
