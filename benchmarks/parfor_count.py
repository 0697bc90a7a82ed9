"""How many parallel regions each parallel kernel of a model's run has (Numba's parfors after fusion).

A kernel compiled with ``parallel=True`` runs each of its parfors as one launch of the thread pool (~1-2 us
on a 2-core VM, even with one thread). Its ``prange`` loops are parfors, and so are, implicitly, its
array expressions outside them: ``np.zeros``/``np.ones``/``np.full``, ``a[:] = value``, whole-array
arithmetic and reductions. A decode kernel with one such expression pays a second launch per call. This
tool compiles the kernels that a short generation on each file calls into a fresh Numba cache (a
cached load carries no parfor diagnostics) and lists, per parallel kernel, its parfor count; more than one
is marked. A count includes ``prange`` loops on paths a decode never takes (a kernel's branch for many
activation rows), so read the kernel before changing it.

    python benchmarks/parfor_count.py MODEL.gguf [MODEL.gguf ...]

Stop 60 (7 files: SmolLM2, Gemma 3 270M, the 0.5B / 1.5B shapes in four mixes, the MoE shape): three
kernels had an implicit parfor on the decode path: ``attn_group_f16x8`` (two: ``np.zeros`` and ``pm[:] =``),
``attn_split`` and the MoE kernels' activation quantizer (``np.ones``); see
``benchmarks/results/stop60_attention.md``.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", help="GGUF files")
    ap.add_argument("-t", "--threads", type=int, default=2)
    a = ap.parse_args()
    # a fresh cache: parfor diagnostics exist only for kernels compiled in this process
    os.environ["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="parfor_count_")
    from llamapy import Llama

    prompt = "Hello there, how are you doing today? I would like to know a few things about the world."
    for path in a.models:
        m = Llama(model_path=os.path.expanduser(path), n_ctx=512, verbose=False, n_threads=a.threads)
        m(prompt, max_tokens=4)  # the prompt path and the decode path
        del m
    rows = []
    for o in gc.get_objects():
        if type(o).__name__ != "CPUDispatcher" or not o.targetoptions.get("parallel"):
            continue
        for sig in o.signatures:
            diag = o.get_metadata(sig).get("parfor_diagnostics")
            if diag is not None:
                rows.append((len(diag.get_parfors()), o.py_func.__module__, o.py_func.__name__))
    print("| parfors | kernel |\n| ---: | --- |")
    for n, mod, name in sorted(set(rows), key=lambda r: (-r[0], r[1], r[2])):
        print(f"| {n}{' (more than one)' if n > 1 else ''} | `{mod}.{name}` |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
