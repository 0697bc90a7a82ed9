"""The generation loop: prompt -> decode -> sample -> piece -> text.

- :mod:`.text`: :class:`IncrementalDetokenizer` (token ids -> text, never half a UTF-8 character) and
  :class:`StopStrings` (hold back what could still become a stop string, cut before the first one).
- :mod:`.sequence`: :class:`TokenSequence` keeps one sequence of a context's KV cache in step with a
  list of tokens (prefix reuse, batched evaluation, context shifting).
- :mod:`.loop`: :class:`Generation`, the per-sequence state of the one token loop that the ``Llama``
  API, the CLI and the server engine all drive, and :func:`generate` over a ``TokenSequence``.
"""

from ..memory import ContextFullError
from .loop import Generation, GenerationParams, Step, TokenLogprob, generate
from .sequence import (
    PromptTooLongError,
    TokenSequence,
    checkpoint_positions,
    common_prefix_length,
    context_shift_plan,
    truncate_prompt,
)
from .text import GenerationError, IncrementalDetokenizer, StopStrings

__all__ = [
    "ContextFullError",
    "Generation",
    "GenerationError",
    "GenerationParams",
    "IncrementalDetokenizer",
    "PromptTooLongError",
    "Step",
    "StopStrings",
    "TokenLogprob",
    "TokenSequence",
    "checkpoint_positions",
    "common_prefix_length",
    "context_shift_plan",
    "generate",
    "truncate_prompt",
]
