#!/usr/bin/env bash
# llama-bench-style speed of both real models (pp512, tg128, 5 repetitions) plus a profile of tg.
# llama.cpp on this machine kind (-t 2): SmolLM2 pp512 336 t/s, tg128 95.3 t/s; Gemma 3 270M 692 / 47.6.
# Usage: benchmarks/bench.sh [threads] [repetitions]
set -euo pipefail
cd "$(dirname "$0")/.."
T="${1:-2}"
R="${2:-5}"
echo "$(nproc) cores, load: $(cut -d' ' -f1-3 /proc/loadavg)"
for m in smollm2-135m-instruct gemma3-270m; do
    path=$(python -m llamapy pull "$m" | tail -1)
    python -m llamapy bench -m "$path" -p 512 -n 128 -r "$R" -t "$T" --profile
done
