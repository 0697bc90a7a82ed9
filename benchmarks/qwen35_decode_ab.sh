#!/bin/bash
# Interleaved CPU ms per decoded token, 1 thread: llamapy from another tree (BEFORE, e.g. an older commit
# unpacked with `git archive <commit> | tar -x -C DIR`), llamapy from this tree, and llama.cpp's AVX2
# llama-bench (tg16/tg64 rusage difference), ROUNDS times. Set NUMBA_CPU_NAME / NUMBA_CPU_FEATURES /
# NUMBA_CACHE_DIR in the environment as the results file says.
#     benchmarks/qwen35_decode_ab.sh BEFORE_DIR MODEL.gguf [ROUNDS]
set -euo pipefail
OLD=$1
F=$2
ROUNDS=${3:-6}
HERE=$(cd "$(dirname "$0")/.." && pwd)
for r in $(seq 1 "$ROUNDS"); do
  echo "round $r load $(cut -d' ' -f1-3 /proc/loadavg)"
  (cd "$OLD" && python3 benchmarks/tg_cputime.py "$F" --threads 1 --tokens 32 | grep '^llamapy' | sed 's/^/before /')
  (cd "$HERE" && python3 benchmarks/tg_cputime.py "$F" --threads 1 --tokens 32 | grep '^llamapy' | sed 's/^/after  /')
  (cd "$HERE" && python3 -c "
import sys
from benchmarks.tg_cputime import llamacpp_cpu_per_token
c, w = llamacpp_cpu_per_token(sys.argv[1], 1, 48)
print(f'llama.cpp: {c * 1e3:.2f} CPU ms/token (wall {w * 1e3:.1f})')" "$F")
done
echo "end load $(cut -d' ' -f1-3 /proc/loadavg)"
