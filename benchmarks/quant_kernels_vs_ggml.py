"""Per-kernel CPU time of llamapy's row quantizers against llama.cpp's ``ggml_quantize_chunk`` (through
ctypes, libggml-base.so of the AVX2 build), one thread, the same random rows; checks the bytes are equal.

    python benchmarks/quant_kernels_vs_ggml.py [--types Q3_K,Q4_K] [--rows 256] [--cols 1536] [--reps 5]

CPU time (time.process_time, min over reps) since the machine is shared; the ratio is llamapy / ggml.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import ctypes  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from benchmarks.harness import llamacpp_bin  # noqa: E402

TYPES = "Q8_0,Q4_0,Q4_1,Q5_0,Q5_1,Q2_K,Q3_K,Q4_K,Q5_K,Q6_K,IQ4_NL,IQ4_XS"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--types", default=TYPES)
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--cols", type=int, default=1536)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--imatrix", choices=("no", "yes", "both"), default="both")
    a = ap.parse_args()
    from llamapy.ggml.quants import quantize
    from llamapy.ggml.types import TRAITS, GGMLType

    lib = ctypes.CDLL(str(llamacpp_bin("avx2") / "libggml-base.so"))
    fn = lib.ggml_quantize_chunk
    fn.restype = ctypes.c_size_t
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                   ctypes.c_int64, ctypes.c_void_p]  # fmt: skip
    lib.ggml_quantize_init.argtypes = [ctypes.c_int]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((a.rows, a.cols)).astype(np.float32)
    im = (rng.random(a.cols, dtype=np.float32) * 4 + 0.01).astype(np.float32)
    modes = {"no": [False], "yes": [True], "both": [False, True]}[a.imatrix]
    print("| type | imatrix | ggml CPU ms | llamapy CPU ms | ratio | bytes |")
    print("|---|---|---|---|---|---|")
    for name in a.types.split(","):
        t = GGMLType[name]
        lib.ggml_quantize_init(int(t))
        tr = TRAITS[t]
        out = np.empty((a.rows, a.cols // tr.block_size * tr.type_size), np.uint8)
        for use_im in modes:
            w = im if use_im else None
            quantize(x[:2], t, w)  # compile / load
            tc, tp = [], []
            for _ in range(a.reps):
                c0 = time.process_time()
                fn(
                    int(t),
                    x.ctypes.data,
                    out.ctypes.data,
                    0,
                    a.rows,
                    a.cols,
                    0 if w is None else w.ctypes.data,
                )
                tc.append(time.process_time() - c0)
                c0 = time.process_time()
                ours = quantize(x, t, w)
                tp.append(time.process_time() - c0)
            same = "identical" if np.array_equal(ours, out) else "DIFFER"
            c, p = min(tc) * 1e3, min(tp) * 1e3
            print(
                f"| {name} | {'yes' if use_im else 'no'} | {c:.1f} | {p:.1f} | {p / c:.2f} | {same} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
