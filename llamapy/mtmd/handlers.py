"""llama-cpp-python's multimodal chat handlers, as far as they map onto llamapy: each only names the
mmproj file (``clip_model_path``), so ``Llama(model_path, chat_handler=Gemma3ChatHandler(
clip_model_path="mmproj.gguf"))`` is ``Llama(model_path, mmproj="mmproj.gguf")``. The prompt comes from
the model's own chat template (or ``chat_format``), not from a template inside the handler.
"""

from __future__ import annotations

import os

__all__ = [
    "Gemma3ChatHandler", "Llava15ChatHandler", "Llava16ChatHandler", "MtmdChatHandler", "SmolVLMChatHandler",
]  # fmt: skip


class MtmdChatHandler:
    """A chat handler that carries the mmproj path (llama-cpp-python's ``Llava15ChatHandler`` and kin)."""

    def __init__(self, clip_model_path: str | os.PathLike, verbose: bool = True) -> None:
        self.clip_model_path = os.fspath(clip_model_path)
        self.verbose = verbose

    def __repr__(self) -> str:
        return f"{type(self).__name__}(clip_model_path={self.clip_model_path!r})"


class Llava15ChatHandler(MtmdChatHandler):
    pass


class Llava16ChatHandler(MtmdChatHandler):
    pass


class Gemma3ChatHandler(MtmdChatHandler):
    pass


class SmolVLMChatHandler(MtmdChatHandler):
    pass
