"""Which format a chat template uses, from markers in its source (as llama.cpp's ``chat.cpp`` dispatch).

The order matters: DeepSeek V3.2 / V4 (DSML), R1 / V3.1, Command R7B, Cohere2MoE, Granite,
Qwen3-Coder XML, Gemma 4, Hy3 (``<arg_key:...>`` in ``<tool_calls:...>``), GLM (``<arg_key>``), Kimi K2, Kimi K3, MiniMax M2, Seed-OSS, Solar Open, MiniCPM 5, GigaChat 3,
Apertus, LFM2, JSON between tags (Nemotron Nano v2, Apriel 1.5 / 1.6, MiniMax M1) and Hermes come first
(their handlers also parse reasoning, so they are used with or without tools), then gpt-oss, Muse Glimmer,
Functionary, Llama 3.x, Magistral; without tools the rest is content-only, with tools Mistral,
Phi-4-mini or the generic JSON fallback. Templates that write ``<tool_call>`` with a syntax this
package does not implement get the generic fallback rather than a wrong parser.
"""

from __future__ import annotations

from collections.abc import Callable

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
from .hy3 import Hy3Format, is_hy3
from .json_tags import JsonTagsFormat, family_of
from .kimi_k2 import KimiK2Format
from .kimi_k3 import KimiK3Format
from .lfm2 import Lfm2Format
from .llama3 import Llama3Format
from .minicpm5 import MiniCpm5Format
from .minimax_m2 import MiniMaxM2Format
from .minimax_m3 import MiniMaxM3Format
from .mistral import MistralFormat
from .muse_glimmer import MuseGlimmerFormat
from .phi4 import Phi4Format
from .qwen3_coder import Qwen3CoderFormat
from .seed_oss import SeedOssFormat
from .solar_open import SolarOpenFormat

_DEEPSEEK_V31 = "message['prefix'] is defined and message['prefix'] and thinking"
_JSON_NAME = regex.compile(r'\{\\?"name\\?"|\\?"name\\?": ')


def _hermes_json(src: str) -> bool:
    """``<tool_call>`` holding ``{"name": ..., "arguments": ...}`` (not another syntax in that tag)."""
    return "<tool_call>" in src and "<arg_key>" not in src and _JSON_NAME.search(src) is not None


def _all(*markers: str) -> Callable[[str], bool]:
    return lambda src: all(m in src for m in markers)


def _json_tags(src: str) -> ChatFormat:
    family = family_of(src)
    assert family is not None
    return JsonTagsFormat(src, family)


# (whether a template is the family's, the family's format), in order: first the families whose handlers
# also parse reasoning (used with or without tools), then gpt-oss and Functionary v3.2
_RULES: tuple[tuple[Callable[[str], bool], Callable[[str], ChatFormat]], ...] = (
    (
        lambda src: (
            "dsml_token" in src and "DSML" in src and ("function_calls" in src or "tool_calls" in src)
        ),
        DeepSeekDsmlFormat,
    ),
    (_all("<｜tool▁calls▁begin｜>"), lambda src: DeepSeekR1Format(src, v31=_DEEPSEEK_V31 in src)),
    (_all("<|END_THINKING|><|START_ACTION|>"), CommandR7BFormat),
    (_all("<|START_TEXT|>", "<|START_ACTION|>"), Cohere2MoeFormat),
    (_all("elif thinking", "<|tool_call|>"), GraniteFormat),
    (_all("<tool_call>", "<function=", "<parameter="), Qwen3CoderFormat),
    (_all("'<|tool_call>call:'"), Gemma4Format),
    (is_hy3, Hy3Format),  # (before GLM: an empty tag suffix writes <tool_call> and <arg_key>)
    (_all("<tool_call>", "<arg_key>"), GlmFormat),
    (_all("<|tool_calls_section_begin|>", "<|tool_call_begin|>"), KimiK2Format),
    (_all("<|open|>", "<|close|>", "<|end_of_msg|>"), KimiK3Format),
    (_all("<minimax:tool_call>"), MiniMaxM2Format),
    (_all("]<]minimax[>[", "<tool_call>", "<invoke name="), MiniMaxM3Format),
    (_all("<seed:tool_call>"), SeedOssFormat),
    (_all("<|tool_call:begin|>", "<|tool_call:name|>", "<|tool_call:args|>"), SolarOpenFormat),
    (_all("Tool usage guidelines:", '<function name="', '<param name="'), MiniCpm5Format),
    (_all("<|role_sep|>", "<|message_sep|>"), GigaChat3Format),
    (_all("<|tools_prefix|>", "<|tools_suffix|>"), ApertusFormat),
    (
        lambda src: _all("<|tool_list_start|>", "<|tool_list_end|>")(src) or "List of tools: [" in src,
        Lfm2Format,
    ),
    # (before Hermes: Apriel 1.5 writes <tool_calls>[...] but its prose names <tool_call>)
    (lambda src: family_of(src) is not None, _json_tags),
    (_hermes_json, HermesFormat),
    (_all("<|channel|>"), GptOssFormat),
    (_all("<atem:function_calls>", "<|eom|>"), MuseGlimmerFormat),
    (_all(">>>all"), FunctionaryV32Format),
)


def detect_format(template_source: str | None, tools_requested: bool = True) -> ChatFormat:
    """The format of the template ``template_source`` (None: no template)."""
    src = template_source or ""
    if not src.strip():
        return GenericFormat() if tools_requested else ContentOnlyFormat()
    for found, make in _RULES:
        if found(src):
            return make(src)
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
