"""Image decoding and preprocessing: formats, bad input, and Gemma 3's pixels vs Hugging Face's processor."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
import transformers
from PIL import Image

from llamapy.mtmd import Bitmap, ImageError, load_image, preprocess_fixed

RNG = np.random.default_rng(7)


def _encode(arr: np.ndarray, fmt: str, **kw: object) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format=fmt, **kw)
    return buf.getvalue()


@pytest.mark.parametrize("fmt", ["PNG", "WEBP", "BMP", "GIF"])
def test_lossless_formats_decode_exactly(fmt: str) -> None:
    arr = RNG.integers(0, 256, (13, 29, 3), dtype=np.uint8)
    if fmt == "GIF":  # palette: a few colours survive exactly
        arr = np.repeat(np.repeat(np.array([[[255, 0, 0], [0, 0, 255]]], np.uint8), 13, 0), 14, 1)[:, :29]
        arr = np.ascontiguousarray(np.pad(arr, ((0, 0), (0, 29 - arr.shape[1]), (0, 0)), mode="edge"))
    kw = {"lossless": True} if fmt == "WEBP" else {}
    bmp = load_image(_encode(arr, fmt, **kw))
    assert bmp.data.shape == (13, 29, 3)
    np.testing.assert_array_equal(bmp.data, arr)


def test_jpeg_and_grey_and_alpha_become_rgb() -> None:
    arr = RNG.integers(0, 256, (16, 24, 3), dtype=np.uint8)
    assert load_image(_encode(arr, "JPEG")).data.shape == (16, 24, 3)
    grey = load_image(_encode(arr[..., 0], "PNG")).data
    np.testing.assert_array_equal(grey[..., 1], arr[..., 0])
    rgba = np.concatenate([arr, np.full((16, 24, 1), 128, np.uint8)], axis=2)
    np.testing.assert_array_equal(load_image(_encode(rgba, "PNG")).data, arr)


def test_bitmap_id_is_a_hash_of_the_pixels() -> None:
    a = RNG.integers(0, 256, (8, 8, 3), dtype=np.uint8)
    b = a.copy()
    b[0, 0, 0] ^= 1
    assert Bitmap(a).id == Bitmap(a.copy()).id != Bitmap(b).id
    assert load_image(_encode(a, "PNG")).id == load_image(_encode(a, "BMP")).id


def test_bad_images_raise_image_error() -> None:
    good = _encode(RNG.integers(0, 256, (32, 32, 3), dtype=np.uint8), "PNG")
    with pytest.raises(ImageError, match="not an image"):
        load_image(b"this is not an image at all")
    with pytest.raises(ImageError, match="empty"):
        load_image(b"")
    with pytest.raises(ImageError, match="corrupt|truncated"):
        load_image(good[: len(good) // 2])
    tiff = io.BytesIO()
    Image.new("RGB", (4, 4)).save(tiff, format="TIFF")
    with pytest.raises(ImageError, match="TIFF is not supported"):
        load_image(tiff.getvalue())


def _png_header_only(w: int, h: int) -> bytes:
    """A PNG whose header says w x h with almost no data (a decompression bomb's shape)."""

    def chunk(t: bytes, d: bytes) -> bytes:
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\0" * 16))
        + chunk(b"IEND", b"")
    )


def test_pixel_limit_is_checked_before_decoding() -> None:
    with pytest.raises(ImageError, match="exceeds the limit"):
        load_image(_png_header_only(5000, 5000), max_pixels=1_000_000)
    with pytest.raises(ImageError, match="exceeds the limit"):  # beyond Pillow's own bomb limit too
        load_image(_png_header_only(60000, 60000))


@pytest.mark.parametrize("size", [(37, 91), (64, 64), (101, 23), (7, 5)])
def test_stretch_matches_hf_gemma3_processor(size: tuple[int, int]) -> None:
    h, w = size
    arr = RNG.integers(0, 256, (h, w, 3), dtype=np.uint8)
    proc = transformers.Gemma3ImageProcessorPil(size={"height": 64, "width": 64})
    ref = proc(images=[Image.fromarray(arr)], return_tensors="np")["pixel_values"][0]
    got = preprocess_fixed(Bitmap(arr), 64, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5), pad=False)
    assert got.shape == (3, 64, 64) and got.dtype == np.float32
    np.testing.assert_allclose(got, ref, atol=1e-6)


def test_pad_keeps_aspect_ratio_like_llama_cpp() -> None:
    arr = np.full((20, 80, 3), 255, dtype=np.uint8)  # 4:1 -> 64 x 16 centred, black (-1) above and below
    got = preprocess_fixed(Bitmap(arr), 64, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5), pad=True)
    rows = np.flatnonzero((got[0] > 0.99).all(axis=1))
    assert rows.tolist() == list(range(24, 40))
    assert np.all(got[:, :24] == -1.0) and np.all(got[:, 40:] == -1.0)
    mean, std = (0.1, 0.2, 0.3), (0.5, 0.25, 2.0)
    one = preprocess_fixed(Bitmap(np.full((8, 8, 3), 51, np.uint8)), 8, mean, std)
    np.testing.assert_allclose(
        one[:, 0, 0], [(0.2 - m) / s for m, s in zip(mean, std, strict=True)], rtol=1e-6
    )
