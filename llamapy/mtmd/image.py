"""Image decoding and preprocessing with Pillow (the optional extra ``llamapy[vision]``).

``load_image`` decodes PNG / JPEG / WebP / GIF (first frame) / BMP bytes to ``uint8[H, W, 3]`` RGB and
refuses, before decoding the pixel data, an image whose header announces more than ``max_pixels``
pixels (decompression bombs). ``preprocess_fixed`` is llama.cpp's ``mtmd_image_preprocessor_fixed_size``
(gemma3): the image scaled to fit ``size x size`` keeping its aspect ratio (new side =
``min(ceil(side * scale), size)``), centred on black padding (``pad=True``, llama.cpp), or stretched to
the square (``pad=False``, what Hugging Face's Gemma3ImageProcessor does); resampling is Pillow's
(HF's; llama.cpp's ``img_tool::resize_pillow`` is a port of Pillow's resampler, so the filters agree), then
``(x / 255 - mean) / std`` per channel. Per projector (``clip.Projector``): gemma3 bilinear + black
padding, idefics3 Lanczos stretched (and ``idefics3_frames``: SmolVLM's tiles, exactly HF's), mlp bicubic +
padding with the CLIP mean colour. SmolVLM's tiles follow HF's processor; llama.cpp differs at the edges
(it rounds each side up to whole tiles directly, and also emits the overview for a 1 x 1 grid).
"""

from __future__ import annotations

import hashlib
import io
import math

import numpy as np

from .._dataclass import dataclass
from .errors import ImageError

__all__ = ["DEFAULT_MAX_PIXELS", "Bitmap", "idefics3_frames", "load_image", "preprocess_fixed"]

DEFAULT_MAX_PIXELS = 64 * 1024 * 1024  # 64 Mpx, well above any camera and below a decompression bomb
FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")


def _pil():  # noqa: ANN202
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - depends on the install
        raise ImageError("images need Pillow: pip install 'llamapy[vision]'") from None
    return Image


@dataclass
class Bitmap:
    """An RGB image ``data uint8[H, W, 3]`` and a hash of its pixels (the prompt cache's key)."""

    data: np.ndarray
    id: str = ""

    def __post_init__(self) -> None:
        d = self.data
        if d.dtype != np.uint8 or d.ndim != 3 or d.shape[2] != 3 or d.shape[0] == 0 or d.shape[1] == 0:
            raise ImageError(f"a bitmap must be uint8[H, W, 3] with H, W > 0, got {d.dtype}{d.shape}")
        if not self.id:
            h = hashlib.sha256()
            h.update(np.asarray(d.shape, dtype=np.int64).tobytes())
            h.update(np.ascontiguousarray(d).tobytes())
            self.id = h.hexdigest()

    @property
    def width(self) -> int:
        return int(self.data.shape[1])

    @property
    def height(self) -> int:
        return int(self.data.shape[0])


