"""The CUDA backend: device buffers, ``supports_op`` and one step per split (``compile_split``).

Memory: the scheduler plans one arena for a graph; this backend mirrors it on the device at the same
offsets, so a tensor's device bytes are ``(device arena, plan offset + view offset)`` exactly as on the
host. Weights are uploaded once (kept quantized, in their GGUF type) and shared by every context;
``buffer`` leaves (the KV cache) pinned to this backend live on the device (the device copy is the
current one: ``sync_to_host`` / ``invalidate`` for code that reads or writes the host copy). At a split's
start the host-produced tensors it reads are uploaded; at its end the tensors it produced that another
backend reads, or that are graph outputs, are downloaded.

Launches: a split's first run walks its nodes' closures (``steps.build_step``) and records every launch
they make into a ``plan.LaunchPlan``; later runs of the same graph replay the record (on a GPU with
CuPy, as one CUDA graph), so a reused decode graph pays no per-node Python work.
"""

from __future__ import annotations

import os
import weakref
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np

from ..backend import Backend, ComputeError, Step
from ..tensor import VIEW_OPS, Tensor
from ..types import GGMLType
from .dequant import DQ_TYPES
from .device import Device, get_device
from .plan import Launch, LaunchPlan
from .steps import GEMM_MIN_TOKENS, build_step

__all__ = ["CUDABackend", "GEMM_MIN_TOKENS"]

F32, F16, I32, I64 = GGMLType.F32, GGMLType.F16, GGMLType.I32, GGMLType.I64
_FLOAT = (F32, F16)
_ELEMENTWISE = {"add", "sub", "mul", "div", "scale", "silu", "gelu", "gelu_quick", "tanh", "relu", "softcap"}

#: leaf tensors uploaded once per process (weights), keyed by the leaf
_LEAVES: weakref.WeakKeyDictionary[Tensor, Any] = weakref.WeakKeyDictionary()


