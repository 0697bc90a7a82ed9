"""CPU time of one prompt decode (``Context.decode`` of N tokens, best of 3): a load-robust A/B of the
prompt path. ``old`` empties ``backend.MATVEC_MAX_ROWS`` (tiles + sgemm from 17 rows), ``new`` keeps it.

    python benchmarks/pp_cputime.py {old,new} MODEL.gguf THREADS N
"""

import os
import sys
import time

import numpy as np

from llamapy.ggml.cpu import backend

if sys.argv[1] == "old":
    backend.MATVEC_MAX_ROWS.clear()
from llamapy.batch import Batch
from llamapy.context import Context, ContextParams
from llamapy.model import Model

model = Model.load(os.path.expanduser(sys.argv[2]))
T = int(sys.argv[3])
n = int(sys.argv[4])
ctx = Context(model, ContextParams(n_ctx=1024, n_threads=T, n_batch=512, n_ubatch=512))
rng = np.random.default_rng(0)
toks = rng.integers(0, model.n_vocab, n)
ctx.decode(Batch.from_tokens(toks, pos0=0))
ctx.memory.seq_rm(0, 0, -1)
cpu = []
wall = []
for _ in range(3):
    c, w = time.process_time(), time.perf_counter()
    ctx.decode(Batch.from_tokens(toks, pos0=0))
    cpu.append(time.process_time() - c)
    wall.append(time.perf_counter() - w)
    ctx.memory.seq_rm(0, 0, -1)
print(
    f"{sys.argv[1]} pp{n} t={T}: cpu min {min(cpu):.3f}s wall min {min(wall):.3f}s -> {n / min(wall):.1f} t/s (wall), {n * T / min(cpu):.1f} t/s (cpu-equiv)  load {os.getloadavg()[0]:.1f}"
)