def load_image(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS, where: str = "image") -> Bitmap:
    """Decode an encoded image; ``ImageError`` for corrupt data, an unsupported format or too many pixels."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ImageError(f"{where}: image data must be bytes, got {type(data).__name__}")
    if len(data) == 0:
        raise ImageError(f"{where}: the image is empty (0 bytes)")
    Image = _pil()
    try:
        img = Image.open(io.BytesIO(bytes(data)))  # reads the header only
    except Image.DecompressionBombError as e:  # Pillow's own limit (2 x MAX_IMAGE_PIXELS), checked first
        raise ImageError(f"{where}: image exceeds the limit of {max_pixels} pixels ({e})") from None
    except Exception as e:  # PIL.UnidentifiedImageError and friends
        known = _signature(bytes(data[:16]))
        if known:  # the header of a supported format, then nothing Pillow can read
            raise ImageError(f"{where}: the {known} image is corrupt or truncated: {e}") from None
        raise ImageError(f"{where}: not an image in a supported format ({', '.join(FORMATS)}): {e}") from None
    fmt = (img.format or "").upper()
    if fmt not in FORMATS:
        raise ImageError(f"{where}: image format {fmt or 'unknown'} is not supported ({', '.join(FORMATS)})")
    w, h = img.size
    if w <= 0 or h <= 0:
        raise ImageError(f"{where}: image has no pixels ({w}x{h})")
    if w * h > max_pixels:
        raise ImageError(
            f"{where}: image of {w}x{h} = {w * h} pixels exceeds the limit of {max_pixels} pixels"
        )
    try:
        img.seek(0)  # the first frame of an animation
        img.load()
        if img.mode.startswith("I"):  # 16-bit grey PNG: Pillow's RGB conversion clips at 255
            grey = (np.clip(np.asarray(img).astype(np.int64), 0, 65535) >> 8).astype(np.uint8)  # as stb_image
            return Bitmap(np.repeat(grey[..., None], 3, axis=2))
        rgb = img.convert("RGB")
    except Exception as e:
        raise ImageError(f"{where}: the {fmt} image is corrupt or truncated: {e}") from None
    return Bitmap(np.asarray(rgb, dtype=np.uint8).copy())


_SIGNATURES = {b"\x89PNG\r\n\x1a\n": "PNG", b"\xff\xd8\xff": "JPEG", b"GIF87a": "GIF", b"GIF89a": "GIF",
               b"BM": "BMP"}  # fmt: skip


def _signature(head: bytes) -> str:
    """The supported format whose magic bytes ``head`` starts with ('' when none)."""
    if head.startswith(b"RIFF") and head[8:12] == b"WEBP":
        return "WEBP"
    return next((f for sig, f in _SIGNATURES.items() if head.startswith(sig)), "")


RESAMPLE = ("bilinear", "bicubic", "lanczos")


def _resize(data: np.ndarray, w: int, h: int, resample: str = "bilinear") -> np.ndarray:
    Image = _pil()
    if data.shape[1] == w and data.shape[0] == h:
        return data
    if resample not in RESAMPLE:
        raise ImageError(f"resampling filter {resample!r} is not one of {', '.join(RESAMPLE)}")
    f = getattr(Image.Resampling, resample.upper())
    return np.asarray(Image.fromarray(data, "RGB").resize((w, h), f), dtype=np.uint8)


def preprocess_fixed(
    bmp: Bitmap,
    size: int,
    mean: tuple[float, float, float],
    std: tuple[float, float, float],
    pad: bool = True,
    resample: str = "bilinear",
    pad_color: tuple[int, int, int] = (0, 0, 0),
) -> np.ndarray:
    """``F32[3, size, size]`` normalized pixels (see the module docstring)."""
    src = bmp.data
    if not pad:
        img = _resize(src, size, size, resample)
    else:
        sw, sh = bmp.width, bmp.height
        scale = min(size / sw, size / sh)
        nw = min(int(math.ceil(sw * scale)), size)
        nh = min(int(math.ceil(sh * scale)), size)
        img = np.empty((size, size, 3), dtype=np.uint8)
        img[:] = np.asarray(pad_color, dtype=np.uint8)
        x0, y0 = (size - nw) // 2, (size - nh) // 2
        img[y0 : y0 + nh, x0 : x0 + nw] = _resize(src, nw, nh, resample)
    x = img.astype(np.float32) / np.float32(255.0)
    x = (x - np.asarray(mean, dtype=np.float32)) / np.asarray(std, dtype=np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1))


def _normalize(
    img: np.ndarray, mean: tuple[float, float, float], std: tuple[float, float, float]
) -> np.ndarray:
    x = img.astype(np.float32) / np.float32(255.0)
    x = (x - np.asarray(mean, dtype=np.float32)) / np.asarray(std, dtype=np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1))


def idefics3_frames(
    bmp: Bitmap,
    tile: int,
    longest_edge: int,
    mean: tuple[float, float, float],
    std: tuple[float, float, float],
) -> tuple[list[np.ndarray], int, int]:
    """SmolVLM's image splitting (HF ``Idefics3ImageProcessor`` with ``do_image_splitting``): the longest
    edge scaled to ``longest_edge`` (even other side), then both sides up to multiples of ``tile``, cut
    into ``rows x cols`` tiles (row-major) followed by the whole image resized to ``tile x tile``; an
    image of one tile gives that tile alone (rows = cols = 0). Lanczos resampling, as HF."""
    h, w = bmp.height, bmp.width
    ar = w / h
    if w >= h:  # _resize_output_size_rescale_to_max_len
        w, h = longest_edge, int(longest_edge / ar)
        h += h % 2
    else:
        h, w = longest_edge, int(longest_edge * ar)
        w += w % 2
    h, w = max(h, 1), max(w, 1)
    ar = w / h
    if w >= h and w > 4096:  # _resize_output_size_scale_below_upper_bound (MAX_IMAGE_SIZE)
        w, h = 4096, max(int(4096 / ar), 1)
    elif h > w and h > 4096:
        h, w = 4096, max(int(4096 * ar), 1)
    img = _resize(bmp.data, w, h, "lanczos")
    ar = w / h
    if w >= h:  # resize_for_vision_encoder
        w = math.ceil(w / tile) * tile
        h = math.ceil(int(w / ar) / tile) * tile
    else:
        h = math.ceil(h / tile) * tile
        w = math.ceil(int(h * ar) / tile) * tile
    img = _resize(img, w, h, "lanczos")
    if h <= tile and w <= tile:
        return [_normalize(img, mean, std)], 0, 0
    rows, cols = (h - tile) // tile + 1, (w - tile) // tile + 1
    frames = [
        _normalize(img[r * tile : (r + 1) * tile, c * tile : (c + 1) * tile], mean, std)
        for r in range(rows)
        for c in range(cols)
    ]
    frames.append(_normalize(_resize(img, tile, tile, "lanczos"), mean, std))
    return frames, rows, cols
