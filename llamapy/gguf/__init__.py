"""The GGUF file format: reading (mmap, strict validation), writing, splits."""

from .constants import GGUFValueType
from .reader import GGUFError, GGUFField, GGUFReader, TensorInfo

__all__ = ["GGUFError", "GGUFField", "GGUFReader", "GGUFValueType", "TensorInfo"]
