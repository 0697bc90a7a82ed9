"""Which format a chat template uses, from markers in its source (as llama.cpp's ``chat.cpp`` dispatch).

The order matters: DeepSeek V3.2 / V4 (DSML), R1 / V3.1, Command R7B, Cohere2MoE, Granite,
Qwen3-Coder XML, Gemma 4, GLM (``<arg_key>``), Kimi K2, MiniMax M2, Seed-OSS, MiniCPM 5, GigaChat 3,
Apertus, LFM2, Hermes and JSON between tags (Nemotron Nano v2, Apriel 1.6, MiniMax M1) come first
(their handlers also parse reasoning, so they are used with or without tools), then gpt-oss,
Functionary, Llama 3.x, Magistral; without tools the rest is content-only, with tools Mistral,
Phi-4-mini or the generic JSON fallback. Templates that write ``<tool_call>`` with a syntax this
package does not implement (MiniMax M3, ...) get the generic fallback rather than a wrong parser.
"""

from __future__ import annotations

import regex

from .apertus import ApertusFormat
from .cohere2moe import Cohere2MoeFormat
from .command_r7b import CommandR7BFormat
from .common import ChatFormat
from .deepseek_dsml import DeepSeekDsmlFormat
from .deepseek_r1 import DeepSeekR1Format
from .functionary import FunctionaryV31Format, FunctionaryV32Format
from .gemma4 import Gemma4Format
from .generic import ContentOnlyFormat, GenericFormat
from .gigachat3 import GigaChat3Format
from .glm import GlmFormat
from .gpt_oss import GptOssFormat
from .granite import GraniteFormat
from .hermes import HermesFormat
from .json_tags import JsonTagsFormat, family_of
from .kimi_k2 import KimiK2Format
from .lfm2 import Lfm2Format
from .llama3 import Llama3Format
from .minicpm5 import MiniCpm5Format
from .minimax_m2 import MiniMaxM2Format
from .mistral import MistralFormat
from .phi4 import Phi4Format
from .qwen3_coder import Qwen3CoderFormat
from .seed_oss import SeedOssFormat

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
    if "dsml_token" in src and "DSML" in src and ("function_calls" in src or "tool_calls" in src):
        return DeepSeekDsmlFormat(src)
    if "<｜tool▁calls▁begin｜>" in src:
        return DeepSeekR1Format(src, v31=_DEEPSEEK_V31 in src)
    if "<|END_THINKING|><|START_ACTION|>" in src:
        return CommandR7BFormat(src)
    if "<|START_TEXT|>" in src and "<|START_ACTION|>" in src:
        return Cohere2MoeFormat(src)
    if "elif thinking" in src and "<|tool_call|>" in src:
        return GraniteFormat(src)
    if "<tool_call>" in src and "<function=" in src and "<parameter=" in src:
        return Qwen3CoderFormat(src)
    if "'<|tool_call>call:'" in src:
        return Gemma4Format(src)
    if "<tool_call>" in src and "<arg_key>" in src:
        return GlmFormat(src)
    if "<|tool_calls_section_begin|>" in src and "<|tool_call_begin|>" in src:
        return KimiK2Format(src)
    if "<minimax:tool_call>" in src:
        return MiniMaxM2Format(src)
    if "<seed:tool_call>" in src:
        return SeedOssFormat(src)
    if "Tool usage guidelines:" in src and '<function name="' in src and '<param name="' in src:
        return MiniCpm5Format(src)
    if "<|role_sep|>" in src and "<|message_sep|>" in src:
        return GigaChat3Format(src)
    if "<|tools_prefix|>" in src and "<|tools_suffix|>" in src:
        return ApertusFormat(src)
    if ("<|tool_list_start|>" in src and "<|tool_list_end|>" in src) or "List of tools: [" in src:
        return Lfm2Format(src)
    if _hermes_json(src):
        return HermesFormat(src)
    if (family := family_of(src)) is not None:
        return JsonTagsFormat(src, family)
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
