"""The one place llamapy imports Numba: kernels compile lazily with ``cache=True`` into a writable
per-user cache (``$NUMBA_CACHE_DIR``, else ``<llamapy cache>/numba/<digest>``), and the thread count
is set here.

The digest covers the source of every kernel module. Numba invalidates a cached function only when
its own file changes, not when an inlined helper or intrinsic from another file does (measured: a
changed ``simd.py`` kept running the old mat-vec kernels), so each version of the kernel sources gets
its own directory.

Use ``from llamapy._numba import njit, prange, set_num_threads`` in kernel modules.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def kernel_sources_digest() -> str:
    """Short hash of the files whose code ends up in cached kernels."""
    root = Path(__file__).resolve().parent
    files = [
        root / "_numba.py",
        *(root / "ggml" / "cpu").glob("*.py"),
        *(root / "ggml" / "quants").glob("*.py"),
    ]
    h = hashlib.sha256()
    for f in sorted(files):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


if "NUMBA_CACHE_DIR" not in os.environ:
    from .hub import cache_dir

    os.environ["NUMBA_CACHE_DIR"] = str(cache_dir() / "numba" / kernel_sources_digest())

# OMP_WAIT_POLICY is left to the user. GNU OpenMP's default (spin briefly, then sleep; less spinning when
# oversubscribed) measured best on a quiet 2-core machine: SmolLM2 tg 44 t/s with 2 threads, against 22 t/s
# with PASSIVE (every kernel launch then pays a thread wake-up). On a machine busy with other work,
# OMP_WAIT_POLICY=PASSIVE avoids spinning against the other processes.
import numba  # noqa: E402
from llvmlite import ir  # noqa: E402
from numba import njit, prange, types  # noqa: E402
from numba.core import cgutils  # noqa: E402
from numba.extending import intrinsic  # noqa: E402

__all__ = [
    "numba",
    "njit",
    "prange",
    "set_num_threads",
    "max_threads",
    "bitcast_f32",
    "fbits",
    "prefetch",
    "kernel_sources_digest",
]


@intrinsic
def bitcast_f32(typingctx, v):  # type: ignore[no-untyped-def]
    """The float32 whose bits are the low 32 bits of the integer ``v`` (vectorizes, unlike a view
    through an array)."""
    if not isinstance(v, types.Integer):
        return None

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        i32 = ir.IntType(32)
        x = args[0]
        if x.type.width > 32:
            x = builder.trunc(x, i32)
        elif x.type.width < 32:
            x = builder.sext(x, i32) if signature.args[0].signed else builder.zext(x, i32)
        return builder.bitcast(x, ir.FloatType())

    return types.float32(v), codegen


@intrinsic
def fbits(typingctx, v, mask):  # type: ignore[no-untyped-def]
    """``float32(v & mask)`` computed in 32-bit integers. Numba widens every integer operation to 64
    bits, and LLVM then vectorizes byte unpacking in 64-bit lanes (4 per AVX2 register instead of 8);
    kernels unpack quant bits through this instead. ``v`` is an unsigned byte or any integer whose
    value fits 32 bits."""
    if not isinstance(v, types.Integer) or not isinstance(mask, types.Integer):
        return None

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        i32 = ir.IntType(32)
        vals = []
        for val, ty in zip(args, signature.args, strict=True):
            if val.type.width > 32:
                val = builder.trunc(val, i32)
            elif val.type.width < 32:
                val = builder.sext(val, i32) if ty.signed else builder.zext(val, i32)
            vals.append(val)
        return builder.sitofp(builder.and_(vals[0], vals[1]), ir.FloatType())

    return types.float32(v, mask), codegen


@intrinsic
def prefetch(typingctx, arr, idx):  # type: ignore[no-untyped-def]
    """Hint the CPU to fetch the cache line of ``arr.flat[idx]`` (a C-contiguous 1-D array) for reading.
    Never faults, even out of bounds; the kernels still keep ``idx`` in bounds."""
    if not isinstance(arr, types.Array) or not isinstance(idx, types.Integer):
        return None

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        i = context.cast(builder, args[1], signature.args[1], types.intp)
        i8p = ir.IntType(8).as_pointer()
        ptr = builder.bitcast(builder.gep(ary.data, [i]), i8p)
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
        builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return types.void(arr, idx), codegen


def max_threads() -> int:
    return numba.config.NUMBA_NUM_THREADS


def set_num_threads(n: int | None) -> int:
    """Use ``n`` threads in parallel kernels (None or <= 0: all cores); returns the count in effect."""
    n = max_threads() if not n or n <= 0 else min(int(n), max_threads())
    numba.set_num_threads(n)
    return n
