"""Dequantize throughput per GGML type: GB/s of float32 output, NumPy codec vs Numba kernel (1 and 2 threads).

    python benchmarks/dequantize.py [--elements 4194304] [--repeat 5] [--types q4_0,q4_k] [--out FILE]

Each type gets a tensor of ``--rows`` rows (about ``--elements`` values in all) made by quantizing
Gaussian values (random bytes for the types without a quantizer); the best of ``--repeat`` runs counts.
Numba times exclude compilation (one warm-up call first).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

# run as a script, this folder comes first on sys.path, where a script named like a stdlib module would shadow the
# standard library's tokenize (which numpy.ma -> inspect imports): put the repository root there instead
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root (benchmarks.harness)
from benchmarks.harness import machine_line  # noqa: E402

_HERE = Path(__file__).resolve().parent
sys.path[:] = [str(_HERE.parent)] + [p for p in sys.path if Path(p or ".").resolve() != _HERE]

import numpy as np  # noqa: E402

from llamapy._numba import max_threads, numba, set_num_threads  # noqa: E402
from llamapy.ggml.quants import (  # noqa: E402
    QUANTS,
    dequantize_numpy,
    dequantize_rows_into,
    has_fast_dequantize,
    quantize,
)
from llamapy.ggml.types import TRAITS, GGMLType, type_from_name  # noqa: E402


def machine() -> str:
    return (
        f"{machine_line(python=True)}; NumPy {np.__version__}, Numba {numba.__version__}; "
        f"{platform.system()} {platform.release()}"
    )


def make_raw(t: GGMLType, rows: int, n: int, rng: np.random.Generator) -> np.ndarray:
    if QUANTS[t].can_quantize:
        x = rng.standard_normal((rows, n), dtype=np.float32)
        return np.ascontiguousarray(quantize(x, t))
    tr = TRAITS[t]
    return rng.integers(0, 256, size=(rows, n // tr.block_size * tr.type_size), dtype=np.uint8)


def best(fn, args: tuple, repeat: int) -> float:
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(*args)
        ts.append(time.perf_counter() - t0)
    return min(ts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--elements", type=int, default=1 << 22)
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--types", default="")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    types = (
        [type_from_name(s) for s in a.types.split(",") if s]
        if a.types
        else [t for t in GGMLType if TRAITS[t].quantized or t in (GGMLType.F16, GGMLType.BF16)]
    )
    rng = np.random.default_rng(0)
    lines = [
        f"# dequantize throughput, GB/s of float32 output (best of {a.repeat}); {a.elements} values per type",
        f"# machine: {machine()}",
        f"# command: python benchmarks/dequantize.py {' '.join(sys.argv[1:])}".rstrip(),
        f"{'type':8s} {'numpy':>8s} {'numba-1t':>9s} {'numba-2t':>9s}",
    ]
    print("\n".join(lines), flush=True)
    for t in types:
        bs = TRAITS[t].block_size
        n = max(256, a.elements // a.rows // 256 * 256)
        n -= n % bs
        raw = make_raw(t, a.rows, n, rng)
        out = np.empty((a.rows, n), dtype=np.float32)
        gb = out.nbytes / 1e9
        with np.errstate(all="ignore"):
            t_np = best(dequantize_numpy, (raw, t), a.repeat)
            cols = [f"{gb / t_np:8.2f}"]
            if has_fast_dequantize(t):
                dequantize_rows_into(raw, t, out)  # compile / load from cache
                for nt in (1, 2):
                    if nt > max_threads():
                        cols.append(f"{'-':>9s}")
                        continue
                    set_num_threads(nt)
                    cols.append(f"{gb / best(dequantize_rows_into, (raw, t, out), a.repeat):9.2f}")
                set_num_threads(None)
            else:
                cols += [f"{'-':>9s}", f"{'-':>9s}"]
        line = f"{t.name:8s} " + " ".join(cols)
        lines.append(line)
        print(line, flush=True)
    try:
        layer = numba.threading_layer()
    except ValueError:  # no parallel kernel ran
        layer = "-"
    tail = f"# numba threading layer: {layer}; OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}"
    lines.append(tail)
    print(tail)
    if a.out:
        Path(a.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
