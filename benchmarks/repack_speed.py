"""How fast each repacked type's ``repack_x8`` runs, and a hash of what it writes (issue 25: the first
evaluation repacks every weight, so a model's time to first token holds this once).

    python benchmarks/repack_speed.py [--threads 1] [--types Q4_K,Q6_K] [--rounds 15]
    PYTHONPATH=/path/to/other/checkout python benchmarks/repack_speed.py   # the same for other code

Per type and shape (rows x columns): random plain bytes, the layout's ``repack`` into one destination
allocated once (so the time is the kernel's, not fresh pages'), the median of ``--rounds`` calls in ms,
and the first 16 hex digits of the SHA-256 of the repacked bytes. Two checkouts writing the same hashes
repack alike, bit for bit. The source is in cache (each call repeats it).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import statistics
import time

import numpy as np


def _types() -> dict[str, tuple[str, int, int]]:
    """type name -> (layout module, plain block bytes, weights per block), from ``repack.LAYOUTS``."""
    from llamapy.ggml.cpu.repack import LAYOUTS
    from llamapy.ggml.types import TRAITS

    return {t.name: (m, TRAITS[t].type_size, TRAITS[t].block_size) for t, m in LAYOUTS.items()}


#: type -> (layout module, plain block bytes, weights per block)
TYPES = _types()
SHAPES = [(8, 256), (64, 1536), (2048, 1536), (1536, 8960)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--types", default=",".join(TYPES))
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()

    import llamapy
    import llamapy._numba as ln
    import llamapy.ggml.cpu.repack as rp
    from llamapy.ggml.types import GGMLType

    ln.set_num_threads(args.threads)
    fresh = rp.anonymous
    buffers: dict[int, np.ndarray] = {}

    def once(n: int) -> np.ndarray:  # one destination per size: the kernel's time, not fresh pages'
        if n not in buffers:
            buffers[n] = fresh(n)
        return buffers[n]

    rp.anonymous = once
    print(f"# {llamapy.__file__}, {args.threads} thread(s), median of {args.rounds} calls")
    print(f"{'type':5} {'shape':10} {'ms':>8} {'GB/s':>6}  sha256[:16]")
    for name in args.types.split(","):
        mod, sbytes, qk = TYPES[name]
        m = importlib.import_module("llamapy.ggml.cpu." + mod)
        t = GGMLType[name]
        for n, k in SHAPES:
            rng = np.random.default_rng(n + k)
            A = rng.integers(0, 256, (n, k // qk * sbytes), dtype=np.uint8)
            R = m.repack(A, t)
            digest = hashlib.sha256(R.tobytes()).hexdigest()[:16]
            times = []
            for _ in range(args.rounds):
                s = time.perf_counter()
                m.repack(A, t)
                times.append(time.perf_counter() - s)
            ms = statistics.median(times) * 1e3
            print(f"{name:5} {f'{n}x{k}':10} {ms:8.3f} {A.nbytes / ms / 1e6:6.2f}  {digest}", flush=True)


if __name__ == "__main__":
    main()
