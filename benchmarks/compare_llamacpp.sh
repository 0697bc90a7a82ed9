#!/usr/bin/env bash
# llamapy and llama.cpp side by side on this machine, interleaved in one run:
#   1. speed: llama-bench and `llamapy bench` (pp512, tg128), model by model, alternating, R rounds;
#   2. start-up and peak memory: the whole process `run -p Hello -n 16 -c 4096` (llamapy run vs
#      llama.cpp's llama-completion, or llama-cli -no-cnv), warm caches, /usr/bin/time -v.
# llama.cpp is built from the llama-cpp-python sdist into a cache dir (benchmarks/build_llamacpp.sh);
# it is a yardstick only. Writes benchmarks/results/vs_llamacpp.md with the machine line.
#
# Usage: benchmarks/compare_llamacpp.sh [threads] [rounds] [models...]
#        (models: known names or GGUF paths; default: smollm2-135m-instruct gemma3-270m)
set -euo pipefail
cd "$(dirname "$0")/.."
T="${1:-2}"
R="${2:-2}"
shift $(( $# > 2 ? 2 : $# )) || true
MODELS=("$@")
[ ${#MODELS[@]} -gt 0 ] || MODELS=(smollm2-135m-instruct gemma3-270m)
BIN=$(bash benchmarks/build_llamacpp.sh | tail -1)
OUT=benchmarks/results/vs_llamacpp.md
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')
flags=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -xE 'avx|avx2|fma|f16c|avx512f|avx512_vnni|avx_vnni' | tr '\n' ' ')
{
    echo "# llamapy vs llama.cpp, side by side"
    echo
    echo "- when: $(date -u '+%Y-%m-%d %H:%M UTC'); machine: $(nproc) cores, $cpu; flags: $flags"
    echo "- load average at start: $(cut -d' ' -f1-3 /proc/loadavg); threads: -t $T; rounds: $R"
    echo "- llama.cpp: $(basename "$(dirname "$(dirname "$BIN")")") (llama-cpp-python sdist), native build"
    echo "- command: \`benchmarks/compare_llamacpp.sh $T $R ${MODELS[*]}\`"
    echo
} > "$OUT"

rss_and_time() {  # command... -> "<seconds> <peak RSS MB>"
    /usr/bin/time -v "$@" > /dev/null 2> "$tmp/time.txt" || true
    local wall rss
    wall=$(grep 'Elapsed (wall clock)' "$tmp/time.txt" | awk '{print $NF}' | awk -F: '{ if (NF==3) print $1*3600+$2*60+$3; else print $1*60+$2 }')
    rss=$(grep 'Maximum resident set size' "$tmp/time.txt" | awk '{printf "%.0f", $NF/1024}')
    echo "$wall $rss"
}

for m in "${MODELS[@]}"; do
    path=$(python3 -m llamapy pull "$m" 2>/dev/null | tail -1)
    name=$(basename "$path")
    echo "## $name" >> "$OUT"
    echo >> "$OUT"
    echo '```' >> "$OUT"
    for r in $(seq "$R"); do
        echo "# round $r: llama.cpp" >> "$OUT"
        "$BIN/llama-bench" -m "$path" -p 512 -n 128 -t "$T" -r 3 -o md 2>/dev/null | grep -E '^\|' >> "$OUT"
        echo "# round $r: llamapy" >> "$OUT"
        python3 -m llamapy bench -m "$path" -p 512 -n 128 -t "$T" -r 3 -o md 2>/dev/null | grep -E '^\|' >> "$OUT"
    done
    echo '```' >> "$OUT"
    echo >> "$OUT"
    # start-up and peak RSS (warm: one untimed run of each first)
    if [ -x "$BIN/llama-completion" ]; then
        lc=("$BIN/llama-completion" -m "$path" -p Hello -n 16 -c 4096 -t "$T" -no-cnv --no-warmup)
    else
        lc=("$BIN/llama-cli" -m "$path" -p Hello -n 16 -c 4096 -t "$T" -no-cnv --no-warmup)
    fi
    lp=(python3 -m llamapy run -m "$path" -p Hello -n 16 -c 4096 -t "$T")
    "${lc[@]}" > /dev/null 2>&1 < /dev/null || true
    "${lp[@]}" > /dev/null 2>&1 < /dev/null || true
    echo "| whole process \`run -p Hello -n 16 -c 4096\` | round | seconds | peak RSS MB |" >> "$OUT"
    echo "| --- | ---: | ---: | ---: |" >> "$OUT"
    for r in $(seq "$R"); do
        read -r s mb < <(rss_and_time "${lc[@]}" < /dev/null)
        echo "| llama.cpp | $r | $s | $mb |" >> "$OUT"
        read -r s mb < <(rss_and_time "${lp[@]}" < /dev/null)
        echo "| llamapy | $r | $s | $mb |" >> "$OUT"
    done
    echo >> "$OUT"
done
echo "- load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT"
cat "$OUT"
