"""``n_gpu_layers``: which weights and KV buffers go to the CUDA backend, as llama.cpp places them.

The last ``n_gpu_layers`` repeating layers (``blk.N.*``) go to the GPU, and the output layer
(``output_norm``, ``output``) too when more than ``n_layer`` are asked for (``-1``: everything). The
token embedding stays on the CPU (llama.cpp keeps the input layer on the host). Pinning a weight puts
its users on the GPU (the scheduler's rule); the KV buffers of offloaded layers are pinned as well
unless ``offload_kqv`` is false (``--no-kv-offload``). This module imports no CUDA code itself: without
CUDA the caller gets ``None`` and one warning line.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import field
from typing import Any

from ..._dataclass import dataclass
from ...errors import LlamapyError
from ..tensor import Tensor
from ..types import GGMLType

__all__ = ["Offload", "plan_offload", "offload_to_cuda", "warn_no_cuda"]

_BLK = re.compile(r"^blk\.(\d+)\.")
_CACHE = re.compile(r"^cache_\w+_l(\d+)$")
_OUTPUT = ("output_norm.", "output.", "cls.")

_warned = False


def warn_no_cuda(n_gpu_layers: int, why: str) -> None:
    """Say once per process that ``-ngl`` is ignored (llama.cpp's behaviour on a CPU-only build)."""
    global _warned
    if not _warned:
        _warned = True
        print(
            f"llamapy: warning: n_gpu_layers = {n_gpu_layers} ignored ({why}); running on the CPU",
            file=sys.stderr,
        )


@dataclass
class Offload:
    """Where things went: the tensors pinned to the GPU and a one-line summary."""

    n_layer: int
    n_gpu: int
    output: bool
    weights: list[Tensor] = field(default_factory=list)
    buffers: list[Tensor] = field(default_factory=list)
    device: str = ""
    requested: int = 0  # the n_gpu_layers asked for
    kv_offload: bool = True  # False: --no-kv-offload
    cpu_weight_bytes: int = 0  # the weights left on the CPU
    main_gpu: int = 0

    @property
    def weight_bytes(self) -> int:
        return sum(t.data.nbytes for t in self.weights)

    @property
    def buffer_bytes(self) -> int:
        return sum(t.data.nbytes for t in self.buffers)

    @property
    def need_bytes(self) -> int:
        """Device memory the pinned tensors take (weights and KV cache of the offloaded layers)."""
        return self.weight_bytes + self.buffer_bytes

    def summary(self) -> str:
        """The load line: what went where."""
        out = " and the output layer" if self.output else ""
        first, last = self.n_layer - self.n_gpu, self.n_layer - 1
        which = "" if not self.n_gpu else f" (blk.{first})" if first == last else f" (blk.{first}-blk.{last})"
        if not self.kv_offload:
            kv = "KV cache on the CPU (no KV offload)"
        else:
            kv = f"KV cache of the offloaded layers on the GPU ({_size(self.buffer_bytes)})"
        return (
            f"llamapy: offloaded {self.n_gpu}/{self.n_layer} layers{which}{out} to {self.device} "
            f"(GPU {self.main_gpu}): {_size(self.weight_bytes)} of weights on the GPU, "
            f"{_size(self.cpu_weight_bytes)} on the CPU; {kv}"
        )


def _size(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n / 1024:.1f} KiB"


def plan_offload(
    weights: Mapping[str, Tensor],
    buffers: Iterable[Tensor],
    n_layer: int,
    n_gpu_layers: int,
    offload_kqv: bool,
) -> Offload:
    """The tensors to pin for ``n_gpu_layers`` (no CUDA needed: this is bookkeeping)."""
    if not isinstance(n_gpu_layers, int) or n_gpu_layers < -1:
        raise LlamapyError(f"n_gpu_layers = {n_gpu_layers!r} must be -1 (all) or a number of layers >= 0")
    ngl = n_layer + 1 if n_gpu_layers == -1 else min(n_gpu_layers, n_layer + 1)
    start = n_layer - min(ngl, n_layer)
    off = Offload(n_layer, min(ngl, n_layer), ngl > n_layer, requested=n_gpu_layers, kv_offload=offload_kqv)
    seen: set[int] = set()
    cpu: dict[int, int] = {}
    for name, t in weights.items():
        m = _BLK.match(name)
        on = (m is not None and int(m.group(1)) >= start) or (off.output and name.startswith(_OUTPUT))
        # tied embeddings: the output layer is token_embd (llama.cpp keeps a GPU copy for it)
        on = on or (off.output and name == "token_embd.weight" and "output.weight" not in weights)
        if on and t.data is not None and id(t) not in seen:
            seen.add(id(t))
            off.weights.append(t)
        elif t.data is not None:
            cpu[id(t)] = t.data.nbytes
    off.cpu_weight_bytes = sum(n for i, n in cpu.items() if i not in seen)
    if offload_kqv:
        for b in buffers:
            m = _CACHE.match(b.name)
            # (quantized caches stay on the CPU: the CUDA backend has no set_rows into Q8_0 / Q4_0)
            if m is not None and int(m.group(1)) >= start and b.type in (GGMLType.F16, GGMLType.F32):
                off.buffers.append(b)
    return off


class _DeviceSync:
    """The memory's hook: the device copies of offloaded KV buffers are the current ones."""

    def __init__(self, backend: Any, buffers: list[Tensor]) -> None:
        self.backend, self.buffers = backend, buffers

    def to_host(self) -> None:
        for t in self.buffers:
            self.backend.sync_to_host(t)

    def from_host(self) -> None:
        for t in self.buffers:
            self.backend.invalidate(t)


def offload_to_cuda(sched: Any, off: Offload, main_gpu: int = 0, quiet: bool = False) -> Any:
    """Add a CUDA backend to ``sched`` and pin ``off``'s tensors to it; returns the memory sync hook, or
    None (with one warning line) when CUDA is not usable here. Raises if the model does not fit."""
    from .device import cuda_unavailable_reason

    why = cuda_unavailable_reason()
    if why is not None:
        warn_no_cuda(off.requested, why)
        return None
    from .backend import CUDABackend

    be = CUDABackend(main_gpu=main_gpu)
    need = off.need_bytes
    free = be.dev.free_bytes()
    if free is not None and need > free:
        mib = 1 << 20
        kv = f" + {off.buffer_bytes / mib:.1f} MiB of KV cache" if off.buffer_bytes else ""
        raise LlamapyError(
            f"n_gpu_layers = {off.requested}: the {off.n_gpu} offloaded layers need {need} bytes "
            f"({need / mib:.1f} MiB: {off.weight_bytes / mib:.1f} MiB of weights{kv}) of GPU memory, "
            f"{be.dev.name} (GPU {main_gpu}) has {free} free ({free / mib:.1f} MiB); lower n_gpu_layers"
            + (" or use --no-kv-offload" if off.buffer_bytes else "")
        )
    off.device, off.main_gpu = be.dev.name, main_gpu
    sched.add_backend(be)
    for t in (*off.weights, *off.buffers):
        sched.set_backend(t, be)
    if not quiet and not os.environ.get("LLAMAPY_QUIET"):
        print(off.summary(), file=sys.stderr)
    return _DeviceSync(be, off.buffers)
