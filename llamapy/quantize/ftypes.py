"""The file types ``llamapy quantize`` offers: llama-quantize's ``QUANT_OPTIONS`` (its names, its
``LLAMA_FTYPE`` numbers written to ``general.file_type``, the default tensor type of each mix)."""

from __future__ import annotations

from .._dataclass import dataclass
from ..errors import LlamapyError
from ..ggml.types import GGMLType

__all__ = ["FTYPES", "FType", "QuantizeError", "parse_ftype", "parse_ggml_type"]


class QuantizeError(LlamapyError, ValueError):
    """Bad input to quantize or imatrix (unknown type, unreadable file, missing imatrix...)."""


@dataclass(frozen=True)
class FType:
    name: str  # as llama-quantize spells it (COPY, Q4_K_M, ...)
    ftype: int  # LLAMA_FTYPE_* (general.file_type)
    default: GGMLType  # the type most tensors get (llama_ftype_get_default_type)
    desc: str

    @property
    def quantized(self) -> bool:
        return self.default not in (GGMLType.F32, GGMLType.F16, GGMLType.BF16)


T = GGMLType
# llama-quantize's QUANT_OPTIONS, in its order (COPY after F32 so that 0 parses as F32); Q1_0, Q2_0 and
# NVFP4 are left out: llamapy has no such tensor type.
FTYPES: tuple[FType, ...] = (
    FType("Q4_0", 2, T.Q4_0, " 4.34G, +0.4685 ppl @ Llama-3-8B"),
    FType("Q4_1", 3, T.Q4_1, " 4.78G, +0.4511 ppl @ Llama-3-8B"),
    FType("MXFP4_MOE", 38, T.MXFP4, " MXFP4 MoE"),
    FType("Q5_0", 8, T.Q5_0, " 5.21G, +0.1316 ppl @ Llama-3-8B"),
    FType("Q5_1", 9, T.Q5_1, " 5.65G, +0.1062 ppl @ Llama-3-8B"),
    FType("IQ2_XXS", 19, T.IQ2_XXS, " 2.06 bpw quantization"),
    FType("IQ2_XS", 20, T.IQ2_XS, " 2.31 bpw quantization"),
    FType("IQ2_S", 28, T.IQ2_XS, " 2.5  bpw quantization"),
    FType("IQ2_M", 29, T.IQ2_S, " 2.7  bpw quantization"),
    FType("IQ1_S", 24, T.IQ1_S, " 1.56 bpw quantization"),
    FType("IQ1_M", 31, T.IQ1_M, " 1.75 bpw quantization"),
    FType("TQ1_0", 36, T.TQ1_0, " 1.69 bpw ternarization"),
    FType("TQ2_0", 37, T.TQ2_0, " 2.06 bpw ternarization"),
    FType("Q2_K", 10, T.Q2_K, " 2.96G, +3.5199 ppl @ Llama-3-8B"),
    FType("Q2_K_S", 21, T.Q2_K, " 2.96G, +3.1836 ppl @ Llama-3-8B"),
    FType("IQ3_XXS", 23, T.IQ3_XXS, " 3.06 bpw quantization"),
    FType("IQ3_S", 26, T.IQ3_S, " 3.44 bpw quantization"),
    FType("IQ3_M", 27, T.IQ3_S, " 3.66 bpw quantization mix"),
    FType("Q3_K", 12, T.Q3_K, "alias for Q3_K_M"),
    FType("IQ3_XS", 22, T.IQ3_S, " 3.3 bpw quantization"),
    FType("Q3_K_S", 11, T.Q3_K, " 3.41G, +1.6321 ppl @ Llama-3-8B"),
    FType("Q3_K_M", 12, T.Q3_K, " 3.74G, +0.6569 ppl @ Llama-3-8B"),
    FType("Q3_K_L", 13, T.Q3_K, " 4.03G, +0.5562 ppl @ Llama-3-8B"),
    FType("IQ4_NL", 25, T.IQ4_NL, " 4.50 bpw non-linear quantization"),
    FType("IQ4_XS", 30, T.IQ4_XS, " 4.25 bpw non-linear quantization"),
    FType("Q4_K", 15, T.Q4_K, "alias for Q4_K_M"),
    FType("Q4_K_S", 14, T.Q4_K, " 4.37G, +0.2689 ppl @ Llama-3-8B"),
    FType("Q4_K_M", 15, T.Q4_K, " 4.58G, +0.1754 ppl @ Llama-3-8B"),
    FType("Q5_K", 17, T.Q5_K, "alias for Q5_K_M"),
    FType("Q5_K_S", 16, T.Q5_K, " 5.21G, +0.1049 ppl @ Llama-3-8B"),
    FType("Q5_K_M", 17, T.Q5_K, " 5.33G, +0.0569 ppl @ Llama-3-8B"),
    FType("Q6_K", 18, T.Q6_K, " 6.14G, +0.0217 ppl @ Llama-3-8B"),
    FType("Q8_0", 7, T.Q8_0, " 7.96G, +0.0026 ppl @ Llama-3-8B"),
    FType("F16", 1, T.F16, "14.00G, +0.0020 ppl @ Mistral-7B"),
    FType("BF16", 32, T.BF16, "14.00G, -0.0050 ppl @ Mistral-7B"),
    FType("F32", 0, T.F32, "26.00G              @ 7B"),
    FType("COPY", 0, T.F32, "only copy tensors, no quantizing"),
)
_BY_NAME = {f.name: f for f in FTYPES}
# the mix each ftype number names when it is given as a number (the first entry with that number)
_BY_NUMBER: dict[int, FType] = {}
for _f in FTYPES:
    _BY_NUMBER.setdefault(_f.ftype, _f)
# aliases resolve to the canonical mix (the rules look at the mix, not at the name typed)
_CANONICAL = {"Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M"}


def parse_ftype(s: str | int | FType) -> FType:
    """A mix by name (any case, as llama-quantize takes it) or by its LLAMA_FTYPE number."""
    if isinstance(s, FType):
        return s
    key = str(s).strip().upper()
    f = _BY_NAME.get(key)
    if f is None and key.isdigit():
        f = _BY_NUMBER.get(int(key))
    if f is None:
        names = ", ".join(x.name for x in FTYPES)
        raise QuantizeError(f"unknown quantization type {s!r} (one of: {names})")
    return _BY_NAME[_CANONICAL[f.name]] if f.name in _CANONICAL else f


def parse_ggml_type(s: str | GGMLType) -> GGMLType:
    """A tensor type by its ggml name (any case): q4_k, f16, iq2_xs..."""
    if isinstance(s, GGMLType):
        return s
    try:
        return GGMLType[str(s).strip().upper()]
    except KeyError:
        names = ", ".join(t.name.lower() for t in GGMLType)
        raise QuantizeError(f"unknown tensor type {s!r} (one of: {names})") from None
