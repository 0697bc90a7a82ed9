#!/usr/bin/env bash
# The CUDA backend on a real GPU, in one run of at most ~8 minutes (issue 31): installs what the GPU
# machine lacks from the wheels in .whl/ (benchmarks/gpu_wheels.sh fetches them on a machine with a
# network), writes random-weight GGUF files of SmolLM2-135M, Qwen2.5-1.5B and Qwen2.5-7B shapes
# (Q4_K_M-like and Q8_0, benchmarks/gpu_check/models.py), then runs, each phase under its own time budget
# and the next one even when one failed:
#   pytest    LLAMAPY_CUDA_REAL=1 pytest tests/ggml/cuda -x (every CUDA kernel test on the device)
#   agree     -ngl half / all / all+output against -ngl 0 (the CPU) on the shaped files
#   graph     CUDA-graph replay vs plain replay vs node walk: bit-identical logits
#   speed     llamapy bench -ngl 99: pp512, tg128, tg128 at depth 4096; achieved GB/s vs the device-to-
#             device copy rate measured with CuPy in the same run
# Everything lands in $OUT (at most 8 files: summary.md, setup.log, pytest.log, agree.log, graph.log,
# speed.log, speed.jsonl), summary.md rewritten after every phase.
#
# On a GPU session (the `run` tool; .whl/ is git-ignored, so it must be carried):
#   benchmarks/gpu_wheels.sh                                   # here, once: ~17 MB of wheels into .whl/
#   run(command="bash benchmarks/gpu_check.sh", carry=[".whl"], timeout_s=560)
# Smoke run on a CPU machine (Numba's CUDA simulator, toy shapes, nothing installed; ~1 min warm):
#   GPU_CHECK_SMOKE=1 OUT=/tmp/gc bash benchmarks/gpu_check.sh      (or: bash benchmarks/gpu_check.sh --smoke)
#
# Knobs: OUT (default ./gpu_check_out), PYTHON (python3), GPU_CHECK_WHL (.whl), GPU_CHECK_WORK (where the
# models go; default $TMPDIR/llamapy-gpu-check, reused when current), GPU_CHECK_TOTAL_S (480),
# GPU_CHECK_PHASES (setup,models,pytest,agree,graph,speed: a second run can skip some),
# GPU_CHECK_PYTEST_ARGS (-x), GPU_CHECK_REPS (2), GPU_CHECK_B_<PHASE> (seconds: SETUP 60, MODELS 90,
# PYTEST 140, AGREE 75, GRAPH 35; speed gets the rest).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
T0=$(date +%s)
SMOKE="${GPU_CHECK_SMOKE:-0}"
[ "${1:-}" = "--smoke" ] && SMOKE=1
PY="${PYTHON:-python3}"
OUT="${OUT:-$ROOT/gpu_check_out}"
WHL="${GPU_CHECK_WHL:-$ROOT/.whl}"
WORK="${GPU_CHECK_WORK:-${TMPDIR:-/tmp}/llamapy-gpu-check}"
PHASES=",${GPU_CHECK_PHASES:-setup,models,pytest,agree,graph,speed},"
REPS="${GPU_CHECK_REPS:-2}"
mkdir -p "$OUT" "$WORK/sections"
rm -f "$WORK"/sections/*.md "$WORK/phases.md" "$WORK/warm.log" "$OUT/speed.jsonl"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"  # llamapy and benchmarks/ even if the install fails
export PIP_BREAK_SYSTEM_PACKAGES=1 PIP_DISABLE_PIP_VERSION_CHECK=1

if [ "$SMOKE" = 1 ]; then
    export NUMBA_ENABLE_CUDASIM=1
    TOTAL="${GPU_CHECK_TOTAL_S:-600}"
    MODELS=(tiny-smollm2:Q4_K_M tiny-smollm2:Q8_0 tiny-qwen:Q4_K_M) # [0], [1]: a Q4_K_M and a Q8_0 file
    PYTEST_SEL=(tests/ggml/cuda/test_cuda_replay.py::test_bad_index_on_a_replayed_run_still_raises)
    # <= 8 tokens: no tiled GEMM (a Python thread per CUDA thread there); the simulator runs a kernel
    # as Python, so few tokens: the point is that every path runs, not the numbers
    SPEED=("tiny-smollm2:Q4_K_M=pp4,tg2,tg2@8")
    AGREE=(tiny-qwen:Q4_K_M tiny-smollm2:Q8_0)
    PROMPT=3 AGREE_DECODE=2 AGREE_NGL=1,all+out GRAPH_DECODE=2 BUDGET=300
    REPS=1
    PIP="echo [smoke: not run] pip"
else
    unset NUMBA_ENABLE_CUDASIM
    export LLAMAPY_CUDA_REAL=1
    TOTAL="${GPU_CHECK_TOTAL_S:-480}"
    MODELS=(smollm2-135m:Q4_K_M smollm2-135m:Q8_0 qwen2.5-1.5b:Q4_K_M qwen2.5-7b:Q4_K_M qwen2.5-1.5b:Q8_0
        qwen2.5-7b:Q8_0)
    # the real-file tests fetch SmolLM2 / Gemma 3 from the hub (no network there): the agree phase runs
    # the same check on the SmolLM2-shaped file instead
    PYTEST_SEL=(tests/ggml/cuda
        --deselect tests/ggml/cuda/test_cuda_models.py::test_smollm2_real_file_on_a_gpu
        --deselect tests/ggml/cuda/test_cuda_models.py::test_gemma3_real_file_on_a_gpu)
    SPEED=()
    for m in "${MODELS[@]}"; do # every Q4_K_M file first, then the Q8_0 ones
        case $m in *Q4_K_M) SPEED+=("$m=pp512,tg128,tg128@4096") ;; esac
    done
    for m in "${MODELS[@]}"; do
        case $m in *Q8_0) SPEED+=("$m=pp512,tg128") ;; esac
    done
    AGREE=()
    for m in "${MODELS[@]}"; do # every Q4_K_M file and one Q8_0 one
        case $m in *Q4_K_M) AGREE+=("$m") ;; esac
    done
    AGREE+=("${MODELS[1]}")
    PROMPT=16 AGREE_DECODE=4 AGREE_NGL=half,all,all+out GRAPH_DECODE=12 BUDGET=""
    PIP="$PY -m pip"
fi
MODELDIR="$WORK/models"
model() { echo "$MODELDIR/${1%%:*}.${1#*:}.gguf"; }

# -- bookkeeping ---------------------------------------------------------------------------------------
left() { echo $((T0 + TOTAL - $(date +%s))); }
record() { # phase status seconds
    echo "| $1 | $2 | $3 |" >>"$WORK/phases.md"
    summary
}
summary() {
    {
        echo "# GPU check: the CUDA backend on a real GPU"
        echo
        if [ "$SMOKE" = 1 ]; then
            echo "**SMOKE RUN** (Numba's CUDA simulator, toy shapes): proves the script, not the GPU."
            echo
        fi
        echo "- when: $(date -u -d "@$T0" +%Y-%m-%dT%H:%MZ 2>/dev/null || date -u +%Y-%m-%dT%H:%MZ)," \
            "$(($(date +%s) - T0)) s so far (budget $TOTAL s)"
        echo "- llamapy: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$ROOT" \
            diff --quiet HEAD -- llamapy tests benchmarks 2>/dev/null || echo ' + uncommitted changes')"
        [ -f "$WORK/gpu.txt" ] && sed 's/^/- /' "$WORK/gpu.txt"
        echo
        echo "| phase | result | s |"
        echo "| --- | --- | ---: |"
        cat "$WORK/phases.md" 2>/dev/null
        for p in setup models pytest agree graph speed; do
            if [ -s "$WORK/sections/$p.md" ]; then
                echo
                echo "## $p"
                echo
                cat "$WORK/sections/$p.md"
            fi
        done
    } >"$OUT/summary.md"
}
want() { [[ "$PHASES" == *",$1,"* ]]; }
# phase NAME BUDGET LOG CMD...: CMD under `timeout`, capped by what is left of the total
phase() {
    local name=$1 budget=$2 log=$3
    shift 3
    if ! want "$name"; then
        return 0
    fi
    local t
    t=$(left)
    t=$((t - 5))
    [ "$budget" -lt "$t" ] && t=$budget
    if [ "$t" -lt 5 ]; then
        record "$name" "**not run: out of time**" 0
        return 0
    fi
    echo "== $name: $(date -u +%T), budget $t s: $*" >>"$log"
    local s rc status
    s=$(date +%s)
    timeout -k 10 "$t" "$@" >>"$log" 2>&1
    rc=$?
    case $rc in
        0) status=ok ;;
        124 | 137) status="**timed out** after $t s" ;;
        *) status="**failed** (exit $rc)" ;;
    esac
    echo "== $name: exit $rc after $(($(date +%s) - s)) s" >>"$log"
    record "$name" "$status" $(($(date +%s) - s))
    return 0
}

# -- setup: wheels, llamapy, what the machine has ------------------------------------------------------
setup() {
    echo "python: $($PY -c 'import sys; print(sys.version)' 2>&1)"
    echo "glibc: $(ldd --version 2>&1 | head -1)"
    echo "disk: $(df -h "$WORK" | tail -1)"
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi 2>&1 | head -15
    else
        echo "no nvidia-smi"
    fi
    shopt -s nullglob
    local wheels=("$WHL"/*.whl)
    shopt -u nullglob
    echo "wheels in $WHL: ${#wheels[@]}"
    if [ ${#wheels[@]} -gt 0 ]; then
        # all together (pip checks their dependencies against what is installed); else one by one
        if ! $PIP install --no-index --find-links "$WHL" "${wheels[@]}"; then
            echo "installing the wheels together failed: one by one, without dependencies"
            for w in "${wheels[@]}"; do
                $PIP install --no-index --no-deps "$w" || echo "FAILED: $w"
            done
        fi
    fi
    $PIP install --no-deps --no-index --no-build-isolation -e "$ROOT" \
        || echo "editable install failed: llamapy runs from PYTHONPATH=$ROOT"
    $PY - <<'EOF'
import importlib, os
for m in ("numpy", "numba", "numba_cuda", "cupy", "llamapy", "fastapi", "uvicorn", "jinja2", "regex",
          "llguidance", "huggingface_hub", "multipart", "pytest"):
    try:
        v = getattr(importlib.import_module(m), "__version__", "?")
        print(f"{m} {v}")
    except Exception as e:
        print(f"MISSING {m}: {type(e).__name__}: {e}")
from llamapy.ggml.cuda.device import cuda_unavailable_reason
why = cuda_unavailable_reason()
print("llamapy CUDA backend:", "usable" if why is None else f"NOT USABLE: {why}",
      "(simulator)" if os.environ.get("NUMBA_ENABLE_CUDASIM") else "")
EOF
}

gpu_line() {
    if [ "$SMOKE" = 1 ]; then
        echo "device: Numba CUDA simulator (smoke run)"
    elif command -v nvidia-smi >/dev/null; then
        echo "GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1);" \
            "$(nvidia-smi 2>/dev/null | grep -o 'CUDA Version: [0-9.]*' | head -1)"
    else
        echo "GPU: none found (no nvidia-smi)"
    fi
    echo "python $($PY -c 'import sys; print(sys.version.split()[0])' 2>&1);" \
        "$($PY -c 'import numba, numba_cuda; print("numba", numba.__version__, "numba-cuda", numba_cuda.__version__)' 2>&1 | tail -1);" \
        "$($PY -c 'import cupy; print("cupy", cupy.__version__)' 2>/dev/null || echo 'no CuPy')"
}

export -f setup
export PY PIP WHL ROOT WORK
gpu_line >"$WORK/gpu.txt" 2>&1
summary
phase setup "${GPU_CHECK_B_SETUP:-${BUDGET:-60}}" "$OUT/setup.log" bash -c setup
gpu_line >"$WORK/gpu.txt" 2>&1 # again: now with what setup installed

# -- the models (and the CPU kernels compiled in the background meanwhile) ---------------------------
files=()
for m in "${MODELS[@]}"; do files+=("$m"); done
phase models "${GPU_CHECK_B_MODELS:-${BUDGET:-90}}" "$OUT/setup.log" "$PY" -m benchmarks.gpu_check.models "$MODELDIR" "${files[@]}"
if want models || want agree; then
    { ls -la "$MODELDIR" 2>&1 | sed 's/^/    /'; } >"$WORK/sections/models.md"
    echo >>"$WORK/sections/models.md"
    echo "(random weights, tokenizer \"none\"; Q4_K_M-like mix: benchmarks/gpu_check/models.py)" >>"$WORK/sections/models.md"
fi
warm_pid=""
if want agree && [ -f "$(model "${MODELS[0]}")" ]; then # the CPU reference's kernels, while pytest runs
    timeout -k 5 240 "$PY" -m benchmarks.gpu_check.agree warm --prompt $PROMPT --md "$WORK/warm.md" \
        "$(model "${MODELS[0]}")" "$(model "${MODELS[1]}")" >"$WORK/warm.log" 2>&1 &
    warm_pid=$!
fi

# -- correctness ----------------------------------------------------------------------------------------
read -r -a pytest_args <<<"${GPU_CHECK_PYTEST_ARGS:--x}"
phase pytest "${GPU_CHECK_B_PYTEST:-${BUDGET:-140}}" "$OUT/pytest.log" "$PY" -m pytest -q -rs -p no:cacheprovider \
    --durations=15 "${pytest_args[@]}" "${PYTEST_SEL[@]}"
if want pytest; then
    tail -40 "$OUT/pytest.log" | grep -E '^(FAILED|ERROR)|passed|failed|error' | tail -12 \
        | sed 's/^/    /' >"$WORK/sections/pytest.md"
    if ! grep -qE 'passed|failed|error' "$WORK/sections/pytest.md"; then # cut short: its last lines
        { echo "no pytest summary line (cut short?); the log ends:"; echo; tail -15 "$OUT/pytest.log" \
            | sed 's/^/    /'; } >"$WORK/sections/pytest.md"
    fi
fi
agree_files=()
for m in "${AGREE[@]}"; do agree_files+=("$(model "$m")"); done
b_agree="${GPU_CHECK_B_AGREE:-${BUDGET:-75}}" # no new file is started in its last 40%
phase agree "$b_agree" "$OUT/agree.log" "$PY" -m benchmarks.gpu_check.agree agree --prompt $PROMPT \
    --decode $AGREE_DECODE --ngl $AGREE_NGL --md "$WORK/sections/agree.md" \
    --deadline $(($(date +%s) + b_agree * 6 / 10)) "${agree_files[@]}"
phase graph "${GPU_CHECK_B_GRAPH:-${BUDGET:-35}}" "$OUT/graph.log" "$PY" -m benchmarks.gpu_check.agree graph \
    --prompt $PROMPT --decode $GRAPH_DECODE --md "$WORK/sections/graph.md" "$(model "${MODELS[0]}")"

# -- speed: whatever time is left -----------------------------------------------------------------------
plan=()
for s in "${SPEED[@]}"; do
    plan+=("$(model "${s%%=*}")=${s#*=}")
done
phase speed "$(left)" "$OUT/speed.log" "$PY" -m benchmarks.gpu_check.speed --jsonl "$OUT/speed.jsonl" \
    --md "$WORK/sections/speed.md" -r "$REPS" --deadline $(($(date +%s) + $(left) - 40)) "${plan[@]}"
if [ -n "$warm_pid" ]; then # the background CPU warm-up: done long ago, normally
    kill "$warm_pid" 2>/dev/null
    wait "$warm_pid" 2>/dev/null
    { echo "== CPU kernel warm-up (background)"; cat "$WORK/warm.log"; } >>"$OUT/setup.log"
fi
summary
echo "gpu_check: $(($(date +%s) - T0)) s; results in $OUT:" >&2
cat "$WORK/phases.md" >&2
