"""Types shared by the pieces of :class:`llamapy.api.Llama`."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .._dataclass import dataclass
from ..errors import LlamapyError

LLAMA_DEFAULT_SEED = 0xFFFFFFFF
StoppingCriteria = Callable[[np.ndarray, np.ndarray], bool]
LogitsProcessor = Callable[[np.ndarray, np.ndarray], np.ndarray]


class UnsupportedError(LlamapyError):
    """A llama-cpp-python feature llamapy does not offer (LoRA adapters, draft models, grammars...)."""


@dataclass
class LlamaState:
    """A saved session (``Llama.save_state``): the tokens, their logits and the KV cache bytes."""

    input_ids: np.ndarray
    scores: np.ndarray
    n_tokens: int
    llama_state: bytes
    llama_state_size: int
    seed: int
