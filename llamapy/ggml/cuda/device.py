"""Device memory for the CUDA backend: CuPy when it is importable and sees a GPU, else numba.cuda
(a real device, or its simulator under ``NUMBA_ENABLE_CUDASIM=1``). Kernels are Numba CUDA kernels on
both paths (they take CuPy arrays through ``__cuda_array_interface__``).

Nothing here is imported by the CPU package: ``llamapy.ggml.cuda`` is loaded only when a CUDA backend
is asked for (``create_backend("cuda")``, ``n_gpu_layers != 0``).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np

from ...errors import LlamapyError

__all__ = ["CUDAUnavailable", "Device", "cuda_unavailable_reason", "get_device"]


class CUDAUnavailable(LlamapyError, RuntimeError):
    """No usable CUDA device (no numba-cuda, no driver, no GPU) and not the simulator."""


def simulator() -> bool:
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "") not in ("", "0")


def cuda_unavailable_reason() -> str | None:
    """None when a CUDA backend can run here, else why not (one short sentence)."""
    if simulator():  # numba reads its environment once: re-read it if numba was imported before
        try:
            import numba.core.config as cfg

            if not cfg.ENABLE_CUDASIM and "numba.cuda" not in sys.modules:
                cfg.reload_config()
        except ImportError:  # pragma: no cover
            pass
    try:
        from numba import cuda
    except ImportError:
        return "numba-cuda is not installed (pip install 'llamapy[cuda]')"
    if simulator():
        return None
    try:
        if not cuda.is_available():
            return "no CUDA driver or GPU was found"
    except Exception as e:  # pragma: no cover - driver errors
        return f"CUDA is not usable: {e}"
    return None


class Device:
    """Allocation and host<->device copies of flat ``uint8`` buffers."""

    def __init__(self, index: int = 0) -> None:
        why = cuda_unavailable_reason()
        if why is not None:
            raise CUDAUnavailable(why)
        from numba import cuda

        self.cuda = cuda
        self.sim = simulator()
        self.index = index
        self.cp: Any = None
        self.stream: Any = None  # CuPy: one non-blocking stream for all of this device's work
        self.nb_stream: Any = None  # ... and the same stream as Numba sees it (kernel launches)
        if not self.sim:  # pragma: no cover - needs a GPU
            n = len(cuda.gpus)
            if not 0 <= index < n:
                raise CUDAUnavailable(f"main_gpu = {index}: this machine has {n} CUDA device(s)")
            cuda.select_device(index)
            try:
                import cupy

                if cupy.cuda.runtime.getDeviceCount() > index:
                    cupy.cuda.Device(index).use()
                    self.stream = cupy.cuda.Stream(non_blocking=True)
                    self.nb_stream = cuda.external_stream(self.stream.ptr)
                    self.cp = cupy
            except Exception:
                self.cp = self.stream = self.nb_stream = None
        self.name = "CUDA simulator" if self.sim else self._gpu_name()

    def _gpu_name(self) -> str:  # pragma: no cover - needs a GPU
        try:
            name = self.cuda.get_current_device().name
            return name.decode() if isinstance(name, bytes) else str(name)
        except Exception:
            return "CUDA device"

    def empty(self, nbytes: int) -> Any:
        n = max(int(nbytes), 8)
        n = -(-n // 8) * 8
        if self.cp is not None:  # pragma: no cover - needs a GPU
            return self.cp.empty(n, dtype=np.uint8)
        return self.cuda.device_array(n, dtype=np.uint8)

    def upload(self, host: np.ndarray) -> Any:
        """A new device buffer holding ``host``'s bytes (padded to a multiple of 8)."""
        flat = np.ascontiguousarray(host).reshape(-1).view(np.uint8)
        buf = self.empty(flat.nbytes)
        self.write(buf, 0, flat)
        return buf

    def write(self, buf: Any, off: int, host: np.ndarray) -> None:
        flat = np.ascontiguousarray(host).reshape(-1).view(np.uint8)
        if flat.nbytes == 0:
            return
        if self.cp is not None:  # pragma: no cover - needs a GPU
            buf[off : off + flat.nbytes].set(flat, stream=self.stream)
        else:
            buf[off : off + flat.nbytes].copy_to_device(flat)

    def read(self, buf: Any, off: int, out: np.ndarray) -> None:
        """Copy ``out.nbytes`` bytes at ``off`` of ``buf`` into the contiguous host array ``out``."""
        flat = out.reshape(-1).view(np.uint8)
        if flat.nbytes == 0:
            return
        if self.cp is not None:  # pragma: no cover - needs a GPU
            buf[off : off + flat.nbytes].get(stream=self.stream, out=flat)  # blocking: waits for the stream
        else:
            buf[off : off + flat.nbytes].copy_to_host(flat)

    def free_bytes(self) -> int | None:
        """Free device memory (None: unknown, e.g. the simulator)."""
        if self.sim:
            return None
        try:  # pragma: no cover - needs a GPU
            free, _ = self.cuda.current_context().get_memory_info()
            return int(free)
        except Exception:  # pragma: no cover
            return None

    def synchronize(self) -> None:
        if self.stream is not None:  # pragma: no cover - needs a GPU
            self.stream.synchronize()
        elif not self.sim:  # pragma: no cover - needs a GPU
            self.cuda.synchronize()

    # -- launches and CUDA graphs (used by plan.LaunchPlan) ----------------------------------------------
    def configure(self, kernel: Any, grid: Any, block: Any) -> Any:  # pragma: no cover - needs a GPU
        """``kernel`` configured for ``grid`` x ``block`` on this device's stream (reusable)."""
        if self.nb_stream is not None:
            return kernel[grid, block, self.nb_stream]
        return kernel[grid, block]

    def kernel_arg(self, a: Any) -> Any:  # pragma: no cover - needs a GPU
        """A CuPy array as a Numba device array, converted once when a launch is recorded: Numba would
        otherwise convert it at every launch and synchronize on the stream CuPy exports with it, which
        is not allowed while a stream is being captured."""
        if self.cp is not None and isinstance(a, self.cp.ndarray):
            return self.cuda.as_cuda_array(a, sync=False)
        return a

    def on_stream(self, fn: Any) -> Any:
        """``fn`` run with this device's stream as CuPy's current stream (a cuBLAS call, say)."""
        if self.stream is None:
            return fn
        stream = self.stream

        def call() -> None:  # pragma: no cover - needs a GPU
            with stream:
                fn()

        return call

    def can_capture(self) -> bool:
        """Whether launches can be captured into CUDA graphs (a GPU with CuPy)."""
        return self.stream is not None

    # GPU ONLY: CUDA graph capture through CuPy. Never runs under the simulator (the simulator tests
    # replace these two methods with fakes that defer the launches to the graph's launch, as CUDA does);
    # tests/ggml/cuda/test_cuda_replay.py::test_cuda_graph_on_a_real_gpu runs them on a GPU.
    def capture(self, run: Any) -> Any:  # pragma: no cover - needs a GPU with CuPy
        """A CUDA graph of what ``run()`` enqueues on this device's stream (nothing runs now)."""
        s = self.stream
        with s:
            s.begin_capture()
            try:
                run()
            except BaseException:
                try:
                    s.end_capture()  # leave capture mode; the partial graph is dropped
                except Exception:
                    pass
                raise
            return s.end_capture()

    def launch_graph(self, graph: Any) -> None:  # pragma: no cover - needs a GPU with CuPy
        graph.launch(self.stream)


