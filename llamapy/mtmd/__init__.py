"""Multimodal input (llama.cpp's ``tools/mtmd``): mmproj files, vision encoders and projectors, image
preprocessing, audio encoders (``audio.py``, ``audio_encoder.py``), and prompts made of text, image and audio
chunks. Images need Pillow (``llamapy[vision]``), audio soundfile and soxr (``llamapy[audio]``)."""

from .audio import AudioBitmap, AudioError, decode_audio
from .clip import PROJECTORS, ClipHParams, ClipModel
from .errors import ImageError, MtmdError
from .image import DEFAULT_MAX_PIXELS, Bitmap, load_image, preprocess_fixed
from .mtmd import MEDIA_MARKER, AudioChunk, ImageChunk, MtmdContext, TextChunk

__all__ = [
    "DEFAULT_MAX_PIXELS", "MEDIA_MARKER", "PROJECTORS", "AudioBitmap", "AudioChunk", "AudioError", "Bitmap",
    "ClipHParams", "ClipModel", "ImageChunk", "ImageError", "MtmdContext", "MtmdError", "TextChunk", "decode_audio",
    "load_image", "preprocess_fixed",
]  # fmt: skip
