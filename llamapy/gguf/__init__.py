"""The GGUF file format: reading (mmap, strict validation), writing, splits."""

from .constants import GGUFValueType
from .reader import GGUFError, GGUFField, GGUFReader, TensorInfo
from .split import GGUFModelFiles, open_model
from .writer import GGUFWriter

__all__ = [
    "GGUFError",
    "GGUFField",
    "GGUFModelFiles",
    "GGUFReader",
    "GGUFValueType",
    "GGUFWriter",
    "TensorInfo",
    "open_model",
]