_DEVICE: Device | None = None


def get_device(index: int = 0) -> Device:
    """The process's device (made on first use, GPU ``index``; raises ``CUDAUnavailable``). One device
    per process: asking for another index later is an error."""
    global _DEVICE
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise CUDAUnavailable(f"main_gpu = {index!r}: must be a GPU index >= 0")
    if _DEVICE is None:
        _DEVICE = Device(index)
    elif _DEVICE.index != index and not _DEVICE.sim:  # pragma: no cover - needs two GPUs
        raise CUDAUnavailable(f"main_gpu = {index}: this process already uses GPU {_DEVICE.index}")
    return _DEVICE


class _OneThread:
    """The ``cuda`` module a grid-stride kernel sees when run as one simulated thread."""

    @staticmethod
    def grid(ndim: int) -> int:
        return 0

    @staticmethod
    def gridsize(ndim: int) -> int:
        return 1


_ONE = _OneThread()


def sim_run(kernel: Any, args: tuple) -> None:
    """Run a grid-stride kernel (no shared memory, no syncthreads) under the simulator as a single
    thread in this thread, on the arrays' host memory. The simulator's own launcher starts a Python
    thread per CUDA thread and polls them, which costs ~10x on the tiny shapes tests use; a kernel
    with shared memory (the tiled GEMM) goes through the full simulator launch instead."""
    from numba.cuda.simulator import kernel as simk
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    raw = [a._ary if isinstance(a, FakeCUDAArray) else a for a in args]
    swaps = _device_fn_swaps(simk)
    try:
        for g, name, fn in swaps:
            g[name] = fn
        with simk._push_kernel_context(_ONE), simk.swapped_cuda_module(kernel.fn, _ONE):
            kernel.fn(*raw)
    finally:
        for g, name, _ in swaps:
            g[name] = _SIM_DEVICE_FNS[(id(g), name)]


_SIM_DEVICE_FNS: dict[tuple[int, str], Any] = {}


def _device_fn_swaps(simk: Any) -> list[tuple[dict, str, Any]]:
    """(module globals, name, plain function) for each simulated device function the kernel modules
    call: calling the plain function skips the simulator's per-call module swap (they use no ``cuda.*``)."""
    from . import attention, dequant, kernels, matmul

    out = []
    for mod in (dequant, kernels, matmul, attention):
        g = mod.__dict__
        for name, v in list(g.items()):
            if isinstance(v, simk.FakeCUDAKernel) and v._device:
                _SIM_DEVICE_FNS[(id(g), name)] = v
                out.append((g, name, v.fn))
    return out
