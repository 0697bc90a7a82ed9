#!/usr/bin/env bash
# The brief's machine kind (AVX2 + FMA, no AVX-512) on a machine that has AVX-512: llama.cpp built
# for AVX2 only (build_llamacpp.sh with LLAMACPP_ARCH=avx2) against llamapy with Numba targeting
# Haswell (NUMBA_CPU_NAME=haswell, AVX-512 off), llama-bench and `llamapy bench` interleaved:
# pp512 and tg128, then tg64 at context depth 4096. Writes benchmarks/results/vs_llamacpp_avx2.md.
#
# Usage: benchmarks/compare_avx2.sh [threads] [rounds] [models...]
#        benchmarks/compare_avx2.sh --quick|--mid|--full [vs_llamacpp.py options]: issue 25's rows, both tools
#        limited to AVX2 (benchmarks/vs_llamacpp.py --avx2; --quick is ~10 minutes on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in --quick|--mid|--full) exec python3 benchmarks/vs_llamacpp.py --avx2 "$@" ;; esac
T="${1:-2}"
R="${2:-2}"
shift $(( $# > 2 ? 2 : $# )) || true
MODELS=("$@")
[ ${#MODELS[@]} -gt 0 ] || MODELS=(smollm2-135m-instruct gemma3-270m)
BIN=$(LLAMACPP_ARCH=avx2 LLAMACPP_TOOLS=llama-bench bash benchmarks/build_llamacpp.sh "$(python3 -c 'from benchmarks.harness import LLAMACPP_VERSION as v; print(v)')" | tail -1)
PY=$(python3 -c 'import sys; print(sys.executable)')
unset PYTHONDONTWRITEBYTECODE
export NUMBA_CPU_NAME=haswell
export NUMBA_CPU_FEATURES=+avx,+avx2,+fma,+f16c,+bmi,+bmi2,+popcnt,+lzcnt,+movbe,+sse4.2,+sse4.1,+ssse3,-avx512f
export OPENBLAS_CORETYPE=Haswell  # NumPy's OpenBLAS: the AVX2 + FMA sgemm kernels, not AVX-512
OUT="${OUT:-benchmarks/results/vs_llamacpp_avx2.md}"
machine=$("$PY" -c 'from benchmarks.harness import machine_line; print(machine_line())')
{
    echo "# llamapy vs llama.cpp, both limited to AVX2 + FMA (no AVX-512)"
    echo
    echo "- when: $(date -u '+%Y-%m-%d %H:%M UTC'); machine: $machine (the host has AVX-512; neither tool uses it here)"
    echo "- llama.cpp: $(cat "$BIN/../flags")"
    echo "- llamapy: NUMBA_CPU_NAME=$NUMBA_CPU_NAME NUMBA_CPU_FEATURES=$NUMBA_CPU_FEATURES"
    echo "- load average at start: $(cut -d' ' -f1-3 /proc/loadavg); threads: -t $T; rounds: $R"
    echo "- command: \`benchmarks/compare_avx2.sh $T $R ${MODELS[*]}\`"
    echo
} > "$OUT"
for m in "${MODELS[@]}"; do
    path=$("$PY" -m llamapy pull "$m" 2>/dev/null | tail -1)
    "$PY" -m llamapy bench -m "$path" -p 16 -n 4 -r 1 > /dev/null 2>&1  # kernels for this target
    echo "## $(basename "$path")" >> "$OUT"
    echo >> "$OUT"
    echo '```' >> "$OUT"
    for r in $(seq "$R"); do
        echo "# round $r: llama.cpp (AVX2)" >> "$OUT"
        "$BIN/llama-bench" -m "$path" -p 512 -n 128 -t "$T" -r 3 -o md 2>/dev/null | grep -E '^\|' >> "$OUT"
        "$BIN/llama-bench" -m "$path" -p 0 -n 64 -d 4096 -t "$T" -r 3 -o md 2>/dev/null | grep -E '^\|' | grep -vE '^\| (model |-)' >> "$OUT"
        echo "# round $r: llamapy (Haswell target)" >> "$OUT"
        "$PY" -m llamapy bench -m "$path" -p 512 -n 128 -t "$T" -r 3 -o md 2>/dev/null | grep -E '^\|' >> "$OUT"
        "$PY" -m llamapy bench -m "$path" -p 0 -n 64 -d 4096 -t "$T" -r 3 -o md 2>/dev/null | grep -E '^\|' | grep -vE '^\| (model |-)' >> "$OUT"
    done
    echo '```' >> "$OUT"
    echo >> "$OUT"
done
echo "- load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT"
cat "$OUT"
