#!/usr/bin/env bash
# The wheels benchmarks/gpu_check.sh installs on the GPU machine (no network there), fetched here into
# .whl/ (git-ignored; the `run` tool sends it with carry=[".whl"]; its limit is 64 MiB in all, this is
# ~17 MB). That machine already has Python 3.12, NumPy, numba, numba-cuda and cupy-cuda13x: these are
# llamapy's other runtime dependencies (pyproject.toml's `dependencies`), pytest for the kernel tests and
# setuptools for the editable install, with their dependencies, as cp312 manylinux x86_64 wheels.
# NumPy / numba / llvmlite are left out (present there, and llvmlite alone is ~40 MB).
#
# Usage: benchmarks/gpu_wheels.sh [DIR]      (default .whl; it is emptied first)
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="${1:-.whl}"
rm -rf "$DIR"
mkdir -p "$DIR"
plat=()
for p in manylinux2014_x86_64 manylinux_2_17_x86_64 manylinux_2_28_x86_64 manylinux_2_31_x86_64; do
    plat+=(--platform "$p") # llguidance 1.9 is manylinux_2_31 only
done
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
    --abi cp312 --abi abi3 --abi none "${plat[@]}" -d "$DIR" \
    "jinja2>=3.1" "regex>=2023.0" "fastapi>=0.110" "uvicorn>=0.29" "llguidance>=1.9,<2" \
    "huggingface_hub>=1.0" "python-multipart>=0.0.9" "pytest>=8" "setuptools>=64"
rm -f "$DIR"/numpy-*.whl "$DIR"/numba-*.whl "$DIR"/llvmlite-*.whl
n=$(find "$DIR" -type f -name '*.whl' | wc -l)
size=$(du -sm "$DIR" | cut -f1)
echo "gpu_wheels: $n wheels, ${size} MiB in $DIR" >&2
[ "$size" -lt 48 ] || {
    echo "gpu_wheels: ${size} MiB is too close to the 64 MiB the run tool carries" >&2
    exit 1
}
