"""``n_ctx = 0``: the model's training context, as llama.cpp, lowered when its KV cache would not fit in
memory (as llama.cpp's ``--fit``, on by default: keep ``FIT_MARGIN`` free, never below ``N_CTX_FIT_MIN``).

The KV buffers are zeroed pages the system hands out as cells fill, so a large context costs nothing at
start; the fit keeps a long session from growing past the machine's memory (an out-of-memory kill)
instead of meeting a full context (a context shift, or a clear error)."""

from __future__ import annotations

import os
from typing import Any

from ..errors import LlamapyError
from ..ggml.types import GGMLType, row_size
from .kv_cache import kv_type

N_CTX_FIT_MIN = 4096  # llama.cpp's --fit-ctx default
FIT_MARGIN = 1 << 30  # bytes left free (llama.cpp's --fit-target default, 1024 MiB)


def available_memory() -> int | None:
    """Bytes of memory available to new allocations (Linux ``MemAvailable``), or None if unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def kv_bytes_per_cell(hp: Any, type_k: str | GGMLType = "f16", type_v: str | GGMLType = "f16") -> int:
    """K and V bytes one cell of the full-attention cache holds (sliding-window layers have their own small
    cache, recurrent layers none)."""
    tk, tv = kv_type(type_k), kv_type(type_v)
    n = 0
    for il in range(hp.n_layer):
        if not hp.has_kv(il) or hp.is_swa(il) or hp.kv_layer(il) != il:
            continue
        n += row_size(tk, hp.n_embd_k_gqa(il)) + row_size(tv, hp.n_embd_v_gqa(il))
    return n


def fit_n_ctx(
    hp: Any,
    type_k: str | GGMLType = "f16",
    type_v: str | GGMLType = "f16",
    available: int | None = -1,
) -> int:
    """The context ``n_ctx = 0`` gives: the training context, lowered to what fits in ``available`` bytes
    (-1: ``available_memory()``; None: unknown, no lowering) less ``FIT_MARGIN``, but not below
    ``N_CTX_FIT_MIN``."""
    n = int(hp.n_ctx_train)
    if n <= 0:
        raise LlamapyError("the model's context_length is 0: give n_ctx (-c N)")
    avail = available_memory() if available == -1 else available
    per_cell = kv_bytes_per_cell(hp, type_k, type_v)
    if avail is None or not per_cell or n * per_cell <= avail - FIT_MARGIN:
        return n
    fits = max(avail - FIT_MARGIN, 0) // per_cell // 256 * 256
    return min(n, max(N_CTX_FIT_MIN, fits))
