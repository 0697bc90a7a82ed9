"""Reasoning blocks: ``<think>...</think>`` (and other families' tags) split from the answer.

As llama.cpp's ``try_parse_reasoning``: a block is recognised only at the start of the output
(after whitespace), several blocks in a row are joined, each block's text is stripped of surrounding
whitespace, whitespace after a closing tag is dropped, and a block never closed is still reasoning.
``thinking_forced_open`` means the prompt already opened the block, so the output starts inside it.
"""

from __future__ import annotations

from .._dataclass import dataclass


@dataclass(frozen=True)
class ThinkTags:
    """The opening and closing tag of a family's reasoning block."""

    start: str
    end: str


THINK = ThinkTags("<think>", "</think>")
COMMAND_R7B_THINK = ThinkTags("<|START_THINKING|>", "<|END_THINKING|>")
MISTRAL_THINK = ThinkTags("[THINK]", "[/THINK]")


def partial_suffix(text: str, *tags: str) -> int:
    """Length of the longest end of ``text`` that is a proper prefix of one of ``tags`` (text to hold back)."""
    best = 0
    for tag in tags:
        for k in range(min(len(tag) - 1, len(text)), best, -1):
            if text.endswith(tag[:k]):
                best = k
                break
    return best


def prompt_opens_block(prompt: str, tags: ThinkTags) -> bool:
    """Whether ``prompt`` ends inside an open reasoning block: after its last opening tag there is only
    whitespace (the generation prompt of QwQ, DeepSeek R1, Command R7B... when thinking is on)."""
    i = prompt.rfind(tags.start)
    return i >= 0 and not prompt[i + len(tags.start) :].strip()


class StrippedText:
    """Streams one reasoning block with llama.cpp's strip: leading whitespace is dropped, trailing
    whitespace is held back until more text follows, and dropped when the block closes."""

    def __init__(self) -> None:
        self.started = False
        self.pending = ""

    def open(self) -> None:
        """Start a new block."""
        self.started = False
        self.pending = ""

    def push(self, piece: str) -> str:
        """The text of ``piece`` that can be emitted now."""
        if not self.started:
            piece = piece.lstrip()
            if not piece:
                return ""
            self.started = True
        text = self.pending + piece
        core = text.rstrip()
        self.pending = text[len(core) :]
        return core
