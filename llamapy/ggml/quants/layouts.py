"""Block layouts of the quantized types, named after the fields of llama.cpp's ``ggml-common.h``.

Bytes per block come from the type traits (``llamapy.ggml.types.TRAITS``); the in-block offsets follow
each struct's fields in order (``d``/``dmin``/``m`` are float16 scales). Kernels read these as module
globals, which Numba freezes into compile-time constants: naming an offset changes no code. No Numba
here.
"""

from __future__ import annotations

from ..types import TRAITS, GGMLType

# -- 32-element blocks ---------------------------------------------------------------------------
#: block_q4_0 { ggml_half d; uint8_t qs[16]; }
Q4_0_BYTES = TRAITS[GGMLType.Q4_0].type_size
Q4_0_D, Q4_0_QS = 0, 2
#: block_q4_1 { ggml_half d; ggml_half m; uint8_t qs[16]; }
Q4_1_BYTES = TRAITS[GGMLType.Q4_1].type_size
Q4_1_D, Q4_1_M, Q4_1_QS = 0, 2, 4
#: block_q5_0 { ggml_half d; uint8_t qh[4]; uint8_t qs[16]; }
Q5_0_BYTES = TRAITS[GGMLType.Q5_0].type_size
Q5_0_D, Q5_0_QH, Q5_0_QS = 0, 2, 6
#: block_q5_1 { ggml_half d; ggml_half m; uint8_t qh[4]; uint8_t qs[16]; }
Q5_1_BYTES = TRAITS[GGMLType.Q5_1].type_size
Q5_1_D, Q5_1_M, Q5_1_QH, Q5_1_QS = 0, 2, 4, 8
#: block_q8_0 { ggml_half d; int8_t qs[32]; }
Q8_0_BYTES = TRAITS[GGMLType.Q8_0].type_size
Q8_0_D, Q8_0_QS = 0, 2

# -- 256-element super-blocks (k-quants) ---------------------------------------------------------
#: block_q2_K { uint8_t scales[16]; uint8_t qs[64]; ggml_half d; ggml_half dmin; }
Q2_K_BYTES = TRAITS[GGMLType.Q2_K].type_size
Q2_K_SCALES, Q2_K_QS, Q2_K_D, Q2_K_DMIN = 0, 16, 80, 82
#: block_q3_K { uint8_t hmask[32]; uint8_t qs[64]; uint8_t scales[12]; ggml_half d; }
Q3_K_BYTES = TRAITS[GGMLType.Q3_K].type_size
Q3_K_HMASK, Q3_K_QS, Q3_K_SCALES, Q3_K_D = 0, 32, 96, 108
#: block_q4_K { ggml_half d; ggml_half dmin; uint8_t scales[12]; uint8_t qs[128]; }
Q4_K_BYTES = TRAITS[GGMLType.Q4_K].type_size
Q4_K_D, Q4_K_DMIN, Q4_K_SCALES, Q4_K_QS = 0, 2, 4, 16
#: block_q5_K { ggml_half d; ggml_half dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; }
Q5_K_BYTES = TRAITS[GGMLType.Q5_K].type_size
Q5_K_D, Q5_K_DMIN, Q5_K_SCALES, Q5_K_QH, Q5_K_QS = 0, 2, 4, 16, 48
#: block_q6_K { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; ggml_half d; }
Q6_K_BYTES = TRAITS[GGMLType.Q6_K].type_size
Q6_K_QL, Q6_K_QH, Q6_K_SCALES, Q6_K_D = 0, 128, 192, 208

# -- non-linear 4-bit types --------------------------------------------------------------------------
#: block_iq4_nl { ggml_half d; uint8_t qs[16]; }
IQ4_NL_BYTES = TRAITS[GGMLType.IQ4_NL].type_size
IQ4_NL_D, IQ4_NL_QS = 0, 2
#: block_iq4_xs { ggml_half d; uint16_t scales_h; uint8_t scales_l[4]; uint8_t qs[128]; }
IQ4_XS_BYTES = TRAITS[GGMLType.IQ4_XS].type_size
IQ4_XS_D, IQ4_XS_SCALES_H, IQ4_XS_SCALES_L, IQ4_XS_QS = 0, 2, 4, 8


def _check() -> None:
    """Each layout's last field ends where the traits say the block ends."""
    ends = [
        (Q4_0_BYTES, Q4_0_QS + 16),
        (Q4_1_BYTES, Q4_1_QS + 16),
        (Q5_0_BYTES, Q5_0_QS + 16),
        (Q5_1_BYTES, Q5_1_QS + 16),
        (Q8_0_BYTES, Q8_0_QS + 32),
        (Q2_K_BYTES, Q2_K_DMIN + 2),
        (Q3_K_BYTES, Q3_K_D + 2),
        (Q4_K_BYTES, Q4_K_QS + 128),
        (Q5_K_BYTES, Q5_K_QS + 128),
        (Q6_K_BYTES, Q6_K_D + 2),
        (IQ4_NL_BYTES, IQ4_NL_QS + 16),
        (IQ4_XS_BYTES, IQ4_XS_QS + 128),
    ]
    for size, end in ends:
        if size != end:  # pragma: no cover - a wrong table above
            raise AssertionError(f"block layout ends at byte {end}, the type traits say {size}")


_check()
