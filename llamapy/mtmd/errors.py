"""Typed errors of the multimodal layer."""

from __future__ import annotations

from ..errors import LlamapyError


class MtmdError(LlamapyError):
    """A multimodal input cannot be used: a bad mmproj file, an mmproj that does not fit the text model,
    an image given to a model without one, a prompt whose markers and images do not match."""


class ImageError(MtmdError):
    """An image cannot be decoded or is refused: corrupt data, unsupported format, too many pixels."""
