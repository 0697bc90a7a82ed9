#!/usr/bin/env bash
# GPU speed, side by side in one run: `llamapy bench -ngl 99` and llama.cpp built with CUDA (from the
# llama-cpp-python sdist's vendored source; nvcc must be on the machine), pp512 / tg128 on SmolLM2 135M,
# Gemma 3 270M and Qwen 0.5B. Writes benchmarks/results/cuda.md. For a session that has a GPU: it is
# not run by the tests. llamapy never imports or calls llama.cpp; it is a yardstick only.
#
# Usage: benchmarks/bench_cuda.sh [MODEL.gguf ...]
#   default models: the two known names (llamapy pull) plus $QWEN_GGUF if set (Qwen2.5 0.5B Instruct GGUF)
#   LLAMACPP_SRC=dir  llama.cpp source tree (default: ~/.cache/llamapy/llamacpp/<newest>, else the sdist
#                     via pip download, which needs the network)
#   REPS=N            repetitions (default 5)
# Needs: pip install -e '.[cuda]' (numba-cuda, cupy-cuda12x), an NVIDIA driver, nvcc, cmake, ninja.
set -euo pipefail
cd "$(dirname "$0")/.."
REPS="${REPS:-5}"
OUT=benchmarks/results/cuda.md
CACHE="${LLAMAPY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/llamapy}/llamacpp"
unset NUMBA_ENABLE_CUDASIM

models=("$@")
if [ ${#models[@]} -eq 0 ]; then
    for m in smollm2-135m-instruct gemma3-270m; do models+=("$(python -m llamapy pull -q "$m" | tail -1)"); done
    [ -n "${QWEN_GGUF:-}" ] && models+=("$QWEN_GGUF")
fi

# -- llama.cpp with CUDA --------------------------------------------------------------------------------
src="${LLAMACPP_SRC:-}"
if [ -z "$src" ]; then
    src=$(ls -d "$CACHE"/*/ 2>/dev/null | sort -V | tail -1 || true)
    src="${src%/}"
fi
if [ -z "$src" ] || [ ! -f "$src/CMakeLists.txt" ]; then
    work=$(mktemp -d)
    python3 -m pip download -q --no-deps --no-binary :all: llama-cpp-python -d "$work"
    tar -xzf "$work"/llama_cpp_python-*.tar.gz -C "$work"
    src="$CACHE/$(basename "$work"/llama_cpp_python-*/ | sed 's/llama_cpp_python-//')"
    mkdir -p "$src" && cp -r "$work"/llama_cpp_python-*/vendor/llama.cpp/. "$src/"
fi
bld="$src/build-cuda"
if [ ! -x "$bld/bin/llama-bench" ]; then
    cmake -S "$src" -B "$bld" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DLLAMA_CURL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DCMAKE_CUDA_ARCHITECTURES=native >&2
    cmake --build "$bld" -j "$(nproc)" --target llama-bench >&2
fi

# -- the runs ---------------------------------------------------------------------------------------------
{
    echo "# CUDA: llamapy -ngl 99 vs llama.cpp (CUDA build), pp512 / tg128, $REPS repetitions"
    echo
    echo "$(date -u +%Y-%m-%dT%H:%MZ); $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1);"
    echo "llama.cpp source: $src; llamapy $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
    for m in "${models[@]}"; do
        echo
        echo "## $(basename "$m")"
        echo
        echo "llamapy:"
        echo
        python -m llamapy bench -m "$m" -p 512 -n 128 -r "$REPS" -ngl 99
        echo
        echo "llama.cpp:"
        echo
        "$bld/bin/llama-bench" -m "$m" -p 512 -n 128 -r "$REPS" -ngl 99 -fa 1
    done
} | tee "$OUT"
echo "wrote $OUT" >&2