def _pad4(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    k = 4 - len(shape)
    return (1,) * k + tuple(shape), (0,) * k + tuple(strides)


class CUDABackend(Backend):
    """Numba CUDA kernels over device memory (a GPU, or the simulator under ``NUMBA_ENABLE_CUDASIM=1``)."""

    name = "cuda"
    buffer_type = "cuda"
    host = False

    def __init__(self, main_gpu: int = 0, n_threads: int | None = None, device: Device | None = None) -> None:
        self.dev = device or get_device(main_gpu)
        self.main_gpu = main_gpu
        #: mat-vec as one block of threads per output row (True on a GPU); the simulator takes the
        #: one-thread-per-output kernel unless a test asks for this one
        self.block_matvec = not self.dev.sim
        self.scratch: dict[tuple, Any] = {}  # reused device scratch (one step uses it at a time)
        self._views: dict[int, tuple[Any, ...]] = {}
        self._err_host = np.zeros(2, dtype=np.int32)
        self._err_buf = self.dev.upload(self._err_host)
        self._err = self._err_buf.view(np.int32)
        #: replay recorded launches on later runs of a split (LLAMAPY_CUDA_REPLAY=0: walk the nodes
        #: every time); capture the replay in a CUDA graph where the device can (LLAMAPY_CUDA_GRAPHS=0: no)
        self.replay = os.environ.get("LLAMAPY_CUDA_REPLAY", "1") != "0"
        self.graphs = self.dev.can_capture() and os.environ.get("LLAMAPY_CUDA_GRAPHS", "1") != "0"
        #: plans (one per split of a graph), records (node walks), replays (plain), captures,
        #: capture_failures, graph_launches, launches (device launches run, all paths)
        self.stats: Counter[str] = Counter()
        self._rec: list[Launch] | None = None
        from . import kernels  # noqa: F401  (compile lazily, fail early if numba.cuda is broken)

    def __repr__(self) -> str:
        return f"CUDABackend({self.dev.name})"

    # -- interface ---------------------------------------------------------------------------------
    def supports_op(self, node: Tensor) -> bool:
        op, s, p = node.op, node.src, node.params
        if op in VIEW_OPS:
            return True
        if op in _ELEMENTWISE:
            return node.type == F32 and all(x.type == F32 for x in s)
        if op == "add_id":
            return node.type == F32 and s[0].type == F32 and s[1].type == F32 and s[2].type == I32
        if op in ("swiglu", "geglu", "swiglu_oai"):
            return node.type == F32 and all(x.type == F32 for x in s) and s[0].shape == s[1].shape
        if op in ("rms_norm", "norm"):
            return node.type == F32 and s[0].type == F32
        if op == "soft_max":
            return s[0].type == F32 and all(x.type in _FLOAT for x in s[1:])
        if op == "rope":
            return p["mode"] in (0, 2, 8, 40) and s[0].type == F32
        if op == "get_rows":
            return s[0].type in DQ_TYPES and s[1].type in (I32, I64)
        if op == "set_rows":
            return node.type in _FLOAT and s[1].type == F32 and s[2].type in (I32, I64)
        if op == "cpy":
            return node.type in _FLOAT and s[0].type in DQ_TYPES
        if op == "cont":
            return node.type in _FLOAT
        if op == "mul_mat":
            return s[0].type in DQ_TYPES and s[1].type in _FLOAT
        if op == "mul_mat_id":
            return s[0].type in DQ_TYPES and s[1].type == F32 and s[2].type == I32
        if op == "flash_attn_ext":
            return all(x.type in DQ_TYPES for x in s)
        return False

    def compile(self, node: Tensor, arrays: Any) -> Step | None:
        raise ComputeError("CUDABackend runs whole splits (Scheduler calls compile_split)")

    def synchronize(self) -> None:
        self.dev.synchronize()

    # -- device copies of leaves ---------------------------------------------------------------------
    def leaf_buffer(self, t: Tensor) -> Any:
        """The device copy of a leaf with data (uploaded on first use)."""
        buf = _LEAVES.get(t)
        if buf is None:
            free = self.dev.free_bytes()
            if free is not None and t.data.nbytes > free:
                raise ComputeError(
                    f"CUDA: {t.name or t.op} needs {t.data.nbytes} bytes of device memory, {free} are free"
                )
            buf = _LEAVES[t] = self.dev.upload(t.data)
        return buf

    def sync_to_host(self, t: Tensor) -> None:
        """Copy the device copy of a pinned ``buffer`` leaf back into its host data."""
        buf = _LEAVES.get(t)
        if buf is not None:
            self.dev.read(buf, 0, t.data)

    def invalidate(self, t: Tensor) -> None:
        """The host data of ``t`` changed: copy it into the device copy (the same buffer: compiled
        graphs hold it)."""
        buf = _LEAVES.get(t)
        if buf is not None:
            self.dev.write(buf, 0, t.data)

    def views(self, buf: Any) -> tuple[Any, Any, Any, Any]:
        v = self._views.get(id(buf))
        if v is None or v[0] is not buf:
            v = (buf, buf.view(np.uint8), buf.view(np.float16), buf.view(np.float32), buf.view(np.int32))
            self._views[id(buf)] = v
        return v[1:]

    # -- splits -----------------------------------------------------------------------------------------
    def compile_split(self, nodes: list[Tensor], info: Any) -> Step:
        """One step running ``nodes`` (in order) on the device, with the copies in and out."""
        st = info.state.setdefault(id(self), {})
        if "arena" not in st:
            st["arena"] = self.dev.empty(info.plan.size)
            st["on_device"] = set()  # owners whose current bytes are in the device arena
            st["copies"] = {}  # unpinned leaves read here: per-graph device copies
        plan, where = info.plan, info.where
        for n in nodes:  # a pinned buffer must not be written on the host (the device copy is current)
            o = n.owner
            if o.data is not None and where.get(id(o)) is self and id(o) in info.host_writes:
                raise ComputeError(
                    f"CUDA: buffer {o.name!r} lives on the device but the graph writes it on the CPU"
                )
        on_dev: set[int] = st["on_device"]
        uploads: list[tuple[Any, int, np.ndarray]] = []
        leaf_up: list[tuple[Any, np.ndarray]] = []
        seen: set[int] = set()

        def desc(t: Tensor) -> tuple[Any, int, tuple[int, ...], tuple[int, ...]]:
            o = t.owner
            if o.data is not None:
                if o.op == "weight" or where.get(id(o)) is self:
                    buf = self.leaf_buffer(o)
                else:  # a host buffer another backend writes: copied in before each run of this split
                    buf = st["copies"].get(id(o))
                    if buf is None:
                        buf = st["copies"][id(o)] = self.dev.empty(o.data.nbytes)
                    if id(o) not in seen:
                        seen.add(id(o))
                        leaf_up.append((buf, o.data))
                off = t.offset
            else:
                buf = st["arena"]
                off = plan.offsets[id(o)] + t.offset
                if id(o) not in on_dev and id(o) not in seen:
                    seen.add(id(o))
                    uploads.append((buf, plan.offsets[id(o)], info.arena[plan.offsets[id(o)] :][: o.nbytes]))
            sh, sd = _pad4(t.shape, t.strides)
            return (buf, off, sh, sd)

        launches: list[Callable[[], None]] = []
        checks: list[str] = []
        produced: list[Tensor] = []
        written: set[int] = set()
        leaf_down: list[tuple[Any, np.ndarray]] = []
        for n in nodes:
            if n.op in VIEW_OPS:
                continue
            srcd = [desc(s) for s in n.src]
            if n.owner.data is None:
                if n.owner is n:  # a fresh result: nothing to copy in
                    on_dev.add(id(n))
                produced.append(n.owner)
            outd = desc(n)
            if n.owner.data is None:
                on_dev.add(id(n.owner))
            elif n.owner.op != "weight" and where.get(id(n.owner)) is not self and id(n.owner) not in written:
                written.add(id(n.owner))  # an unpinned host buffer written here: copied back after the split
                leaf_down.append((outd[0], n.owner.data))
            launches.append(build_step(self, n, srcd, outd))
            if n.op in ("get_rows", "set_rows", "mul_mat_id", "add_id"):
                checks.append(n.name or n.op)
        down = [
            (st["arena"], plan.offsets[id(n)], info.arena[plan.offsets[id(n)] :][: n.nbytes])
            for n in dict.fromkeys(produced)
            if id(n) in info.read_elsewhere
        ]
        dev, err, err_host = self.dev, self._err_buf, self._err_host
        plan = LaunchPlan(self, launches)  # recorded on the first run, replayed after (see plan.py)
        self.stats["plans"] += 1

        def step() -> None:
            for buf, host in leaf_up:
                dev.write(buf, 0, host)
            for buf, off, host in uploads:
                dev.write(buf, off, host)
            plan.run()
            if checks:
                dev.read(err, 0, err_host)
                if err_host[0]:
                    code, val = int(err_host[0]), int(err_host[1])
                    err_host[:] = 0
                    dev.write(err, 0, err_host)
                    what = "expert id" if code == 2 else "row index"
                    raise ComputeError(f"CUDA {'/'.join(checks)}: {what} {val} out of range")
            for buf, off, host in down:
                dev.read(buf, off, host)
            for buf, host in leaf_down:
                dev.read(buf, 0, host)

        return step

    # -- launching ----------------------------------------------------------------------------------------
    # Every device launch of a step goes through ``emit``: it runs the launch and, while a split is being
    # recorded (``LaunchPlan``), appends it to the plan so that later runs replay it as is.
    def launch(self, kernel: Any, n: int, *args: Any) -> None:
        """A grid-stride kernel over ``n`` work items."""
        if n <= 0:
            return
        tpb = 128
        self.emit(kernel, min(-(-n // tpb), 65535), tpb, args)

    def launch_cfg(self, kernel: Any, grid: Any, block: Any, *args: Any) -> None:
        """A kernel with an explicit grid and block (shared-memory kernels: tiled GEMM, block mat-vec)."""
        self.emit(kernel, grid, block, args, grid_stride=False)

    def device_call(self, fn: Callable[[], None]) -> None:
        """Device work that is not a Numba kernel (a cuBLAS GEMM through CuPy), on the device's stream."""
        self.emit(None, None, None, (), call=self.dev.on_stream(fn))

    def emit(
        self, kernel: Any, grid: Any, block: Any, args: tuple, grid_stride: bool = True, call: Any = None
    ) -> None:
        if call is not None:
            ln: Launch = (call, ())
        elif self.dev.sim:
            ln = _sim_launcher(kernel, grid, block, args, grid_stride)
        else:  # pragma: no cover - needs a GPU
            ln = (self.dev.configure(kernel, grid, block), tuple(self.dev.kernel_arg(a) for a in args))
        if self._rec is not None:
            self._rec.append(ln)
        ln[0](*ln[1])


def _sim_launcher(kernel: Any, grid: Any, block: Any, args: tuple, grid_stride: bool) -> Launch:
    """Under the simulator a grid-stride kernel runs as one simulated thread (``device.sim_run``); the
    others through the simulator's own launch (configured at call time: its kernels keep their last
    configuration on the kernel object)."""
    if grid_stride:
        from .device import sim_run

        return (lambda *a: sim_run(kernel, a)), args
    return (lambda *a: kernel[grid, block](*a)), args
