"""What the CPU kernels share besides the block layouts (those are in ``llamapy.ggml.quants.layouts``):
rows per pass and the kind codes of the element-wise kernels, one definition for ``backend.py`` (which
picks them) and ``op_kernels.py`` (which branches on them). No Numba here.
"""

from __future__ import annotations

#: rows per pass of the mat-vec kernels (``rowgroups.rows4``): a prefetch covers one block of each
ROWS_PER_PASS = 4

# -- kind codes of the element-wise kernels (op_kernels.unary_rows / glu_rows) -----------------------
UNARY_SILU, UNARY_GELU, UNARY_GELU_QUICK, UNARY_TANH, UNARY_RELU, UNARY_SOFTCAP = range(6)
UNARY_KIND = {
    "silu": UNARY_SILU,
    "gelu": UNARY_GELU,
    "gelu_quick": UNARY_GELU_QUICK,
    "tanh": UNARY_TANH,
    "relu": UNARY_RELU,
    "softcap": UNARY_SOFTCAP,
}
GLU_SWIGLU, GLU_GEGLU = 0, 1
GLU_KIND = {"swiglu": GLU_SWIGLU, "geglu": GLU_GEGLU}
