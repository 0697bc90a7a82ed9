"""Multimodal input (llama.cpp's ``tools/mtmd``): mmproj files, vision encoders and projectors, image
preprocessing, and prompts made of text and image chunks. Images need Pillow (``llamapy[vision]``)."""

from .clip import PROJECTORS, ClipHParams, ClipModel
from .errors import ImageError, MtmdError
from .image import DEFAULT_MAX_PIXELS, Bitmap, load_image, preprocess_fixed
from .mtmd import MEDIA_MARKER, ImageChunk, MtmdContext, TextChunk

__all__ = [
    "DEFAULT_MAX_PIXELS", "MEDIA_MARKER", "PROJECTORS", "Bitmap", "ClipHParams", "ClipModel", "ImageChunk",
    "ImageError", "MtmdContext", "MtmdError", "TextChunk", "load_image", "preprocess_fixed",
]  # fmt: skip
