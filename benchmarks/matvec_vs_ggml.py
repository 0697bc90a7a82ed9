"""One-thread mat-vec kernel speed against llama.cpp's own, with the weight hot in L2: llamapy's repacked
eight-row kernel (``mm_<type>_x8``) against ggml's ``vec_dot`` for the type (through ctypes,
``ggml_get_type_traits_cpu`` of the AVX2 build's libggml-cpu.so; the activation quantized once by ggml's
``from_float`` of its ``vec_dot_type``, outside the timing). Both get the same random rows (quantized
by llamapy), the same activation; the outputs are checked to agree (within 1 % of the largest: ggml's Q8_0 rows
multiply Q8_0 activations, llamapy's Q8_K ones).

    python benchmarks/matvec_vs_ggml.py [--types Q4_K,Q5_K,Q6_K] [--rows 256] [--cols 1024] [--reps 2000]

This is the compute side of a decode step's mat-vec (how many weight bytes a core can turn into dot
products per second when memory is not in the way), so a kernel slower than ggml's here is slower in a
decode whenever the memory bus is not the only limit. Wall seconds, best of 5 rounds, GB/s of weight
bytes. llamapy's kernel also quantizes its activation inside the call (ggml's is excluded): that is
~0.3 us a call at 1024 columns, ~3 % of the default shape's time. ggml's ``vec_dot`` is called
row by row from a Numba loop (no Python between calls).
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import time
from pathlib import Path

import numpy as np

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.harness import llamacpp_bin, machine_line  # noqa: E402

GGML_TYPE = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}


#: type -> (llamapy's x8 layout module, its one-row kernel)
X8 = {
    "Q4_0": ("q40_x8", "mm_q4_0_x8"), "Q4_1": ("q40_x8", "mm_q4_1_x8"), "Q5_0": ("q50_x8", "mm_q5_0_x8"),
    "Q8_0": ("q80_x8", "mm_q8_0_x8"), "Q4_K": ("q4k_x8", "mm_q4_k_x8"), "Q5_K": ("q5k_x8", "mm_q5_k_x8"),
    "Q6_K": ("q6k_x8", "mm_q6_k_x8"),
}  # fmt: skip


class Traits(ctypes.Structure):
    _fields_ = [
        ("from_float", ctypes.c_void_p),
        ("vec_dot", ctypes.c_void_p),
        ("vec_dot_type", ctypes.c_int),
        ("nrows", ctypes.c_int64),
    ]


FROM_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
#: ggml_vec_dot_t with its pointers as integers (the same registers on x86-64), so that a Numba loop
#: can call it without Python in between
VEC_DOT = ctypes.CFUNCTYPE(
    None, ctypes.c_int, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_size_t,
    ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int,
)  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--types", default="Q4_K,Q5_K,Q6_K")
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--cols", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=2000)
    a = ap.parse_args()

    import importlib

    import numba

    from llamapy.ggml import GGMLType
    from llamapy.ggml.quants import quantize

    numba.set_num_threads(1)
    lib_dir = llamacpp_bin()
    base = ctypes.CDLL(str(lib_dir / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL(str(lib_dir / "libggml-cpu.so"))
    cpu.ggml_cpu_init()
    cpu.ggml_get_type_traits_cpu.restype = ctypes.POINTER(Traits)
    base.ggml_row_size.restype = ctypes.c_size_t
    base.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    print(f"# {machine_line()}; 1 thread; weight {a.rows} x {a.cols} (hot in L2); {a.reps} calls a round")
    print("| type | llama.cpp vec_dot GB/s | llamapy kernel | GB/s | ratio |")
    print("| --- | ---: | --- | ---: | ---: |")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, a.cols)).astype(np.float32)
    for name in a.types.split(","):
        gt = GGMLType[name]
        W = quantize(rng.standard_normal((a.rows, a.cols)).astype(np.float32), gt).reshape(a.rows, -1)
        W = np.ascontiguousarray(W)
        tr = cpu.ggml_get_type_traits_cpu(GGML_TYPE[name]).contents
        vdt = tr.vec_dot_type
        y = np.zeros(base.ggml_row_size(vdt, a.cols) + 64, np.uint8)
        FROM_FLOAT(cpu.ggml_get_type_traits_cpu(vdt).contents.from_float)(
            x.ctypes.data, y.ctypes.data, a.cols
        )
        dot = VEC_DOT(tr.vec_dot)
        s = np.zeros(a.rows, np.float32)
        rb = W.shape[1]

        @numba.njit(cache=False)
        def rows_loop(n, s, W, y, rows, rb):  # pragma: no cover - compiled
            sp, wp, yp = s.ctypes.data, W.ctypes.data, y.ctypes.data
            for r in range(rows):
                dot(n, sp + 4 * r, 0, wp + r * rb, 0, yp, 0, 1)  # noqa: B023  (compiled now, with this dot)

        def ggml_call(W=W, s=s, y=y, rb=rb, f=rows_loop) -> None:
            f(a.cols, s, W, y, a.rows, rb)

        mod, kname = X8[name]
        R = importlib.import_module(f"llamapy.ggml.cpu.{mod}").repack(W, gt)
        kern = getattr(importlib.import_module(f"llamapy.ggml.cpu.{mod}_kernels"), kname)
        out = np.zeros((1, a.rows), np.float32)
        kern(R, x, out, 0)
        ggml_call()
        assert np.allclose(out[0], s, rtol=0, atol=1e-2 * np.abs(s).max()), (out[0][:4], s[:4])
        nbytes = W.nbytes

        def timed(fn) -> float:
            best = 1e9
            for _ in range(5):
                t = time.perf_counter()
                for _ in range(a.reps // 10):
                    fn()
                best = min(best, (time.perf_counter() - t) / (a.reps // 10))
            return best

        t_g = timed(ggml_call)
        t_l = timed(lambda kern=kern, R=R, out=out: kern(R, x, out, 0))
        g, l_ = nbytes / t_g / 1e9, nbytes / t_l / 1e9
        print(f"| {name} | {g:.1f} | {kname} | {l_:.1f} | {l_ / g:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
