"""The converter's error type."""

from __future__ import annotations


class ConvertError(ValueError):
    """A checkpoint cannot be converted: what is wrong and where (the CLI prints it as ``error: ...``)."""
