"""Graph nodes: the ``Tensor`` of llamapy's compute graph.

Axis order: **NumPy order** everywhere (outermost first, the last axis is contiguous), the reverse
of ggml's ``ne``. A weight with ggml ``ne = (n_embd, n_out)`` has ``shape == (n_out, n_embd)``.

Strides are in bytes, in the same order as ``shape``. For block-quantized types (Q4_0, Q4_K, ...)
the last axis counts *elements* but its stride is the size of one *block* (``type_size``): a row of
``C`` elements takes ``row_size(t, C)`` bytes, and views of a quantized tensor must keep the last
axis whole and in place (they may select rows, heads, ...). Plain types (F32, F16, I32, ...) have
ordinary byte strides.

A tensor either owns its memory (a leaf with ``data``, or an op result the planner places) or is a
view: ``view_src`` is then the tensor that owns the memory and ``offset`` is the byte offset into it.
In-place ops (``cpy``, ``set_rows``) are nodes whose ``view_src`` is the destination's owner.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

from ..errors import LlamapyError
from .types import TRAITS, GGMLType, row_size

__all__ = ["GraphError", "Tensor", "contiguous_strides", "LEAF_OPS", "VIEW_OPS", "INPLACE_OPS"]

LEAF_OPS = frozenset({"input", "weight", "buffer"})
VIEW_OPS = frozenset({"view", "reshape", "permute", "transpose"})
INPLACE_OPS = frozenset({"cpy", "set_rows"})

_ids = itertools.count()


class GraphError(LlamapyError, ValueError):
    """A graph node was built with shapes, types or parameters that do not fit the op."""


def contiguous_strides(t: GGMLType, shape: Sequence[int]) -> tuple[int, ...]:
    """Byte strides of a contiguous tensor of type ``t`` and ``shape`` (NumPy order)."""
    tr = TRAITS[t]
    if not shape:
        return ()
    strides = [0] * len(shape)
    strides[-1] = tr.type_size
    acc = row_size(t, shape[-1]) if tr.block_size > 1 else tr.type_size * shape[-1]
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = acc
        acc *= shape[i]
    return tuple(strides)


def nbytes_of(t: GGMLType, shape: Sequence[int]) -> int:
    """Bytes taken by a contiguous tensor."""
    tr = TRAITS[t]
    if not shape:
        return tr.type_size
    n = shape[-1]
    if n % tr.block_size:
        row_size(t, n)  # raises, naming the type
    return math.prod(shape[:-1]) * (n // tr.block_size * tr.type_size)


class Tensor:
    """One node of a compute graph (see the module docstring for axis order and strides)."""

    __slots__ = (
        "type",
        "shape",
        "strides",
        "offset",
        "op",
        "params",
        "src",
        "name",
        "data",
        "view_src",
        "id",
        "__weakref__",
    )

    def __init__(
        self,
        type: GGMLType,
        shape: Sequence[int],
        op: str,
        src: Sequence[Tensor] = (),
        params: dict | None = None,
        name: str = "",
        strides: Sequence[int] | None = None,
        offset: int = 0,
        view_src: Tensor | None = None,
        data: np.ndarray | None = None,
    ) -> None:
        self.type = type if type.__class__ is GGMLType else GGMLType(type)
        self.shape = tuple(map(int, shape))
        if not 1 <= len(self.shape) <= 4:
            raise GraphError(f"{op} {name!r}: tensors have 1 to 4 dimensions, got shape {self.shape}")
        if any(s < 0 for s in self.shape):
            raise GraphError(f"{op} {name!r}: negative dimension in shape {self.shape}")
        bs = TRAITS[self.type].block_size
        if self.shape[-1] % bs:
            raise GraphError(
                f"{op} {name!r}: last dimension {self.shape[-1]} is not a multiple of the "
                f"{self.type.name} block size {bs}"
            )
        self.strides = tuple(strides) if strides is not None else contiguous_strides(self.type, self.shape)
        self.offset = int(offset)
        self.op = op
        self.params = params or {}
        self.src = list(src)
        self.name = name
        self.data = data
        self.view_src = view_src
        self.id = next(_ids)

    # -- properties -------------------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of a contiguous tensor of this type and shape."""
        return nbytes_of(self.type, self.shape)

    @property
    def is_leaf(self) -> bool:
        return self.op in LEAF_OPS

    @property
    def is_view(self) -> bool:
        return self.view_src is not None

    @property
    def owner(self) -> Tensor:
        """The tensor that owns this tensor's memory (itself unless it is a view or in-place op)."""
        return self.view_src if self.view_src is not None else self

    @property
    def quantized(self) -> bool:
        return TRAITS[self.type].block_size > 1

    def is_contiguous(self) -> bool:
        return self.strides == contiguous_strides(self.type, self.shape)

    def __repr__(self) -> str:
        nm = f" {self.name!r}" if self.name else ""
        return f"Tensor({self.op}{nm}, {self.type.name}, shape={self.shape})"

    # Identity semantics (tensors are dict keys); arithmetic builds nodes.
    __hash__ = object.__hash__

    def __add__(self, other: Tensor) -> Tensor:
        from . import ops

        return ops.add(self, other)

    def __sub__(self, other: Tensor) -> Tensor:
        from . import ops

        return ops.sub(self, other)

    def __mul__(self, other: Tensor | float) -> Tensor:
        from . import ops

        if isinstance(other, Tensor):
            return ops.mul(self, other)
        return ops.scale(self, float(other))

    def __truediv__(self, other: Tensor) -> Tensor:
        from . import ops

        return ops.div(self, other)

    def __matmul__(self, other: Tensor) -> Tensor:
        """``w @ x`` is ``mul_mat(w, x)`` (output ``[..., M, N]``)."""
        from . import ops

        return ops.mul_mat(self, other)
