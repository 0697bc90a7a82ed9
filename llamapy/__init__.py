"""llamapy: llama.cpp, rebuilt in Python.

``from llamapy import Llama`` gives the llama-cpp-python compatible high-level API; it (and the heavier
modules behind it) is imported on first use, so ``import llamapy`` stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> module that defines it (imported lazily by __getattr__)
_LAZY = {
    "Llama": "llamapy.api",
    "LlamaState": "llamapy.api",
    "LlamaGrammar": "llamapy.grammar",
    "LlamaPromptLookupDecoding": "llamapy.generation.speculative",
    "LlamaModelDraft": "llamapy.generation.draft_model",
}

if TYPE_CHECKING:  # pragma: no cover
    from .api import Llama, LlamaState
    from .generation.draft_model import LlamaModelDraft
    from .generation.speculative import LlamaPromptLookupDecoding
    from .grammar import LlamaGrammar

__all__ = [
    "Llama",
    "LlamaGrammar",
    "LlamaModelDraft",
    "LlamaPromptLookupDecoding",
    "LlamaState",
    "__version__",
]


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'llamapy' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
