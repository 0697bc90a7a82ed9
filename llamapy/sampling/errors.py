"""The sampling layer's error type."""

from __future__ import annotations

from ..errors import LlamapyError


class SamplingError(LlamapyError, ValueError):
    """Bad sampling input: parameters out of range, unknown sampler names, logits of the wrong shape."""
