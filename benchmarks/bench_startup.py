"""Start-up cost of the CPU backend: cold (empty Numba cache: kernels compile) vs warm (loaded from
the cache), measured in fresh processes (issue 3, section 5).

    python -m benchmarks.bench_startup [--model smollm2-135m-instruct] [--threads 2]

Each run is a new Python process that loads the model, creates a context and decodes one token;
it reports the time to import llamapy and to finish that first decode. The cold run uses an empty
temporary ``NUMBA_CACHE_DIR``, the warm runs reuse it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import numpy as np
from llamapy import hub
from llamapy.model import Model
from llamapy.context import Context, ContextParams
from llamapy.batch import Batch
t1 = time.perf_counter()
m = Model.load(hub.pull(sys.argv[1], quiet=True))
t2 = time.perf_counter()
ctx = Context(m, ContextParams(n_ctx=256, n_threads=int(sys.argv[2])))
ctx.decode(Batch.from_tokens([1, 2, 3]))
t3 = time.perf_counter()
ctx.decode(Batch.from_tokens([4], pos0=3))
t4 = time.perf_counter()
print(json.dumps(dict(imports=t1 - t0, load=t2 - t1, first_decode=t3 - t2, second_decode=t4 - t3, total=t3 - t0)))
"""


def run(cache: str, model: str, threads: int) -> dict:
    env = dict(os.environ, NUMBA_CACHE_DIR=cache, LLAMAPY_QUIET="1")
    out = subprocess.run(
        [sys.executable, "-c", CHILD, model, str(threads)], env=env, capture_output=True, text=True
    )
    if out.returncode:
        raise SystemExit(out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warm-runs", type=int, default=2)
    args = ap.parse_args()
    print(f"model {args.model}, threads={args.threads}, load average: {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as cache:
        rows = [("cold", run(cache, args.model, args.threads))]
        rows += [("warm", run(cache, args.model, args.threads)) for _ in range(args.warm_runs)]
    for name, r in rows:
        print(f"{name}: " + ", ".join(f"{k} {v:.2f}s" for k, v in r.items()))


if __name__ == "__main__":
    main()
