#!/usr/bin/env bash
# Build llama.cpp from the llama-cpp-python sdist into a cache dir, for side-by-side benchmarks only
# (llamapy never imports, loads or calls it). Prints the directory holding the binaries.
#
# Usage: benchmarks/build_llamacpp.sh [VERSION]     (default: the newest llama-cpp-python sdist)
# Cache: ${LLAMAPY_CACHE:-~/.cache/llamapy}/llamacpp/<version>/build/bin (built once, ~10 min on 2 cores)
# LLAMACPP_ARCH=avx2: an AVX2 + FMA build without AVX-512 (the brief's machine kind, on a machine that
# has more) into .../build-avx2/bin; LLAMACPP_TOOLS="llama-bench ...": build only those tools.
set -euo pipefail
VERSION="${1:-}"
CACHE="${LLAMAPY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/llamapy}/llamacpp"
mkdir -p "$CACHE"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
spec="llama-cpp-python${VERSION:+==$VERSION}"
if [ -n "$VERSION" ] && [ -f "$CACHE/$VERSION/CMakeLists.txt" ]; then
    ver="$VERSION"  # the sources are already here: no download (works offline)
else
    python3 -m pip download -q --no-deps --no-binary :all: "$spec" -d "$work" >&2
    sdist=$(ls "$work"/llama_cpp_python-*.tar.gz)
    ver=$(basename "$sdist" .tar.gz | sed 's/llama_cpp_python-//')
fi
dest="$CACHE/$ver"
# native build (AVX2/FMA/AVX-512 as the machine has them), no network, no CUDA; no AMX: its tile
# registers need a kernel permission some VMs do not grant (llama-bench died in ggml_backend_amx_mul_mat)
NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
FLAGS=(-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON "-DCMAKE_C_FLAGS=$NO_AMX" "-DCMAKE_CXX_FLAGS=$NO_AMX"
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=ON)
BUILD=build
if [ "${LLAMACPP_ARCH:-native}" = avx2 ]; then
    BUILD=build-avx2
    FLAGS=(-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON
        -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF
        -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=ON)
fi
read -r -a TOOLS <<< "${LLAMACPP_TOOLS:-llama-bench llama-cli llama-completion llama-server llama-perplexity llama-embedding llama-speculative llama-speculative-simple llama-lookup llama-mtmd-cli}"
have_all=1
for t in "${TOOLS[@]}"; do [ -x "$dest/$BUILD/bin/$t" ] || have_all=0; done
if [ "$have_all" = 1 ] && [ "$(cat "$dest/$BUILD/flags" 2>/dev/null)" = "${FLAGS[*]}" ]; then
    echo "$dest/$BUILD/bin"
    exit 0
fi
if [ ! -f "$dest/CMakeLists.txt" ]; then
    mkdir -p "$dest"
    tar -xzf "$sdist" -C "$work"
    cp -r "$work/llama_cpp_python-$ver/vendor/llama.cpp/." "$dest/"
fi
cmake -S "$dest" -B "$dest/$BUILD" -G Ninja "${FLAGS[@]}" >&2
# (older sdists lack some tools: build what exists)
cmake --build "$dest/$BUILD" -j "${LLAMACPP_JOBS:-$(nproc)}" --target "${TOOLS[@]}" >&2 || for t in "${TOOLS[@]}"; do
    cmake --build "$dest/$BUILD" -j "${LLAMACPP_JOBS:-$(nproc)}" --target "$t" >&2 || echo "no target $t in this version" >&2
done
echo "${FLAGS[*]}" > "$dest/$BUILD/flags"
echo "$dest/$BUILD/bin"
