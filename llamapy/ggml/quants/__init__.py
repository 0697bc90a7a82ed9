"""Quantize and dequantize every GGML tensor type.

- ``dequantize(raw, t)``: ``uint8[..., nbytes]`` -> ``float32[..., n]`` (gguf-py's convention: the last
  axis goes from bytes to elements; plain-type arrays such as float16 are accepted too).
- ``quantize(x, t, imatrix=None)``: ``float32[..., n]`` -> ``uint8[..., nbytes]``, byte for byte what
  llama.cpp's reference quantizers produce; ``imatrix`` (``float32[n]``, one importance weight per
  column) selects llama.cpp's weighted quantizers where it has them.
- ``dequantize_rows_into(raw2d, t, out)``: fills a preallocated ``float32[rows, n]`` (Numba kernels,
  parallel over rows, for the hot types; NumPy otherwise). Used by the CPU backend for large-batch matmul.

One codec class per type (``QUANTS[t]``), grouped in ``legacy`` (Q4_0..Q8_1, plain types), ``kquants``
(Q2_K..Q8_K), ``iquants`` (IQ*, TQ*, MXFP4); the quantizers live beside them: the Numba row quantizers
``_rowq`` (Q4_0..Q8_0, Q6_K, IQ4_NL/XS) and ``_rowk`` (Q2_K..Q5_K), whose scale searches run one group per
SIMD lane; ``_search`` (llama.cpp's scale searches, NumPy, with ``_search_fast`` in Numba), ``_kquantize``
and ``_iquantize`` (the NumPy versions, the references the tests hold the Numba ones to), and the Numba
lattice searches ``_iq3``, ``_iq2``, ``_iq1``; the Numba dequantize kernels in ``fast`` (MXFP4's in
``mxfp4``), the i-quant grids in ``iq_tables``.
Every type llama.cpp can quantize is quantizable here (IQ2_XXS, IQ2_XS and IQ1_S need an imatrix, as
in llama.cpp); the integer types are not.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ..types import TRAITS, GGMLType
from .base import QUANTS, BlockQuant, QuantError

__all__ = [
    "QUANTS",
    "BlockQuant",
    "QuantError",
    "dequantize",
    "dequantize_numpy",
    "dequantize_rows_into",
    "rows_dequantizer",
    "get_quant",
    "has_fast_dequantize",
    "quantize",
]

# elements per NumPy chunk: bounds the temporaries of the vectorized codecs
_CHUNK_ELEMS = 1 << 20
# inputs at least this big go through the Numba kernel when the type has one
_NUMBA_MIN_BYTES = 1 << 16


def _type(t: GGMLType | int) -> GGMLType:
    try:
        return GGMLType(int(t))
    except (ValueError, TypeError):
        raise QuantError(f"unknown ggml type {t!r}") from None


def get_quant(t: GGMLType | int) -> type[BlockQuant]:
    """The codec class of type ``t``."""
    gt = _type(t)
    q = QUANTS.get(gt)
    if q is None:
        raise QuantError(f"{gt.name}: no codec for this type")
    return q


def _as_bytes(raw: np.ndarray, gt: GGMLType, what: str) -> np.ndarray:
    raw = np.asarray(raw)
    if raw.ndim == 0:
        raise QuantError(f"{what} {gt.name}: expected an array of bytes, got a scalar")
    if raw.dtype != np.uint8:
        if raw.dtype != np.int8:
            raise QuantError(f"{what} {gt.name}: expected uint8 bytes, got an array of {raw.dtype}")
        raw = raw.view(np.uint8)
    return raw


def _block_count(nbytes: int, gt: GGMLType, what: str) -> int:
    ts = TRAITS[gt].type_size
    if nbytes % ts:
        raise QuantError(
            f"{what} {gt.name}: the last axis holds {nbytes} bytes, not a whole number of {ts}-byte blocks"
        )
    return nbytes // ts


def dequantize(raw: np.ndarray, t: GGMLType | int) -> np.ndarray:
    """``uint8[..., nbytes]`` of type ``t`` -> ``float32[..., n]``. F32 input comes back as a view."""
    gt = _type(t)
    q = get_quant(gt)
    tr = TRAITS[gt]
    raw = np.asarray(raw)
    if not tr.quantized and raw.ndim > 0 and raw.dtype != np.uint8:
        # an already typed plain array (float16, bfloat16 as uint16/int16, int32, ...)
        if gt == GGMLType.BF16 and raw.dtype in (np.uint16, np.int16):
            return q.dequantize_blocks(raw.reshape(-1, 1)).reshape(raw.shape)
        if (
            tr.dtype is not None
            and raw.dtype.kind == tr.dtype.kind
            and raw.dtype.itemsize == tr.dtype.itemsize
        ):
            return raw.astype(np.float32, copy=False)
        raise QuantError(
            f"dequantize {gt.name}: expected uint8 bytes or {tr.dtype or 'uint16'} values, got {raw.dtype}"
        )
    raw = _as_bytes(raw, gt, "dequantize")
    nb_row = _block_count(raw.shape[-1], gt, "dequantize")
    lead = raw.shape[:-1]
    n = nb_row * tr.block_size
    if gt == GGMLType.F32:
        return np.ascontiguousarray(raw).view("<f4").view(np.float32).reshape((*lead, n))
    if tr.dtype is not None:
        return np.ascontiguousarray(raw).view(tr.dtype).astype(np.float32)
    if raw.size >= _NUMBA_MIN_BYTES and has_fast_dequantize(gt):
        # blocks are independent: regroup them into enough rows to keep every thread busy
        nblk = raw.size // tr.type_size
        g = math.gcd(nblk, 64)
        rows2d = np.ascontiguousarray(raw).reshape((nblk // g, g * tr.type_size))
        out2d = np.empty((rows2d.shape[0], g * tr.block_size), dtype=np.float32)
        return dequantize_rows_into(rows2d, gt, out2d).reshape((*lead, n))
    return dequantize_numpy(raw, gt)


def dequantize_numpy(raw: np.ndarray, t: GGMLType | int) -> np.ndarray:
    """``dequantize`` through the NumPy codec only (the reference the Numba kernels are tested against)."""
    gt = _type(t)
    q = get_quant(gt)
    tr = TRAITS[gt]
    raw = _as_bytes(raw, gt, "dequantize")
    n = _block_count(raw.shape[-1], gt, "dequantize") * tr.block_size
    lead = raw.shape[:-1]
    blocks = np.ascontiguousarray(raw).reshape((-1, tr.type_size))
    out = np.empty((blocks.shape[0], tr.block_size), dtype=np.float32)
    step = max(1, _CHUNK_ELEMS // tr.block_size)
    for i in range(0, blocks.shape[0], step):
        out[i : i + step] = q.dequantize_blocks(blocks[i : i + step])
    return out.reshape((*lead, n))


def quantize(x: np.ndarray, t: GGMLType | int, imatrix: np.ndarray | None = None) -> np.ndarray:
    """``float32[..., n]`` -> ``uint8[..., nbytes]`` of type ``t`` (llama.cpp's reference quantizers).

    ``imatrix``: ``float32[n]`` importance weights per column, used by the types whose llama.cpp
    quantizer takes them (ignored by the others, as in llama.cpp).
    """
    gt = _type(t)
    q = get_quant(gt)
    if not q.can_quantize:
        raise QuantError(f"quantize: quantization to {gt.name} is not implemented")
    x = np.asarray(x)
    if x.ndim == 0:
        raise QuantError(f"quantize {gt.name}: expected an array, got a scalar")
    if x.dtype.kind not in "fiu":
        raise QuantError(f"quantize {gt.name}: expected float values, got dtype {x.dtype}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    n = x.shape[-1]
    bs, ts = q.block_size, q.type_size
    if n % bs:
        raise QuantError(f"quantize {gt.name}: a row of {n} values is not a multiple of the block size {bs}")
    if q.requires_imatrix and imatrix is None:
        raise QuantError(
            f"quantize {gt.name}: this type needs importance weights (imatrix=...), as in llama.cpp"
        )
    if n == 0 or x.size == 0:
        return np.zeros((*x.shape[:-1], n // bs * ts), dtype=np.uint8)
    rows = x.reshape((-1, n))
    if TRAITS[gt].quantized and rows.size and not np.isfinite(rows).all():
        r, c = np.argwhere(~np.isfinite(rows))[0]
        raise QuantError(
            f"quantize {gt.name}: value {rows[r, c]} at row {r}, column {c} is not finite "
            "(block types cannot represent inf or nan)"
        )
    qw = sigma2 = None
    if imatrix is not None and q.uses_imatrix:
        im = np.asarray(imatrix, dtype=np.float32)
        if im.shape != (n,):
            raise QuantError(
                f"quantize {gt.name}: imatrix has shape {im.shape}, expected ({n},) for rows of {n}"
            )
        if not np.all(np.isfinite(im)):
            raise QuantError(f"quantize {gt.name}: imatrix holds non-finite values")
        qw = np.broadcast_to(im.reshape((1, n // bs, bs)), (rows.shape[0], n // bs, bs)).reshape((-1, bs))
        # per-row mean square, summed in order like llama.cpp
        s2 = np.cumsum(rows * rows, axis=-1, dtype=np.float32)[:, -1:] / np.float32(n)
        sigma2 = np.broadcast_to(s2[:, None, :], (rows.shape[0], n // bs, 1)).reshape((-1, 1))
    blocks = rows.reshape((-1, bs))
    out = np.empty((blocks.shape[0], ts), dtype=np.uint8)
    step = max(1, (_CHUNK_ELEMS // 8) // bs)
    with np.errstate(all="ignore"):  # inf/nan inputs and half-float overflow behave as in C
        for i in range(0, blocks.shape[0], step):
            sl = slice(i, i + step)
            out[sl] = q.quantize_blocks(
                blocks[sl], None if qw is None else qw[sl], None if sigma2 is None else sigma2[sl]
            )
    return out.reshape((*x.shape[:-1], n // bs * ts))


def has_fast_dequantize(t: GGMLType | int) -> bool:
    """Whether ``dequantize_rows_into`` has a Numba kernel for ``t``."""
    from . import fast

    return _type(t) in fast.KERNELS


def dequantize_rows_into(raw2d: np.ndarray, t: GGMLType | int, out: np.ndarray) -> np.ndarray:
    """Dequantize ``raw2d: uint8[rows, row_bytes]`` into ``out: float32[rows, n]`` and return ``out``.

    Uses the Numba kernel of ``t`` (parallel over rows, see ``llamapy._numba.set_num_threads``) when
    there is one, else the NumPy codec.
    """
    gt = _type(t)
    raw2d = _as_bytes(raw2d, gt, "dequantize_rows_into")
    if raw2d.ndim != 2:
        raise QuantError(
            f"dequantize_rows_into {gt.name}: raw must be 2-D [rows, row_bytes], got {raw2d.shape}"
        )
    deq = _rows_dequantizer(gt, raw2d.shape[0], raw2d.shape[1], out, "dequantize_rows_into")
    return deq(np.ascontiguousarray(raw2d))


def rows_dequantizer(
    t: GGMLType | int, rows: int, row_bytes: int, out: np.ndarray
) -> Callable[[np.ndarray], np.ndarray]:
    """``dequantize_rows_into(raw2d, t, out)`` prepared for many calls with the same ``out``: ``t``,
    ``rows``, ``row_bytes`` and ``out`` are checked here, once (``QuantError`` as
    ``dequantize_rows_into`` raises); the function returned takes ``raw2d``, C-contiguous
    ``uint8[rows, row_bytes]`` (not checked again), and returns ``out``. Where ``t`` has a Numba kernel,
    that kernel's call and nothing else: a decode step's one embedding row costs microseconds, not the
    ~60 us of cold Python validation it took a call after the mat-vecs had flushed the caches."""
    return _rows_dequantizer(_type(t), rows, row_bytes, out, "rows_dequantizer")


def _rows_dequantizer(
    gt: GGMLType, rows: int, row_bytes: int, out: np.ndarray, what: str
) -> Callable[[np.ndarray], np.ndarray]:
    """The checks of ``dequantize_rows_into``, and the function doing its work on C-contiguous rows."""
    tr = TRAITS[gt]
    n = _block_count(row_bytes, gt, what) * tr.block_size
    ok = isinstance(out, np.ndarray) and out.dtype == np.float32 and out.ndim == 2 and out.shape[1] == n
    if not ok or out.shape[0] != rows:
        got = f"{out.dtype}{list(out.shape)}" if isinstance(out, np.ndarray) else type(out).__name__
        raise QuantError(f"{what} {gt.name}: out must be float32[{rows}, {n}], got {got}")
    if not out.flags.writeable:
        raise QuantError(f"{what} {gt.name}: out is read-only")
    from . import fast

    kern = fast.KERNELS.get(gt)

    def run_numpy(raw2d: np.ndarray) -> np.ndarray:
        if rows and n:
            out[...] = dequantize_numpy(raw2d, gt)
        return out

    if kern is None or out.strides[1] != 4 or rows == 0 or n == 0:
        return run_numpy

    def run_kernel(raw2d: np.ndarray) -> np.ndarray:
        kern(raw2d, out)
        return out

    return run_kernel
