#!/usr/bin/env bash
# GPU speed, side by side in one run: `llamapy bench -ngl 99` and llama.cpp built with CUDA (from the
# llama-cpp-python sdist's vendored source; nvcc must be on the machine), pp512 / tg128 on SmolLM2 135M,
# Gemma 3 270M and Qwen2.5 0.5B. Writes benchmarks/results/cuda.md. For a session that has a GPU: it is
# not run by the tests. llamapy never imports or calls llama.cpp; it is a yardstick only.
#
# Usage: benchmarks/bench_cuda.sh [MODEL.gguf ...]
#   default models: SmolLM2 and Gemma 3 from the llamapy cache (else `llamapy pull`, which needs the
#                   network) plus $QWEN_GGUF if set (a Qwen2.5 0.5B Instruct GGUF)
#   LLAMACPP_SRC=dir       a llama.cpp source tree (default: the newest ~/.cache/llamapy/llamacpp/<ver>)
#   LLAMACPP_SDIST=file    a llama-cpp-python sdist (.tar.gz) to take the source from (no network needed)
#                          when there is no source tree; without either, pip downloads the newest sdist
#   REPS=N                 repetitions (default 5)
#   SKIP_LLAMACPP=1        only llamapy (the CUDA build of llama.cpp takes minutes even for one target)
# Needs: pip install -e '.[cuda]' (numba-cuda, cupy-cuda12x), an NVIDIA driver, and for llama.cpp nvcc,
# cmake >= 3.24 (CMAKE_CUDA_ARCHITECTURES=native) and ninja. The first llamapy run also compiles the
# Numba CUDA kernels (cached in __pycache__ after that).
set -euo pipefail
cd "$(dirname "$0")/.."
REPS="${REPS:-5}"
OUT=benchmarks/results/cuda.md
CACHE_ROOT="${LLAMAPY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/llamapy}"
CACHE="$CACHE_ROOT/llamacpp"
unset NUMBA_ENABLE_CUDASIM

die() {
    echo "bench_cuda.sh: $*" >&2
    exit 1
}

command -v nvidia-smi >/dev/null || die "nvidia-smi not found: this needs a machine with an NVIDIA GPU"
why=$(python -c 'from llamapy.ggml.cuda.device import cuda_unavailable_reason as r; print(r() or "")') \
    || die "llamapy is not importable here"
[ -z "$why" ] || die "the llamapy CUDA backend cannot run here: $why"
python -c 'import cupy' 2>/dev/null || echo "bench_cuda.sh: warning: no CuPy: no cuBLAS, no CUDA graphs" >&2

models=("$@")
if [ ${#models[@]} -eq 0 ]; then
    for name in SmolLM2-135M-Instruct.Q4_1.gguf:smollm2-135m-instruct gemma-3-270m-q4_k_m.gguf:gemma3-270m; do
        file="$CACHE_ROOT/models/${name%%:*}"
        if [ ! -f "$file" ]; then
            file=$(python -m llamapy pull -q "${name#*:}" | tail -1) || die "cannot get ${name#*:}"
        fi
        models+=("$file")
    done
    if [ -n "${QWEN_GGUF:-}" ]; then
        models+=("$QWEN_GGUF")
    fi
fi
for m in "${models[@]}"; do
    [ -f "$m" ] || die "no such model file: $m"
done

# -- llama.cpp with CUDA --------------------------------------------------------------------------------
bld=""
if [ -z "${SKIP_LLAMACPP:-}" ]; then
    command -v nvcc >/dev/null || die "nvcc not found (set SKIP_LLAMACPP=1 to bench llamapy only)"
    src="${LLAMACPP_SRC:-}"
    if [ -z "$src" ]; then
        shopt -s nullglob
        trees=("$CACHE"/*/CMakeLists.txt)
        shopt -u nullglob
        if [ ${#trees[@]} -gt 0 ]; then
            src=$(printf '%s\n' "${trees[@]%/CMakeLists.txt}" | sort -V | tail -1)
        fi
    fi
    if [ -z "$src" ] || [ ! -f "$src/CMakeLists.txt" ]; then
        work=$(mktemp -d)
        trap 'rm -rf "$work"' EXIT
        sdist="${LLAMACPP_SDIST:-}"
        if [ -z "$sdist" ]; then
            python3 -m pip download -q --no-deps --no-binary :all: llama-cpp-python -d "$work" >&2
            sdist=$(find "$work" -maxdepth 1 -name 'llama_cpp_python-*.tar.gz' | head -1)
        fi
        [ -f "$sdist" ] || die "no llama-cpp-python sdist (set LLAMACPP_SRC or LLAMACPP_SDIST)"
        ver=$(basename "$sdist" .tar.gz)
        ver="${ver#llama_cpp_python-}"
        tar -xzf "$sdist" -C "$work"
        src="$CACHE/$ver"
        mkdir -p "$src"
        cp -r "$work/llama_cpp_python-$ver/vendor/llama.cpp/." "$src/"
    fi
    bld="$src/build-cuda"
    if [ ! -x "$bld/bin/llama-bench" ]; then
        cmake -S "$src" -B "$bld" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DLLAMA_CURL=OFF \
            -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
            -DCMAKE_CUDA_ARCHITECTURES=native >&2
        cmake --build "$bld" -j "$(nproc)" --target llama-bench >&2
    fi
fi

# -- the runs ---------------------------------------------------------------------------------------------
mkdir -p "$(dirname "$OUT")"
gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)
{
    echo "# CUDA: llamapy -ngl 99 vs llama.cpp (CUDA build), pp512 / tg128, $REPS repetitions"
    echo
    echo "$(date -u +%Y-%m-%dT%H:%MZ); $gpu;"
    echo "llama.cpp source: ${src:-not built}; llamapy $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
    for m in "${models[@]}"; do
        echo
        echo "## $(basename "$m")"
        echo
        echo "llamapy:"
        echo
        python -m llamapy bench -m "$m" -p 512 -n 128 -r "$REPS" -ngl 99
        if [ -n "$bld" ]; then
            echo
            echo "llama.cpp:"
            echo
            "$bld/bin/llama-bench" -m "$m" -p 512 -n 128 -r "$REPS" -ngl 99 -fa 1
        fi
    done
} | tee "$OUT"
echo "wrote $OUT" >&2
