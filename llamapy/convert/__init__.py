"""Hugging Face checkpoint -> GGUF (``llamapy convert``), as llama.cpp's ``convert_hf_to_gguf.py`` writes it.

- ``convert(hf_dir, out, outtype, ...)``: the whole tool as a function; ``outtype`` is f32, f16, bf16,
  q8_0, auto (the checkpoint's 16-bit type) or any ``llamapy quantize`` mix (converted, then quantized);
- ``convert_lora(lora_dir, base_dir, out, outtype)``: a PEFT LoRA adapter as a GGUF LoRA (``convert`` calls
  it for a directory with ``adapter_config.json``);
- each family's differences are declared in its architecture file (``HF_CONVERT``, see
  ``llamapy.model.hf``).
"""

from __future__ import annotations

from .convert import OUTTYPES, ConvertResult, convert, hf_families
from .errors import ConvertError
from .lora import convert_lora

__all__ = ["OUTTYPES", "ConvertError", "ConvertResult", "convert", "convert_lora", "hf_families"]
