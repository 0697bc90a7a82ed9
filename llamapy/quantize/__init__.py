"""Make quantized GGUF files: llama.cpp's ``llama-quantize`` (every mix, the same per-tensor types and
bytes) and ``llama-imatrix`` (importance matrices, its GGUF and legacy formats).

- ``quantize_file(in_path, out_path, ftype, ...)``: the whole tool as a function (``llamapy quantize``);
- ``rules``: the per-tensor type choice (``llama_tensor_get_type``) as data and small functions;
- ``imatrix_file``: reading, writing and combining importance matrices; ``imatrix``: collecting one.
"""

from __future__ import annotations

from .ftypes import FTYPES, FType, QuantizeError, parse_ftype, parse_ggml_type
from .imatrix_file import Imatrix, ImatrixEntry, load_imatrix, save_imatrix, save_imatrix_legacy
from .quantize import QuantizeResult, TensorPlan, quantize_file

__all__ = [
    "FTYPES",
    "FType",
    "Imatrix",
    "ImatrixEntry",
    "QuantizeError",
    "QuantizeResult",
    "TensorPlan",
    "load_imatrix",
    "parse_ftype",
    "parse_ggml_type",
    "quantize_file",
    "save_imatrix",
    "save_imatrix_legacy",
]
