"""The GGUF file format: reading (mmap, strict validation), writing, splits."""

from typing import TYPE_CHECKING

from .constants import GGUFValueType
from .reader import GGUFError, GGUFField, GGUFReader, TensorInfo
from .split import GGUFModelFiles, open_model

if TYPE_CHECKING:
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


def __getattr__(name: str) -> object:
    """``GGUFWriter`` imported on first use: reading a model needs no writer."""
    if name == "GGUFWriter":
        from .writer import GGUFWriter

        return GGUFWriter
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
