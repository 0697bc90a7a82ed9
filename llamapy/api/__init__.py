"""``Llama``: the high-level object of llama-cpp-python, over llamapy's Model/Context/sampling.

Code written for ``llama_cpp.Llama`` runs with only the import changed::

    from llamapy import Llama
    llm = Llama(model_path="model.gguf", n_ctx=2048)
    out = llm("Q: Name the planets in the solar system? A: ", max_tokens=32, stop=["Q:", "\\n"])
    print(out["choices"][0]["text"])

Completions and chat completions return the same OpenAI-shaped dicts and stream chunks.
Lower level, llama.h style: ``llm.model`` (:class:`llamapy.model.Model`), ``llm.ctx``
(:class:`llamapy.context.Context`), :class:`llamapy.batch.Batch` and :mod:`llamapy.sampling`.
"""

from __future__ import annotations

from .common import (
    LLAMA_DEFAULT_SEED,
    LlamaState,
    LogitsProcessor,
    StoppingCriteria,
    UnsupportedError,
)
from .llama import Llama

__all__ = [
    "LLAMA_DEFAULT_SEED",
    "Llama",
    "LlamaState",
    "LogitsProcessor",
    "StoppingCriteria",
    "UnsupportedError",
]
