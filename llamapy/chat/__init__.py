"""Tool-call and reasoning formats of chat models (llama.cpp's ``common/chat.cpp``).

``detect_format(template_source)`` gives the family's :class:`ChatFormat`; it prepares the messages
for the template, builds the tool-call grammar, and makes a streaming :class:`ChatParser` that turns
generated text into content, reasoning and tool-call deltas.
"""

from .common import (
    ChatDelta,
    ChatFormat,
    ChatParser,
    ChatSyntax,
    ParsedMessage,
    ToolCall,
    ToolGrammar,
)
from .detect import detect_format

__all__ = [
    "ChatDelta",
    "ChatFormat",
    "ChatParser",
    "ChatSyntax",
    "ParsedMessage",
    "ToolCall",
    "ToolGrammar",
    "detect_format",
]
