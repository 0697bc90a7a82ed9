#!/usr/bin/env bash
# Full perplexity runs (llama-perplexity's method) on ../shared/reference/gpl-3.txt with -c 512, for
# comparison with llama.cpp 0c1e570: SmolLM2-135M Q4_1 18.3914, Gemma 3 270M Q4_K_M 13.9062.
# Usage: benchmarks/perplexity.sh [threads]   (prints one "Final estimate" line per model)
set -euo pipefail
cd "$(dirname "$0")/.."
T="${1:-2}"
TEXT=../shared/reference/gpl-3.txt
for m in smollm2-135m-instruct gemma3-270m; do
    path=$(python -m llamapy pull "$m" | tail -1)
    echo "== $m ($path), $(nproc) cores, -t $T"
    python -m llamapy perplexity -m "$path" -f "$TEXT" -c 512 -t "$T"
done
