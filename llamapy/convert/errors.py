"""The converter's error type."""

from __future__ import annotations

from ..errors import LlamapyError


class ConvertError(LlamapyError, ValueError):
    """A checkpoint cannot be converted: what is wrong and where (the CLI prints it as ``error: ...``)."""
