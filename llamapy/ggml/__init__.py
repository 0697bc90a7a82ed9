"""Tensor types, quantization, the compute graph and its backends.

Light to import: the graph classes load on first use, and Numba only when the CPU backend compiles.
"""

from __future__ import annotations

from typing import Any

from .types import TRAITS, GGMLType, row_size, traits

__all__ = [
    "TRAITS", "GGMLType", "row_size", "traits",
    "Tensor", "GraphError", "Graph", "Scheduler", "Backend", "ComputeError", "NumpyBackend", "CPUBackend",
    "ops", "create_backend",
]  # fmt: skip

_LAZY = {
    "Tensor": ("tensor", "Tensor"),
    "GraphError": ("tensor", "GraphError"),
    "Graph": ("graph", "Graph"),
    "Scheduler": ("sched", "Scheduler"),
    "Backend": ("backend", "Backend"),
    "ComputeError": ("backend", "ComputeError"),
    "create_backend": ("backend", "create_backend"),
    "NumpyBackend": ("numpy_backend", "NumpyBackend"),
    "CPUBackend": ("cpu.backend", "CPUBackend"),
}


def __getattr__(name: str) -> Any:
    import importlib

    if name == "ops":
        return importlib.import_module(".ops", __name__)
    if name in _LAZY:
        mod, attr = _LAZY[name]
        return getattr(importlib.import_module(f".{mod}", __name__), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
