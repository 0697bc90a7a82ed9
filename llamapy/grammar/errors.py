"""The grammar layer's error type."""

from ..errors import LlamapyError


class GrammarError(LlamapyError):
    """A grammar, schema or trigger is invalid, or a token broke the grammar (the message says which)."""
