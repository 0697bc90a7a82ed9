"""The backend interface and the registry of backends.

A backend is narrow: it says which ops it supports, owns buffers of its buffer type, and turns each
node it is given into a *step* (a no-argument callable bound to the planned arrays of the node and its
sources) that the scheduler runs in order. Host backends share the process memory, so a tensor one
host backend produced is read in place by another; a device backend would add copies in ``Scheduler``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import LlamapyError
from .tensor import Tensor

__all__ = ["Backend", "ComputeError", "register_backend", "backend_names", "create_backend"]

Step = Callable[[], None]
ArrayMap = dict[int, np.ndarray]  # id(tensor) -> its NumPy view over planned / leaf memory


class ComputeError(LlamapyError, ValueError):
    """A graph could not be executed with the given inputs (bad index, wrong input shape, ...)."""


class Backend:
    """Base class of backends."""

    name = "backend"
    buffer_type = "host"  # where this backend's buffers live; equal types share memory
    host = True
    #: weights copied into the backend's own kernel layouts on first use (the CPU's 8-row layouts);
    #: False: the plain layout of the file (llama.cpp's ``--no-repack``). Read when a graph is compiled.
    repack = True

    def supports_op(self, node: Tensor) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError

    def compile(self, node: Tensor, arrays: ArrayMap) -> Step | None:  # pragma: no cover - abstract
        """A step computing ``node`` into ``arrays[id(node)]`` from its sources' arrays (None: nothing to do)."""
        raise NotImplementedError

    def alloc_buffer(self, nbytes: int) -> np.ndarray:
        """A buffer of this backend's buffer type (flat bytes)."""
        return np.empty(max(int(nbytes), 1), dtype=np.uint8)

    def set_tensor(self, dst: np.ndarray, value: np.ndarray) -> None:
        np.copyto(dst, value, casting="same_kind")

    def get_tensor(self, src: np.ndarray) -> np.ndarray:
        return np.array(src, copy=True)

    def synchronize(self) -> None:
        """Wait for queued work (host backends run synchronously)."""

    def keep_tuning(self, path: str | os.PathLike[str], scope: str, threads: int) -> None:
        """Keep what this backend measures about its kernels (the CPU's prefetch choices) in ``path``, for
        ``scope`` (what the weights are: the context's model file) run on ``threads`` threads, and start
        from what is kept there. Nothing by default."""

    def compute(self, graph: Any, inputs: dict[Tensor, np.ndarray] | None = None) -> Any:
        """Run a whole graph on this backend alone; returns the scheduler (``.get(t)`` reads outputs)."""
        from .sched import Scheduler

        s = Scheduler([self])
        s.compute(graph, inputs or {})
        return s

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


_REGISTRY: dict[str, Callable[..., Backend]] = {}


def register_backend(name: str, factory: Callable[..., Backend]) -> None:
    _REGISTRY[name] = factory


def backend_names() -> list[str]:
    _builtin()
    return sorted(_REGISTRY)


def create_backend(name: str, **kwargs: Any) -> Backend:
    """``create_backend("cpu", n_threads=2)`` / ``create_backend("numpy")``."""
    _builtin()
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise LlamapyError(f"unknown backend {name!r} (known: {', '.join(sorted(_REGISTRY))})") from None
    return factory(**kwargs)


def _builtin() -> None:
    if "numpy" not in _REGISTRY:
        from .numpy_backend import NumpyBackend

        register_backend("numpy", NumpyBackend)
    if "cuda" not in _REGISTRY:
        register_backend("cuda", _cuda_factory)
    if "cpu" not in _REGISTRY:
        try:
            from .cpu.backend import CPUBackend
        except ImportError:  # pragma: no cover - cpu backend not available yet
            return
        register_backend("cpu", CPUBackend)


def _cuda_factory(**kwargs: Any) -> Backend:
    """The CUDA backend, imported only when asked for (numba.cuda / CuPy never load otherwise)."""
    from .cuda.backend import CUDABackend

    kwargs.pop("n_threads", None)
    return CUDABackend(**kwargs)
