#!/usr/bin/env bash
# llamapy and llama.cpp side by side on this machine, interleaved in one run:
#   1. speed: llama-bench and `llamapy bench` (pp512, tg128), model by model, alternating, R rounds;
#   2. long context: tg64 after filling the context to depth 0/1024/2048/4096/8192 (llama-bench -d and
#      `llamapy bench -d`), depth by depth, alternating;
#   3. start-up and peak memory: the whole process `run -p Hello -n 16 -c 4096` (llamapy run vs
#      llama.cpp's llama-completion, or llama-cli -no-cnv), warm caches, /usr/bin/time -v;
#   4. server (first model only, or SERVER_MODEL): llama-server and `llamapy serve`, -np 4, streamed
#      128-token chats, aggregate t/s at 1/4/16/32 concurrent clients, none lost, TTFT of the first
#      request after start vs a later one (benchmarks/server_compare.py), the two servers alternating;
#   5. a busy machine (first model): tg32 with and without a one-core CPU hog, each tool with its
#      default thread count and with -t all cores (benchmarks/bench_busy.py).
# llama.cpp is built from the llama-cpp-python sdist into a cache dir (benchmarks/build_llamacpp.sh);
# it is a yardstick only. Writes benchmarks/results/vs_llamacpp.md with the machine line.
#
# Usage: benchmarks/compare_llamacpp.sh [threads] [rounds] [models...]
#        (models: known names or GGUF paths; default: smollm2-135m-instruct gemma3-270m)
# Environment: DEPTHS (default 0,1024,2048,4096,8192; empty: skip), SERVER=0 skips the server test,
#              CLIENTS (default 1,4,16,32), SERVER_MODEL (default: the first model), OUT (the report),
#              START_RUNS (start-up runs per round, default 3), BUSY=0 skips the busy-machine test.
#
# Issue 25's rows (real files, llama-quantize'd 1.5B-8B shapes, the MoE shape, pp64/pp512, depth, run -p
# Hello, GB/s and the bandwidth fraction): benchmarks/compare_llamacpp.sh --quick|--mid|--full [vs_llamacpp.py
# options] runs benchmarks/vs_llamacpp.py (see its docstring; --quick is ~10 minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in --quick|--mid|--full) exec python3 benchmarks/vs_llamacpp.py "$@" ;; esac
T="${1:-2}"
R="${2:-2}"
shift $(( $# > 2 ? 2 : $# )) || true
MODELS=("$@")
[ ${#MODELS[@]} -gt 0 ] || MODELS=(smollm2-135m-instruct gemma3-270m)
DEPTHS="${DEPTHS-0,1024,2048,4096,8192}"
CLIENTS="${CLIENTS:-1,4,16,32}"
SERVER="${SERVER:-1}"
BUSY="${BUSY:-1}"
START_RUNS="${START_RUNS:-3}"
BIN=$(bash benchmarks/build_llamacpp.sh "$(python3 -c 'from benchmarks.harness import LLAMACPP_VERSION as v; print(v)')" | tail -1)
# the interpreter itself, not a wrapper in front of it (a pyenv shim is a bash script: +0.05-0.15 s a
# process), and .pyc files written as on any normal install (some shells set PYTHONDONTWRITEBYTECODE)
PY=$(python3 -c 'import sys; print(sys.executable)')
unset PYTHONDONTWRITEBYTECODE
OUT="${OUT:-benchmarks/results/vs_llamacpp.md}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

machine=$("$PY" -c 'from benchmarks.harness import machine_line; print(machine_line())')
{
    echo "# llamapy vs llama.cpp, side by side"
    echo
    echo "- when: $(date -u '+%Y-%m-%d %H:%M UTC'); machine: $machine"
    echo "- load average at start: $(cut -d' ' -f1-3 /proc/loadavg); threads: -t $T; rounds: $R"
    echo "- llama.cpp: $(basename "$(dirname "$(dirname "$BIN")")") (llama-cpp-python sdist), native build"
    echo "- command: \`benchmarks/compare_llamacpp.sh $T $R ${MODELS[*]}\`; llamapy runs as \`$PY -m llamapy\`"
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
    path=$("$PY" -m llamapy pull "$m" 2>/dev/null | tail -1)
    name=$(basename "$path")
    echo "## $name" >> "$OUT"
    echo >> "$OUT"
    echo '```' >> "$OUT"
    for r in $(seq "$R"); do
        echo "# round $r: llama.cpp" >> "$OUT"
        "$BIN/llama-bench" -m "$path" -p 512 -n 128 -t "$T" -r 3 -o md 2>/dev/null | grep -E '^\|' >> "$OUT"
        echo "# round $r: llamapy" >> "$OUT"
        "$PY" -m llamapy bench -m "$path" -p 512 -n 128 -t "$T" -r 3 -o md 2>/dev/null | grep -E '^\|' >> "$OUT"
    done
    echo '```' >> "$OUT"
    echo >> "$OUT"
    if [ -n "$DEPTHS" ]; then
        # long context: tg64 at each depth, llama.cpp then llamapy, depth by depth
        echo '```' >> "$OUT"
        echo "# tg64 by context depth (-d), load average $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT"
        echo "| model | size | params | backend | threads | test | t/s |" >> "$OUT"
        for r in $(seq "$R"); do
            for d in ${DEPTHS//,/ }; do
                echo "# round $r, depth $d: llama.cpp" >> "$OUT"
                "$BIN/llama-bench" -m "$path" -p 0 -n 64 -d "$d" -t "$T" -r 3 -o md 2>/dev/null | grep -E '^\|' | grep -vE '^\| (model |-)' >> "$OUT" || true
                echo "# round $r, depth $d: llamapy" >> "$OUT"
                "$PY" -m llamapy bench -m "$path" -p 0 -n 64 -d "$d" -t "$T" -r 3 -o md 2>/dev/null | grep -E '^\|' | grep -vE '^\| (model |-)' >> "$OUT" || true
            done
        done
        echo '```' >> "$OUT"
        echo >> "$OUT"
    fi
    # start-up and peak RSS (warm: one untimed run of each first)
    if [ -x "$BIN/llama-completion" ]; then
        lc=("$BIN/llama-completion" -m "$path" -p Hello -n 16 -c 4096 -t "$T" -no-cnv --no-warmup)
    else
        lc=("$BIN/llama-cli" -m "$path" -p Hello -n 16 -c 4096 -t "$T" -st --no-warmup)  # this llama-cli has no -no-cnv
    fi
    lp=("$PY" -m llamapy run -m "$path" -p Hello -n 16 -c 4096 -t "$T")
    "${lc[@]}" > /dev/null 2>&1 < /dev/null || true
    "${lp[@]}" > /dev/null 2>&1 < /dev/null || true
    echo "| whole process \`run -p Hello -n 16 -c 4096\` | round | seconds | peak RSS MB |" >> "$OUT"
    echo "| --- | ---: | ---: | ---: |" >> "$OUT"
    for r in $(seq "$R"); do
        for i in $(seq "$START_RUNS"); do
            read -r s mb < <(rss_and_time "${lc[@]}" < /dev/null)
            echo "| llama.cpp | $r.$i | $s | $mb |" >> "$OUT"
            read -r s mb < <(rss_and_time "${lp[@]}" < /dev/null)
            echo "| llamapy | $r.$i | $s | $mb |" >> "$OUT"
        done
    done
    echo >> "$OUT"
done
if [ "$SERVER" != 0 ]; then
    spath=$("$PY" -m llamapy pull "${SERVER_MODEL:-${MODELS[0]}}" 2>/dev/null | tail -1)
    echo "## server: $(basename "$spath"), -np 4, streamed 128-token chats" >> "$OUT"
    echo >> "$OUT"
    echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT"
    echo >> "$OUT"
    echo "| server | round | clients | requests ok/sent | tokens | seconds | aggregate t/s | TTFT median s |" >> "$OUT"
    echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |" >> "$OUT"
    for r in $(seq "$R"); do
        for tool in llama.cpp llamapy; do
            "$PY" benchmarks/server_compare.py --server "$tool" --bin "$BIN" -m "$spath" -t "$T" \
                --parallel 4 --clients "$CLIENTS" --max-tokens 128 --round "$r" --md-rows-only \
                >> "$OUT" 2> "$tmp/server.err" || { echo "| $tool | $r | failed: $(tail -1 "$tmp/server.err") |" >> "$OUT"; }
        done
    done
    echo >> "$OUT"
    echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT"
    echo >> "$OUT"
fi
if [ "$BUSY" != 0 ]; then
    bpath=$("$PY" -m llamapy pull "${MODELS[0]}" 2>/dev/null | tail -1)
    echo "## busy machine" >> "$OUT"
    echo >> "$OUT"
    "$PY" benchmarks/bench_busy.py -m "$bpath" --bin "$BIN" | sed 's/^# /### /' >> "$OUT" 2> "$tmp/busy.err" \
        || echo "busy-machine test failed: $(tail -1 "$tmp/busy.err")" >> "$OUT"
    echo >> "$OUT"
fi
echo "- load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT"
cat "$OUT"
