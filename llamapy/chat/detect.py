"""Which format a chat template uses, from markers in its source (as llama.cpp's ``chat.cpp`` dispatch).

The order matters: DeepSeek R1 / V3.1, Command R7B, Granite, Qwen3-Coder XML and Hermes come first
(their handlers also parse reasoning, so they are used with or without tools), then gpt-oss,
Functionary, Llama 3.x, Magistral; without tools the rest is content-only, with tools Mistral, Phi-4-mini
or the generic JSON fallback. Templates that write ``<tool_call>`` with a syntax this package does not
implement (GLM's ``<arg_key>``, MiniMax, ...) get the generic fallback rather than a wrong parser.
"""

from __future__ import annotations

import regex

from .command_r7b import CommandR7BFormat
from .common import ChatFormat
from .deepseek_r1 import DeepSeekR1Format
from .functionary import FunctionaryV31Format, FunctionaryV32Format
from .generic import ContentOnlyFormat, GenericFormat
from .gpt_oss import GptOssFormat
from .granite import GraniteFormat
from .hermes import HermesFormat
from .llama3 import Llama3Format
from .mistral import MistralFormat
from .phi4 import Phi4Format
from .qwen3_coder import Qwen3CoderFormat

_DEEPSEEK_V31 = "message['prefix'] is defined and message['prefix'] and thinking"
_JSON_NAME = regex.compile(r'\{\\?"name\\?"|\\?"name\\?": ')


def _hermes_json(src: str) -> bool:
    """``<tool_call>`` holding ``{"name": ..., "arguments": ...}`` (not another syntax in that tag)."""
    return "<tool_call>" in src and "<arg_key>" not in src and _JSON_NAME.search(src) is not None


def detect_format(template_source: str | None, tools_requested: bool = True) -> ChatFormat:
    """The format of the template ``template_source`` (None: no template)."""
    src = template_source or ""
    if not src.strip():
        return GenericFormat() if tools_requested else ContentOnlyFormat()
    if "<｜tool▁calls▁begin｜>" in src:
        return DeepSeekR1Format(src, v31=_DEEPSEEK_V31 in src)
    if "<|END_THINKING|><|START_ACTION|>" in src:
        return CommandR7BFormat(src)
    if "elif thinking" in src and "<|tool_call|>" in src:
        return GraniteFormat(src)
    if "<tool_call>" in src and "<function=" in src and "<parameter=" in src:
        return Qwen3CoderFormat(src)
    if _hermes_json(src):
        return HermesFormat(src)
    if "<|channel|>" in src:
        return GptOssFormat(src)
    if ">>>all" in src:
        return FunctionaryV32Format(src)
    if "<|start_header_id|>" in src and "<function=" in src:
        return FunctionaryV31Format(src) if tools_requested else ContentOnlyFormat(src)
    if "<|start_header_id|>ipython<|end_header_id|>" in src:
        return Llama3Format(src) if tools_requested else ContentOnlyFormat(src)
    if "[TOOL_CALLS]" in src and "[THINK]" in src and "[/THINK]" in src:
        return MistralFormat(src)
    if not tools_requested:
        return ContentOnlyFormat(src)
    if "[TOOL_CALLS]" in src:
        return MistralFormat(src)
    if "<|tool|>" in src and "<|/tool|>" in src:
        return Phi4Format(src)
    return GenericFormat(src)
